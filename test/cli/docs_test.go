package cli_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestDocumentationLinksResolve: every relative link of the README, the
// changelog and docs/ reaches a file of the repository (and, into a
// Markdown page, a heading of it), every page of docs/ is reachable from
// docs/README.md, and the README stays a front page (under 15 KB).
func TestDocumentationLinksResolve(t *testing.T) {
	root := "../.."
	pages, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	pages = append(pages, filepath.Join(root, "README.md"), filepath.Join(root, "CHANGELOG.md"), filepath.Join(root, "clients/typescript/README.md"))
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := map[string]bool{}
		data, _ := os.ReadFile(path)
		inCode := false
		for line := range strings.Lines(string(data)) {
			if strings.HasPrefix(line, "```") {
				inCode = !inCode
			}
			if !inCode && strings.HasPrefix(line, "#") {
				a[githubAnchor(strings.TrimSpace(strings.TrimLeft(line, "#")))] = true
			}
		}
		anchors[path] = a
		return a
	}
	for _, page := range pages {
		data, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(string(data), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			file, frag, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
			}
			if _, err := os.Stat(path); err != nil {
				t.Errorf("%s: link %s: no such file", page, target)
				continue
			}
			if frag != "" && strings.HasSuffix(path, ".md") && !anchorsOf(path)[frag] {
				t.Errorf("%s: link %s: no such heading in %s", page, target, path)
			}
		}
	}
	index, _ := os.ReadFile(filepath.Join(root, "docs", "README.md"))
	for _, page := range pages {
		if filepath.Dir(page) == filepath.Join(root, "docs") && filepath.Base(page) != "README.md" &&
			!strings.Contains(string(index), "("+filepath.Base(page)+")") {
			t.Errorf("docs/README.md does not link %s", filepath.Base(page))
		}
	}
	if fi, err := os.Stat(filepath.Join(root, "README.md")); err != nil || fi.Size() >= 15<<10 {
		t.Errorf("README.md: %v bytes, want a front page under 15 KB", fi.Size())
	}
}

// githubAnchor is the fragment GitHub gives a Markdown heading.
func githubAnchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '-', r == '_', r > 127:
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}
