package ctl

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/docref"
)

// subcommands are the command lines whose -h shows every flag set of
// vpcnictl: lab's verbs share one, bench pool has a second for aws.
func subcommands() [][]string {
	out := [][]string{
		{"status"}, {"trace"}, {"audit"}, {"doctor"}, {"install-cni"}, {"uninstall-cni"}, {"max-pods"},
		{"demo"}, {"lab", "up"}, {"bench", "pool", "--provider", "aws"},
	}
	for _, b := range benches {
		out = append(out, []string{"bench", b.name})
	}
	return out
}

// kind is the reference table of a flag set: "vpcnictl status flag",
// "vpcnictl lab flag" (every verb of lab has the same flags).
func kind(fsName string) string {
	if strings.HasPrefix(fsName, "lab ") {
		fsName = "lab"
	}
	return "vpcnictl " + fsName + " flag"
}

// TestEveryFlagDocumentedOnce: every flag of every vpcnictl subcommand
// has exactly one row in its subcommand's table — docs/configuration.md
// for the operator's commands, docs/development.md for lab, demo and
// bench — with its default, and no table names a flag the subcommand does
// not have. A flag set this test does not reach (a new subcommand) fails
// it too, by its name in the source.
func TestEveryFlagDocumentedOnce(t *testing.T) {
	sets := map[string]map[string]string{}
	flagsSeen = func(fs *flag.FlagSet) {
		fs.SetOutput(io.Discard)
		sets[kind(fs.Name())] = docref.FlagDefaults(fs)
	}
	defer func() { flagsSeen = nil }()
	for _, args := range subcommands() {
		if code := Main(append(args, "-h"), io.Discard, io.Discard); code != 0 {
			t.Errorf("vpcnictl %s -h exited %d", strings.Join(args, " "), code)
		}
	}
	// Every flag set the source makes must have been seen.
	made := regexp.MustCompile(`flag\.NewFlagSet\("([^"]+)"`)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range made.FindAllStringSubmatch(string(src), -1) {
			name := strings.TrimSuffix(m[1], " ") // "lab "+verb
			if _, ok := sets[kind(name)]; !ok && !strings.HasPrefix(name, "lab") {
				t.Errorf("%s makes flag set %q, which no command line of subcommands() reaches: add it there (and its flags to %s)", f, m[1], docref.Main(kind(name)))
			}
		}
	}
	if len(sets) < 15 {
		t.Fatalf("saw %d flag sets: the walk is broken", len(sets))
	}
	rows, err := docref.Read("../..", docref.ReferenceFiles)
	if err != nil {
		t.Fatal(err)
	}
	for k, want := range sets {
		for _, p := range docref.Check(rows, k, want, docref.FlagName) {
			t.Error(p)
		}
	}
	// A table of a subcommand vpcnictl does not have is stale as a whole.
	for _, r := range rows {
		if strings.HasPrefix(r.Kind, "vpcnictl ") && sets[r.Kind] == nil {
			t.Errorf("%s: a %q table, but vpcnictl has no such subcommand: remove it", r.Where(), r.Kind)
		}
	}
}
