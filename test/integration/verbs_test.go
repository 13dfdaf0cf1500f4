package integration

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// TestGC: the plugin's GC verb (spec 1.1.0) frees every allocation of the
// network the runtime no longer lists. The runtime's cache is empty here,
// so libcni cannot DEL them itself: only vpcni's GC can free them.
func TestGC(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.cni("1.1.0")
	var ips []netip.Addr
	for i := range 3 {
		ips = append(ips, e.AddIP(c, fmt.Sprintf("gc-%d", i), e.Pod(i)))
	}
	// Another network's allocation is not GC's business.
	other, err := e.TB.NewCNI([]string{binDir}, filepath.Join(e.Dir, "other-cache"),
		testbed.VpcniConfList("1.1.0", "other-net", e.Cfg.SocketPath))
	if err != nil {
		t.Fatal(err)
	}
	otherIP := e.AddIP(other, "gc-other", e.Pod(9))

	fresh, err := e.TB.NewCNI([]string{binDir}, filepath.Join(e.Dir, "empty-cache"),
		testbed.VpcniConfList("1.1.0", "vpcni-test", e.Cfg.SocketPath))
	if err != nil {
		t.Fatal(err)
	}
	if err := fresh.GC(bedtest.Ctx(t), []types.GCAttachment{{ContainerID: "gc-0", IfName: "eth0"}}); err != nil {
		t.Fatalf("GC: %v", err)
	}
	st := e.state()
	got := map[string]string{}
	for _, a := range st.Allocations {
		got[a.ContainerID] = a.Address.String()
	}
	want := map[string]string{"gc-0": ips[0].String(), "gc-other": otherIP.String()}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("after GC the agent holds %v, want %v", got, want)
	}
	bedtest.WaitFor(t, 10*time.Second, "GC'd links to go", func() bool {
		ks := e.kernel()
		return len(ks.Links) == 2 && len(ks.Routes) == 2 && len(ks.Proxies) == 2
	})
	for _, id := range []string{"gc-1", "gc-2"} {
		if err := bedtest.NoLink(e.node(), veth.HostIfName(id, "eth0")); err != nil {
			t.Errorf("host link of GC'd %s: %v", id, err)
		}
	}
}

// TestStatus: STATUS (spec 1.1.0) says ready while an address can be had,
// and "not available" (50) with the reason once none can.
func TestStatus(t *testing.T) {
	t.Parallel()
	// 10.78.0.48/29: .49 is the range's gateway, so .50-.54: 5 addresses.
	e := newEnv(t, withRange("10.78.0.48/29"), withPool(2, 2))
	c := e.cni("1.1.0")
	if err := c.Status(bedtest.Ctx(t)); err != nil {
		t.Fatalf("STATUS on a fresh node: %v", err)
	}
	for i := range 5 {
		e.AddIP(c, fmt.Sprintf("st-%d", i), e.Pod(i))
	}
	err := c.Status(bedtest.Ctx(t))
	if !bedtest.IsCode(err, 50) || !strings.Contains(err.Error(), "no free address and none obtainable") {
		t.Fatalf("STATUS with the pool used up: %v, want code 50 and the reason", err)
	}
	// The exhausted ADD is "try again later" and leaves nothing behind.
	_, err = c.Add(bedtest.Ctx(t), testbed.Runtime("st-5", e.Pod(5), "eth0", nil))
	if !bedtest.IsCode(err, 11) || !strings.Contains(err.Error(), "no free address") {
		t.Fatalf("ADD on an exhausted pool: %v, want code 11", err)
	}
	if st := e.state(); len(st.Allocations) != 5 || st.Pool.Allocated != 5 || st.Pool.Free != 0 {
		t.Fatalf("after the failed ADD: %d records, pool %+v", len(st.Allocations), st.Pool)
	}
	if err := bedtest.NoLink(bedtest.HandleIn(t, netnsutil.Path(e.TB.PodNS(5))), "eth0"); err != nil {
		t.Fatalf("eth0 in the pod after the failed ADD: %v", err)
	}
	if err := c.Del(bedtest.Ctx(t), testbed.Runtime("st-0", e.TB.PodNS(0), "eth0", nil)); err != nil {
		t.Fatal(err)
	}
	if err := c.Status(bedtest.Ctx(t)); err != nil {
		t.Fatalf("STATUS after a DEL freed an address: %v", err)
	}
	// The agent gone: STATUS says try again later.
	if err := e.Agent.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := c.Status(bedtest.Ctx(t)); !bedtest.IsCode(err, 11) {
		t.Fatalf("STATUS with the agent down: %v, want code 11", err)
	}
}

// TestChainPortmapBandwidth: the real portmap and bandwidth plugins chained
// after vpcni get a correct prevResult: a hostPort on the node reaches the
// pod, and the bandwidth limits land on vpcni's host veth. Debian's plugins
// for the versions they speak (up to 1.0.0), upstream's built from the Go
// module proxy by make deps for 1.1.0.
func TestChainPortmapBandwidth(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	debian := debianMaxVersion(t, testbed.DebianCNIDir)
	for _, v := range versions {
		t.Run(v, func(t *testing.T) {
			dir := testbed.DebianCNIDir
			if v > debian {
				dir = upstreamCNIDir
				if _, err := os.Stat(filepath.Join(dir, "portmap")); err != nil {
					t.Fatalf("upstream plugins missing in %s (run make deps): %v", dir, err)
				}
			}
			t.Logf("chaining %s/portmap and %s/bandwidth at %s", dir, dir, v)
			plugins := []map[string]any{
				{"type": "portmap", "capabilities": map[string]bool{"portMappings": true}, "snat": true},
				{"type": "bandwidth", "capabilities": map[string]bool{"bandwidth": true}},
			}
			c, err := e.TB.NewCNI([]string{binDir, dir}, filepath.Join(e.Dir, "cni-cache"),
				testbed.VpcniConfList(v, "vpcni-test", e.Cfg.SocketPath, plugins...))
			if err != nil {
				t.Fatal(err)
			}
			podNS := e.Pod(1)
			defer netnsutil.Delete(e.TB.PodNS(1))
			id := "chain-" + strings.ReplaceAll(v, ".", "")
			rt := testbed.Runtime(id, podNS, "eth0", map[string]any{
				"portMappings": []map[string]any{{"hostPort": 18080, "containerPort": 7777, "protocol": "tcp"}},
				"bandwidth":    map[string]any{"ingressRate": 8_000_000, "ingressBurst": 1_000_000, "egressRate": 8_000_000, "egressBurst": 1_000_000},
			})
			res, err := c.Add(bedtest.Ctx(t), rt)
			if err != nil {
				t.Fatalf("ADD through vpcni+portmap+bandwidth: %v", err)
			}
			ip := bedtest.ResultIP(t, res)
			r, _ := types100.GetResult(res)
			hostIf := veth.HostIfName(id, "eth0")
			if len(r.Interfaces) < 2 || r.Interfaces[0].Name != hostIf || r.Interfaces[1].Sandbox != podNS {
				t.Fatalf("chained result lost vpcni's interfaces: %+v", r.Interfaces)
			}
			bedtest.Echo(t, podNS, ip)
			bedtest.Reach(t, netnsutil.Path(e.TB.NbrNS()), testbed.HostPort(e.TB.NodeIP, 18080))
			qd, _ := netnsutil.Output(e.TB.NodeNS(), "tc", "qdisc", "show", "dev", hostIf)
			if !strings.Contains(qd, "tbf") {
				t.Errorf("no bandwidth limit on %s: %s", hostIf, qd)
			}
			if err := c.Check(bedtest.Ctx(t), rt); err != nil {
				if dir == testbed.DebianCNIDir && strings.Contains(err.Error(), "could not check ipv6 dnat") {
					// Debian's portmap 1.1.1 checks an IPv6 chain it never
					// made for an IPv4-only pod (fixed upstream): the rest of
					// the chain is checked without it.
					t.Logf("vpcni-test: Debian portmap CHECK bug (%v); checking vpcni+bandwidth", err)
					c2, err := e.TB.NewCNI([]string{binDir, dir}, filepath.Join(e.Dir, "cni-cache"),
						testbed.VpcniConfList(v, "vpcni-test", e.Cfg.SocketPath, plugins[1]))
					if err != nil {
						t.Fatal(err)
					}
					if err := c2.Check(bedtest.Ctx(t), rt); err != nil {
						t.Errorf("CHECK of vpcni+bandwidth: %v", err)
					}
				} else {
					t.Errorf("CHECK of the chain: %v", err)
				}
			}
			if err := c.Del(bedtest.Ctx(t), rt); err != nil {
				t.Fatalf("DEL: %v", err)
			}
			e.waitClean()
			nat := bedtest.Sh(t, e.TB.NodeNS(), "iptables-save", "-t", "nat")
			nft := bedtest.Sh(t, e.TB.NodeNS(), "nft", "list", "ruleset")
			if strings.Contains(nat+nft, "18080") {
				t.Errorf("portmap rules survived DEL:\n%s\n%s", nat, nft)
			}
		})
	}
}

// upstreamCNIDir holds the upstream plugins make deps builds.
const upstreamCNIDir = "/usr/local/lib/vpcni/cni-upstream"

// debianMaxVersion asks a Debian plugin which CNI versions it speaks.
func debianMaxVersion(t *testing.T, dir string) string {
	t.Helper()
	plugin := "portmap"
	cmd := exec.Command(filepath.Join(dir, plugin))
	cmd.Env = []string{"CNI_COMMAND=VERSION"}
	cmd.Stdin = strings.NewReader(`{"cniVersion":"1.0.0"}`)
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s VERSION: %v", plugin, err)
	}
	var info struct {
		Supported []string `json:"supportedVersions"`
	}
	if err := json.Unmarshal(out, &info); err != nil || len(info.Supported) == 0 {
		t.Fatalf("%s VERSION: %s", plugin, out)
	}
	return info.Supported[len(info.Supported)-1]
}

// TestNodeSettings: the uplink defaults to the default route's interface,
// the pod MTU follows the uplink unless configured, and the agent's socket
// is root-only.
func TestNodeSettings(t *testing.T) {
	t.Parallel()
	for _, mtu := range []int{0, 1400} {
		t.Run(fmt.Sprintf("mtu=%d", mtu), func(t *testing.T) {
			e := newEnv(t, func(c *config.Config) { c.MTU = mtu })
			st := e.state()
			want := mtu
			if want == 0 {
				want = 1500 // the testbed uplink's
			}
			if st.Uplink != "eth0" || st.MTU != want {
				t.Fatalf("agent uplink %q mtu %d, want eth0 (the default route's) and %d", st.Uplink, st.MTU, want)
			}
			fi, err := os.Stat(e.Cfg.SocketPath)
			if err != nil || fi.Mode().Perm() != 0o600 || fi.Mode()&os.ModeSocket == 0 {
				t.Fatalf("socket %s: %v mode %v, want a socket with mode 0600", e.Cfg.SocketPath, err, fi.Mode())
			}
			c := e.cni("1.0.0")
			podNS := e.Pod(1)
			e.AddIP(c, "mtu", podNS)
			podLink, err := bedtest.HandleIn(t, podNS).LinkByName("eth0")
			if err != nil {
				t.Fatal(err)
			}
			hostLink, err := e.node().LinkByName(veth.HostIfName("mtu", "eth0"))
			if err != nil {
				t.Fatal(err)
			}
			if podLink.Attrs().MTU != want || hostLink.Attrs().MTU != want {
				t.Errorf("pod MTU %d, host MTU %d, want %d", podLink.Attrs().MTU, hostLink.Attrs().MTU, want)
			}
		})
	}
}

// TestMetrics: the agent's Prometheus endpoint, on the node's own address
// as the DaemonSet serves it, answers a scrape from another host of the
// segment (the neighbour), as Prometheus scrapes it; it shows the pool by
// state, its capacity, the allocations and the CNI request latency.
func TestMetrics(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *config.Config) { c.MetricsAddr = "10.78.0.10:9695" }) // the node, .10
	if e.Cfg.MetricsAddr != e.TB.NodeIP.String()+":9695" {
		t.Fatalf("the testbed's node is %s, the test serves metrics on %s", e.TB.NodeIP, e.Cfg.MetricsAddr)
	}
	c := e.cni("1.0.0")
	e.AddIP(c, "metrics", e.Pod(1))
	var body string
	err := netnsutil.Do(netnsutil.Path(e.TB.NbrNS()), func() error {
		conn, err := net.Dial("tcp4", e.Cfg.MetricsAddr)
		if err != nil {
			return err
		}
		defer conn.Close()
		_, _ = io.WriteString(conn, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n")
		b, err := io.ReadAll(conn)
		body = string(b)
		return err
	})
	if err != nil {
		t.Fatalf("scrape %s from the neighbour: %v", e.Cfg.MetricsAddr, err)
	}
	capacity := e.state().Pool.Capacity
	if capacity <= 0 {
		t.Fatalf("the static provider reports capacity %d, want its pool's size", capacity)
	}
	for _, want := range []string{
		`vpcni_pool_addresses{state="allocated"} 1`,
		fmt.Sprintf("vpcni_pool_capacity %d\n", capacity),
		`vpcni_allocations 1`,
		`vpcni_degraded 0`,
		`vpcni_cni_request_duration_seconds_count{result="ok",verb="ADD"} 1`,
		`vpcni_cloud_calls_total{op="assign",result="ok"}`,
		`vpcni_cloud_calls_total{op="held",result="ok"} 1`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", body)
	}
}
