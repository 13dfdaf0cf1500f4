package svcpath

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netns"
)

// scratchNS is a network namespace of the test's own (root only).
func scratchNS(t *testing.T) (name string, fd int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED LOUDLY: needs root to create a network namespace")
	}
	name = fmt.Sprintf("vpcni-svct%d", os.Getpid())
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add: %v %s", err, out)
	}
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Close(); _ = exec.Command("ip", "netns", "del", name).Run() })
	return name, int(h)
}

func nftList(t *testing.T, ns string) string {
	t.Helper()
	out, err := exec.Command("ip", "netns", "exec", ns, "nft", "list", "ruleset").CombinedOutput()
	if err != nil {
		t.Fatalf("nft list ruleset: %v %s", err, out)
	}
	return string(out)
}

// The NAT table as nft shows it, made once, left alone while intact, put
// back when deleted or emptied, removed whole.
func TestNATTable(t *testing.T) {
	ns, fd := scratchNS(t)
	opt := nftables.WithNetNSFd(fd)
	for i, want := range []bool{true, false} {
		changed, err := ensureNAT(nftables.TableFamilyIPv4, opt)
		if err != nil || changed != want {
			t.Fatalf("ensure #%d: changed %v (want %v), %v", i, changed, want, err)
		}
	}
	got := nftList(t, ns)
	for _, s := range []string{"table ip vpcni_svcpath", "type nat hook postrouting priority srcnat", `iifname "vsv*" ct status dnat masquerade`} {
		if !strings.Contains(got, s) {
			t.Fatalf("ruleset lacks %q:\n%s", s, got)
		}
	}
	if strings.Count(got, "masquerade") != 1 {
		t.Fatalf("rule not exactly once:\n%s", got)
	}
	for _, damage := range [][]string{
		{"nft", "flush", "chain", "ip", NATTable, "postrouting"},
		{"nft", "add", "rule", "ip", NATTable, "postrouting", "counter"},
		{"nft", "delete", "table", "ip", NATTable},
	} {
		if out, err := exec.Command("ip", append([]string{"netns", "exec", ns}, damage...)...).CombinedOutput(); err != nil {
			t.Fatalf("%v: %v %s", damage, err, out)
		}
		if changed, err := ensureNAT(nftables.TableFamilyIPv4, opt); err != nil || !changed {
			t.Fatalf("after %v: changed %v, %v", damage, changed, err)
		}
		if got := nftList(t, ns); strings.Count(got, `iifname "vsv*" ct status dnat masquerade`) != 1 || strings.Contains(got, "counter") {
			t.Fatalf("after %v the table is not back as made:\n%s", damage, got)
		}
	}
	// IPv6's table is ip6's own, the same rule; removeNAT takes both.
	if changed, err := ensureNAT(nftables.TableFamilyIPv6, opt); err != nil || !changed {
		t.Fatalf("ensure ip6: changed %v, %v", changed, err)
	}
	if got := nftList(t, ns); !strings.Contains(got, "table ip6 vpcni_svcpath") || strings.Count(got, `iifname "vsv*" ct status dnat masquerade`) != 2 {
		t.Fatalf("ip6 table not as made:\n%s", got)
	}
	for range 2 {
		if err := removeNAT(opt); err != nil {
			t.Fatal(err)
		}
	}
	if got := nftList(t, ns); strings.Contains(got, NATTable) {
		t.Fatalf("table left:\n%s", got)
	}
}
