package lab

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/cluster"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/routes"
	"github.com/vpcni/vpcni/internal/testbed"
)

// The routed pod subnet carries traffic: pods on a CIDR of their own
// (10.77.0.0/16, not the VM subnet), each node's pods from its block (the
// static provider over that block, veth datapath). With the router's
// extra route and the VM port's pair that routes.Reconciler sets, the
// legacy VM reaches each pod through the lab's router namespace and the
// pod answers through port security; without them it does not (the route
// alone is not enough: port security drops the pod's answers).
func TestRoutedPodSubnet(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := labUp(t, c, "rt", 2, "10.90.0.0/24")
	block := map[string]netip.Prefix{"n1": netip.MustParsePrefix("10.77.0.0/26"), "n2": netip.MustParsePrefix("10.77.0.64/26")}
	nodes := startAgents(t, l, "1.0.0", func(cfg *config.Config) {
		cfg.Provider = config.Provider{Type: "static", Settings: &static.Config{Ranges: []static.Range{{CIDR: block[cfg.NodeName].String()}}}}
	})
	pods := []labPod{addPod(t, c, l, nodes[0], "0"), addPod(t, c, l, nodes[1], "1")}
	for i, p := range pods {
		if b := block[l.Nodes[i].Name]; !b.Contains(p.ip) {
			t.Fatalf("pod on %s got %s, outside its block %s", l.Nodes[i].Name, p.ip, b)
		}
	}
	legacy := netnsutil.Path(l.Legacy.NS)
	unreachable := func(why string) {
		t.Helper()
		for _, p := range pods {
			if err := probe(c, legacy, testbed.HostPort(p.ip, 7777)); err == nil {
				t.Fatalf("legacy VM reaches pod %s %s", p.ip, why)
			}
		}
	}
	unreachable("with no route on the router")

	nc := openstack.NoAuthClient(l.URL, http.Client{Timeout: 30 * time.Second})
	rec, err := routes.New(cluster.NewRoutes(nc, l.RouterID, l.SubnetID, 10), routes.Options{Ranges: []netip.Prefix{netip.MustParsePrefix("10.77.0.0/16")},
		MaxPairs: 10}, slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []routes.Block
	for _, h := range l.Nodes {
		blocks = append(blocks, routes.Block{Name: h.Name, CIDR: block[h.Name], Node: h.Name, NodeIP: h.IP})
	}
	res, err := rec.Sync(c, blocks)
	if err != nil {
		t.Fatal(err)
	}
	if res.Routes != 2 {
		t.Fatalf("%d routes, want 2: %+v", res.Routes, res)
	}
	if err := l.FabricErr(); err != nil {
		t.Fatalf("fabric: %v", err)
	}
	out, _ := netnsutil.Output(l.Router.NS, "ip", "route")
	for _, h := range l.Nodes {
		if !strings.Contains(out, block[h.Name].String()+" via "+h.IP.String()) {
			t.Fatalf("the router namespace lacks the route of %s:\n%s", block[h.Name], out)
		}
	}
	serveEcho(t, legacy, l.Legacy.IP)
	var paths []reachable
	for _, p := range pods {
		paths = append(paths,
			reachable{fmt.Sprintf("legacy VM -> pod %s via the router", p.ip), legacy, p.ip},
			reachable{fmt.Sprintf("pod %s -> legacy VM", p.ip), p.ns, l.Legacy.IP})
	}
	expectReach(t, c, append(paths,
		reachable{"pod on n1 -> pod on n2", pods[0].ns, pods[1].ip},
		reachable{"pod on n2 -> pod on n1", pods[1].ns, pods[0].ip}))
	if t.Failed() {
		t.FailNow()
	}

	// The pair taken off n1's port by hand: the route alone does not do.
	updatePort(t, l, l.Nodes[0].PortID, func(*ports.Port) ports.UpdateOpts {
		return ports.UpdateOpts{AllowedAddressPairs: &[]ports.AddressPair{}}
	})
	if err := probe(c, legacy, testbed.HostPort(pods[0].ip, 7777)); err == nil {
		t.Fatalf("legacy VM reaches %s without the block's pair on n1's port: port security is not enforced", pods[0].ip)
	}
	// The next pass puts it back.
	if _, err := rec.Sync(c, blocks); err != nil {
		t.Fatal(err)
	}
	expectReach(t, c, paths[:1])
}
