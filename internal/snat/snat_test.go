package snat

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/netnsutil"
)

// scratchNS is a network namespace of the test's own (root only): nft
// runs inside it, never on the machine's own tables.
func scratchNS(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("SKIPPED LOUDLY: needs root to create a network namespace")
	}
	name := fmt.Sprintf("vpcni-snatt%d", os.Getpid())
	_ = netnsutil.Delete(name)
	if err := netnsutil.Add(name); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = netnsutil.Delete(name) })
	return name
}

func ipRules(t *testing.T, ns string) string {
	t.Helper()
	out, err := exec.Command("ip", "-n", ns, "rule").CombinedOutput()
	if err != nil {
		t.Fatalf("ip rule: %v %s", err, out)
	}
	return string(out)
}

func nft(t *testing.T, ns string, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", append([]string{"netns", "exec", ns, "nft"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("nft %s: %v %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// The end state in the kernel: Sync writes the table whole (a rule added
// by hand to vpcni's chain and a pod gone from the list disappear), never
// touches another table, and Remove deletes only vpcni's, twice as well as
// once.
func TestSyncAndRemove(t *testing.T) {
	ns := scratchNS(t)
	nft(t, ns, "add", "table", "ip", "someone_elses")
	nft(t, ns, "add", "chain", "ip", "someone_elses", "post", "{ type nat hook postrouting priority srcnat; }")
	nft(t, ns, "add", "rule", "ip", "someone_elses", "post", "ip saddr 10.1.2.3 masquerade")
	on := true
	cfg := Config{Enabled: &on, VPCCIDRs: []netip.Prefix{netip.MustParsePrefix("10.20.0.0/16"), netip.MustParsePrefix("10.20.5.0/24")},
		ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("100.64.0.0/10")}}
	ctx := context.Background()
	err := netnsutil.Do(netnsutil.Path(ns), func() error {
		n, err := Open(cfg)
		if err != nil {
			return err
		}
		fixed, err := n.Sync(ctx, []netip.Addr{netip.MustParseAddr("10.20.0.7"), netip.MustParseAddr("10.20.0.8")})
		if err != nil {
			return err
		}
		if !strings.Contains(fixed, "or its chain") {
			t.Errorf("first Sync: fixed %q, want the missing table named", fixed)
		}
		if err := n.AddPod(ctx, netip.MustParseAddr("10.20.0.9")); err != nil {
			return err
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := nft(t, ns, "list", "table", "ip", Table)
	for _, want := range []string{"10.20.0.7", "10.20.0.8", "10.20.0.9", "10.20.0.0/16", "100.64.0.0/10",
		"type nat hook postrouting priority srcnat", "ip saddr @pods ip daddr != @vpc ip daddr != @exclude masquerade",
		"type filter hook prerouting priority mangle", "ip saddr @pods ip daddr != @vpc ip daddr != @exclude meta mark set meta mark | 0x00000080"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	// Marked traffic is routed by the main table (the node's uplink), also
	// from a pod whose own rule points at a secondary NIC's table.
	if rules := ipRules(t, ns); !strings.Contains(rules, "1024:\tfrom all fwmark 0x80/0x80 lookup main") {
		t.Errorf("no policy rule for the mark:\n%s", rules)
	}
	// Someone adds a rule to vpcni's chain; a pod leaves: the next Sync
	// puts the table back to what it should be.
	nft(t, ns, "add", "rule", "ip", Table, "postrouting", "ip saddr 10.9.9.9 masquerade")
	err = netnsutil.Do(netnsutil.Path(ns), func() error {
		n, err := Open(cfg)
		if err != nil {
			return err
		}
		fixed, err := n.Sync(ctx, []netip.Addr{netip.MustParseAddr("10.20.0.8")})
		if err == nil && !strings.Contains(fixed, "the postrouting rule (chain held 2 rules") {
			t.Errorf("Sync after a rule was added by hand: fixed %q", fixed)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	out = nft(t, ns, "list", "table", "ip", Table)
	if strings.Contains(out, "10.9.9.9") || strings.Contains(out, "10.20.0.7") || !strings.Contains(out, "10.20.0.8") {
		t.Errorf("Sync did not rewrite the table whole:\n%s", out)
	}
	// A Sync that finds the table as it should be deletes nothing the
	// agent's kernel watch reacts to (a table, chain, set or rule of a
	// vpcni table): otherwise every reconcile would kick the next.
	mon := exec.Command("ip", "netns", "exec", ns, "nft", "monitor")
	events := &lockedBuf{}
	mon.Stdout = events
	if err := mon.Start(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // nft monitor subscribes after it starts
	err = netnsutil.Do(netnsutil.Path(ns), func() error {
		n, err := Open(cfg)
		if err != nil {
			return err
		}
		fixed, err := n.Sync(ctx, []netip.Addr{netip.MustParseAddr("10.20.0.8")})
		if err == nil && fixed != "" {
			t.Errorf("Sync of a table as made reports %q fixed", fixed)
		}
		return err
	})
	// A marker the monitor must print: it was listening all along.
	nft(t, ns, "add", "table", "ip", "vpcni_marker")
	for end := time.Now().Add(3 * time.Second); !strings.Contains(events.String(), "vpcni_marker") && time.Now().Before(end); {
		time.Sleep(20 * time.Millisecond)
	}
	_ = mon.Process.Kill()
	_ = mon.Wait()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(events.String(), "vpcni_marker") {
		t.Fatalf("nft monitor saw nothing:\n%s", events.String())
	}
	for _, line := range strings.Split(events.String(), "\n") {
		if strings.HasPrefix(line, "delete ") && !strings.HasPrefix(line, "delete element") {
			t.Errorf("an unchanged Sync deleted %q", line)
		}
	}
	for range 2 {
		if err := netnsutil.Do(netnsutil.Path(ns), func() error { return Remove(ctx) }); err != nil {
			t.Fatalf("Remove: %v", err)
		}
	}
	all := nft(t, ns, "list", "ruleset")
	if strings.Contains(all, Table) {
		t.Errorf("Remove left vpcni's table:\n%s", all)
	}
	if rules := ipRules(t, ns); strings.Contains(rules, "fwmark 0x80") {
		t.Errorf("Remove left the policy rule:\n%s", rules)
	}
	if !strings.Contains(all, "ip saddr 10.1.2.3 masquerade") {
		t.Errorf("someone else's table was touched:\n%s", all)
	}
}

func TestValidate(t *testing.T) {
	if err := (Config{}).Validate(); err != nil {
		t.Errorf("off, empty: %v", err)
	}
	on := true
	err := Config{Enabled: &on, ExcludeCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.1/8"), netip.MustParsePrefix("fd00::/64")}}.Validate()
	for _, want := range []string{"excludeCIDRs[0]: \"10.0.0.1/8\" has host bits set (did you mean 10.0.0.0/8?)", "excludeCIDRs[1]: fd00::/64 is not IPv4"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want %q", err, want)
		}
	}
}

// Without vpcCIDRs in the file the table waits for the provider's: Sync
// and AddPod write nothing (masquerading with an empty vpc set would hide
// pods from their own VPC), and once SetVPC gave the CIDRs Sync writes
// them.
func TestWaitsForTheProvidersVPC(t *testing.T) {
	ns := scratchNS(t)
	ctx := context.Background()
	pod := netip.MustParseAddr("10.30.0.7")
	var n *NAT
	err := netnsutil.Do(netnsutil.Path(ns), func() error {
		var err error
		if n, err = Open(Config{}); err != nil {
			return err
		}
		if !n.WaitingForVPC() {
			t.Error("a table without vpcCIDRs does not wait for the provider's")
		}
		if fixed, err := n.Sync(ctx, []netip.Addr{pod}); err != nil || fixed != "" {
			t.Errorf("Sync while waiting: %q, %v", fixed, err)
		}
		return n.AddPod(ctx, pod)
	})
	if err != nil {
		t.Fatal(err)
	}
	if out := nft(t, ns, "list", "tables"); strings.Contains(out, Table) {
		t.Errorf("a table was written while waiting for the VPC's CIDRs: %s", out)
	}
	n.SetVPC([]netip.Prefix{netip.MustParsePrefix("10.30.0.0/16"), netip.MustParsePrefix("100.64.0.0/16")})
	n.SetVPC([]netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}) // the first report stands
	err = netnsutil.Do(netnsutil.Path(ns), func() error {
		_, err := n.Sync(ctx, []netip.Addr{pod})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	out := nft(t, ns, "list", "table", "ip", Table)
	for _, want := range []string{"10.30.0.7", "10.30.0.0/16", "100.64.0.0/16"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "192.0.2.0/24") {
		t.Errorf("a later SetVPC replaced the first:\n%s", out)
	}
}

// lockedBuf is an io.Writer the test reads while a child writes to it.
type lockedBuf struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
