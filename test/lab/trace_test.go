package lab

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/cluster"
)

// TestTraceNamesEachPlantedFault: vpcnictl trace on a lab node shows every
// piece of a pod's path ok; then, one planted fault at a time — the node's
// route to the pod deleted, its proxy ARP entry deleted, the pod's default
// route deleted, the address taken off the VM port by hand — it names the
// piece, says missing, gives the fix and exits 1. The agent's self-healing
// and resync are off, so each fault stays until the trace has seen it.
func TestTraceNamesEachPlantedFault(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := labUp(t, c, "tr", 1, "10.93.0.0/24")
	nodes := startAgents(t, l, "1.1.0", func(cfg *config.Config) {
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID}}
		off := false
		cfg.SelfHeal.Watch, cfg.SelfHeal.Period.Duration = &off, 24*time.Hour
		cfg.Resync.Duration, cfg.Health.Interval.Duration = 24*time.Hour, 0
	})
	n := nodes[0]
	p := addPod(t, c, l, n, "tr")
	pod := "default/" + p.id
	hostIf := veth.HostIfName(p.id, "eth0")

	tr, err := traceOf(t, n, pod)
	if err != nil || !tr.OK() {
		t.Fatalf("trace of a healthy pod: %v\n%+v", err, tr)
	}
	if len(tr.Attachments) != 1 || tr.Attachments[0].Address != p.ip.String() {
		t.Fatalf("trace names %+v, want one attachment with %s", tr.Attachments, p.ip)
	}
	var wheres []string
	for _, h := range tr.Attachments[0].Hops {
		wheres = append(wheres, h.Where+": "+h.What)
	}
	t.Logf("vpcni-test: the pieces of a healthy pod's path:\n  %s", strings.Join(wheres, "\n  "))
	var uplink string
	for _, h := range tr.Attachments[0].Hops {
		if rest, ok := strings.CutPrefix(h.What, "proxy ARP entry "+p.ip.String()+" on "); ok {
			uplink = rest
		}
	}
	if uplink == "" {
		t.Fatal("no proxy ARP entry in the trace of a veth pod")
	}
	// The controller's side, with its cloud file: a floating IP of the pod.
	cloudCfg := filepath.Join(t.TempDir(), "cloud.yaml")
	if err := os.WriteFile(cloudCfg, fmt.Appendf(nil, "openstack:\n  endpoint: %s\n  subnetID: %s\n", l.URL, l.SubnetID), 0o600); err != nil {
		t.Fatal(err)
	}
	fc := &cluster.FloatingIPs{NC: openstack.NoAuthClient(l.URL, http.Client{Timeout: 10 * time.Second}), Timeout: 10 * time.Second}
	fip, err := fc.Ensure(c, floatingip.Want{Owner: pod, Network: l.Prefix + "-external", Policy: floatingip.Release, PortID: l.Nodes[0].PortID, FixedIP: p.ip})
	if err != nil {
		t.Fatal(err)
	}
	withCloud, err := traceOf(t, n, pod, "--cloud-config", cloudCfg)
	if err != nil || !withCloud.OK() {
		t.Fatalf("trace with the cloud file: %v\n%+v", err, withCloud)
	}
	if !slices.ContainsFunc(withCloud.Attachments[0].Hops, func(h api.Hop) bool {
		return h.Where == api.HopCloud && strings.HasPrefix(h.What, "floating IP "+fip.Address+" -> "+p.ip.String())
	}) {
		t.Errorf("no hop for floating IP %s in %+v", fip.Address, withCloud.Attachments[0].Hops)
	}
	if _, err := fc.Detach(c, pod, nil); err != nil {
		t.Fatal(err)
	}
	table := vpcnictl(t, "trace", pod, "--socket", n.cfg.SocketPath)
	if !strings.Contains(table, "proxy ARP entry "+p.ip.String()) || !strings.Contains(table, "WHERE") {
		t.Errorf("trace table without its pieces:\n%s", table)
	}

	// One fault at a time, each repaired before the next: the trace names
	// exactly the planted piece.
	for _, fault := range []struct {
		name          string
		plant, repair func()
		piece         string // the start of the hop's What
		where         string
	}{
		{"node route deleted",
			func() { mustRun(t, l.Nodes[0].NS, "ip", "route", "del", p.ip.String()+"/32", "dev", hostIf) },
			func() { mustRun(t, l.Nodes[0].NS, "ip", "route", "add", p.ip.String()+"/32", "dev", hostIf) },
			"route " + p.ip.String() + "/32 dev " + hostIf, api.HopNode},
		{"proxy ARP entry deleted",
			func() { mustRun(t, l.Nodes[0].NS, "ip", "neigh", "del", "proxy", p.ip.String(), "dev", uplink) },
			func() { mustRun(t, l.Nodes[0].NS, "ip", "neigh", "add", "proxy", p.ip.String(), "dev", uplink) },
			"proxy ARP entry " + p.ip.String(), api.HopNode},
		{"pod default route deleted",
			func() { mustRun(t, p.name, "ip", "route", "del", "default") },
			func() {
				mustRun(t, p.name, "ip", "route", "add", "default", "via", veth.Gateway.String(), "dev", "eth0")
			},
			"default route via", api.HopPod},
		{"address off the VM port",
			func() { setOnPort(t, l, l.Nodes[0].PortID, p.ip, false) },
			func() { setOnPort(t, l, l.Nodes[0].PortID, p.ip, true) },
			p.ip.String() + " held by provider openstack", api.HopCloud},
	} {
		fault.plant()
		tr, err := traceOf(t, n, pod)
		if err == nil || tr.OK() {
			t.Errorf("%s: trace exited 0 / found every piece ok", fault.name)
		}
		var bad []api.Hop
		for _, h := range tr.Attachments[0].Hops {
			if h.State != api.HopOK {
				bad = append(bad, h)
			}
		}
		switch {
		case len(bad) != 1 || !strings.HasPrefix(bad[0].What, fault.piece):
			t.Errorf("%s: pieces not ok %+v, want only %q", fault.name, bad, fault.piece)
		case bad[0].State != api.HopMissing || bad[0].Where != fault.where || bad[0].Fix == "":
			t.Errorf("%s: %+v, want %s missing with a fix", fault.name, bad[0], fault.where)
		default:
			t.Logf("vpcni-test: %s: %s %s: %s; fix: %.80s…", fault.name, strings.ToUpper(bad[0].State), bad[0].What, bad[0].Detail, bad[0].Fix)
		}
		fault.repair()
		if tr, err := traceOf(t, n, pod); err != nil || !tr.OK() {
			t.Fatalf("%s repaired by hand: the trace still finds a piece not ok (%v): %+v", fault.name, err, tr.Attachments)
		}
	}

	// A pod the node does not have: a clear error, exit 1.
	cmd := exec.Command(filepath.Join(binDir, "vpcnictl"), "trace", "default/nobody", "--socket", n.cfg.SocketPath)
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 || !strings.Contains(string(out), "has no address for pod default/nobody") {
		t.Errorf("trace of an unknown pod: %v\n%s", err, out)
	}
}

// traceOf runs vpcnictl trace -o json; the error is its exit status.
func traceOf(t *testing.T, n *labNode, pod string, more ...string) (api.Trace, error) {
	t.Helper()
	var stderr strings.Builder
	cmd := exec.Command(filepath.Join(binDir, "vpcnictl"), append([]string{"trace", pod, "--socket", n.cfg.SocketPath, "-o", "json"}, more...)...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	var tr api.Trace
	if jerr := json.Unmarshal(out, &tr); jerr != nil {
		t.Fatalf("trace JSON: %v (exit: %v)\n%s%s", jerr, err, out, stderr.String())
	}
	return tr, err
}

func vpcnictl(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command(filepath.Join(binDir, "vpcnictl"), args...).CombinedOutput()
	if err != nil {
		t.Fatalf("vpcnictl %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func mustRun(t *testing.T, ns string, argv ...string) {
	t.Helper()
	if err := netnsutil.Exec(ns, argv...); err != nil {
		t.Fatalf("%s in %s: %v", strings.Join(argv, " "), ns, err)
	}
}
