// Package cli holds the one convention of toolq's commands: Main as the
// whole of a binary's main, a Commands table that dispatches subcommands,
// flag sets that fail in one line and print their usage (on standard output)
// only on --help, flags interspersed with arguments, PrintJSON for every
// --json and NewTable for every table, environment defaults and day-aware
// durations.
package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

// IO is a command's standard streams.
type IO struct {
	In       io.Reader
	Out, Err io.Writer
}

// NewFlagSet returns a flag set whose usage ("usage: " and the synopsis,
// then the flags) goes to stdio.Out on --help, as a Commands list does, and
// whose errors come back from Parse as one line instead of being printed.
func NewFlagSet(name, synopsis string, stdio IO) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(stdio.Out, "usage: %s\n", synopsis)
		var b strings.Builder
		fs.SetOutput(&b)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
		if b.Len() > 0 {
			fmt.Fprintf(stdio.Out, "\nflags:\n%s", b.String())
		}
	}
	return fs
}

// Parse parses args, allowing flags after positional arguments, and returns
// the positional ones. help is true when --help was given and the usage has
// been printed: the command should then end successfully.
func Parse(fs *flag.FlagSet, args []string) (positional []string, help bool, err error) {
	usage := fs.Usage
	fs.Usage = func() {}
	defer func() { fs.Usage = usage }()
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				usage()
				return nil, true, nil
			}
			return nil, false, WithCode(ExitUsage, err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, false, nil
		}
		if args[0] == "--" {
			return append(positional, args[1:]...), false, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}

// EnvName is the environment variable of a flag: the ecosystem's own for
// the NATS connection (NATS_URL, NATS_CREDS, …) and the ledger
// (DATABASE_URL); else prefix and the flag's name in upper case, '-' as
// '_' (TOOLQ_ and --max-deliver: TOOLQ_MAX_DELIVER).
func EnvName(prefix, flagName string) string {
	name := strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
	if ecosystemEnv[name] {
		return name
	}
	return prefix + name
}

// ecosystemEnv are the variables NATS's and Postgres's own tools read.
var ecosystemEnv = map[string]bool{"NATS_URL": true, "NATS_CREDS": true, "NATS_NKEY": true, "NATS_USER": true, "NATS_PASSWORD": true,
	"NATS_TOKEN": true, "NATS_CA": true, "NATS_CERT": true, "NATS_KEY": true, "DATABASE_URL": true}

// BindEnv gives every flag of fs its environment variable (EnvName): a
// variable that is set and not empty becomes the flag's value, which the
// command line still overrides, and the flag's help names it. Call it
// after defining the flags and before parsing. A value the flag refuses
// is a usage error that names the variable.
func BindEnv(fs *flag.FlagSet, getenv func(string) string, prefix string) error {
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		name := EnvName(prefix, f.Name)
		if tag := "(env " + name + ")"; !strings.Contains(f.Usage, tag) {
			f.Usage += " " + tag
		}
		v := getenv(name)
		if v == "" || err != nil {
			return
		}
		if serr := f.Value.Set(v); serr != nil {
			err = Usagef("%s=%q: %v", name, v, serr)
		}
	})
	return err
}

// Env returns the value of the environment variable name, or def when it is
// unset or empty.
func Env(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// ParseDuration is time.ParseDuration that also takes whole days ("30d",
// "7d12h"). A duration beyond time.Duration's range (about 292 years) is an
// error, not one that wrapped around.
func ParseDuration(s string) (time.Duration, error) {
	days, rest, found := strings.Cut(s, "d")
	if !found {
		return time.ParseDuration(s)
	}
	n, err := strconv.Atoi(days)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("invalid duration %q (use e.g. 90m, 36h or 30d)", s)
	}
	const day = 24 * time.Hour
	if n > int(math.MaxInt64/day) {
		return 0, fmt.Errorf("invalid duration %q: more than %d days", s, math.MaxInt64/day)
	}
	d := time.Duration(n) * day
	if rest != "" {
		r, err := time.ParseDuration(rest)
		if err != nil {
			return 0, fmt.Errorf("invalid duration %q (use e.g. 90m, 36h or 30d)", s)
		}
		if r > math.MaxInt64-d {
			return 0, fmt.Errorf("invalid duration %q: more than %d days", s, math.MaxInt64/day)
		}
		d += r
	}
	return d, nil
}

// ErrHelp is returned by ParseNone and ParseN when --help printed the
// usage: the command should end successfully (Commands and Main take it as
// success).
var ErrHelp = errors.New("help requested")

// ParseNone parses args and refuses positional arguments.
func ParseNone(fs *flag.FlagSet, args []string) error {
	_, err := ParseN(fs, args, 0, "")
	return err
}

// ParseN parses args and requires exactly n positional arguments, named
// what in the error.
func ParseN(fs *flag.FlagSet, args []string, n int, what string) ([]string, error) {
	pos, help, err := Parse(fs, args)
	switch {
	case help:
		return nil, ErrHelp
	case err != nil:
		return nil, err
	case n == 0 && len(pos) > 0:
		return nil, WithCode(ExitUsage, fmt.Errorf("unexpected argument %q", pos[0]))
	case len(pos) != n:
		return nil, WithCode(ExitUsage, fmt.Errorf("want exactly %d %s, got %d arguments", n, what, len(pos)))
	}
	return pos, nil
}

// RefuseEmpty is a usage error when the flag name was given with an empty
// value ("--tenant $TENANT" with the variable unset), which would otherwise
// mean the same as leaving it out; hint says what leaving it out does.
func RefuseEmpty(fs *flag.FlagSet, name, hint string) error {
	empty := false
	fs.Visit(func(f *flag.Flag) { empty = empty || f.Name == name && f.Value.String() == "" })
	if empty {
		return Usagef("--%s is empty: leave it out %s", name, hint)
	}
	return nil
}
