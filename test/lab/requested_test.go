package lab

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// TestRequestedAddressFollowsThePod: a pod asks for its address by name
// (CNI_ARGS IP=) through the real plugin against the lab's Neutron. While
// n1's pod holds it, n2 is told to try again later (code 11) and its port
// gains nothing; an address outside the subnet is refused (code 4), as is
// one another VM's port holds (11). DEL on n1 gives the address back to
// the cloud at once, and the pod starts on n2 with it; the legacy VM
// reaches it there.
func TestRequestedAddressFollowsThePod(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := labUp(t, c, "r", 2, "10.96.0.0/24")
	nodes := startAgents(t, l, "1.1.0", func(cfg *config.Config) {
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID}}
	})
	want := netip.MustParseAddr("10.96.0.123")
	add := func(n *labNode, id, ip string) (netip.Addr, error) {
		ns := l.Prefix + "-" + id
		if err := netnsutil.Add(ns); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = netnsutil.Delete(ns) })
		rt := testbed.Runtime(id, netnsutil.Path(ns), "eth0", nil)
		rt.Args = append(rt.Args, [2]string{"IP", ip})
		res, err := n.cni.Add(c, rt)
		if err != nil {
			return netip.Addr{}, err
		}
		r, err := types100Result(res)
		if err != nil {
			t.Fatal(err)
		}
		return r, nil
	}
	got, err := add(nodes[0], "a1", want.String())
	if err != nil || got != want {
		t.Fatalf("ADD IP=%s on n1 = %s, %v", want, got, err)
	}
	if !slices.Contains(fixedIPs(t, l, l.Nodes[0].PortID), want) {
		t.Fatalf("%s is not on n1's port", want)
	}
	before := fixedIPs(t, l, l.Nodes[1].PortID)
	for _, bad := range []struct {
		ip   string
		code uint
		why  string
	}{
		{want.String(), api.CodeTryAgainLater, "held by n1's pod"},
		{l.Legacy.IP.String(), api.CodeTryAgainLater, "the legacy VM's own address"},
		{"10.99.0.5", api.CodeInvalidEnv, "outside the subnet"},
		{"not-an-ip", api.CodeInvalidEnv, "not an address"},
	} {
		_, err := add(nodes[1], "b-"+fmt.Sprint(bad.code)+"-"+fmt.Sprint(len(bad.why)), bad.ip)
		t.Logf("ADD IP=%s on n2 (%s): %v", bad.ip, bad.why, err)
		var ce *types.Error
		if !errors.As(err, &ce) || ce.Code != bad.code {
			t.Errorf("ADD IP=%s on n2 (%s) = %v, want CNI code %d", bad.ip, bad.why, err, bad.code)
		}
	}
	if after := fixedIPs(t, l, l.Nodes[1].PortID); !slices.Equal(after, before) {
		t.Errorf("refused requests changed n2's port: %v -> %v", before, after)
	}

	// The move: DEL on n1 gives the address back to the cloud at once.
	rt := testbed.Runtime("a1", netnsutil.Path(l.Prefix+"-a1"), "eth0", nil)
	if err := nodes[0].cni.Del(c, rt); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(fixedIPs(t, l, l.Nodes[0].PortID), want) {
		t.Errorf("%s is still on n1's port after DEL of the pod that asked for it", want)
	}
	got, err = add(nodes[1], "a2", want.String())
	if err != nil || got != want {
		t.Fatalf("ADD IP=%s on n2 after the move = %s, %v", want, got, err)
	}
	serveEcho(t, netnsutil.Path(l.Prefix+"-a2"), want)
	expectReach(t, c, []reachable{{"legacy VM -> the moved pod on n2", netnsutil.Path(l.Legacy.NS), want}})
}

// fixedIPs lists a port's fixed IPs as Neutron holds them.
func fixedIPs(t *testing.T, l *lab.Lab, portID string) []netip.Addr {
	t.Helper()
	nc := openstack.NoAuthClient(l.URL, http.Client{Timeout: 30 * time.Second})
	p, err := ports.Get(context.Background(), nc, portID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, f := range p.FixedIPs {
		out = append(out, netip.MustParseAddr(f.IPAddress))
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}

func types100Result(res types.Result) (netip.Addr, error) {
	r, err := types100.GetResult(res)
	if err != nil {
		return netip.Addr{}, err
	}
	ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
	return ip, nil
}
