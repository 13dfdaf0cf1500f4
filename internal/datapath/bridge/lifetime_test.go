package bridge

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/datapath"
)

// ipAddr is one address as `ip -j addr` prints it.
type ipAddr struct {
	Local         string `json:"local"`
	Valid         uint64 `json:"valid_life_time"`
	Preferred     uint64 `json:"preferred_life_time"`
	NoPrefixRoute bool   `json:"noprefixroute"`
}

// addrsOf is dev's IPv4 addresses by address, read with `ip -j`.
func addrsOf(t *testing.T, dev string) map[string]ipAddr {
	t.Helper()
	out := sh(t, "ip -j -4 addr show dev "+dev)
	var links []struct {
		AddrInfo []ipAddr `json:"addr_info"`
	}
	if err := json.Unmarshal([]byte(out), &links); err != nil {
		t.Errorf("ip -j -4 addr show dev %s: %v\n%s", dev, err, out)
	}
	got := map[string]ipAddr{}
	for _, l := range links {
		for _, a := range l.AddrInfo {
			got[a.Local] = a
		}
	}
	return got
}

// wantLifetime fails unless dev holds ip with a valid lifetime in
// [lo, hi] seconds (preferred never longer), and noprefixroute as wanted.
func wantLifetime(t *testing.T, when, dev, ip string, lo, hi uint64, noPrefixRoute bool) {
	t.Helper()
	a, ok := addrsOf(t, dev)[ip]
	switch {
	case !ok:
		t.Errorf("%s: %s does not hold %s:\n%s", when, dev, ip, sh(t, "ip -4 addr show"))
	case a.Valid < lo || a.Valid > hi || a.Preferred > a.Valid:
		t.Errorf("%s: %s on %s has valid_lft %d preferred_lft %d, want valid in [%d, %d]", when, ip, dev, a.Valid, a.Preferred, lo, hi)
	case a.NoPrefixRoute != noPrefixRoute:
		t.Errorf("%s: %s on %s has noprefixroute %v, want %v", when, ip, dev, a.NoPrefixRoute, noPrefixRoute)
	}
}

// reconcileNode runs the mode's reconcile as the agent's loop does and
// fails unless it repaired the node side without an error. The tests run
// on a thread of their own (inFreshNetns): they report with Errorf and
// return, never Fatal.
func reconcileNode(t *testing.T, b *Bridge) bool {
	t.Helper()
	rep, err := b.Reconcile(t.Context(), datapath.Desired{})
	if err != nil || len(rep.Failed) > 0 {
		t.Errorf("reconcile: %v, failed %v", err, rep.Failed)
		return false
	}
	if !slices.ContainsFunc(rep.Repaired, func(r datapath.Repair) bool { return r.Kind == datapath.RepairNode }) {
		t.Errorf("reconcile repaired no node state (repairs %v); the uplink held an address", rep.Repaired)
		return false
	}
	return true
}

// TestRenewedLeaseMovesWithItsLifetime: on a DHCP node the address has
// finite lifetimes, and a renewal re-adds it on the uplink (as
// dhclient-script's `ip addr change` does) while the bridge holds it. The
// reconcile must give the bridge's copy the renewed lifetimes, not keep
// counting down the old ones; giving the uplink back carries the
// lifetimes and flags, and keeps a copy the uplink was renewed with.
func TestRenewedLeaseMovesWithItsLifetime(t *testing.T) {
	inFreshNetns(t, func() {
		for _, c := range []string{
			"ip link add eth0 type veth peer name peer0",
			"ip link set eth0 up", "ip link set peer0 up", "ip link set lo up",
			"ip addr add 10.99.0.10/24 dev eth0 valid_lft 30 preferred_lft 30",
			"ip addr add 10.97.0.10/24 dev eth0 noprefixroute valid_lft 40 preferred_lft 20",
			"ip route add default via 10.99.0.1 dev eth0",
		} {
			sh(t, c)
		}
		if t.Failed() {
			return
		}
		if _, err := takeUplink("eth0", DefaultBridge, false); err != nil {
			t.Errorf("take uplink: %v", err)
			return
		}
		wantLifetime(t, "taken", DefaultBridge, "10.99.0.10", 20, 30, false)
		wantLifetime(t, "taken", DefaultBridge, "10.97.0.10", 30, 40, true)

		// The lease is renewed for an hour.
		sh(t, "ip addr change 10.99.0.10/24 dev eth0 valid_lft 3600 preferred_lft 3000")
		sh(t, "ip addr change 10.97.0.10/24 dev eth0 noprefixroute valid_lft 3600 preferred_lft 3000")
		if !reconcileNode(t, &Bridge{name: DefaultBridge, uplink: "eth0", mtu: 1500}) {
			return
		}
		wantLifetime(t, "renewed", DefaultBridge, "10.99.0.10", 3500, 3600, false)
		wantLifetime(t, "renewed", DefaultBridge, "10.97.0.10", 3500, 3600, true)
		if left := addrsOf(t, "eth0"); len(left) > 0 {
			t.Errorf("eth0 still holds %v after the reconcile", left)
		}

		// Renewed again just before the uplink is given back: the
		// uplink's own, newer copy stays; the other comes back with the
		// bridge's lifetimes and flags.
		sh(t, "ip addr change 10.99.0.10/24 dev eth0 valid_lft 7200 preferred_lft 7000")
		if err := Uninstall("eth0", Settings{}); err != nil {
			t.Errorf("uninstall: %v", err)
			return
		}
		wantLifetime(t, "given back", "eth0", "10.99.0.10", 7100, 7200, false)
		wantLifetime(t, "given back", "eth0", "10.97.0.10", 3500, 3600, true)
	})
}

// TestExpiredLeaseKeepsNodeAddress: the lifetime the bridge took over
// runs out after a renewal, and the node keeps its address. A witness
// address with the same lifetime, added just after the node's, shows when
// the kernel has expired addresses of that age.
func TestExpiredLeaseKeepsNodeAddress(t *testing.T) {
	inFreshNetns(t, func() {
		const life = "valid_lft 3 preferred_lft 3"
		for _, c := range []string{
			"ip link add eth0 type veth peer name peer0",
			"ip link add vpcwit type veth peer name vpcwitp",
			"ip link set eth0 up", "ip link set peer0 up", "ip link set vpcwit up", "ip link set lo up",
			"ip addr add 10.99.0.10/24 dev eth0 " + life,
			"ip addr add 10.96.0.10/24 dev vpcwit " + life,
		} {
			sh(t, c)
		}
		if t.Failed() {
			return
		}
		if _, err := takeUplink("eth0", DefaultBridge, false); err != nil {
			t.Errorf("take uplink: %v", err)
			return
		}
		sh(t, "ip addr change 10.99.0.10/24 dev eth0 valid_lft 3600 preferred_lft 3600")
		if !reconcileNode(t, &Bridge{name: DefaultBridge, uplink: "eth0", mtu: 1500}) {
			return
		}
		deadline := time.Now().Add(15 * time.Second)
		for len(addrsOf(t, "vpcwit")) > 0 {
			if time.Now().After(deadline) {
				t.Errorf("the witness address never expired:\n%s", sh(t, "ip -4 addr show"))
				return
			}
			time.Sleep(200 * time.Millisecond)
		}
		wantLifetime(t, "after the first lease's end", DefaultBridge, "10.99.0.10", 3500, 3600, false)
		if t.Failed() {
			t.Logf("addresses:\n%s", strings.TrimSpace(sh(t, "ip -4 addr show")))
		}
	})
}
