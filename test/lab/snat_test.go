package lab

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/snat"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// TestSNAT: with snat.enabled the external host (outside the VPC, behind a
// router that does not SNAT) sees a pod's connection come from the pod's
// node; without it, from the pod's own address. Traffic inside the VPC
// keeps the pod's address either way. A hand-flushed chain is put back;
// switching SNAT off, and `vpcnictl uninstall-cni`, leave no table behind.
func TestSNAT(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := labUp(t, c, "s", 2, "10.93.0.0/24")
	on := config.Config{}.SNAT
	enabled := true
	on.Enabled = &enabled
	on.VPCCIDRs = []netip.Prefix{netip.MustParsePrefix("10.93.0.0/16")}
	on.ExcludeCIDRs = []netip.Prefix{netip.MustParsePrefix("198.51.100.0/24")}
	nodes := startAgents(t, l, "1.0.0", func(cfg *config.Config) {
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID}}
		if cfg.NodeName == "n1" {
			cfg.SNAT = on
			cfg.LogLevel = "debug" // each reconcile is logged: counted below
		}
	})
	pods := []labPod{addPod(t, c, l, nodes[0], "0"), addPod(t, c, l, nodes[1], "1")}
	external := netnsutil.Path(l.External.NS)
	legacy := netnsutil.Path(l.Legacy.NS)
	serveWho(t, external, l.External.IP)
	serveWho(t, legacy, l.Legacy.IP)

	expectSource(t, c, "pod on n1 (SNAT on) -> external", pods[0].ns, l.External.IP, l.Nodes[0].IP)
	expectSource(t, c, "pod on n2 (SNAT off) -> external", pods[1].ns, l.External.IP, pods[1].ip)
	expectSource(t, c, "pod on n1 (SNAT on) -> legacy VM in the VPC", pods[0].ns, l.Legacy.IP, pods[0].ip)
	// The node's own traffic is not the table's business (its source is
	// its own address anyway; the rule matches pod sources only).
	expectSource(t, c, "node n1 -> external", netnsutil.Path(l.Nodes[0].NS), l.External.IP, l.Nodes[0].IP)

	table := func(n int) string {
		out, err := netnsutil.Output(l.Nodes[n].NS, "nft", "list", "table", "ip", snat.Table)
		if err != nil && strings.Contains(out+err.Error(), "No such file") {
			return "" // no table
		}
		if err != nil {
			t.Fatalf("nft list table on %s: %v %s", l.Nodes[n].Name, err, out)
		}
		return out
	}
	if out := table(0); !strings.Contains(out, pods[0].ip.String()) || !strings.Contains(out, "10.93.0.0/16") || !strings.Contains(out, "198.51.100.0/24") || !strings.Contains(out, "@exclude masquerade") {
		t.Errorf("n1's table lacks the pod, the VPC, the exclusion or the masquerade:\n%s", out)
	}
	if out := table(1); out != "" {
		t.Errorf("n2 (SNAT off) has a table:\n%s", out)
	}
	// vpcnictl trace shows the pod in the SNAT table on n1, and no SNAT
	// piece on n2 (SNAT off there).
	for i, want := range []bool{true, false} {
		tr, err := traceOf(t, nodes[i], "default/"+pods[i].id)
		if err != nil || !tr.OK() {
			t.Fatalf("trace of the pod on %s: %v %+v", l.Nodes[i].Name, err, tr)
		}
		has := slices.ContainsFunc(tr.Attachments[0].Hops, func(h api.Hop) bool {
			return strings.HasPrefix(h.What, "SNAT: "+pods[i].ip.String()+" in nftables set ip "+snat.Table+" pods") && h.State == api.HopOK
		})
		if has != want {
			t.Errorf("trace of the pod on %s: SNAT piece %v, want %v: %+v", l.Nodes[i].Name, has, want, tr.Attachments[0].Hops)
		}
	}
	// The agent logs each node reconcile (debug): counted below.
	reconciles := func() int {
		data, err := os.ReadFile(nodes[0].agent.LogPath)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Count(string(data), `msg="node reconciled"`)
	}
	beforeFlush := reconciles()
	// Self-healing: the chain flushed by hand is put back by the agent's
	// next reconcile (the kernel watch sees a rule deleted from a vpcni
	// table; selfHeal.period catches it otherwise).
	if err := netnsutil.Exec(l.Nodes[0].NS, "nft", "flush", "chain", "ip", snat.Table, "postrouting"); err != nil {
		t.Fatal(err)
	}
	flushed := time.Now()
	waitFor(t, c, "n1's SNAT rule back after a hand flush", func() bool { return strings.Contains(table(0), "@exclude masquerade") })
	t.Logf("SNAT rule flushed by hand was back after %s", time.Since(flushed).Round(time.Millisecond))
	expectSource(t, c, "pod on n1 after the repair", pods[0].ns, l.External.IP, l.Nodes[0].IP)
	if reconciles() == beforeFlush {
		t.Fatal("no reconcile logged for the repair: the count below would prove nothing")
	}
	// Idle, the agent does not reconcile over and over: its own table
	// writes must not look like damage to its kernel watch.
	before := reconciles()
	time.Sleep(2 * time.Second)
	if n := reconciles() - before; n > 1 {
		t.Errorf("n1 reconciled %d times in 2 idle seconds: its SNAT writes kick its own kernel watch", n)
	}
	// A restart keeps it (the table is written before the socket serves).
	nodes[0].restart(t)
	expectSource(t, c, "pod on n1 after a restart", pods[0].ns, l.External.IP, l.Nodes[0].IP)

	// SNAT switched off: the agent removes its table at start.
	if err := nodes[0].agent.Stop(); err != nil {
		t.Fatal(err)
	}
	nodes[0].cfg.SNAT = config.Config{}.SNAT
	nodes[0].start(t)
	if err := nodes[0].agent.WaitReady(30 * time.Second); err != nil {
		t.Fatal(err)
	}
	if out := table(0); out != "" {
		t.Errorf("n1 restarted with SNAT off still has the table:\n%s", out)
	}
	expectSource(t, c, "pod on n1 after SNAT was switched off", pods[0].ns, l.External.IP, pods[0].ip)

	// On again, then uninstalled: nothing of vpcni's in nftables after.
	if err := nodes[0].agent.Stop(); err != nil {
		t.Fatal(err)
	}
	nodes[0].cfg.SNAT = on
	nodes[0].start(t)
	waitFor(t, c, "n1's table back with SNAT on", func() bool { return strings.Contains(table(0), "@exclude masquerade") })
	if err := nodes[0].agent.Stop(); err != nil {
		t.Fatal(err)
	}
	cniDir := t.TempDir()
	cmd := exec.CommandContext(c, "ip", "netns", "exec", l.Nodes[0].NS, filepath.Join(binDir, "vpcnictl"), "uninstall-cni",
		"--bin-dir", cniDir, "--conf-dir", cniDir, "--agent-config", nodes[0].agent.ConfigPath)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("uninstall-cni: %v\n%s", err, out)
	}
	if out := bedtest.Sh(t, l.Nodes[0].NS, "nft", "list", "ruleset"); strings.Contains(out, snat.Table) {
		t.Errorf("uninstall-cni left vpcni's table:\n%s", out)
	}
}

// serveWho answers every TCP connection on ip:7778 with the address the
// connection came from, until the test ends.
func serveWho(t *testing.T, ns string, ip netip.Addr) {
	t.Helper()
	ln, err := netnsutil.Listen(ns, testbed.HostPort(ip, 7778))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintf(conn, "%s\n", conn.RemoteAddr().(*net.TCPAddr).IP)
			conn.Close()
		}
	}()
}

// expectSource connects from a namespace to a serveWho server and checks
// the source address it saw.
func expectSource(t *testing.T, c context.Context, what, from string, to, want netip.Addr) {
	t.Helper()
	dc, cancel := context.WithTimeout(c, 3*time.Second)
	defer cancel()
	var conn net.Conn
	err := netnsutil.Do(from, func() (err error) {
		var d net.Dialer
		conn, err = d.DialContext(dc, "tcp4", testbed.HostPort(to, 7778))
		return err
	})
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(3 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		t.Errorf("%s: %v", what, err)
		return
	}
	if got := strings.TrimSpace(line); got != want.String() {
		t.Errorf("%s: seen from %s, want %s", what, got, want)
	}
}

// waitFor polls cond until it holds, failing the test at the context's end.
func waitFor(t *testing.T, c context.Context, what string, cond func() bool) {
	t.Helper()
	for !cond() {
		select {
		case <-c.Done():
			t.Fatalf("timed out waiting for %s", what)
		case <-time.After(100 * time.Millisecond):
		}
	}
}
