// Command consumer is toolq's worker and the operator's ledger commands:
// `consumer` (or `consumer run`) processes jobs; `consumer migrate` applies
// the ledger schema; `consumer ledger …` inspects and resolves ledger rows.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/toolq/toolq/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], cli.IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}, os.Getenv)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

const usage = `usage: consumer [command] [flags]

commands:
  migrate          apply the ledger schema
  tools audit      which tools can take effect twice, and why (--tools FILE, --json)
  ledger ls        list ledger rows (--state S, --stale, --json)
  ledger show KEY  show one row
  ledger resolve KEY (--output JSON | --not-run)
                   settle an indeterminate row
  ledger purge --older-than D
                   delete finished rows older than D

Run 'consumer <command> --help' for the flags of a command.`

func run(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	if len(args) == 0 {
		fmt.Fprintln(stdio.Err, usage)
		return fmt.Errorf("no command given")
	}
	switch args[0] {
	case "migrate":
		return runMigrate(ctx, args[1:], stdio, getenv)
	case "ledger":
		return runLedger(ctx, args[1:], stdio, getenv)
	case "tools":
		return runTools(ctx, args[1:], stdio, getenv)
	case "-h", "--help", "help":
		fmt.Fprintln(stdio.Out, usage)
		return nil
	default:
		return fmt.Errorf("unknown command %q (try --help)", args[0])
	}
}
