package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"regexp"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// parse parses a command's flags; asked-for help (-h, --help) goes to out
// and returns flag.ErrHelp. Positional arguments are returned; flags may
// come before or after them, and a negative number that is not a flag's
// value is positional (the version of 'migrate force -1'). A flag is
// written with one dash or two, its value after '=' or as the next
// argument (a boolean's only after '='). A mistake is a usageError that
// names the flag with two dashes, as the help writes it.
func parse(fs *flag.FlagSet, args []string, out io.Writer, synopsis string) ([]string, error) {
	var positional []string
	for len(args) > 0 {
		a := args[0]
		args = args[1:]
		if a == "--" {
			return append(positional, args...), nil
		}
		if !strings.HasPrefix(a, "-") || a == "-" || negativeNumber.MatchString(a) {
			positional = append(positional, a)
			continue
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(a[1:], "-"), "=")
		f := fs.Lookup(name)
		switch {
		case f == nil && (name == "h" || name == "help"):
			fmt.Fprintf(out, "Usage:\n  %s\n\nFlags:\n", synopsis)
			printFlags(out, fs)
			return nil, flag.ErrHelp
		case f == nil:
			return nil, usageError{"unknown flag --" + name}
		case !hasValue && isBoolFlag(f):
			value = "true"
		case !hasValue && len(args) == 0:
			return nil, usageError{fmt.Sprintf("--%s needs a value", name)}
		case !hasValue:
			value, args = args[0], args[1:]
		}
		if err := fs.Set(name, value); err != nil {
			return nil, usageError{fmt.Sprintf("invalid value %q for --%s: %s", value, name, wanted(f, err))}
		}
	}
	return positional, nil
}

var negativeNumber = regexp.MustCompile(`^-[0-9]+$`)

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// wanted says what f takes, for the error err of a value it refused. The
// flag package's own values say only "parse error".
func wanted(f *flag.Flag, err error) string {
	g, ok := f.Value.(flag.Getter)
	if !ok {
		return err.Error()
	}
	switch g.Get().(type) {
	case bool:
		return "want true or false"
	case int:
		return "want a whole number"
	default:
		return err.Error()
	}
}

// printFlags lists fs's flags like flag.PrintDefaults, but with two dashes,
// as the rest of the help writes them (one dash is accepted too).
func printFlags(w io.Writer, fs *flag.FlagSet) {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fs.VisitAll(func(f *flag.Flag) {
		arg, usage := flag.UnquoteUsage(f)
		if arg != "" {
			arg = " " + arg
		}
		if !isBoolFlag(f) && f.DefValue != "" && f.DefValue != "0" && f.DefValue != "0s" {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		fmt.Fprintf(tw, "  --%s%s\t%s\n", f.Name, arg, usage)
	})
	tw.Flush()
}

// duration is a flag.Value for a duration as time.ParseDuration reads it
// ("36h", "90m") or in days ("7d", "1.5d", "1d12h"): a retention is
// counted in days.
type duration time.Duration

// errDuration says which durations a duration flag takes.
var errDuration = errors.New("want a duration such as 7d, 36h or 90m (units: d, h, m, s, ms; a day is 24 hours)")

func (d *duration) Set(s string) error {
	v, err := parseDuration(s)
	if err != nil {
		return errDuration
	}
	*d = duration(v)
	return nil
}

func (d *duration) String() string { return time.Duration(*d).String() }

func (d *duration) Get() any { return time.Duration(*d) }

var days = regexp.MustCompile(`^([-+]?)([0-9]+(?:\.[0-9]*)?)d([0-9.].*)?$`)

// parseDuration is time.ParseDuration that also takes days, first: "7d",
// "1d12h".
func parseDuration(s string) (time.Duration, error) {
	m := days.FindStringSubmatch(s)
	if m == nil {
		return time.ParseDuration(s)
	}
	n, err := strconv.ParseFloat(m[2], 64)
	if err != nil || n*24 > math.MaxInt64/float64(time.Hour) {
		return 0, fmt.Errorf("invalid duration %q", s)
	}
	d := time.Duration(n * 24 * float64(time.Hour))
	if m[3] != "" {
		rest, err := time.ParseDuration(m[3])
		if err != nil || d > math.MaxInt64-rest {
			return 0, fmt.Errorf("invalid duration %q", s)
		}
		d += rest
	}
	if m[1] == "-" {
		d = -d
	}
	return d, nil
}
