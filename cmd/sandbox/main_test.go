package main

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/testenv"
)

func TestSandboxCommand(t *testing.T) {
	t.Parallel()
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"--listen", addr}, cli.IO{Out: io.Discard, Err: io.Discard}, func(string) string { return "" })
	}()
	var resp *http.Response
	var err error
	testenv.Eventually(t, 10*time.Second, "the sandbox to answer", func() bool {
		resp, err = http.Post("http://"+addr+"/v1/tickets", "application/json", strings.NewReader(`{"title":"t","body":"b"}`))
		return err == nil
	})
	if resp.StatusCode != 200 {
		t.Fatalf("sandbox answered %s", resp.Status)
	}
	resp.Body.Close()
	// A taken port is a one-line error that says how to choose another.
	err = run(context.Background(), []string{"--listen", addr}, cli.IO{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}}, func(string) string { return "" })
	if err == nil || !strings.Contains(err.Error(), "--listen") {
		t.Fatalf("second sandbox on a taken port: %v", err)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := run(context.Background(), []string{"--error-rate", "2"}, cli.IO{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}}, func(string) string { return "" }); err == nil {
		t.Fatal("error rate 2 accepted")
	}
}

// TestComposeCommand: the sandbox's command line in docker-compose.yml is
// one this binary accepts.
func TestComposeCommand(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile("../../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var compose struct {
		Services map[string]struct {
			Command []string `yaml:"command"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(data, &compose); err != nil {
		t.Fatal(err)
	}
	cmd := compose.Services["sandbox"].Command
	if len(cmd) == 0 {
		t.Fatal("no sandbox command")
	}
	if err := run(context.Background(), append(append([]string{}, cmd...), "--help"), cli.IO{Out: io.Discard, Err: io.Discard}, func(string) string { return "" }); err != nil {
		t.Fatalf("sandbox %v: %v", cmd, err)
	}
}
