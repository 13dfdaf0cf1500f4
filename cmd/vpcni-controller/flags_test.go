package main

import (
	"flag"
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
