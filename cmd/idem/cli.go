package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/idemkit/idem"
)

const usage = `idem operates the record table of github.com/idemkit/idem.

Usage:
  idem <command> [flags]

Commands:
  migrate up                 apply idem's migrations
  migrate down --yes         revert them: drop the record, inbox and version tables
  migrate version            show the applied version (writes nothing)
  migrate force N --yes      record version N (-1: none) and clear the dirty flag,
                             running no migration
  purge                      delete expired records; --dry-run only counts them
  inspect --scope S --key K  show one record
  stuck                      list lease records whose lease ran out, oldest first
  stats                      counts by status, the oldest record, table and index size
  version                    the versions of idem, its library and Go (also --version)

Flags every command but version takes:
  --database-url URL   where to connect; else DATABASE_URL, else the PG* variables
  --schema NAME        the record table's schema, on MySQL its database
                       (default: the search_path; on MySQL the URL's database)
  --table NAME         the record table (default idempotent_record)
  --json               print JSON instead of text (version takes it too)

Databases:
  PostgreSQL           postgres://user:pass@host:5432/db?sslmode=disable, a
                       libpq keyword/value string, or the PG* variables
  MySQL, MariaDB       mysql://user:pass@host:3306/db?param=value (or mariadb://;
                       user and password percent-encoded, the parameters those
                       of a go-sql-driver DSN), or a go-sql-driver DSN with its
                       network written out: user:pass@tcp(host:3306)/db?params
                       or user@unix(/run/mysqld/mysqld.sock)/db
  On MySQL, migrate runs in the database of --schema, else of the URL, and
  creates only the tables idempotent_record and idem_inbox (no --table).

Run 'idem <command> --help' for a command's own flags.
`

// exit codes
const (
	exitOK          = 0
	exitError       = 1
	exitUsage       = 2
	exitInterrupted = 130 // 128 + SIGINT, as shells report it
)

// env reads an environment variable (os.Getenv, or a test's).
type env func(string) string

// common holds the flags every command takes.
type common struct {
	url, schema, table string
	json               bool
}

func (c *common) register(fs *flag.FlagSet) {
	fs.StringVar(&c.url, "database-url", "", "connection `URL`: postgres://..., mysql://user:pass@host:3306/db, "+
		"or a go-sql-driver DSN user:pass@tcp(host:3306)/db (default $DATABASE_URL, then the PG* variables)")
	fs.StringVar(&c.schema, "schema", "", "the schema `NAME` of the record and inbox tables, on MySQL their database "+
		"(default: the search_path; on MySQL the URL's database)")
	fs.StringVar(&c.table, "table", idem.DefaultTable, "the record table's `NAME`")
	fs.BoolVar(&c.json, "json", false, "print JSON")
}

// tableFlags repeats --schema and --table when they are not the defaults,
// for a hint.
func (c *common) tableFlags() string {
	var b strings.Builder
	if c.schema != "" {
		b.WriteString(" --schema " + c.schema)
	}
	if c.table != idem.DefaultTable {
		b.WriteString(" --table " + c.table)
	}
	return b.String()
}

// target names the record table, qualified when --schema is set.
func (c *common) target() string { return c.qualified(c.table) }

// qualified names table in the schema of --schema, when it is set.
func (c *common) qualified(table string) string {
	if c.schema == "" {
		return table
	}
	return c.schema + "." + table
}

// options are the idem options naming the tables.
func (c *common) options() []idem.TableOption {
	return []idem.TableOption{idem.WithTable(c.schema, c.table), idem.WithInboxTable(c.schema, idem.DefaultInboxTable)}
}

// command is one subcommand.
type command struct {
	name, summary string
	run           func(ctx context.Context, args []string, out, errOut io.Writer, getenv env) error
}

var commands = []command{
	{"migrate", "apply, revert or show idem's migrations", runMigrate},
	{"purge", "delete expired records", runPurge},
	{"inspect", "show one record", runInspect},
	{"stuck", "list lease records whose lease ran out", runStuck},
	{"stats", "counts by status, oldest record, sizes", runStats},
	{"version", "the versions of idem, its library and Go", runVersion},
}

// usageError is a mistake in the command line: exit code 2.
type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

// errInterrupted is a command stopped by a signal that has already printed
// what it did: exit code 130, nothing more to say.
var errInterrupted = errors.New("interrupted")

func run(ctx context.Context, args []string, out, errOut io.Writer, getenv env) int {
	if len(args) > 0 && (args[0] == "--version" || args[0] == "-version") {
		args = append([]string{"version"}, args[1:]...)
	}
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(out, usage)
		if len(args) == 0 {
			return exitUsage
		}
		return exitOK
	}
	i := slices.IndexFunc(commands, func(c command) bool { return c.name == args[0] })
	if i < 0 {
		fmt.Fprintf(errOut, "idem: unknown command %q\n\n%s", args[0], usage)
		return exitUsage
	}
	err := commands[i].run(ctx, args[1:], out, errOut, getenv)
	var ue usageError
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.Is(err, errInterrupted):
		return exitInterrupted
	case errors.As(err, &ue):
		fmt.Fprintf(errOut, "idem %s: %v (see idem %s --help)\n", args[0], err, args[0])
		return exitUsage
	case ctx.Err() != nil:
		fmt.Fprintf(errOut, "idem %s: interrupted: %v\n", args[0], err)
		return exitInterrupted
	default:
		fmt.Fprintf(errOut, "idem %s: %v\n", args[0], err)
		return exitError
	}
}

// missingTableError is a command that met a table of idem's that does not
// exist.
type missingTableError struct {
	// table names the table; remedy says how to create it.
	table, remedy string
}

func (e *missingTableError) Error() string {
	return fmt.Sprintf("table %s does not exist: %s, or name the table with --schema and --table", e.table, e.remedy)
}

func printJSON(out io.Writer, v any) error {
	enc := json.NewEncoder(out)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func runMigrate(ctx context.Context, args []string, out, _ io.Writer, getenv env) error {
	fs := flag.NewFlagSet("migrate", flag.ContinueOnError)
	var c common
	c.register(fs)
	yes := fs.Bool("yes", false, "confirm 'migrate down', which drops the record and inbox tables, or 'migrate force'")
	pos, err := parse(fs, args, out, "idem migrate up|down|version|force N [flags]")
	if err != nil {
		return err
	}
	var force int
	switch {
	case len(pos) == 1 && slices.Contains([]string{"up", "down", "version"}, pos[0]):
	case len(pos) == 2 && pos[0] == "force":
		if force, err = strconv.Atoi(pos[1]); err != nil {
			return usageError{fmt.Sprintf("'migrate force' wants a version number (-1 for none), not %q", pos[1])}
		}
	case len(pos) == 1 && pos[0] == "force":
		return usageError{"'migrate force' wants the version to record: 'idem migrate force N --yes' (-1 for none)"}
	default:
		return usageError{"want one of: up, down, version, force N"}
	}
	action := pos[0]
	if action == "down" && !*yes {
		return usageError{"'migrate down' drops the record and inbox tables with every record in them; add --yes to confirm"}
	}
	if action == "force" && !*yes {
		return usageError{"'migrate force' records a version without running any migration; add --yes to confirm"}
	}
	db, err := c.connect(ctx, getenv, true)
	if err != nil {
		return err
	}
	defer db.close()
	// version only reads: on a schema never migrated it creates nothing.
	before, beforeDirty, err := db.version(ctx)
	if err != nil {
		return err
	}
	switch action {
	case "up":
		err = db.up(ctx)
	case "down":
		err = db.down(ctx)
	case "force":
		err = db.force(ctx, force)
	}
	if errors.Is(err, idem.ErrInvalidOption) {
		return usageError{err.Error()}
	}
	if err != nil {
		return err
	}
	version, dirty, err := db.version(ctx)
	if err != nil {
		return err
	}
	if c.json {
		res := map[string]any{"action": action, "version": version, "dirty": dirty}
		if action != "version" {
			res["previous_version"], res["previous_dirty"] = before, beforeDirty
		}
		return printJSON(out, res)
	}
	switch {
	case dirty:
		fmt.Fprintf(out, "version %d, dirty: a migration failed halfway; repair the schema by hand, "+
			"then record the version it is at with 'idem migrate force N --yes%s'\n", version, c.tableFlags())
	case action == "version":
		fmt.Fprintf(out, "version %d\n", version)
	case action == "down" && before == 0 && !beforeDirty:
		fmt.Fprintf(out, "nothing to revert: no migration of idem's is recorded for %s (version 0)\n", c.target())
	case action == "force" && force == -1:
		fmt.Fprintln(out, "recorded no version (version 0), not dirty; no migration was run")
	case action == "force":
		fmt.Fprintf(out, "recorded version %d, not dirty; no migration was run\n", version)
	case action == "up" && version == before && !beforeDirty:
		fmt.Fprintf(out, "already at version %d: nothing to migrate\n", version)
	default:
		fmt.Fprintf(out, "migrated %s: now at version %d\n", action, version)
	}
	return nil
}

func runPurge(ctx context.Context, args []string, out, errOut io.Writer, getenv env) error {
	fs := flag.NewFlagSet("purge", flag.ContinueOnError)
	var c common
	c.register(fs)
	dryRun := fs.Bool("dry-run", false, "count the records a purge would delete, delete nothing")
	batch := fs.Int("batch-size", 0, "delete `N` rows per statement; 0 means 10,000, or 2,000 with --rows-per-second")
	var inboxRetention duration
	fs.Var(&inboxRetention, "inbox-retention", "also delete inbox rows consumed longer ago than `D` (7d, 36h, 90m); 0 leaves the inbox alone")
	rate := fs.Int("rows-per-second", 0, "pace the purge to at most `N` rows per second, leaving room for live traffic; 0 runs flat out")
	progress := fs.String("progress", "auto", "show a progress bar on stderr: `WHEN` is auto (when stderr is a terminal), always or never")
	pos, err := parse(fs, args, out, "idem purge [--dry-run] [flags]")
	if err != nil {
		return err
	}
	inbox := time.Duration(inboxRetention)
	if len(pos) > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", pos[0])}
	}
	for _, f := range []struct {
		name     string
		negative bool
	}{{"--batch-size", *batch < 0}, {"--inbox-retention", inbox < 0}, {"--rows-per-second", *rate < 0}} {
		if f.negative {
			return usageError{f.name + " must not be negative"}
		}
	}
	if !slices.Contains([]string{"auto", "always", "never"}, *progress) {
		return usageError{"--progress must be auto, always or never"}
	}
	db, err := c.connect(ctx, getenv, false)
	if err != nil {
		return err
	}
	defer db.close()
	showBar := *progress == "always" || (*progress == "auto" && isTerminal(errOut))
	var expired, inboxRows int64
	if *dryRun || showBar {
		// Through the expires_at index: no full scan.
		if expired, inboxRows, err = db.countExpired(ctx, inbox); err != nil {
			return db.explain(ctx, err)
		}
	}
	if *dryRun {
		if c.json {
			return printJSON(out, map[string]any{"dry_run": true, "expired": expired, "inbox": inboxRows})
		}
		fmt.Fprintf(out, "%s would be deleted", count(expired, "expired record"))
		if inbox > 0 {
			fmt.Fprintf(out, ", and %s", count(inboxRows, "inbox row"))
		}
		fmt.Fprintln(out, "; nothing was deleted")
		return nil
	}
	// The bar counts every row the purge deletes, records and inbox rows,
	// as its summary does.
	bar := newProgress(errOut, expired+inboxRows, showBar)
	start := time.Now()
	var records int64
	onRecords := func(n int64) { records += n; bar.add(n) }
	deleted, err := db.purge(ctx, idem.PurgeParams{BatchSize: *batch, InboxRetention: inbox, RowsPerSecond: *rate,
		OnBatch: onRecords, OnInboxBatch: bar.add})
	elapsed := time.Since(start)
	// Interrupted (Ctrl-C, SIGTERM), the purge reports what it did: the
	// rows it deleted stay deleted.
	interrupted := err != nil && ctx.Err() != nil
	if err == nil {
		bar.finish(deleted)
	}
	bar.done()
	if err != nil && !interrupted {
		if err = db.explain(ctx, err); deleted == 0 {
			return err
		}
		return fmt.Errorf("%w (%s deleted before it)", err, count(deleted, "row"))
	}
	if c.json {
		err = printJSON(out, map[string]any{"deleted": deleted, "records": records, "inbox": deleted - records,
			"seconds": elapsed.Seconds(), "interrupted": interrupted})
	} else {
		prefix, split := "", ""
		if interrupted {
			prefix = "interrupted: "
		}
		if inbox > 0 {
			split = fmt.Sprintf(" (%s, %s)", count(records, "record"), count(deleted-records, "inbox row"))
		}
		fmt.Fprintf(out, "%sdeleted %s%s in %s (%.0f rows/s)\n", prefix, count(deleted, "row"), split, elapsed.Round(time.Millisecond),
			float64(deleted)/max(elapsed.Seconds(), 1e-9))
	}
	if err == nil && interrupted {
		err = errInterrupted
	}
	return err
}

// count is n and noun, in the plural unless n is 1: "1 record", "2 records".
func count[N int | int64](n N, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// statuses are the record statuses stats lists, in its order.
var statuses = []string{idem.StatusProcessing, idem.StatusSucceeded, idem.StatusFailed, idem.StatusIssued}

func total(st *idem.Stats) int64 {
	var n int64
	for _, v := range st.Statuses {
		n += v
	}
	return n
}

func runInspect(ctx context.Context, args []string, out, _ io.Writer, getenv env) error {
	fs := flag.NewFlagSet("inspect", flag.ContinueOnError)
	var c common
	c.register(fs)
	scope := fs.String("scope", "", "the scope `S` of the key (required)")
	key := fs.String("key", "", "the key `K` (required)")
	pos, err := parse(fs, args, out, "idem inspect --scope S --key K [flags]")
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", pos[0])}
	}
	if *scope == "" || *key == "" {
		return usageError{"--scope and --key are required"}
	}
	db, err := c.connect(ctx, getenv, false)
	if err != nil {
		return err
	}
	defer db.close()
	r, err := db.lookup(ctx, *scope, *key)
	if errors.Is(err, idem.ErrNotFound) {
		return fmt.Errorf("no record for scope %q, key %q (never claimed, purged, or its claim not committed yet)", *scope, *key)
	}
	if err != nil {
		return db.explain(ctx, err)
	}
	if c.json {
		return printJSON(out, jsonRecord(r))
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	now := time.Now()
	fmt.Fprintf(tw, "scope\t%s\n", r.Scope)
	fmt.Fprintf(tw, "key\t%s\n", r.ID)
	fmt.Fprintf(tw, "status\t%s\n", r.Status)
	fmt.Fprintf(tw, "attempt\t%d\n", r.Attempt)
	fmt.Fprintf(tw, "created\t%s\n", when(r.CreatedAt, now))
	fmt.Fprintf(tw, "updated\t%s\n", when(r.UpdatedAt, now))
	fmt.Fprintf(tw, "expires\t%s\n", when(r.ExpiresAt, now))
	if r.LockedUntil != nil {
		fmt.Fprintf(tw, "lease until\t%s\n", when(*r.LockedUntil, now))
	}
	if len(r.Fingerprint) > 0 {
		fmt.Fprintf(tw, "fingerprint\t%x\n", r.Fingerprint)
	}
	if r.Status == idem.StatusProcessing {
		// A lease still processing holds its last checkpoint's data, not a
		// response.
		fmt.Fprintf(tw, "recovery point\t%s\n", cmpOr(r.RecoveryPoint, "(none: no checkpoint yet)"))
		writeStored(tw, "checkpoint data", r.Response)
		return tw.Flush()
	}
	if r.RecoveryPoint != "" {
		fmt.Fprintf(tw, "recovery point\t%s\n", r.RecoveryPoint)
	}
	label := "response"
	if r.Status == idem.StatusFailed {
		label = "error" // a Permanent failure's recorded message
	}
	writeStored(tw, label, r.Response)
	return tw.Flush()
}

// cmpOr returns s, or otherwise when s is empty.
func cmpOr(s, otherwise string) string {
	if s == "" {
		return otherwise
	}
	return s
}

// when prints t with how far it is from now.
func when(t, now time.Time) string {
	d := t.Sub(now).Round(time.Second)
	switch {
	case d > 0:
		return fmt.Sprintf("%s (in %s)", t.Format(time.RFC3339), d)
	case d < 0:
		return fmt.Sprintf("%s (%s ago)", t.Format(time.RFC3339), -d)
	default:
		return t.Format(time.RFC3339) + " (now)"
	}
}

func runStuck(ctx context.Context, args []string, out, _ io.Writer, getenv env) error {
	fs := flag.NewFlagSet("stuck", flag.ContinueOnError)
	var c common
	c.register(fs)
	limit := fs.Int("limit", 100, "list at most `N` records")
	pos, err := parse(fs, args, out, "idem stuck [--limit N] [flags]")
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", pos[0])}
	}
	if *limit <= 0 {
		return usageError{"--limit must be positive"}
	}
	db, err := c.connect(ctx, getenv, false)
	if err != nil {
		return err
	}
	defer db.close()
	recs, err := db.stuck(ctx, *limit)
	if err != nil {
		return db.explain(ctx, err)
	}
	if c.json {
		list := make([]recordJSON, 0, len(recs))
		for i := range recs {
			list = append(list, jsonRecord(&recs[i]))
		}
		return printJSON(out, list)
	}
	if len(recs) == 0 {
		fmt.Fprintln(out, "no stuck leases")
		return nil
	}
	now := time.Now()
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SCOPE\tKEY\tATTEMPT\tLEASE ENDED\tRECOVERY POINT\tCHECKPOINT DATA\tCREATED")
	for _, r := range recs {
		data := "-"
		if r.Response != nil {
			data = shorten(summary(r.Response), 40)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s ago\t%s\t%s\t%s\n", r.Scope, r.ID, r.Attempt,
			now.Sub(*r.LockedUntil).Round(time.Second), cmpOr(r.RecoveryPoint, "-"), data, r.CreatedAt.Format(time.RFC3339))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(recs) == 1 {
		fmt.Fprintln(out, "1 stuck lease (the next Claim of its key takes it over)")
	} else {
		fmt.Fprintf(out, "%d stuck leases (the next Claim of each key takes it over)\n", len(recs))
	}
	return nil
}

func runStats(ctx context.Context, args []string, out, _ io.Writer, getenv env) error {
	fs := flag.NewFlagSet("stats", flag.ContinueOnError)
	var c common
	c.register(fs)
	pos, err := parse(fs, args, out, "idem stats [flags]")
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", pos[0])}
	}
	db, err := c.connect(ctx, getenv, false)
	if err != nil {
		return err
	}
	defer db.close()
	st, err := db.stats(ctx)
	if err != nil {
		return db.explain(ctx, err)
	}
	if c.json {
		// Every status, 0 included, so that the fields never vary.
		byStatus := make(map[string]int64, len(statuses))
		for _, s := range statuses {
			byStatus[s] = 0
		}
		for s, n := range st.Statuses {
			byStatus[s] = n
		}
		return printJSON(out, map[string]any{
			"records": total(st), "by_status": byStatus, "expired": st.Expired, "stuck_leases": st.StuckLeases,
			"oldest": st.Oldest, "table_bytes": st.TableBytes, "index_bytes": st.IndexBytes,
		})
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "records\t%d\n", total(st))
	for _, s := range statuses {
		fmt.Fprintf(tw, "  %s\t%d\n", s, st.Statuses[s])
	}
	fmt.Fprintf(tw, "expired (purgeable)\t%d\n", st.Expired)
	fmt.Fprintf(tw, "stuck leases\t%d\n", st.StuckLeases)
	if st.Oldest != nil {
		fmt.Fprintf(tw, "oldest record\t%s\n", when(*st.Oldest, time.Now()))
	} else {
		fmt.Fprintf(tw, "oldest record\t-\n")
	}
	fmt.Fprintf(tw, "table size\t%s\n", bytesText(st.TableBytes))
	fmt.Fprintf(tw, "index size\t%s\n", bytesText(st.IndexBytes))
	return tw.Flush()
}

func runVersion(_ context.Context, args []string, out, _ io.Writer, _ env) error {
	fs := flag.NewFlagSet("version", flag.ContinueOnError)
	asJSON := fs.Bool("json", false, "print JSON")
	pos, err := parse(fs, args, out, "idem version [--json]   (or: idem --version)")
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError{fmt.Sprintf("unexpected argument %q", pos[0])}
	}
	bi, ok := debug.ReadBuildInfo()
	v := readVersion(bi, ok)
	if *asJSON {
		return printJSON(out, v)
	}
	return writeVersion(out, v)
}

// writeVersion writes v as text. A build that recorded neither a version nor
// a commit gets a note saying how to build one that does.
func writeVersion(out io.Writer, v versionInfo) error {
	headline := "idem " + v.Version
	if v.Version == "(devel)" && v.Revision != "" {
		headline += " at commit " + v.Revision
		if v.Modified == "true" {
			headline += ", with uncommitted changes"
		}
	}
	fmt.Fprintln(out, headline)
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "  command\t%s %s\n", v.Path, v.Version)
	fmt.Fprintf(tw, "  library\t%s %s\n", libraryPath, v.Library)
	fmt.Fprintf(tw, "  go\t%s %s\n", v.Go, v.Platform)
	if v.Revision != "" {
		fmt.Fprintf(tw, "  vcs.revision\t%s\n", v.Revision)
	}
	if v.Time != "" {
		fmt.Fprintf(tw, "  vcs.time\t%s\n", v.Time)
	}
	if v.Modified != "" {
		fmt.Fprintf(tw, "  vcs.modified\t%s\n", v.Modified)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if v.Version == "(devel)" && v.Revision == "" {
		_, err := fmt.Fprint(out, unversioned)
		return err
	}
	return nil
}

// unversioned is the note of a build that recorded no version or commit.
const unversioned = `This build recorded no version and no commit. 'go build' and 'go install' in
a git checkout record them ('go install ./cmd/idem' from the repository's
root) unless -buildvcs=false is set (see 'go env GOFLAGS'); 'go run' records
them only with -buildvcs=true. Once a version is tagged,
'go install github.com/idemkit/idem/cmd/idem@<version>' records it.
`

// libraryPath is the idem library's module.
const libraryPath = "github.com/idemkit/idem"

// versionInfo is what 'idem version' prints.
type versionInfo struct {
	Path     string `json:"path"`
	Version  string `json:"version"`
	Library  string `json:"library_version"`
	Go       string `json:"go_version"`
	Platform string `json:"platform"`
	Revision string `json:"vcs_revision,omitempty"`
	Time     string `json:"vcs_time,omitempty"`
	Modified string `json:"vcs_modified,omitempty"`
}

// readVersion reads the versions from the binary's build information;
// what it lacks is "(devel)" (a build from a working tree) or "unknown".
func readVersion(bi *debug.BuildInfo, ok bool) versionInfo {
	v := versionInfo{Path: "github.com/idemkit/idem/cmd/idem", Version: "(devel)", Library: "(devel)",
		Go: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if !ok {
		return v
	}
	if bi.Main.Path != "" {
		v.Path = bi.Main.Path
	}
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	if bi.GoVersion != "" {
		v.Go = bi.GoVersion
	}
	for _, d := range bi.Deps {
		if d.Path != libraryPath {
			continue
		}
		v.Library = cmpOr(d.Version, "(devel)")
		if r := d.Replace; r != nil {
			v.Library += " => " + strings.TrimSpace(r.Path+" "+r.Version)
		}
	}
	if bi.Main.Path == libraryPath { // built inside the library's own module
		v.Library = v.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.time":
			v.Time = s.Value
		case "vcs.modified":
			v.Modified = s.Value
		}
	}
	return v
}

func bytesText(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

// isTerminal reports whether w is a character device (a terminal).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

// progress draws a bar for a purge of about total rows.
type progress struct {
	w       io.Writer
	on      bool
	total   int64
	deleted int64
	start   time.Time
}

func newProgress(w io.Writer, total int64, on bool) *progress {
	return &progress{w: w, on: on, total: total, start: time.Now()}
}

// add counts n more rows deleted and draws the bar.
func (p *progress) add(n int64) {
	p.deleted += n
	p.total = max(p.total, p.deleted) // records that expired since the count
	p.draw()
}

// finish draws the bar of a purge that completed with deleted rows in all,
// so that it ends where the summary does also when fewer rows than counted
// were left to delete (purged meanwhile by another purge, say).
func (p *progress) finish(deleted int64) {
	if p.deleted == deleted && p.total == deleted {
		return
	}
	p.deleted, p.total = deleted, deleted
	p.draw()
}

func (p *progress) draw() {
	if !p.on {
		return
	}
	const width = 30
	frac := 1.0
	if p.total > 0 {
		frac = min(1, float64(p.deleted)/float64(p.total))
	}
	filled := int(frac * width)
	rate := float64(p.deleted) / max(time.Since(p.start).Seconds(), 1e-9)
	fmt.Fprintf(p.w, "\r[%s%s] %3.0f%%  %d/%d rows  %.0f rows/s ", strings.Repeat("#", filled), strings.Repeat("-", width-filled),
		frac*100, p.deleted, p.total, rate)
}

func (p *progress) done() {
	if p.on {
		fmt.Fprintln(p.w)
	}
}
