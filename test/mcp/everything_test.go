// Package mcp_test runs toolq's MCP executor and `tools import` against an
// MCP server nobody here wrote: the reference server-everything from npm
// (installed in this folder by `make test-mcp-deps`), over stdio and
// Streamable HTTP.
package mcp_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/toolq/toolq/internal/testenv"
	"github.com/toolq/toolq/tools"
)

// everything is the reference server's entry point, or a loud skip (a
// failure in CI) when node or the npm packages are missing.
func everything(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("node"); err != nil {
		testenv.Missing(t, "node is not installed: the MCP reference server needs it")
	}
	script, err := filepath.Abs("node_modules/@modelcontextprotocol/server-everything/dist/index.js")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(script); err != nil {
		testenv.Missing(t, "test/mcp's npm packages are not installed (make test-mcp-deps): %v", err)
	}
	return script
}

// stdioCommand starts the reference server over stdio, writing its pid to
// the returned file.
func stdioCommand(t *testing.T) (command []string, pidFile string) {
	script := everything(t)
	pidFile = filepath.Join(t.TempDir(), "pid")
	return []string{"sh", "-c", `echo $$ > "$1"; exec node "$2" stdio 2>/dev/null`, "sh", pidFile, script}, pidFile
}

// httpServer starts the reference server over Streamable HTTP and returns
// its endpoint and process.
func httpServer(t *testing.T) (url string, proc *os.Process) {
	t.Helper()
	script := everything(t)
	port, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("node", script, "streamableHttp")
	cmd.Env = append(os.Environ(), "PORT="+strconv.Itoa(port))
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
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
	return fmt.Sprintf("http://127.0.0.1:%d/mcp", port), cmd.Process
}

// registry builds a registry of the reference server's tools named, each
// of class read, reached with m.
func registry(t *testing.T, m tools.MCP, timeout time.Duration, names ...string) *tools.Registry {
	t.Helper()
	var defs []tools.Definition
	for _, name := range names {
		m.Tool = name
		exec, err := tools.MCPExecutor(m)
		if err != nil {
			t.Fatal(err)
		}
		defs = append(defs, tools.Definition{Name: strings.ReplaceAll(name, "-", "_"), Class: tools.UnkeyedWrite, Schema: json.RawMessage(`{"type":"object"}`),
			Executor: exec, Downstream: exec.Downstream(), Timeout: timeout, Breaker: tools.Breaker{Failures: 1000}})
	}
	reg, err := tools.NewRegistry(defs, tools.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })
	return reg
}

func run(t *testing.T, reg *tools.Registry, name, args string) (json.RawMessage, tools.Outcome, *tools.Error) {
	t.Helper()
	tool, ok := reg.Lookup(name)
	if !ok {
		t.Fatalf("no tool %s", name)
	}
	out, err := tool.Run(context.Background(), tools.Request{Tool: name, Key: "key_" + name, Args: json.RawMessage(args), ToolUseID: "toolu_1"})
	outcome, te := tools.Classify(err)
	return out, outcome, te
}

func TestReferenceServerToolsRunOverStdioAndStreamableHTTP(t *testing.T) {
	t.Parallel()
	command, _ := stdioCommand(t)
	url, _ := httpServer(t)
	for transport, m := range map[string]tools.MCP{"stdio": {Command: command}, "streamable HTTP": {URL: url}} {
		t.Run(transport, func(t *testing.T) {
			reg := registry(t, m, 20*time.Second, "echo", "get-structured-content", "get-sum")
			out, outcome, te := run(t, reg, "echo", `{"message":"hi there"}`)
			if outcome != tools.Success || !strings.Contains(string(out), `"text":"Echo: hi there"`) || !strings.Contains(string(out), `"type":"text"`) {
				t.Fatalf("echo: %v %+v %s: want the text content block", outcome, te, out)
			}
			out, outcome, te = run(t, reg, "get_structured_content", `{"location":"Chicago"}`)
			var weather struct {
				Temperature float64 `json:"temperature"`
				Conditions  string  `json:"conditions"`
			}
			if outcome != tools.Success || json.Unmarshal(out, &weather) != nil || weather.Temperature != 36 || weather.Conditions == "" {
				t.Fatalf("get-structured-content: %v %+v %s: want its structured content as the output", outcome, te, out)
			}
			if out, outcome, te = run(t, reg, "get_sum", `{"a":2,"b":40}`); outcome != tools.Success || !strings.Contains(string(out), "42") {
				t.Fatalf("get-sum: %v %+v %s", outcome, te, out)
			}
			// Arguments the server's schema refuses: answered, so definite.
			if _, outcome, te = run(t, reg, "get_sum", `{"a":"two"}`); outcome != tools.Definite {
				t.Fatalf("bad args: %v %+v, want definite", outcome, te)
			}
		})
	}
}

func TestReferenceServerKilledMidCallLeavesTheCallAmbiguous(t *testing.T) {
	t.Parallel()
	const longOp = "trigger-long-running-operation"
	const args = `{"duration":8,"steps":4}`
	t.Run("stdio", func(t *testing.T) {
		t.Parallel()
		command, pidFile := stdioCommand(t)
		reg := registry(t, tools.MCP{Command: command}, 30*time.Second, longOp, "echo")
		killDuring(t, func() int {
			var pid int
			testenv.Eventually(t, 20*time.Second, "the server started", func() bool {
				b, err := os.ReadFile(pidFile)
				pid, _ = strconv.Atoi(strings.TrimSpace(string(b)))
				return err == nil && pid > 0
			})
			return pid
		}, func() (tools.Outcome, *tools.Error) {
			_, outcome, te := run(t, reg, "trigger_long_running_operation", args)
			return outcome, te
		})
		// The next call starts the server again.
		os.Remove(pidFile)
		if _, outcome, te := run(t, reg, "echo", `{"message":"again"}`); outcome != tools.Success {
			t.Fatalf("after the kill: %v %+v", outcome, te)
		}
	})
	t.Run("streamable HTTP", func(t *testing.T) {
		t.Parallel()
		url, proc := httpServer(t)
		reg := registry(t, tools.MCP{URL: url}, 30*time.Second, longOp, "echo")
		killDuring(t, func() int { return proc.Pid }, func() (tools.Outcome, *tools.Error) {
			_, outcome, te := run(t, reg, "trigger_long_running_operation", args)
			return outcome, te
		})
		// Nothing listens now: the next call is refused before it is sent.
		if _, outcome, te := run(t, reg, "echo", `{"message":"again"}`); outcome != tools.NotSent {
			t.Fatalf("with the server gone: %v %+v, want not sent", outcome, te)
		}
	})
}

// killDuring runs call, SIGKILLs the process pid names once the call is
// under way, and wants the call ambiguous.
func killDuring(t *testing.T, pid func() int, call func() (tools.Outcome, *tools.Error)) {
	t.Helper()
	type result struct {
		outcome tools.Outcome
		te      *tools.Error
	}
	done := make(chan result, 1)
	go func() {
		o, te := call()
		done <- result{o, te}
	}()
	p := pid()
	time.Sleep(time.Second) // the call is written; the operation runs for 8 s
	if err := syscall.Kill(p, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case r := <-done:
		if r.outcome != tools.Ambiguous {
			t.Fatalf("a server killed mid-call gave %v %+v, want ambiguous", r.outcome, r.te)
		}
		if r.te.Code == tools.CodeTimeout {
			t.Fatalf("the call ended by its timeout (%+v), not by its server's death", r.te)
		}
	case <-time.After(40 * time.Second): // the tool's timeout is 30 s
		t.Fatal("the call did not end after its server was killed")
	}
}

func TestImportedRegistryOfTheReferenceServerLoadsWithProposedClasses(t *testing.T) {
	t.Parallel()
	command, _ := stdioCommand(t)
	url, _ := httpServer(t)
	for transport, m := range map[string]tools.MCP{"stdio": {Command: command}, "streamable HTTP": {URL: url}} {
		t.Run(transport, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			file, err := tools.ImportMCP(ctx, m, nil)
			if err != nil {
				t.Fatal(err)
			}
			reg, err := tools.Parse(file, "imported.yaml", tools.Config{})
			if err != nil {
				t.Fatalf("the imported file does not load: %v\n%s", err, file)
			}
			defer reg.Close()
			classes := map[string]tools.Class{}
			for _, tool := range reg.Tools() {
				classes[tool.Name] = tool.Class
				if tool.Class == tools.KeyedWrite {
					t.Errorf("%s proposed keyed_write: only the operator can know the server honours the key", tool.Name)
				}
				if tool.Description == "" {
					t.Errorf("%s lost its description", tool.Name)
				}
			}
			// echo says readOnlyHint: true; gzip-file-as-resource does not.
			if classes["echo"] != tools.Read || classes["gzip-file-as-resource"] != tools.UnkeyedWrite {
				t.Fatalf("classes %v: want echo read, gzip-file-as-resource unkeyed_write", classes)
			}
			if !strings.Contains(string(file), "PROPOSAL") || !strings.Contains(string(file), "may not be trusted") {
				t.Fatalf("the file does not say the classes are proposals:\n%s", file)
			}
			// The imported entries call the server.
			echo, _ := reg.Lookup("echo")
			out, err := echo.Run(ctx, tools.Request{Tool: "echo", Args: json.RawMessage(`{"message":"imported"}`)})
			if err != nil || !strings.Contains(string(out), "Echo: imported") {
				t.Fatalf("the imported echo: %v %s", err, out)
			}
		})
	}
}
