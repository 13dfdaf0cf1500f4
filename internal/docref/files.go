package docref

import (
	"path/filepath"
	"sort"
)

// Documents are every operator and developer document: the READMEs and
// docs/*.md, relative to root.
func Documents(root string) ([]string, error) {
	out := []string{"README.md", "deploy/README.md", "deploy/helm/vpcni/README.md"}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		return nil, err
	}
	sort.Strings(more)
	for _, p := range more {
		rel, err := filepath.Rel(root, p)
		if err != nil {
			return nil, err
		}
		out = append(out, filepath.ToSlash(rel))
	}
	return out, nil
}
