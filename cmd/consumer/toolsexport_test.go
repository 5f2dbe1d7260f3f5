package main

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/tools"
)

// TestToolsExportPrintsWhatEachAPITakes: consumer tools export prints, for
// each format, the registry's tools as that API's tool definitions (checked
// against tools/testdata/export); a missing or unknown --format is a usage
// error naming the formats; a tool without a description is printed with a
// warning; a schema for args that are not an object fails naming the tool.
func TestToolsExportPrintsWhatEachAPITakes(t *testing.T) {
	t.Parallel()
	export := func(args ...string) (string, string, error) {
		var out, errOut bytes.Buffer
		err := run(context.Background(), append([]string{"tools", "export"}, args...),
			cli.IO{In: strings.NewReader(""), Out: &out, Err: &errOut}, func(string) string { return "" })
		return out.String(), errOut.String(), err
	}
	for _, f := range tools.Formats {
		out, warnings, err := export("--format", string(f))
		if err != nil || warnings != "" {
			t.Fatalf("%s: %v %s", f, err, warnings)
		}
		path := filepath.Join("..", "..", "tools", "testdata", "export", string(f)+".schema.json")
		c := jsonschema.NewCompiler()
		schema, err := c.Compile(path)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := jsonschema.UnmarshalJSON(strings.NewReader(out))
		if err != nil {
			t.Fatalf("%s: %v\n%s", f, err, out)
		}
		if err := schema.Validate(doc); err != nil {
			t.Errorf("%s: %v\n%s", f, err, out)
		}
		if n := len(doc.([]any)); n != 3 {
			t.Errorf("%s: %d demo tools", f, n)
		}
	}

	for _, args := range [][]string{{}, {"--format", "gemini"}} {
		_, _, err := export(args...)
		var ee *cli.ExitError
		if !errors.As(err, &ee) || ee.Code != cli.ExitUsage || !strings.Contains(err.Error(), "anthropic, openai, openai-responses or mcp") {
			t.Errorf("%v: %v, want a usage error naming the formats", args, err)
		}
	}

	dir := t.TempDir()
	terse := filepath.Join(dir, "terse.yaml")
	os.WriteFile(terse, []byte(`tools:
  - name: terse
    class: read
    schema: {properties: {q: {type: string}}}
    http: {method: GET, url: "http://127.0.0.1:1/q"}
`), 0o600)
	out, warnings, err := export("--format", "anthropic", "--tools", terse)
	if err != nil || !strings.Contains(out, `"input_schema": {`) || !strings.Contains(out, `"type": "object"`) ||
		warnings != "warning: tool terse has no description: the model sees only its name and schema\n" {
		t.Errorf("no description: %q %q %v", out, warnings, err)
	}
	odd := filepath.Join(dir, "odd.yaml")
	os.WriteFile(odd, []byte(`tools:
  - name: odd
    class: read
    schema: {type: string}
    http: {method: GET, url: "http://127.0.0.1:1/q"}
`), 0o600)
	if out, _, err := export("--format", "openai", "--tools", odd); err == nil || out != "" || !strings.Contains(err.Error(), `tool "odd": schema: `) {
		t.Errorf("a string schema: %q %v", out, err)
	}
}
