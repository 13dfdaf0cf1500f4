package integration

import (
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestSelfHeal takes every piece of vpcni's datapath away in turn (veth:
// host route, proxy ARP entry, host link down, host veth deleted, a
// secondary NIC's rules, table and proxy entry; macvlan: the service
// path's NAT table, route and link; bridge: the uplink off the bridge)
// while pods are added and deleted on the node, through `vpcnictl bench
// selfheal` — the bench make bench runs at length. Every item must come
// back (the bench fails otherwise), with the kernel watch well inside the
// timer's period, with the timer alone within about one period, and be
// logged as a repair of its kind.
func TestSelfHeal(t *testing.T) {
	bench := func() ([]byte, error) {
		return exec.Command(filepath.Join(binDir, "vpcnictl"), "bench", "selfheal", "-rounds", "1", "-period", "1s").CombinedOutput()
	}
	out, err := bench()
	if err != nil {
		// The bench times repairs on a loaded machine, beside the other
		// packages' tests: a run that fails is shown whole and run once
		// more, and the second must pass.
		for _, l := range strings.Split(strings.TrimSpace(string(out)), "\n") {
			t.Logf("vpcni-test: bench selfheal, first run: %s", l)
		}
		t.Logf("vpcni-test: bench selfheal failed (%v); running it again", err)
		out, err = bench()
	}
	t.Logf("%s", out)
	if err != nil {
		t.Fatalf("bench selfheal: %v\n%s", err, out)
	}
	rows := 0
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) != 5 || (f[0] != "veth" && f[0] != "macvlan" && f[0] != "bridge") {
			continue
		}
		rows++
		watch, err1 := strconv.ParseFloat(f[2], 64)
		timer, err2 := strconv.ParseFloat(f[3], 64)
		if err1 != nil || err2 != nil {
			t.Fatalf("bad row %q", line)
		}
		// The watch must answer long before the timer would (goal 100 ms;
		// the bound leaves room for a loaded CI machine).
		if watch > 500 {
			t.Errorf("%s %s: repaired in %.1f ms with the watch, want well under the 1 s period", f[0], f[1], watch)
		}
		if timer > 2500 {
			t.Errorf("%s %s: repaired in %.1f ms by the timer alone, want about one period (1 s)", f[0], f[1], timer)
		}
		// A churning pod's ADD on the secondary NIC prepares the NIC's
		// table and the local-pods rule itself, and may put them back
		// before the reconcile does: then no repair is logged, rightly.
		if f[4] != "true" && f[1] != "nic-table" && f[1] != "nic-rule-local" {
			t.Errorf("%s %s: repair not logged with its kind", f[0], f[1])
		}
	}
	if rows != 12 {
		t.Errorf("%d items measured, want 12", rows)
	}
	if !strings.Contains(string(out), "selfheal: items=12 max_repair_ms=") {
		t.Error("no summary line")
	}
}
