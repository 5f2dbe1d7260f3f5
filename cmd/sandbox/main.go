// Command sandbox serves toolq's Stripe-like payments and tickets API, with
// fault knobs, for demos, tests and benchmarks. See package
// github.com/toolq/toolq/demo/sandbox for the endpoints.
package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/toolq/toolq/demo/sandbox"
	"github.com/toolq/toolq/internal/cli"
)

func main() { cli.Main("sandbox", run) }

func run(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("sandbox", "sandbox [--listen ADDR] [--state FILE] [fault flags]\n\n"+
		"Fault knobs can also be changed while it runs:\n"+
		"  curl -X POST localhost:8089/v1/_faults -d '{\"drop_after_effect_rate\":0.2}'", stdio)
	listen := fs.String("listen", "127.0.0.1:8089", "address to listen on")
	statePath := fs.String("state", "", "persist effects to this JSON file and reload them at start")
	latency := fs.Duration("latency", 0, "time every write takes")
	errorRate := fs.Float64("error-rate", 0, "probability of a definite failure (402/400), no effect")
	serverErrorRate := fs.Float64("server-error-rate", 0, "probability of a 500, no effect")
	dropRate := fs.Float64("drop-after-effect-rate", 0, "probability of applying the effect, then resetting the connection")
	mcpStdio := fs.Bool("mcp-stdio", false, "serve the tools as an MCP server over stdin and stdout instead of HTTP (a dropped answer ends the process)")
	redirectRate := fs.Float64("redirect-after-effect-rate", 0, "probability of applying the effect, then answering 302 Found (Post/Redirect/Get)")
	if err := cli.BindEnv(fs, getenv, "TOOLQ_SANDBOX_"); err != nil {
		return err
	}
	if err := cli.ParseNone(fs, args); errors.Is(err, cli.ErrHelp) {
		return nil
	} else if err != nil {
		return err
	}
	srv, err := sandbox.New(sandbox.Config{StatePath: *statePath, Faults: sandbox.Faults{
		LatencyMS: int(*latency / time.Millisecond), ErrorRate: *errorRate, ServerErrorRate: *serverErrorRate, DropAfterEffectRate: *dropRate, RedirectAfterEffectRate: *redirectRate}})
	if err != nil {
		return err
	}
	if *mcpStdio {
		return srv.ServeMCPStdio(ctx)
	}
	url, shutdown, err := srv.Listen(*listen)
	if err != nil {
		return fmt.Errorf("%w (choose another address with --listen)", err)
	}
	fmt.Fprintf(stdio.Out, "sandbox API on %s (payments: %d, tickets: %d)\n", url, len(srv.Payments()), len(srv.Tickets()))
	fmt.Fprintf(stdio.Out, "try: curl -s %s/v1/payments -H 'Idempotency-Key: \"k1\"' -d '{\"invoice_id\":\"inv_1\",\"amount_cents\":500,\"currency\":\"EUR\"}'\n", url)
	<-ctx.Done()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	return shutdown(sctx)
}
