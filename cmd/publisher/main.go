// Command publisher is the agent- and operator-facing command line of toolq:
// it derives keys, and (as the project grows) publishes jobs, awaits results,
// replays history and works the dead letters.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], stdio{in: os.Stdin, out: os.Stdout, err: os.Stderr}, os.Getenv)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "publisher:", err)
		os.Exit(1)
	}
}

type stdio struct {
	in       io.Reader
	out, err io.Writer
}

const usage = `usage: publisher <command> [flags]

commands:
  key      print the idempotency key of one call, or of each job read from stdin

Run 'publisher <command> --help' for the flags of a command.`

func run(ctx context.Context, args []string, stdio stdio, getenv func(string) string) error {
	if len(args) == 0 {
		fmt.Fprintln(stdio.err, usage)
		return errors.New("no command given")
	}
	switch args[0] {
	case "key":
		return runKey(ctx, args[1:], stdio)
	case "-h", "--help", "help":
		fmt.Fprintln(stdio.out, usage)
		return nil
	default:
		return fmt.Errorf("unknown command %q (try --help)", args[0])
	}
}

// newFlagSet returns a flag set that reports errors in one line and prints
// its usage only when asked with --help.
func newFlagSet(name, synopsis string, stdio stdio) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {
		fmt.Fprintf(stdio.err, "usage: publisher %s\n\n", synopsis)
		fs.SetOutput(stdio.err)
		fs.PrintDefaults()
		fs.SetOutput(io.Discard)
	}
	return fs
}

// parseFlags parses args; --help prints the usage and ends the command
// successfully, any other error comes back as one line.
func parseFlags(fs *flag.FlagSet, args []string) (help bool, err error) {
	usage := fs.Usage
	fs.Usage = func() {}
	err = fs.Parse(args)
	fs.Usage = usage
	if errors.Is(err, flag.ErrHelp) {
		usage()
		return true, nil
	}
	if err == nil && fs.NArg() > 0 {
		err = fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return false, err
}
