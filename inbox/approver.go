package inbox

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"unicode"

	"go.yaml.in/yaml/v3"

	"github.com/toolq/toolq/ledger"
)

// Approver is a person the inbox decides as: a decision is taken in their
// Name, and only on calls of their Groups.
type Approver struct {
	Name   string
	Groups []string
	// TokenSHA256 is the SHA-256 of the token they log in with; the zero
	// value for the operator of a token-less inbox (Config.Operator).
	TokenSHA256 [sha256.Size]byte
}

// Decides reports whether a may decide calls of group.
func (a *Approver) Decides(group string) bool { return slices.Contains(a.Groups, group) }

// minTokenLength is the shortest token read from the environment or a
// file: a token is a secret to be guessed, not a password to be typed.
const minTokenLength = 20

// approversFile is the approvers file (--approvals-tokens).
type approversFile struct {
	Approvers []approverEntry `yaml:"approvers"`
}

// approverEntry is one approver of the file, whose token is given in
// exactly one way.
type approverEntry struct {
	Name        string   `yaml:"name"`
	Groups      []string `yaml:"groups"`
	TokenSHA256 string   `yaml:"token_sha256"`
	TokenEnv    string   `yaml:"token_env"`
	TokenFile   string   `yaml:"token_file"`
}

// LoadApprovers reads the approvers file at path: YAML (or JSON, which is
// YAML), an entry per approver with a name, its groups and its token,
// given as exactly one of token_sha256 (the hex SHA-256 of the token),
// token_env (a variable holding it, read with getenv) or token_file (a
// file holding it; a final newline is not part of it):
//
//	approvers:
//	  - name: alice
//	    groups: [finance]
//	    token_sha256: 3ba617f3ac3861a53c3a558c7eb6b2c939b427544a519666e6dbf7c9e0532773
//	  - name: bob
//	    groups: [finance, ops]
//	    token_env: TOOLQ_TOKEN_BOB
//
// (alice's is the hash of a token made with openssl rand -hex 32, given
// to her alone: printf %s "$TOKEN" | sha256sum.) A token read from the
// environment or a file has at least 20 characters; the file cannot tell
// the length of a token given by its hash, which must be of a random
// token as well, never of a password: the login slows guessing down, it
// cannot stop the guess of a word. Names and token hashes are unique.
// Errors name the entry, never a token.
func LoadApprovers(path string, getenv func(string) string) ([]Approver, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("inbox: approvers file: %w", err)
	}
	approvers, err := ParseApprovers(data, getenv)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return approvers, nil
}

// ParseApprovers is LoadApprovers on the file's content.
func ParseApprovers(data []byte, getenv func(string) string) ([]Approver, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var f approversFile
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("inbox: approvers file: %w", err)
	}
	if len(f.Approvers) == 0 {
		return nil, errors.New("inbox: approvers file: no approvers (want approvers: [{name, groups, token_sha256 | token_env | token_file}])")
	}
	var out []Approver
	names := map[string]bool{}
	hashes := map[[sha256.Size]byte]string{}
	for i, e := range f.Approvers {
		a, err := e.approver(getenv)
		if err != nil {
			return nil, fmt.Errorf("inbox: approver %d (%q): %w", i+1, e.Name, err)
		}
		if names[a.Name] {
			return nil, fmt.Errorf("inbox: approver %q is named twice", a.Name)
		}
		if other, ok := hashes[a.TokenSHA256]; ok {
			return nil, fmt.Errorf("inbox: approvers %q and %q have the same token", other, a.Name)
		}
		names[a.Name], hashes[a.TokenSHA256] = true, a.Name
		out = append(out, a)
	}
	return out, nil
}

func (e approverEntry) approver(getenv func(string) string) (Approver, error) {
	a := Approver{Name: e.Name, Groups: e.Groups}
	if err := a.check(); err != nil {
		return Approver{}, err
	}
	given := 0
	for _, s := range []string{e.TokenSHA256, e.TokenEnv, e.TokenFile} {
		if s != "" {
			given++
		}
	}
	if given != 1 {
		return Approver{}, errors.New("give its token as exactly one of token_sha256, token_env and token_file")
	}
	var token string
	switch {
	case e.TokenSHA256 != "":
		sum, err := hex.DecodeString(e.TokenSHA256)
		if err != nil || len(sum) != sha256.Size {
			return Approver{}, errors.New("token_sha256: want the 64 hexadecimal digits of a SHA-256")
		}
		copy(a.TokenSHA256[:], sum)
		return a, nil
	case e.TokenEnv != "":
		if getenv != nil {
			token = getenv(e.TokenEnv)
		}
		if token == "" {
			return Approver{}, fmt.Errorf("token_env: %s is not set", e.TokenEnv)
		}
	default:
		b, err := os.ReadFile(e.TokenFile)
		if err != nil {
			return Approver{}, fmt.Errorf("token_file: %w", err)
		}
		token = strings.TrimSuffix(strings.TrimSuffix(string(b), "\n"), "\r")
	}
	if len(token) < minTokenLength {
		return Approver{}, fmt.Errorf("its token has %d characters, want at least %d (e.g. openssl rand -hex 32)", len(token), minTokenLength)
	}
	a.TokenSHA256 = sha256.Sum256([]byte(token))
	return a, nil
}

// check validates an approver's name and groups.
func (a *Approver) check() error {
	switch {
	case strings.TrimSpace(a.Name) == "" || len(a.Name) > 64:
		return errors.New("name: want 1 to 64 characters")
	case strings.ContainsFunc(a.Name, func(r rune) bool { return !unicode.IsPrint(r) }):
		return errors.New("name: want printable characters")
	case len(a.Groups) == 0:
		return errors.New("groups: want at least one approver group")
	}
	for _, g := range a.Groups {
		if !ledger.ValidGroup(g) {
			return fmt.Errorf("group %q: want letters, digits, _ and -", g)
		}
	}
	return nil
}

// match returns the approver whose token is token, comparing every hash in
// constant time.
func match(approvers []Approver, token string) *Approver {
	sum := sha256.Sum256([]byte(token))
	var found *Approver
	for i := range approvers {
		if subtle.ConstantTimeCompare(sum[:], approvers[i].TokenSHA256[:]) == 1 {
			found = &approvers[i]
		}
	}
	return found
}
