package docref

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"unicode"
)

// link is a Markdown link's target, e.g. "../deploy/README.md#values".
var link = regexp.MustCompile(`\]\(([^)\s]+)\)`)

// Link is one relative link of a document.
type Link struct {
	File, Target string
	Line         int
}

// scan reads a Markdown file's headings' anchors and its relative links,
// outside fenced code.
func scan(path string) (anchors map[string]bool, links []Link, err error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer fh.Close()
	anchors = map[string]bool{}
	seen := map[string]int{}
	fenced := false
	n := 0
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.HasPrefix(strings.TrimSpace(line), "```") {
			fenced = !fenced
			continue
		}
		if fenced {
			continue
		}
		if h := strings.TrimLeft(line, "#"); len(h) < len(line) && strings.HasPrefix(h, " ") && len(line)-len(h) <= 6 {
			a := Anchor(h)
			if k := seen[a]; k > 0 {
				anchors[fmt.Sprintf("%s-%d", a, k)] = true
			} else {
				anchors[a] = true
			}
			seen[a]++
		}
		for _, m := range link.FindAllStringSubmatch(line, -1) {
			t := m[1]
			if strings.Contains(t, "://") || strings.HasPrefix(t, "mailto:") {
				continue
			}
			links = append(links, Link{Target: t, Line: n})
		}
	}
	return anchors, links, sc.Err()
}

// Anchor is the fragment GitHub gives a heading: its text lower-cased,
// formatting and punctuation dropped, spaces turned into hyphens.
func Anchor(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(heading)) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteByte('-')
		}
	}
	return b.String()
}

// BrokenLinks checks every relative link of files (relative to root): its
// file or directory exists and, for a Markdown target with a #fragment,
// the fragment is one of its headings. It returns one message per broken
// link.
func BrokenLinks(root string, files []string) ([]string, error) {
	anchorsOf := map[string]map[string]bool{}
	anchors := func(path string) (map[string]bool, error) {
		if a, ok := anchorsOf[path]; ok {
			return a, nil
		}
		a, _, err := scan(path)
		anchorsOf[path] = a
		return a, err
	}
	var broken []string
	for _, f := range files {
		_, links, err := scan(filepath.Join(root, f))
		if err != nil {
			return nil, err
		}
		for _, l := range links {
			target, frag, _ := strings.Cut(l.Target, "#")
			path := filepath.Join(root, f)
			if target != "" {
				path = filepath.Join(root, filepath.Dir(f), target)
			}
			st, err := os.Stat(path)
			if err != nil {
				broken = append(broken, fmt.Sprintf("%s:%d: link %q: %s does not exist", f, l.Line, l.Target, filepath.Join(filepath.Dir(f), target)))
				continue
			}
			if frag == "" || st.IsDir() || !strings.HasSuffix(path, ".md") {
				continue
			}
			a, err := anchors(path)
			if err != nil {
				return nil, err
			}
			if !a[frag] {
				broken = append(broken, fmt.Sprintf("%s:%d: link %q: %s has no heading with anchor #%s", f, l.Line, l.Target, filepath.Join(filepath.Dir(f), target), frag))
			}
		}
	}
	return broken, nil
}
