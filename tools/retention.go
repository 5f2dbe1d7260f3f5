package tools

import (
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Retention is how long the ledger keeps the rows of finished calls, as the
// registry file states it: a default for every tool (top-level retention)
// and a tool's own (its retention). A finished call's row is what keeps a job
// that comes back from running it again, so a tool whose calls can come back
// later than the streams keep them (an agent that resends old conversations)
// states how long.
//
//	retention: 31d
//	tools:
//	  - name: send_payment
//	    retention: 90d
type Retention struct {
	Default time.Duration            // 0: none stated
	Tools   map[string]time.Duration // the tools that state their own
}

// Of returns the retention of tool: its own, or the default.
func (r Retention) Of(tool string) time.Duration {
	if d, ok := r.Tools[tool]; ok {
		return d
	}
	return r.Default
}

// LoadRetention reads only the retentions of the registry file at path, so
// that a purge can read them without the environment the executors need.
// Errors name the file and the tool (a *DefinitionError); a file that
// cannot be read gives the *fs.PathError, wrapped.
func LoadRetention(path string) (Retention, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Retention{}, fmt.Errorf("tools: %w", err)
	}
	var f struct {
		Retention string `yaml:"retention"`
		Tools     []struct {
			Name      string `yaml:"name"`
			Retention string `yaml:"retention"`
		} `yaml:"tools"`
	}
	if err := yaml.NewDecoder(bytes.NewReader(data)).Decode(&f); err != nil {
		return Retention{}, &DefinitionError{File: path, Msg: oneLine(err.Error())}
	}
	r := Retention{Tools: map[string]time.Duration{}}
	if r.Default, err = parseRetention(f.Retention); err != nil {
		return Retention{}, &DefinitionError{File: path, Field: "retention", Msg: err.Error()}
	}
	for _, t := range f.Tools {
		if t.Retention == "" {
			continue
		}
		d, err := parseRetention(t.Retention)
		if err != nil {
			return Retention{}, &DefinitionError{File: path, Tool: t.Name, Field: "retention", Msg: err.Error()}
		}
		r.Tools[t.Name] = d
	}
	return r, nil
}

// parseRetention reads 31d, 36h, 1d12h; empty is 0.
func parseRetention(s string) (time.Duration, error) {
	if s == "" {
		return 0, nil
	}
	bad := fmt.Errorf("%q is not a positive duration (e.g. 31d, 36h)", s)
	var d time.Duration
	if days, rest, ok := strings.Cut(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 0 {
			return 0, bad
		}
		d, s = time.Duration(n)*24*time.Hour, rest
	}
	if s != "" {
		r, err := time.ParseDuration(s)
		if err != nil {
			return 0, bad
		}
		d += r
	}
	if d <= 0 {
		return 0, bad
	}
	return d, nil
}
