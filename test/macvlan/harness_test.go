// Package macvlan drives the built vpcni plugin through libcni against a
// vpcnid in datapath mode macvlan (and ipvlan, where the kernel has it),
// in a testbed of namespaces (segment, node, neighbour host), and checks
// the end state in the kernel: links, routes, nftables, reachability.
// Root only.
package macvlan

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/macvlan"
	"github.com/vpcni/vpcni/internal/datapath/svcpath"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

var binDir string

// versions are the CNI spec versions every lifecycle test runs with (the
// plugin refuses 0.3.1: TestMacvlanLifecycle/0.3.1 proves it).
var versions = []string{"0.4.0", "1.0.0", "1.1.0"}

// serviceCIDR is the Service range the agent routes through the node.
const serviceCIDR = "10.96.0.0/12"

func TestMain(m *testing.M) {
	testbed.RequireRoot("macvlan/ipvlan datapath tests (network namespaces)")
	dir, err := testbed.Binaries()
	if err != nil {
		fmt.Println("vpcni-test:", err)
		os.Exit(1)
	}
	binDir = dir
	os.Exit(m.Run())
}

// env is one node testbed (segment 10.79.0.0/24: gateway .1, node .10,
// neighbour .20) with vpcnid in an L2 mode over a static pool of .64-.254.
type env struct {
	*bedtest.Env
}

func newEnv(t *testing.T, mode macvlan.Kind) *env {
	t.Helper()
	e := &env{bedtest.New(t, binDir, "vpcnim", "10.79.0.0/24", "10.79.0.0/26")}
	e.Cfg.Datapath = config.Datapath{Mode: string(mode), Settings: &macvlan.Settings{Settings: svcpath.Settings{ServiceCIDRs: []string{serviceCIDR}}}}
	e.StartAgent()
	return e
}

// cni loads a conflist with vpcni alone, a result cache per version.
func (e *env) cni(version string) *testbed.CNI {
	e.T.Helper()
	return e.CNI("vpcni-test", "cni-cache-"+version, version)
}

// nodeState is what vpcni owns in the node namespace, per pod: service
// veths (by name or alias) and vpcni's routes of both families. The NAT table is the
// node's, not a pod's: it stays.
type nodeState struct {
	Links  []string
	Routes []string
}

func (s nodeState) empty() bool { return len(s.Links)+len(s.Routes) == 0 }

func (e *env) node() nodeState {
	e.T.Helper()
	h := bedtest.HandleIn(e.T, netnsutil.Path(e.TB.NodeNS()))
	return bedtest.Retry(e.T, func() (nodeState, error) {
		var s nodeState
		links, err := h.LinkList()
		if err != nil {
			return s, err
		}
		for _, l := range links {
			if strings.HasPrefix(l.Attrs().Alias, datapath.AliasPrefix) || strings.HasPrefix(l.Attrs().Name, svcpath.HostPrefix) {
				s.Links = append(s.Links, l.Attrs().Name)
			}
		}
		routes, err := h.RouteListFiltered(netlink.FAMILY_ALL, &netlink.Route{Protocol: svcpath.RouteProtocol}, netlink.RT_FILTER_PROTOCOL)
		if err != nil {
			return s, err
		}
		for _, r := range routes {
			s.Routes = append(s.Routes, r.Dst.String())
		}
		return s, nil
	})
}

// podLinks names the pod's links other than lo.
func podLinks(t *testing.T, path string) []string {
	t.Helper()
	links, err := bedtest.HandleIn(t, path).LinkList()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().Name != "lo" {
			out = append(out, l.Attrs().Name)
		}
	}
	return out
}

// ipvlanMissing says why this kernel cannot make an ipvlan link ("" when it
// can), found by trying in a scratch namespace of the test's own.
func ipvlanMissing(t *testing.T) string {
	t.Helper()
	ns := fmt.Sprintf("vpcni-ipvt%d", os.Getpid())
	if err := netnsutil.Add(ns); err != nil {
		t.Fatal(err)
	}
	defer netnsutil.Delete(ns)
	if err := netnsutil.Exec(ns, "ip", "link", "add", "p0", "type", "veth", "peer", "name", "p1"); err != nil {
		t.Fatal(err)
	}
	if out, err := netnsutil.Output(ns, "ip", "link", "add", "link", "p0", "name", "iv0", "type", "ipvlan", "mode", "l2"); err != nil {
		return fmt.Sprintf("%v: %s", err, strings.TrimSpace(out))
	}
	return ""
}
