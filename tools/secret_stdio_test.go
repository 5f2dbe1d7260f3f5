package tools_test

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/toolq/toolq/tools"
)

// A stdio server's standard error is copied to the consumer's, where the
// consumer's logs go, line by line: what the server writes there, as a
// server that cannot log in often does, is shown with the token that came
// from the registry's ${…} redacted.
//
// Not parallel: it swaps os.Stderr.
func TestSecretAStdioServerWritesToItsStderrIsRedactedInTheConsumersLogs(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	saved := os.Stderr
	os.Stderr = w
	defer func() { os.Stderr = saved }()
	reg, err := tools.Parse([]byte(`tools:
  - name: search
    class: read
    timeout: 2s
    schema: {type: object}
    mcp:
      command: [sh, -c, 'echo "login failed with token $MCP_TOKEN" >&2; exit 1']
      env: {MCP_TOKEN: "${MCP_TOKEN}"}
`), "secrets.yaml", tools.Config{Getenv: func(k string) string {
		return map[string]string{"MCP_TOKEN": "stdio-5ecret-token"}[k]
	}})
	if err != nil {
		t.Fatal(err)
	}
	tool, _ := reg.Lookup("search")
	_, runErr := tool.Run(context.Background(), tools.Request{Tool: "search", Args: json.RawMessage(`{}`)})
	reg.Close()
	os.Stderr = saved
	w.Close()
	logged, _ := io.ReadAll(r)
	if runErr == nil {
		t.Fatal("a server that exits answered")
	}
	if strings.Contains(string(logged), "stdio-5ecret-token") {
		t.Errorf("the consumer's stderr has %q", strings.TrimSpace(string(logged)))
	}
	if !strings.Contains(string(logged), "login failed with token "+tools.Redacted+"\n") {
		t.Errorf("the consumer's stderr has %q, not the server's line, redacted", logged)
	}
}
