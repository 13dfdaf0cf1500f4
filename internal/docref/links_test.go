package docref

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestDocLinksResolve: every relative link in the READMEs, docs/ and the
// CHANGELOG names a file that exists and, with a #fragment into a
// Markdown file, a heading it has.
func TestDocLinksResolve(t *testing.T) {
	files, err := Documents(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, "CHANGELOG.md")
	broken, err := BrokenLinks(repoRoot, files)
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range broken {
		t.Error(b)
	}
}

// TestBrokenLinksFindsEach: a missing file, a missing anchor and a
// heading inside fenced code (no anchor) are each reported; a good file
// link, a good anchor, a repeated heading's "-1" anchor and a directory
// are not.
func TestBrokenLinksFindsEach(t *testing.T) {
	dir := t.TempDir()
	must := func(name, body string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	must("docs/b.md", "# B\n\n## The `veth` mode: routed\n\n## Again\n\n## Again\n\n```yaml\n# not-a-heading\n```\n")
	must("a.md", "[ok](docs/b.md) [ok](docs/b.md#the-veth-mode-routed) [ok](docs/b.md#again-1) [dir](docs)\n"+
		"[gone](docs/c.md) [no anchor](docs/b.md#nope) [fenced](docs/b.md#not-a-heading) [web](https://x/y#z)\n")
	broken, err := BrokenLinks(dir, []string{"a.md"})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{`"docs/c.md"`, `"docs/b.md#nope"`, `"docs/b.md#not-a-heading"`}
	if len(broken) != len(want) {
		t.Fatalf("broken = %q, want the %d of %v", broken, len(want), want)
	}
	for i, w := range want {
		if !strings.Contains(broken[i], w) {
			t.Errorf("broken[%d] = %q, want it to name %s", i, broken[i], w)
		}
	}
}
