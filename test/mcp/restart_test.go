package mcp_test

// The mcp executor across a restart of the npm reference server.

import (
	"bufio"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/tools"
)

// startEverythingOn starts the reference server over Streamable HTTP on
// port, and returns a func that kills it.
func startEverythingOn(t *testing.T, port int) (stop func()) {
	t.Helper()
	cmd := exec.Command("node", everything(t), "streamableHttp")
	cmd.Env = append(os.Environ(), "PORT="+strconv.Itoa(port))
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	stop = func() { cmd.Process.Kill(); cmd.Wait() }
	t.Cleanup(stop)
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if strings.Contains(sc.Text(), "listening on port") {
				close(ready)
				break
			}
		}
		for sc.Scan() {
		}
	}()
	select {
	case <-ready:
	case <-time.After(30 * time.Second):
		t.Fatal("the reference server did not start listening in 30 s")
	}
	return stop
}

// A session the restarted server no longer knows costs nothing: the
// reference server answers its POST 400 (a JSON-RPC error without an id,
// which the SDK cannot read as an answer) before doing anything, and the
// call is sent once more on a new session, not left ambiguous.
func TestReferenceServerRestartCostsNothing(t *testing.T) {
	t.Parallel()
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	stop := startEverythingOn(t, port)
	url := "http://127.0.0.1:" + strconv.Itoa(port) + "/mcp"
	reg := registry(t, tools.MCP{URL: url}, 20*time.Second, "echo")
	if _, outcome, te := run(t, reg, "echo", `{"message":"before"}`); outcome != tools.Success {
		t.Fatalf("before the restart: %v %+v", outcome, te)
	}
	stop()
	startEverythingOn(t, port)
	if out, outcome, te := run(t, reg, "echo", `{"message":"after"}`); outcome != tools.Success {
		t.Fatalf("after the restart: %v %+v %s: want the call sent once, on a new session", outcome, te, out)
	}
}
