package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/toolq/toolq/embedded"
	"github.com/toolq/toolq/internal/version"
	"github.com/toolq/toolq/ledger"
	"github.com/toolq/toolq/tracing"
)

// Func is a command: a binary's run and each of its subcommands. It returns
// nil after --help, and an error of one line otherwise.
type Func func(ctx context.Context, args []string, stdio IO, getenv func(string) string) error

// Main is the whole of a binary's main: it runs run with the process's
// arguments, streams and environment until SIGINT or SIGTERM cancels ctx,
// then prints an error as one line "<name>: <error>" on standard error and
// exits with its code (see Exit). It exits 0 when run returns nil or
// ErrHelp.
func Main(name string, run Func) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}, os.Getenv)
	stop()
	os.Exit(Exit(os.Stderr, name, err))
}

// The exit codes of toolq's commands, for scripts to branch on.
const (
	ExitOK            = 0
	ExitFailure       = 1 // any other failure (a tool's own error result included)
	ExitUsage         = 2 // a flag, argument or command the command does not take
	ExitUnavailable   = 3 // NATS or the ledger could not be reached
	ExitRejected      = 4 // the call was rejected (an unknown tool, invalid args, a key mismatch): nothing ran
	ExitIndeterminate = 5 // the call's outcome is indeterminate: an operator must resolve it
)

// ExitError is an error with the exit code Main exits with.
type ExitError struct {
	Code int
	Err  error
}

func (e *ExitError) Error() string { return e.Err.Error() }
func (e *ExitError) Unwrap() error { return e.Err }

// WithCode gives err the exit code code (nil stays nil).
func WithCode(code int, err error) error {
	if err == nil {
		return nil
	}
	return &ExitError{Code: code, Err: err}
}

// Usagef is a usage error (ExitUsage): a flag or argument the command
// cannot take, said as fmt.Errorf would.
func Usagef(format string, args ...any) error {
	return WithCode(ExitUsage, fmt.Errorf(format, args...))
}

// Exit reports err on w as Main does and returns the exit code: 0 for nil
// and ErrHelp; an ExitError's code; ExitUnavailable for an error of NATS
// or the ledger that says it could not be reached; else ExitFailure.
func Exit(w io.Writer, name string, err error) int {
	if err == nil || errors.Is(err, ErrHelp) {
		return ExitOK
	}
	fmt.Fprintf(w, "%s: %v\n", name, err)
	var ee *ExitError
	switch {
	case errors.As(err, &ee):
		return ee.Code
	case unavailable(err):
		return ExitUnavailable
	}
	return ExitFailure
}

// unavailable reports an error that says NATS or the ledger could not be
// reached.
func unavailable(err error) bool {
	return errors.Is(err, ledger.ErrUnavailable) || errors.Is(err, embedded.ErrUnavailable) || errors.Is(err, nats.ErrNoServers) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrConnectionClosed) || errors.Is(err, jetstream.ErrNoHeartbeat) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, context.DeadlineExceeded) // a dependency that did not answer in time
}

// FlushTimeout bounds how long a command waits, on its way out, for its
// last spans and metrics to be exported.
const FlushTimeout = 5 * time.Second

// Traced runs run with tracing set up from the process's OTEL_* environment
// for service (see tracing.Setup), and flushes the last spans after it
// returns, waiting at most FlushTimeout.
func Traced(service string, run Func) Func {
	return func(ctx context.Context, args []string, stdio IO, getenv func(string) string) error {
		shutdown, err := tracing.Setup(ctx, service)
		if err != nil {
			return err
		}
		err = run(ctx, args, stdio, getenv)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), FlushTimeout)
		defer cancel()
		shutdown(sctx)
		return err
	}
}

// Command is one entry of a Commands table.
type Command struct {
	Name    string
	Summary string // one line for the list that help prints
	Run     Func
}

// Commands runs the command its first argument names. "help", "-h" and
// "--help" print the list of commands on stdio.Out; a missing or unknown
// command is a one-line error that names the known ones. ErrHelp from a
// command (its --help) is success.
type Commands struct {
	// Name is what comes before the command on the command line:
	// "publisher", or "consumer ledger" for a group of subcommands.
	Name string
	// Default is the command run when there is no argument or the first is
	// a flag; empty: a command must be given.
	Default string
	List    []Command
}

// Run dispatches args. It is a Func, so that a group of subcommands can be
// an entry of another table.
func (c *Commands) Run(ctx context.Context, args []string, stdio IO, getenv func(string) string) error {
	name := ""
	if len(args) > 0 {
		name = args[0]
	}
	switch {
	case name == "help" || name == "-h" || name == "--help":
		c.printHelp(stdio.Out)
		return nil
	case name == "--version" || name == "-version":
		name, args = "version", args[1:]
	case c.Default != "" && (name == "" || strings.HasPrefix(name, "-")):
		name = c.Default
	case name == "":
		return WithCode(ExitUsage, fmt.Errorf("%swant a command: %s", c.prefix(), c.names()))
	default:
		args = args[1:]
	}
	for _, cmd := range c.List {
		if cmd.Name == name {
			if err := cmd.Run(ctx, args, stdio, getenv); err != nil && !errors.Is(err, ErrHelp) {
				return err
			}
			return nil
		}
	}
	return WithCode(ExitUsage, fmt.Errorf("%sunknown command %q (want %s)", c.prefix(), name, c.names()))
}

// prefix names a group in its errors ("ledger: "); a binary's own errors
// are prefixed by Main.
func (c *Commands) prefix() string {
	if _, group, ok := strings.Cut(c.Name, " "); ok {
		return group + ": "
	}
	return ""
}

func (c *Commands) names() string {
	var names []string
	for _, cmd := range c.List {
		names = append(names, cmd.Name)
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
}

func (c *Commands) printHelp(w io.Writer) {
	command := "<command>"
	if c.Default != "" {
		command = "[command]"
	}
	fmt.Fprintf(w, "usage: %s %s [flags]\n\ncommands:\n", c.Name, command)
	t := NewTable(w)
	for _, cmd := range c.List {
		summary := cmd.Summary
		if cmd.Name == c.Default {
			summary = "(the default) " + summary
		}
		fmt.Fprintf(t, "  %s\t%s\n", cmd.Name, summary)
	}
	t.Flush()
	fmt.Fprintf(w, "\nRun '%s <command> --help' for the flags of a command.\n", c.Name)
}

// Version is the version command of binary: it prints the binary's name and
// its build (version.Info) in one line, or as JSON with --json. A binary's
// --version runs it too (see Commands.Run).
func Version(binary string) Command {
	return Command{Name: "version", Summary: "print the version, commit and build date (--json)", Run: func(_ context.Context, args []string, stdio IO, _ func(string) string) error {
		fs := NewFlagSet("version", binary+" version [--json]", stdio)
		asJSON := fs.Bool("json", false, "print the build as JSON")
		if err := ParseNone(fs, args); err != nil {
			return err
		}
		if *asJSON {
			return PrintJSON(stdio.Out, version.Get())
		}
		_, err := fmt.Fprintf(stdio.Out, "%s %s\n", binary, version.Get())
		return err
	}}
}
