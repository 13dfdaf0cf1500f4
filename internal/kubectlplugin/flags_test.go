package kubectlplugin

import (
	"flag"
	"testing"

	"github.com/vpcni/vpcni/internal/docref"
)

// TestEveryFlagDocumentedOnce: each of kubectl-vpcni's own flags has
// exactly one row in docs/configuration.md's "kubectl-vpcni flag" table,
// with its default, and that table names no flag the plugin lacks.
func TestEveryFlagDocumentedOnce(t *testing.T) {
	fs := flag.NewFlagSet("kubectl-vpcni", flag.ContinueOnError)
	var o options
	o.register(fs)
	want := docref.FlagDefaults(fs)
	if _, ok := want["node"]; !ok {
		t.Fatalf("register gave %v: no --node", want)
	}
	rows, err := docref.Read("../..", docref.ReferenceFiles)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range docref.Check(rows, "kubectl-vpcni flag", want, docref.FlagName) {
		t.Error(p)
	}
}
