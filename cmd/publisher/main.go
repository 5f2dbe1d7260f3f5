// Command publisher is the agent- and operator-facing command line of toolq:
// it derives keys, publishes jobs and awaits their results.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/tracing"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	shutdown, err := tracing.Setup(ctx, "toolq-publisher", os.Getenv)
	if err == nil {
		err = run(ctx, os.Args[1:], cli.IO{In: os.Stdin, Out: os.Stdout, Err: os.Stderr}, os.Getenv)
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		shutdown(sctx) // flush the last spans
		cancel()
	}
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "publisher:", err)
		os.Exit(1)
	}
}

const usage = `usage: publisher <command> [flags]

commands:
  key      print the idempotency key of one call, or of each job read from stdin
  publish  publish one job; --wait prints its result
  status   streams, consumers (pending, awaiting ack, redelivered), ledger rows by state
  replay   re-publish history from TOOLQ_JOBS (--subject, --since/--until or --from-seq/--to-seq)
  dlq      dead letters: ls, show SEQ, requeue SEQ…|--all, purge --yes
  simulate the streaming-agent scenario, naive dispatcher against toolq, in-process

Run 'publisher <command> --help' for the flags of a command.`

func run(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	if len(args) == 0 {
		fmt.Fprintln(stdio.Err, usage)
		return fmt.Errorf("no command given")
	}
	switch args[0] {
	case "key":
		return runKey(ctx, args[1:], stdio)
	case "dlq", "replay", "simulate":
		run := map[string]func(context.Context, []string, cli.IO, func(string) string) error{
			"dlq": runDLQ, "replay": runReplay, "simulate": runSimulate}[args[0]]
		if err := run(ctx, args[1:], stdio, getenv); err != nil && !errors.Is(err, cli.ErrHelp) {
			return err
		}
		return nil
	case "status":
		if err := runStatus(ctx, args[1:], stdio, getenv); err != nil && !errors.Is(err, cli.ErrHelp) {
			return err
		}
		return nil
	case "publish":
		if err := runPublish(ctx, args[1:], stdio, getenv); err != nil && !errors.Is(err, cli.ErrHelp) {
			return err
		}
		return nil
	case "-h", "--help", "help":
		fmt.Fprintln(stdio.Out, usage)
		return nil
	default:
		return fmt.Errorf("unknown command %q (try --help)", args[0])
	}
}
