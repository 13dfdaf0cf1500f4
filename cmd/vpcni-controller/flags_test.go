package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/docref"
)

// TestEveryFlagDocumentedOnce: each of vpcni-controller's flags has
// exactly one row in docs/configuration.md's "vpcni-controller flag"
// table, with its default, and that table names no flag the controller
// does not have.
func TestEveryFlagDocumentedOnce(t *testing.T) {
	var o options
	fs := flag.NewFlagSet("vpcni-controller", flag.ContinueOnError)
	o.register(fs)
	want := docref.FlagDefaults(fs)
	if len(want) < 20 {
		t.Fatalf("register gave %d flags: the controller has more", len(want))
	}
	// The lease's namespace and the replica's name default to the pod's
	// ($POD_NAMESPACE, $POD_NAME): not literals to compare.
	want["lease-namespace"], want["id"] = "", ""
	rows, err := docref.Read("../..", docref.ReferenceFiles)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range docref.Check(rows, "vpcni-controller flag", want, docref.FlagName) {
		t.Error(p)
	}
}

// TestFlagsNotDescribedElsewhere: a controller flag is described in the
// reference only; another page's table whose first column names one
// repeats it and should link to docs/configuration.md instead.
func TestFlagsNotDescribedElsewhere(t *testing.T) {
	var o options
	fs := flag.NewFlagSet("vpcni-controller", flag.ContinueOnError)
	o.register(fs)
	flags := docref.FlagDefaults(fs)
	files, err := docref.Documents("../..")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f == "docs/configuration.md" || f == "docs/development.md" { // the reference, and vpcnictl's dev flags
			continue
		}
		rows, err := docref.Tables("../..", f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if _, ok := flags[docref.FlagName(r.Key)]; ok && strings.HasPrefix(r.Key, "-") {
				t.Errorf("%s: a table describes vpcni-controller's %s, which docs/configuration.md describes: link to it instead", r.Where(), r.Key)
			}
		}
	}
}
