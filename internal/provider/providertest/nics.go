package providertest

import (
	"errors"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
)

// NICEndpoint is a cloud whose provider attaches ports to the node's VM as
// NICs (passthrough, secondary NICs): the contract reads what the compute
// API lists on the VM, not what the provider says.
type NICEndpoint interface {
	NewSubnet(t *testing.T, cidr string, pool int) Subnet
	// NewNICNode makes a VM (its port with nodeIP attached) and a provider
	// for it with opts.
	NewNICNode(t *testing.T, sn Subnet, nodeIP netip.Addr, opts NICOptions) Node
}

// NICOptions configure a NIC-attaching provider.
type NICOptions struct {
	Mode                                 string // "passthrough" or "fixed-ips"
	MaxNICs, MaxAddresses, SecondaryNICs int
	// InstanceID overrides the server the provider attaches to (a wrong
	// one, to make attaches fail).
	InstanceID string
}

// AttachedNIC is one NIC as the compute API lists it on the VM.
type AttachedNIC struct {
	MAC   string
	Addrs []netip.Addr
}

// RunNICs runs the contract of NIC-attaching providers.
func RunNICs(t *testing.T, ep NICEndpoint) {
	t.Run("PassthroughLifecycle", func(t *testing.T) { t.Parallel(); passthroughLifecycle(t, ep) })
	t.Run("PassthroughNICLimit", func(t *testing.T) { t.Parallel(); passthroughLimit(t, ep) })
	t.Run("PassthroughAttachFailsLeavesNoPort", func(t *testing.T) { t.Parallel(); attachFails(t, ep) })
	t.Run("SecondaryNICs", func(t *testing.T) { t.Parallel(); secondaryNICs(t, ep) })
}

// checkNICLeases: every lease on a NIC names a port the VM has attached,
// with that port's MAC, and the address is on that port.
func checkNICLeases(t *testing.T, sn Subnet, n Node, leases []alloc.Lease) map[string]AttachedNIC {
	t.Helper()
	att := n.Attached(t)
	for _, l := range leases {
		if l.Prefix != sn.CIDR || l.Gateway != sn.Gateway {
			t.Errorf("lease %+v: want prefix %s, gateway %s", l, sn.CIDR, sn.Gateway)
		}
		if l.NIC == nil {
			if l.Interface != n.PortID {
				t.Errorf("lease %s without a NIC names %q, want the VM port %s", l.Address, l.Interface, n.PortID)
			}
			continue
		}
		nic, ok := att[l.Interface]
		switch {
		case l.Interface == n.PortID || !ok:
			t.Errorf("lease %s names port %q, which is not a NIC attached to the VM besides its own (%v)", l.Address, l.Interface, att)
		case !strings.EqualFold(nic.MAC, l.NIC.MAC):
			t.Errorf("lease %s: NIC MAC %s, the VM's NIC %s has %s", l.Address, l.NIC.MAC, l.Interface, nic.MAC)
		case !slices.Contains(nic.Addrs, l.Address) || !slices.Contains(nic.Addrs, l.NIC.Address):
			t.Errorf("lease %s (NIC address %s): the VM's NIC %s holds %v", l.Address, l.NIC.Address, l.Interface, nic.Addrs)
		}
	}
	return att
}

func byAddr(ls []alloc.Lease) []alloc.Lease {
	ls = slices.Clone(ls)
	slices.SortFunc(ls, func(a, b alloc.Lease) int { return a.Address.Compare(b.Address) })
	return ls
}

func sameLeases(a, b []alloc.Lease) bool {
	return slices.EqualFunc(byAddr(a), byAddr(b), func(x, y alloc.Lease) bool {
		return x.Address == y.Address && x.Interface == y.Interface && (x.NIC == nil) == (y.NIC == nil) && (x.NIC == nil || *x.NIC == *y.NIC)
	})
}

func passthroughLifecycle(t *testing.T, ep NICEndpoint) {
	sn := ep.NewSubnet(t, nextCIDR(24), 200)
	nodeIP := at(sn, 10)
	n := ep.NewNICNode(t, sn, nodeIP, NICOptions{Mode: "passthrough"})
	got, err := n.Provider.Assign(ctx(t), provider.AssignRequest{Count: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("Assign(2) = %v, %v", got, err)
	}
	att := checkNICLeases(t, sn, n, got)
	for _, l := range got {
		if l.NIC == nil || l.NIC.Address != l.Address || len(att[l.Interface].Addrs) != 1 {
			t.Errorf("passthrough lease %+v: want a NIC of its own whose address is the pod's", l)
		}
	}
	if len(att) != 3 {
		t.Errorf("the VM has %d NICs, want its own and 2: %v", len(att), att)
	}
	if on := podIPs(t, n, nodeIP); len(on) != 0 {
		t.Errorf("passthrough wrote %v on the VM port", on)
	}
	h, err := n.Provider.Held(ctx(t))
	if err != nil || !sameLeases(h, got) {
		t.Fatalf("Held = %+v, %v; want %+v", h, err, got)
	}
	p2 := n.Reopen(t)
	if h, err := p2.Held(ctx(t)); err != nil || !sameLeases(h, got) {
		t.Fatalf("after restart Held = %+v, %v; want %+v", h, err, got)
	}
	if err := p2.Release(ctx(t), []netip.Addr{got[0].Address}); err != nil {
		t.Fatalf("Release: %v", err)
	}
	att = n.Attached(t)
	if _, still := att[got[0].Interface]; still || len(att) != 2 {
		t.Fatalf("after Release of %s the VM has NICs %v", got[0].Address, att)
	}
	if left := n.Unattached(t); len(left) != 0 {
		t.Fatalf("ports left unattached after Release: %v", left)
	}
	if err := p2.Release(ctx(t), []netip.Addr{got[0].Address}); err != nil {
		t.Fatalf("Release of what is gone: %v", err)
	}
	if err := p2.Release(ctx(t), []netip.Addr{got[1].Address}); err != nil {
		t.Fatal(err)
	}
	if att := n.Attached(t); len(att) != 1 {
		t.Fatalf("after releasing everything the VM has NICs %v, want only its own", att)
	}
}

func passthroughLimit(t *testing.T, ep NICEndpoint) {
	sn := ep.NewSubnet(t, nextCIDR(24), 200)
	nodeIP := at(sn, 10)
	n := ep.NewNICNode(t, sn, nodeIP, NICOptions{Mode: "passthrough", MaxNICs: 3})
	info := n.Provider.Info()
	if info.Capacity != 2 || !strings.Contains(info.CapacityReason, "maxNICs 3") {
		t.Errorf("Info = capacity %d (%q), want 2 bounded by maxNICs 3", info.Capacity, info.CapacityReason)
	}
	got, err := n.Provider.Assign(ctx(t), provider.AssignRequest{Count: 3})
	if len(got) != 2 || !errors.Is(err, provider.ErrExhausted) || !strings.Contains(err.Error(), "maxNICs 3") {
		t.Fatalf("Assign(3) with room for 2 NICs = %v, %v; want 2 and ErrExhausted naming maxNICs", got, err)
	}
	checkNICLeases(t, sn, n, got)
	if left := n.Unattached(t); len(left) != 0 {
		t.Fatalf("ports left unattached: %v", left)
	}
	if err := n.Provider.Release(ctx(t), provider.Addresses(got)); err != nil {
		t.Fatal(err)
	}
}

func attachFails(t *testing.T, ep NICEndpoint) {
	sn := ep.NewSubnet(t, nextCIDR(24), 200)
	nodeIP := at(sn, 10)
	n := ep.NewNICNode(t, sn, nodeIP, NICOptions{Mode: "passthrough", InstanceID: "00000000-0000-4000-8000-00000000dead"})
	got, err := n.Provider.Assign(ctx(t), provider.AssignRequest{Count: 2})
	if err == nil || len(got) != 0 {
		t.Fatalf("Assign to a server that does not exist = %v, %v; want an error", got, err)
	}
	t.Logf("vpcni-test: attach to a missing server says: %v", err)
	if left := n.Unattached(t); len(left) != 0 {
		t.Fatalf("a failed Assign left ports %v", left)
	}
}

func secondaryNICs(t *testing.T, ep NICEndpoint) {
	sn := ep.NewSubnet(t, nextCIDR(24), 200)
	nodeIP := at(sn, 10)
	n := ep.NewNICNode(t, sn, nodeIP, NICOptions{Mode: "fixed-ips", MaxAddresses: 2, SecondaryNICs: 2})
	if c := n.Provider.Info().Capacity; c != 6 {
		t.Errorf("capacity %d, want 6 (2 on the VM port and 2 on each of 2 secondary NICs)", c)
	}
	got, err := n.Provider.Assign(ctx(t), provider.AssignRequest{Count: 5})
	if err != nil || len(got) != 5 {
		t.Fatalf("Assign(5) = %v, %v", got, err)
	}
	att := checkNICLeases(t, sn, n, got)
	nics := map[string][]netip.Addr{}
	for _, l := range got {
		if l.NIC != nil {
			nics[l.Interface] = append(nics[l.Interface], l.Address)
			if l.NIC.Address == l.Address {
				t.Errorf("lease %s: a secondary NIC's own address is not a pod's", l.Address)
			}
		}
	}
	if len(nics) != 2 || len(att) != 3 || len(podIPs(t, n, nodeIP)) != 2 {
		t.Fatalf("want 2 addresses on the VM port and 3 on 2 secondary NICs: leases %+v, NICs %v", got, att)
	}
	more, err := n.Provider.Assign(ctx(t), provider.AssignRequest{Count: 2})
	if len(more) != 1 || !errors.Is(err, provider.ErrExhausted) {
		t.Fatalf("Assign(2) with room for 1 = %v, %v; want 1 and ErrExhausted", more, err)
	}
	all := append(slices.Clone(got), more...)
	checkNICLeases(t, sn, n, all)
	p2 := n.Reopen(t)
	h, err := p2.Held(ctx(t))
	if err != nil || !sameLeases(h, all) {
		t.Fatalf("after restart Held = %+v, %v; want %+v", h, err, all)
	}
	// Emptying one secondary NIC gives it back.
	var one string
	for id, addrs := range nics {
		if len(addrs) == 2 {
			one = id
		}
	}
	if err := p2.Release(ctx(t), nics[one]); err != nil {
		t.Fatal(err)
	}
	if att := n.Attached(t); len(att) != 2 || att[one].MAC != "" {
		t.Fatalf("after emptying secondary NIC %s the VM has %v", one, att)
	}
	if err := p2.Release(ctx(t), provider.Addresses(all)); err != nil {
		t.Fatal(err)
	}
	if att := n.Attached(t); len(att) != 1 {
		t.Fatalf("after releasing everything the VM has NICs %v, want only its own", att)
	}
	if on := podIPs(t, n, nodeIP); len(on) != 0 {
		t.Fatalf("after releasing everything the VM port holds %v", on)
	}
	if left := n.Unattached(t); len(left) != 0 {
		t.Fatalf("ports left: %v", left)
	}
}
