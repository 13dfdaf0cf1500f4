package docref

import (
	"flag"
	"path/filepath"
	"sort"
	"strings"
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

// FlagDefaults lists fs's flags by name with their defaults as the flag
// package prints them ("" for an empty one).
func FlagDefaults(fs *flag.FlagSet) map[string]string {
	out := map[string]string{}
	fs.VisitAll(func(f *flag.Flag) { out[f.Name] = f.DefValue })
	return out
}

// FlagName is a documented flag's name without its dashes ("-config",
// "--config" and "config" are one flag to the flag package).
func FlagName(s string) string { return strings.TrimLeft(s, "-") }
