package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/toolq/toolq/internal/cli"
)

// runHealthcheck asks a URL (a consumer's /readyz by default) and succeeds
// on a 2xx: the image has no shell or curl, so a container healthcheck runs
// this. Any other answer, or none, exits ExitUnavailable with what it got.
func runHealthcheck(ctx context.Context, args []string, stdio cli.IO, getenv func(string) string) error {
	fs := cli.NewFlagSet("healthcheck", "consumer healthcheck [URL] [--timeout D]\n\n"+
		"Exits 0 when URL (default http://127.0.0.1:8081/readyz) answers 2xx, else 3.", stdio)
	timeout := fs.Duration("timeout", 3*time.Second, "how long to wait for the answer")
	pos, help, err := cli.Parse(fs, args)
	switch {
	case help:
		return cli.ErrHelp
	case err != nil:
		return err
	case len(pos) > 1:
		return cli.Usagef("want at most one URL, got %d", len(pos))
	}
	url := "http://127.0.0.1:8081/readyz"
	if len(pos) == 1 {
		url = pos[0]
	}
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return cli.Usagef("%s: %v", url, err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return cli.WithCode(cli.ExitUnavailable, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode/100 != 2 {
		return cli.WithCode(cli.ExitUnavailable, fmt.Errorf("%s: %s %s", url, resp.Status, strings.TrimSpace(string(body))))
	}
	return nil
}
