package main

import (
	"flag"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/docref"
	"github.com/vpcni/vpcni/internal/ipam"
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

// TestBlockFlags: -block-ranges of one family, or of both (dual-stack):
// IPv4 blocks of -block-size, IPv6 ones of -block-size-v6; an IPv6-only
// controller keeps taking -block-size unless -block-size-v6 is given; a
// bad size names the flag to fix.
func TestBlockFlags(t *testing.T) {
	parse := func(args ...string) ([]ipam.Blocks, error) {
		var o options
		fs := flag.NewFlagSet("vpcni-controller", flag.ContinueOnError)
		o.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		o.noteSetFlags(fs)
		return o.blocks()
	}
	got, err := parse("-block-ranges", "10.20.0.0/22, fd00:20::/64", "-block-size", "24")
	if err != nil || len(got) != 2 || got[0].Bits != 24 || got[0].Ranges[0].String() != "10.20.0.0/22" ||
		got[1].Bits != 80 || got[1].Ranges[0].String() != "fd00:20::/64" {
		t.Fatalf("dual-stack: %+v, %v", got, err)
	}
	if got, err := parse("-block-ranges", "fd00:30::/112", "-block-size", "120"); err != nil || len(got) != 1 || got[0].Bits != 120 {
		t.Fatalf("IPv6 only with -block-size: %+v, %v", got, err)
	}
	if got, err := parse("-block-ranges", "fd00:30::/112", "-block-size-v6", "116"); err != nil || len(got) != 1 || got[0].Bits != 116 {
		t.Fatalf("IPv6 only with -block-size-v6: %+v, %v", got, err)
	}
	if _, err := parse("-block-ranges", "10.20.0.0/22,fd00:20::/64", "-block-size-v6", "40"); err == nil || !strings.Contains(err.Error(), "-block-ranges (IPv6)/-block-size-v6") {
		t.Errorf("an IPv6 block larger than the range: %v", err)
	}
	if got, err := parse(); err != nil || got != nil {
		t.Errorf("no ranges: %+v, %v", got, err)
	}
}
