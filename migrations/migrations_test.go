package migrations_test

import (
	"io/fs"
	"regexp"
	"strings"
	"testing"

	"github.com/golang-migrate/migrate/v4/source"
	"github.com/stretchr/testify/require"

	"github.com/idemkit/idem/migrations"
)

// golang-migrate's iofs source silently skips files that do not match its
// pattern; every embedded file must match, and every version must have both
// directions.
func TestEmbeddedFileNamesMatchGolangMigrate(t *testing.T) {
	entries, err := fs.ReadDir(migrations.FS, ".")
	require.NoError(t, err)
	require.NotEmpty(t, entries)
	strict := regexp.MustCompile(`^[0-9]{6}_[a-z0-9_]+\.(up|down)\.sql$`)
	directions := map[uint]map[source.Direction]bool{}
	for _, e := range entries {
		m, err := source.Parse(e.Name())
		require.NoError(t, err, "golang-migrate would skip %s", e.Name())
		require.Regexp(t, strict, e.Name())
		if directions[m.Version] == nil {
			directions[m.Version] = map[source.Direction]bool{}
		}
		directions[m.Version][m.Direction] = true
	}
	for v, d := range directions {
		require.True(t, d[source.Up] && d[source.Down], "version %d needs an up and a down file", v)
	}
}

func TestFilesRenameTheTable(t *testing.T) {
	fsys := migrations.Files("app", "keys")
	up, err := fs.ReadFile(fsys, "000001_create_idempotent_record.up.sql")
	require.NoError(t, err)
	require.Contains(t, string(up), `CREATE TABLE "app"."keys"`)
	require.Contains(t, string(up), `CREATE INDEX "keys_expires_at_idx" ON "app"."keys"`)
	require.False(t, strings.Contains(string(up), "idempotent_record"))
	down, err := fs.ReadFile(fsys, "000001_create_idempotent_record.down.sql")
	require.NoError(t, err)
	require.Contains(t, string(down), `DROP TABLE IF EXISTS "app"."keys"`)

	inbox, err := fs.ReadFile(fsys, "000002_create_idem_inbox.up.sql")
	require.NoError(t, err)
	require.Contains(t, string(inbox), `CREATE TABLE IF NOT EXISTS "app"."idem_inbox"`)
	require.Contains(t, string(inbox), `CREATE INDEX IF NOT EXISTS "idem_inbox_consumed_at_idx" ON "app"."idem_inbox"`)

	require.Equal(t, migrations.FS, migrations.Files("", "idempotent_record"), "the default names use the raw files")
}
