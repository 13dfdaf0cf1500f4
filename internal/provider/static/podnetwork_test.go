package static_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/static"
)

// podNetwork connects PodNetwork name through the static registration, as
// the agent does, on a node whose own ranges are 10.9.0.0/24.
func podNetwork(t *testing.T, node provider.Node, name, spec string) (provider.Provider, error) {
	t.Helper()
	reg, err := provider.Lookup("static")
	if err != nil {
		t.Fatal(err)
	}
	if reg.Network == nil {
		t.Fatal("the static provider registers no Network")
	}
	s := &static.Config{Ranges: []static.Range{{CIDR: "10.9.0.0/24"}}}
	s.Defaults()
	if err := s.Validate(); err != nil {
		t.Fatal(err)
	}
	return reg.Network(context.Background(), node, s, name, json.RawMessage(spec))
}

// A PodNetwork's addresses come from its ranges only; the range holding
// the network's gateway hands it to the L2 modes in every lease (and never
// to a pod); another range uses its first address, as provider.static
// does. The network's state file is its own, and survives a restart.
func TestNetworkTakesFromItsRangesWithItsGateway(t *testing.T) {
	dir := t.TempDir()
	node := provider.Node{Name: "n1", StateDir: dir}
	spec := `{"ranges":["10.30.0.0/29","10.30.1.0/30"],"gateway":"10.30.0.6"}`
	p, err := podNetwork(t, node, "web", spec)
	if err != nil {
		t.Fatal(err)
	}
	// /29: .1-.5 (.0, .7 the subnet's own, .6 the gateway); /30: .2 (.1
	// its first address, the gateway).
	if info := p.Info(); info.Capacity != 6 || !strings.Contains(info.Subnet, "pod network web") || !strings.Contains(info.Subnet, "10.30.0.0/29 (gateway 10.30.0.6)") {
		t.Errorf("info %+v", info)
	}
	got, err := p.Assign(context.Background(), provider.AssignRequest{Count: 10})
	if len(got) != 6 || !errors.Is(err, provider.ErrExhausted) {
		t.Fatalf("got %v, %v; want the 6 usable addresses and ErrExhausted", got, err)
	}
	for _, l := range got {
		want := "10.30.0.6"
		if l.Prefix.String() == "10.30.1.0/30" {
			want = "10.30.1.1"
		}
		if l.Gateway.String() != want || !l.Prefix.Contains(l.Address) || l.Address == l.Gateway || l.NIC != nil {
			t.Errorf("lease %+v: want gateway %s inside its prefix, no NIC", l, want)
		}
	}
	if a := leased(t, got); !slices.Equal(a, addrs("10.30.0.1", "10.30.0.2", "10.30.0.3", "10.30.0.4", "10.30.0.5", "10.30.1.2")) {
		t.Errorf("addresses %v", a)
	}
	if err := p.Release(context.Background(), addrs("10.30.0.3")); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "podnetworks", "web", "static-provider.json")); err != nil {
		t.Errorf("no state file of its own: %v", err)
	}
	if _, err := os.Stat(filepath.Join(dir, "static-provider.json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the network wrote the default's state file: %v", err)
	}
	again, err := podNetwork(t, node, "web", spec)
	if err != nil {
		t.Fatalf("the same network again (a restart): %v", err)
	}
	h, err := again.Held(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if a := leased(t, h); !slices.Equal(a, addrs("10.30.0.1", "10.30.0.2", "10.30.0.4", "10.30.0.5", "10.30.1.2")) {
		t.Errorf("held after a restart %v", a)
	}
}

// The default network and two PodNetworks on one node keep apart: each
// holds only what it took, in its own file.
func TestNetworksAndTheDefaultKeepApart(t *testing.T) {
	dir := t.TempDir()
	node := provider.Node{Name: "n1", StateDir: dir}
	reg, _ := provider.Lookup("static")
	s := &static.Config{Ranges: []static.Range{{CIDR: "10.9.0.0/24"}}}
	s.Defaults()
	def, err := reg.New(context.Background(), node, s)
	if err != nil {
		t.Fatal(err)
	}
	web, err := podNetwork(t, node, "web", `{"ranges":["10.30.0.0/28"]}`)
	if err != nil {
		t.Fatal(err)
	}
	db, err := podNetwork(t, node, "db", `{"ranges":["10.31.0.0/28"]}`)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []provider.Provider{def, web, db} {
		if _, err := p.Assign(context.Background(), provider.AssignRequest{Count: 2}); err != nil {
			t.Fatal(err)
		}
	}
	if err := web.Release(context.Background(), addrs("10.30.0.2")); err != nil {
		t.Fatal(err)
	}
	for p, want := range map[provider.Provider][]string{def: {"10.9.0.2", "10.9.0.3"}, web: {"10.30.0.3"}, db: {"10.31.0.2", "10.31.0.3"}} {
		h, _ := p.Held(context.Background())
		if got := leased(t, h); !slices.Equal(got, addrs(want...)) {
			t.Errorf("%s holds %v, want %v", p.Info().Subnet, got, want)
		}
	}
	for _, f := range []string{"static-provider.json", "podnetworks/web/static-provider.json", "podnetworks/db/static-provider.json"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("state file %s: %v", f, err)
		}
	}
}

// A spec the node cannot serve is refused with every reason at once.
func TestNetworkSpecRejected(t *testing.T) {
	for _, c := range []struct {
		name, spec string
		want       []string
	}{
		{"web", `{"ranges":[]}`, []string{"static.ranges is empty"}},
		{"web", `{"ranges":["10.30.0.0/24"],"blocks":{}}`, []string{"unknown field", "blocks"}},
		{"web", `{"ranges":["10.30.0.0/33", "fd00::/48", "10.30.0.1/24"]}`, []string{
			`static.ranges[0]: "10.30.0.0/33" is not a CIDR`, `static.ranges[1]: "fd00::/48" is larger than a /64`, `static.ranges[2]: "10.30.0.1/24" has host bits set (did you mean 10.30.0.0/24?)`}},
		{"web", `{"ranges":["10.0.0.0/8"]}`, []string{"larger than a /16"}},
		{"web", `{"ranges":["10.30.0.0/24"],"gateway":"10.31.0.1"}`, []string{"static.gateway: 10.31.0.1 is in none of the ranges 10.30.0.0/24"}},
		{"web", `{"ranges":["10.30.0.0/24"],"gateway":"gw"}`, []string{`static.gateway: "gw" is not an IP address`}},
		{"web", `{"ranges":["10.30.0.0/24","10.30.0.128/25"]}`, []string{"static.ranges[1]: 10.30.0.128/25 overlaps static.ranges[0] 10.30.0.0/24"}},
		{"web", `{"ranges":["10.9.0.64/26"]}`, []string{"overlaps this node's provider.static.ranges[0] 10.9.0.0/24"}},
		{"../etc", `{"ranges":["10.30.0.0/24"]}`, []string{"not a Kubernetes object name"}},
	} {
		dir := t.TempDir()
		_, err := podNetwork(t, provider.Node{Name: "n1", StateDir: dir}, c.name, c.spec)
		if err == nil {
			t.Errorf("%s: accepted", c.spec)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v\nwant it to say %q", c.spec, err, w)
			}
		}
		if entries, _ := os.ReadDir(dir); len(entries) != 0 {
			t.Errorf("%s: refused, but wrote %d entries in the state dir", c.spec, len(entries))
		}
	}
}

// Two PodNetworks whose ranges overlap are never both served on a node:
// the second is refused, naming the first.
func TestNetworkOverlappingAServedOneRefused(t *testing.T) {
	node := provider.Node{Name: "n1", StateDir: t.TempDir()}
	if _, err := podNetwork(t, node, "web", `{"ranges":["10.30.0.0/24"]}`); err != nil {
		t.Fatal(err)
	}
	_, err := podNetwork(t, node, "db", `{"ranges":["10.32.0.0/24","10.30.0.128/25"]}`)
	if err == nil || !strings.Contains(err.Error(), "range 10.30.0.128/25 overlaps 10.30.0.0/24 of PodNetwork web") {
		t.Fatalf("overlapping network: %v", err)
	}
	// Another node (state dir) serves its own networks.
	if _, err := podNetwork(t, provider.Node{Name: "n2", StateDir: t.TempDir()}, "db", `{"ranges":["10.30.0.128/25"]}`); err != nil {
		t.Errorf("another node: %v", err)
	}
}

// The node's guard is armed on a PodNetwork as on the default: the
// uplink's own address is never handed out (lo here, probe off: no ARP
// socket, its addresses only).
func TestNetworkGuardKeepsTheNodesAddressOut(t *testing.T) {
	reg, _ := provider.Lookup("static")
	off := false
	s := &static.Config{Ranges: []static.Range{{CIDR: "10.9.0.0/24"}}, Probe: static.Probe{Enabled: &off}}
	s.Defaults()
	node := provider.Node{Name: "n1", StateDir: t.TempDir(), Uplink: "lo"}
	p, err := reg.Network(context.Background(), node, s, "web", json.RawMessage(`{"ranges":["127.0.0.0/29"],"gateway":"127.0.0.6"}`))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := p.Assign(context.Background(), provider.AssignRequest{Count: 8})
	if a := leased(t, got); !slices.Equal(a, addrs("127.0.0.2", "127.0.0.3", "127.0.0.4", "127.0.0.5")) {
		t.Errorf("got %v: want .2-.5, never lo's 127.0.0.1 nor the gateway", a)
	}
	if err := p.Release(context.Background(), addrs("127.0.0.2")); err != nil {
		t.Fatal(err)
	}
	_, err = p.Assign(context.Background(), provider.AssignRequest{Addresses: addrs("127.0.0.1")})
	if !errors.Is(err, provider.ErrTaken) || !strings.Contains(err.Error(), "this node's own address") {
		t.Errorf("asking for the uplink's address: %v", err)
	}
}
