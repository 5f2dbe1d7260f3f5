package version

import (
	"runtime/debug"
	"strings"
	"testing"
)

func buildInfo(main string, settings ...string) func() (*debug.BuildInfo, bool) {
	return func() (*debug.BuildInfo, bool) {
		bi := &debug.BuildInfo{GoVersion: "go1.99", Main: debug.Module{Path: "github.com/toolq/toolq", Version: main}}
		for i := 0; i+1 < len(settings); i += 2 {
			bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
		}
		return bi, true
	}
}

func TestVersionComesFromTheBuildInformation(t *testing.T) {
	got := read("", "", "", buildInfo("v0.1.0", "vcs.revision", "0123456789abcdef0123", "vcs.time", "2026-12-05T12:00:00Z", "vcs.modified", "true"))
	want := Info{Version: "v0.1.0", Commit: "0123456789abcdef0123", Date: "2026-12-05T12:00:00Z", Modified: true, Go: "go1.99"}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	if s := got.String(); s != "v0.1.0 (commit 0123456789ab+changes, 2026-12-05T12:00:00Z, go1.99)" {
		t.Fatalf("String() = %q", s)
	}
}

func TestLinkerValuesOverrideTheBuildInformation(t *testing.T) {
	got := read("v1.2.3", "feedface", "2027-01-01T00:00:00Z", buildInfo("(devel)", "vcs.revision", "0123", "vcs.time", "2026-12-05T12:00:00Z", "vcs.modified", "true"))
	want := Info{Version: "v1.2.3", Commit: "feedface", Date: "2027-01-01T00:00:00Z", Go: "go1.99"}
	if got != want {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}

func TestAWorkTreeBuildWithoutVCSIsDevel(t *testing.T) {
	got := read("", "", "", buildInfo("(devel)"))
	if got.Version != "devel" || got.Commit != "" || got.String() != "devel (go1.99)" {
		t.Fatalf("got %+v %q", got, got.String())
	}
	if s := read("", "", "", func() (*debug.BuildInfo, bool) { return nil, false }); s.Version != "devel" || !strings.HasPrefix(s.Go, "go") {
		t.Fatalf("without build information: %+v", s)
	}
}
