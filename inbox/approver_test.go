package inbox_test

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/toolq/toolq/inbox"
)

// TestTheApproversFileGivesEachApproverGroupsAndAToken: an approvers file
// (YAML, or JSON) names each approver, their groups and their token as a
// SHA-256, a variable or a file; whatever it gets wrong is refused naming
// the approver, never the token.
func TestTheApproversFileGivesEachApproverGroupsAndAToken(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	carolFile := filepath.Join(dir, "carol")
	os.WriteFile(carolFile, []byte("carol-token-0123456789abcdef\n"), 0o600)
	env := map[string]string{"BOB_TOKEN": "bob-token-0123456789abcdef", "SHORT": "short-token"}
	getenv := func(k string) string { return env[k] }
	hash := sha256.Sum256([]byte("alice-token-0123456789abcdef"))
	good := `
approvers:
  - name: alice
    groups: [finance]
    token_sha256: ` + hex.EncodeToString(hash[:]) + `
  - name: bob
    groups: [finance, ops]
    token_env: BOB_TOKEN
  - name: carol
    groups: [ops]
    token_file: ` + carolFile + "\n"
	approvers, err := inbox.ParseApprovers([]byte(good), getenv)
	if err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct{ name, groups, token string }{
		{"alice", "finance", "alice-token-0123456789abcdef"},
		{"bob", "finance,ops", "bob-token-0123456789abcdef"},
		{"carol", "ops", "carol-token-0123456789abcdef"},
	} {
		a := approvers[i]
		if a.Name != want.name || strings.Join(a.Groups, ",") != want.groups || a.TokenSHA256 != sha256.Sum256([]byte(want.token)) {
			t.Errorf("approver %d: %+v, want %+v", i, a, want)
		}
	}
	json := `{"approvers": [{"name": "dave", "groups": ["finance"], "token_env": "BOB_TOKEN"}]}`
	if a, err := inbox.ParseApprovers([]byte(json), getenv); err != nil || len(a) != 1 || a[0].Name != "dave" {
		t.Fatalf("JSON: %+v %v", a, err)
	}
	for _, c := range []struct{ name, file, want string }{
		{"empty", `approvers: []`, "no approvers"},
		{"no token", `{approvers: [{name: x, groups: [g]}]}`, "exactly one of"},
		{"two tokens", `{approvers: [{name: x, groups: [g], token_env: BOB_TOKEN, token_file: /x}]}`, "exactly one of"},
		{"unset variable", `{approvers: [{name: x, groups: [g], token_env: NOPE}]}`, "NOPE is not set"},
		{"short token", `{approvers: [{name: x, groups: [g], token_env: SHORT}]}`, "at least 20"},
		{"bad hash", `{approvers: [{name: x, groups: [g], token_sha256: abc}]}`, "64 hexadecimal"},
		{"no groups", `{approvers: [{name: x, token_env: BOB_TOKEN}]}`, "at least one approver group"},
		{"bad group", `{approvers: [{name: x, groups: [a.b], token_env: BOB_TOKEN}]}`, `group "a.b"`},
		{"no name", `{approvers: [{groups: [g], token_env: BOB_TOKEN}]}`, "name:"},
		{"unknown field", `{approvers: [{name: x, groups: [g], token: hunter2hunter2hunter2}]}`, "field token not found"},
		{"same name", `{approvers: [{name: x, groups: [g], token_env: BOB_TOKEN}, {name: x, groups: [g], token_file: ` + carolFile + `}]}`, "named twice"},
		{"same token", `{approvers: [{name: x, groups: [g], token_env: BOB_TOKEN}, {name: y, groups: [g], token_env: BOB_TOKEN}]}`, "same token"},
	} {
		_, err := inbox.ParseApprovers([]byte(c.file), getenv)
		switch {
		case err == nil:
			t.Errorf("%s: accepted", c.name)
		case !strings.Contains(err.Error(), c.want):
			t.Errorf("%s: %v, want %q", c.name, err, c.want)
		case strings.Contains(err.Error(), "bob-token") || strings.Contains(err.Error(), "short-token") || strings.Contains(err.Error(), "hunter2"):
			t.Errorf("%s: the error shows a token: %v", c.name, err)
		}
	}
	if _, err := inbox.LoadApprovers(filepath.Join(dir, "missing.yaml"), getenv); err == nil {
		t.Error("a missing file was accepted")
	}
}

func TestLoopbackAddresses(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]bool{
		"127.0.0.1:8080": true, "localhost:1": true, "[::1]:80": true, "127.1.2.3:9": true, "LOCALHOST": true,
		":8080": false, "0.0.0.0:80": false, "10.0.0.1:80": false, "example.com:80": false, "[::]:80": false, "localhost.evil.example:80": false,
	} {
		if inbox.Loopback(addr) != want {
			t.Errorf("Loopback(%q) = %v", addr, !want)
		}
	}
}
