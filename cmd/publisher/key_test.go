package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"strings"
	"testing"

	"github.com/gowebpki/jcs"

	"github.com/toolq/toolq/internal/cli"
	"github.com/toolq/toolq/internal/jsontest"
)

func runPublisher(t *testing.T, stdin string, args ...string) (stdout string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = run(context.Background(), args, cli.IO{In: strings.NewReader(stdin), Out: &out, Err: &errOut}, func(string) string { return "" })
	return out.String(), err
}

func TestKeyFromFlags(t *testing.T) {
	t.Parallel()
	out, err := runPublisher(t, "", "key", "--conversation", "conv-42", "--turn", "7", "--tool", "send_payment",
		"--args", `{"invoice_id": "inv_9", "amount_cents": 1500.0, "currency": "EUR"}`)
	if err != nil || out != "f59a97883fdd6f13531d0209b36a3446\n" {
		t.Fatalf("out %q err %v", out, err)
	}
	out, err = runPublisher(t, "", "key", "--conversation", "conv-42", "--turn", "7", "--tool", "send_payment", "--material",
		"--args", `{"amount_cents": 1500, "currency": "EUR", "invoice_id": "inv_9"}`)
	want := `conv-42|7|send_payment|0|{"amount_cents":1500,"currency":"EUR","invoice_id":"inv_9"}` + "\n"
	if err != nil || out != want {
		t.Fatalf("out %q err %v", out, err)
	}
	a, _ := runPublisher(t, "", "key", "--conversation", "c", "--turn", "1", "--tool", "t", "--args", `{"amount":1}`)
	b, _ := runPublisher(t, "", "key", "--conversation", "c", "--turn", "1", "--tool", "t", "--args", `{"amount":1.0}`)
	if a != b || a == "" {
		t.Fatalf("1 and 1.0 give %q and %q", a, b)
	}
}

// TestKeyRejectsFlags: each rejection is one line and a non-zero exit, and
// nothing is printed as a key.
func TestKeyRejectsFlags(t *testing.T) {
	t.Parallel()
	for name, args := range map[string][]string{
		"conversation with |":    {"--conversation", "a|b", "--turn", "1", "--tool", "t", "--args", "{}"},
		"conversation with .":    {"--conversation", "a.b", "--turn", "1", "--tool", "t", "--args", "{}"},
		"negative turn":          {"--conversation", "c", "--turn", "-1", "--tool", "t", "--args", "{}"},
		"turn not a number":      {"--conversation", "c", "--turn", "x", "--tool", "t", "--args", "{}"},
		"tool with a space":      {"--conversation", "c", "--turn", "1", "--tool", "a b", "--args", "{}"},
		"args not an object":     {"--conversation", "c", "--turn", "1", "--tool", "t", "--args", "[1]"},
		"duplicate names":        {"--conversation", "c", "--turn", "1", "--tool", "t", "--args", `{"a":1,"a":1}`},
		"integer beyond 2^53":    {"--conversation", "c", "--turn", "1", "--tool", "t", "--args", `{"a":9007199254740993}`},
		"truncated JSON":         {"--conversation", "c", "--turn", "1", "--tool", "t", "--args", `{"a":`},
		"invalid UTF-8":          {"--conversation", "c", "--turn", "1", "--tool", "t", "--args", "{\"a\":\"\xff\"}"},
		"lone surrogate":         {"--conversation", "c", "--turn", "1", "--tool", "t", "--args", `{"a":"\udead"}`},
		"nesting thousands deep": {"--conversation", "c", "--turn", "1", "--tool", "t", "--args", `{"a":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + "}"},
		"unexpected argument":    {"--conversation", "c", "--turn", "1", "--tool", "t", "--args", "{}", "extra"},
		"empty tenant":           {"--tenant", "", "--conversation", "c", "--turn", "1", "--tool", "t", "--args", "{}"},
		"fields without args":    {"--tenant", "acme", "--conversation", "c"},
	} {
		out, err := runPublisher(t, "", append([]string{"key"}, args...)...)
		if err == nil || out != "" {
			t.Errorf("%s: accepted, out %q", name, out)
			continue
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error is not one line: %q", name, err)
		}
	}
}

func TestKeyFromJSONLines(t *testing.T) {
	t.Parallel()
	in := `{"conversation_id":"c","turn_index":1,"tool":"t","args":{"b":1,"a":2}}
{"conversation_id":"c|x","turn_index":1,"tool":"t","args":{}}
not json
{"conversation_id":"c","turn_index":1,"tool":"t","args":{"a":2,"b":1.0},"tool_use_id":"toolu_9","version":1}`
	out, err := runPublisher(t, in, "key")
	if err == nil {
		t.Fatal("rejected lines did not fail the command")
	}
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(lines) != 4 {
		t.Fatalf("want 4 lines, got %q", out)
	}
	if len(lines[0]) != 32 || lines[3] != lines[0] {
		t.Fatalf("lines 1 and 4 are the same call: %q", lines)
	}
	for _, i := range []int{1, 2} {
		if !strings.HasPrefix(lines[i], "error: ") {
			t.Fatalf("line %d: %q", i+1, lines[i])
		}
	}
	if out, err := runPublisher(t, "{\"conversation_id\":\"c\",\"turn_index\":1,\"tool\":\"t\",\"args\":{}}\n", "key"); err != nil || len(out) != 33 {
		t.Fatalf("clean input: %q %v", out, err)
	}
}

// TestKeyAgreesWithIndependentJCS derives keys for random documents through
// the command and compares each with sha256 over the material built from an
// independent RFC 8785 implementation.
func TestKeyAgreesWithIndependentJCS(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(42, 7))
	var in strings.Builder
	var want []string
	for i := range 1000 {
		// Raw line breaks in a document are whitespace only: JSON Lines needs one line.
		args := strings.NewReplacer("\n", " ", "\r", " ").Replace(jsontest.RandomObject(rng))
		canon, err := jcs.Transform([]byte(args))
		if err != nil {
			t.Fatal(err)
		}
		conv := fmt.Sprintf("conv:%d-x_%d", i, rng.IntN(1e6))
		sum := sha256.Sum256(fmt.Appendf(nil, "%s|%d|%s|%d|%s", conv, i, "send_payment", i%3, canon))
		want = append(want, hex.EncodeToString(sum[:])[:32])
		fmt.Fprintf(&in, `{"conversation_id":%q,"turn_index":%d,"tool":"send_payment","ordinal":%d,"args":%s}`+"\n", conv, i, i%3, args)
	}
	out, err := runPublisher(t, in.String(), "key")
	if err != nil {
		t.Fatal(err)
	}
	got := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	if len(got) != len(want) {
		t.Fatalf("%d lines for %d inputs", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("line %d: %s, want %s", i+1, got[i], want[i])
		}
	}
}

// TestKeyAgreesWithPythonFormula runs the committed Python-derived vectors
// through the command.
func TestKeyAgreesWithPythonFormula(t *testing.T) {
	t.Parallel()
	f, err := os.Open("../../jobs/testdata/python_keys.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var in strings.Builder
	var want []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var v struct {
			ConversationID string `json:"conversation_id"`
			TurnIndex      int    `json:"turn_index"`
			Tool           string `json:"tool"`
			Ordinal        int    `json:"ordinal"`
			ArgsWire       string `json:"args_wire"`
			Key            string `json:"key"`
		}
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(&in, `{"conversation_id":%q,"turn_index":%d,"tool":%q,"ordinal":%d,"args":%s}`+"\n",
			v.ConversationID, v.TurnIndex, v.Tool, v.Ordinal, strings.ReplaceAll(v.ArgsWire, "\n", " "))
		want = append(want, v.Key)
	}
	out, err := runPublisher(t, in.String(), "key")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if got := strings.Split(strings.TrimSuffix(out, "\n"), "\n"); strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("keys differ from the Python formula:\n%q\n%q", got[:3], want[:3])
	}
}
