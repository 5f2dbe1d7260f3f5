// Package version says which build of toolq is running: the module
// version, the commit and the build date, read from the binary's build
// information (debug.ReadBuildInfo) unless the linker set them:
//
//	go build -ldflags "-X github.com/toolq/toolq/internal/version.version=v0.1.0 \
//	  -X github.com/toolq/toolq/internal/version.commit=$(git rev-parse HEAD) \
//	  -X github.com/toolq/toolq/internal/version.date=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
//
// as `make release` and the Dockerfile do.
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"
)

// Set by the linker (-X); empty: taken from the build information.
var version, commit, date string

// Info is one build of toolq.
type Info struct {
	Version  string `json:"version"`            // v0.1.0; "devel" for a build from a work tree
	Commit   string `json:"commit,omitempty"`   // the full commit hash, when known
	Date     string `json:"date,omitempty"`     // the commit's or the build's time, RFC 3339
	Modified bool   `json:"modified,omitempty"` // built from a work tree with changes
	Go       string `json:"go"`                 // the Go release it was built with
}

// Get returns the running binary's build.
var Get = sync.OnceValue(func() Info { return read(version, commit, date, debug.ReadBuildInfo) })

func read(v, c, d string, buildInfo func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: v, Commit: c, Date: d, Go: runtime.Version()}
	if bi, ok := buildInfo(); ok {
		if info.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			info.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && info.Commit == "":
				info.Commit = s.Value
			case s.Key == "vcs.time" && info.Date == "":
				info.Date = s.Value
			case s.Key == "vcs.modified" && c == "":
				info.Modified = s.Value == "true"
			}
		}
		if bi.GoVersion != "" {
			info.Go = bi.GoVersion
		}
	}
	if info.Version == "" {
		info.Version = "devel"
	}
	return info
}

// String is the one line `--version` prints after the binary's name:
// "v0.1.0 (commit 1a2b3c4d5e6f, 2026-12-05T12:00:00Z, go1.26.0)".
func (i Info) String() string {
	s := i.Version + " ("
	if i.Commit != "" {
		c := i.Commit
		if len(c) > 12 {
			c = c[:12]
		}
		s += "commit " + c
		if i.Modified {
			s += "+changes"
		}
		s += ", "
	}
	if i.Date != "" {
		s += i.Date + ", "
	}
	return fmt.Sprintf("%s%s)", s, i.Go)
}
