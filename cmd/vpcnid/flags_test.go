package main

import (
	"flag"
	"testing"

	"github.com/vpcni/vpcni/internal/docref"
)

// TestEveryFlagDocumentedOnce: each of vpcnid's flags has exactly one row
// in docs/configuration.md's "vpcnid flag" table, with its default, and
// that table names no flag vpcnid does not have.
func TestEveryFlagDocumentedOnce(t *testing.T) {
	fs := flag.NewFlagSet("vpcnid", flag.ContinueOnError)
	registerFlags(fs)
	want := docref.FlagDefaults(fs)
	if _, ok := want["config"]; !ok {
		t.Fatalf("registerFlags gave %v: no -config", want)
	}
	rows, err := docref.Read("../..", docref.ReferenceFiles)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range docref.Check(rows, "vpcnid flag", want, docref.FlagName) {
		t.Error(p)
	}
}
