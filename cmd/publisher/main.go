// Command publisher is the agent- and operator-facing command line of toolq:
// it derives keys, publishes jobs and awaits their results.
package main

import (
	"context"

	"github.com/toolq/toolq/internal/cli"
)

func main() { cli.Main("publisher", cli.Traced("toolq-publisher", run)) }

var commands = &cli.Commands{Name: "publisher", List: []cli.Command{
	{Name: "key", Summary: "print the idempotency key of one call, or of each job read from stdin", Run: runKey},
	{Name: "publish", Summary: "publish one job; --wait prints its result", Run: runPublish},
	{Name: "status", Summary: "streams, consumers (pending, awaiting ack, redelivered), ledger rows by state", Run: runStatus},
	{Name: "replay", Summary: "re-publish history from TOOLQ_JOBS (--subject, --since/--until or --from-seq/--to-seq)", Run: runReplay},
	{Name: "dlq", Summary: "dead letters: ls, show SEQ, requeue SEQ…|--all, purge --yes", Run: dlqCommands.Run},
	{Name: "simulate", Summary: "the streaming-agent scenario, naive dispatcher against toolq, in-process", Run: runSimulate},
	{Name: "bench", Summary: "throughput and latency of toolq next to a dispatcher with no memory (--quick, --json)", Run: runBench},
	cli.Version("publisher"),
}}

var dlqCommands = &cli.Commands{Name: "publisher dlq", List: []cli.Command{
	{Name: "ls", Summary: "list the dead letters (--reason R, --json)", Run: runDLQ("ls")},
	{Name: "show", Summary: "one dead letter with its body, headers and history (SEQ, --json)", Run: runDLQ("show")},
	{Name: "requeue", Summary: "publish dead letters again and remove them (SEQ… | --all)", Run: runDLQ("requeue")},
	{Name: "purge", Summary: "delete dead letters for good (--reason R, --yes)", Run: runDLQ("purge")},
}}

func run(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	if len(args) == 3 && args[0] == natsServerCommand { // the bench's server process
		return runNATSServer(args[1], args[2])
	}
	if len(args) > 0 && args[0] == naiveCommand { // the bench's naive dispatcher process
		return runNaive(ctx, args[1:], stdio, getenv)
	}
	return commands.Run(ctx, args, stdio, getenv)
}
