// Command consumer is toolq's worker and the operator's ledger commands:
// `consumer` (or `consumer run`) processes jobs; `consumer migrate` applies
// the ledger schema; `consumer ledger …` inspects and resolves ledger rows.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/tracing"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	shutdown, err := tracing.Setup(ctx, "toolq-consumer", os.Getenv)
	if err == nil {
		err = run(ctx, os.Args[1:], cli.IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}, os.Getenv)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		shutdown(sctx) // flush the last spans
		cancel()
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "consumer:", err)
		os.Exit(1)
	}
}

const usage = `usage: consumer [command] [flags]

commands:
  run              (the default) process jobs; 'consumer run --help' lists its flags
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
	if len(args) == 0 || strings.HasPrefix(args[0], "-") && args[0] != "-h" && args[0] != "--help" {
		return runWorker(ctx, args, stdio, getenv)
	}
	switch args[0] {
	case "run":
		return runWorker(ctx, args[1:], stdio, getenv)
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
