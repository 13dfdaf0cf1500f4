package nodeside

import (
	"context"
	"net/netip"
	"reflect"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
)

// portAgent has a provider port and no pods.
type portAgent struct{ noAgent }

func (portAgent) ProviderPort() string { return "port-1" }

// wired is an attachment as the agent records it once wired: its first
// address and, for a dual-stack pod, its others, each with the gateway
// the datapath gave it (an invalid gw: none).
func wired(first string, others ...string) *alloc.Allocation {
	a := &alloc.Allocation{ContainerID: "c1", IfName: "eth0", PodNamespace: "shop", PodName: "web-0", PodUID: "u1",
		Wiring: &alloc.Wiring{Interfaces: []alloc.Interface{{Name: "eth0", MAC: "0a:58:0a:00:00:05", Sandbox: "/run/netns/x"}}}}
	gw := map[bool]netip.Addr{true: netip.MustParseAddr("169.254.1.1"), false: netip.MustParseAddr("fe80::1")}
	for i, s := range append([]string{first}, others...) {
		addr := netip.MustParseAddr(s)
		if i == 0 {
			a.Address = addr
		} else {
			a.Others = append(a.Others, alloc.Lease{Address: addr})
		}
		a.Wiring.IPs = append(a.Wiring.IPs, alloc.IPConfig{Address: netip.PrefixFrom(addr, addr.BitLen()), Gateway: gw[addr.Is4()]})
	}
	return a
}

// The PodAddress of an attachment: address and gateway stay its first
// family's (what a reader before dual-stack reads), addresses and
// gateways list every family in the agent's order, the gateway of each in
// its place.
func TestPodAddressSpecOfEachFamily(t *testing.T) {
	n := &Node{name: "n1", agent: portAgent{}}
	noGW := wired("10.0.0.5", "fd00::5")
	noGW.Wiring.IPs[1].Gateway = netip.Addr{}
	for _, c := range []struct {
		name         string
		att          *alloc.Allocation
		address, gw  string
		addrs, gws   []string
		annIPs, annG string
	}{
		{"IPv4 only", wired("10.0.0.5"), "10.0.0.5", "169.254.1.1", []string{"10.0.0.5"}, []string{"169.254.1.1"}, "10.0.0.5", "169.254.1.1"},
		{"IPv6 only", wired("fd00::5"), "fd00::5", "fe80::1", []string{"fd00::5"}, []string{"fe80::1"}, "fd00::5", "fe80::1"},
		{"dual-stack, IPv4 first", wired("10.0.0.5", "fd00::5"), "10.0.0.5", "169.254.1.1",
			[]string{"10.0.0.5", "fd00::5"}, []string{"169.254.1.1", "fe80::1"}, "10.0.0.5,fd00::5", "169.254.1.1,fe80::1"},
		{"dual-stack, IPv6 first", wired("fd00::5", "10.0.0.5"), "fd00::5", "fe80::1",
			[]string{"fd00::5", "10.0.0.5"}, []string{"fe80::1", "169.254.1.1"}, "fd00::5,10.0.0.5", "fe80::1,169.254.1.1"},
		{"one family without a gateway", noGW, "10.0.0.5", "169.254.1.1",
			[]string{"10.0.0.5", "fd00::5"}, []string{"169.254.1.1", ""}, "10.0.0.5,fd00::5", "169.254.1.1,"},
	} {
		s := n.spec(c.att, nil)
		want := v1alpha1.PodAddressSpec{Node: "n1", PodNamespace: "shop", PodName: "web-0", PodUID: "u1", ContainerID: "c1", IfName: "eth0",
			Address: c.address, Addresses: c.addrs, MAC: "0a:58:0a:00:00:05", Gateway: c.gw, Gateways: c.gws, ProviderPort: "port-1"}
		if !reflect.DeepEqual(s, want) {
			t.Errorf("%s: PodAddress spec\n got %+v\nwant %+v", c.name, s, want)
		}
		// What the pod's annotations say: the first address alone where
		// one is read, all of them in the lists.
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "shop", Name: "web-0", UID: "u1"}}
		cs := fake.NewSimpleClientset(pod)
		n.cs = cs
		if err := n.annotate(context.Background(), pod, c.att); err != nil {
			t.Fatal(err)
		}
		got, err := cs.CoreV1().Pods("shop").Get(context.Background(), "web-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		wantAnn := map[string]string{AnnotationIP: c.address, AnnotationIPs: c.annIPs, AnnotationGateway: c.gw, AnnotationGateways: c.annG,
			AnnotationMAC: "0a:58:0a:00:00:05", AnnotationInterface: "eth0", AnnotationProviderPort: "port-1"}
		if !reflect.DeepEqual(got.Annotations, wantAnn) {
			t.Errorf("%s: annotations\n got %v\nwant %v", c.name, got.Annotations, wantAnn)
		}
		// Annotated once: the same facts again write nothing.
		cs.ClearActions()
		if err := n.annotate(context.Background(), got, c.att); err != nil || len(cs.Actions()) != 0 {
			t.Errorf("%s: annotating an annotated pod again: %v, %d calls", c.name, err, len(cs.Actions()))
		}
	}
	// No gateway known for any family: gateways left out, as gateway is.
	bare := wired("10.0.0.5", "fd00::5")
	bare.Wiring.IPs[0].Gateway, bare.Wiring.IPs[1].Gateway = netip.Addr{}, netip.Addr{}
	if s := n.spec(bare, nil); s.Gateway != "" || s.Gateways != nil || len(s.Addresses) != 2 {
		t.Errorf("no gateway known: gateway %q, gateways %q, addresses %q", s.Gateway, s.Gateways, s.Addresses)
	}
}

// The agent's view of a reservation: every address it holds, first
// family first, whichever release recorded it; Reserved keeps giving the
// first alone, and a reservation without an address yet is still one.
func TestReservedAddresses(t *testing.T) {
	inf := cache.NewSharedIndexInformer(nil, &v1alpha1.AddressReservation{}, 0, cache.Indexers{})
	for _, ar := range []*v1alpha1.AddressReservation{
		{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "old-0"}, Spec: v1alpha1.AddressReservationSpec{StatefulSet: "old", Address: "10.0.0.7"}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "dual-0"}, Spec: v1alpha1.AddressReservationSpec{StatefulSet: "dual",
			Address: "fd00::7", Addresses: []string{"fd00::7", "10.0.0.8"}}},
		{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "new-0"}, Spec: v1alpha1.AddressReservationSpec{StatefulSet: "new"}},
	} {
		if err := inf.GetStore().Add(ar); err != nil {
			t.Fatal(err)
		}
	}
	r := &Reservations{inf: inf}
	for _, c := range []struct {
		name  string
		ok    bool
		addrs []string
	}{
		{"old-0", true, []string{"10.0.0.7"}},
		{"dual-0", true, []string{"fd00::7", "10.0.0.8"}},
		{"new-0", true, nil},
		{"none-0", false, nil},
	} {
		addrs, ok := r.ReservedAddresses("db", c.name)
		if ok != c.ok || !slices.Equal(k8s.AddressStrings(addrs), c.addrs) {
			t.Errorf("%s: %v %v, want %v %v", c.name, addrs, ok, c.addrs, c.ok)
		}
		first, ok := r.Reserved("db", c.name)
		if ok != c.ok || (len(c.addrs) == 0) == first.IsValid() || len(c.addrs) > 0 && first.String() != c.addrs[0] {
			t.Errorf("%s: Reserved %v %v, want the first of %v, %v", c.name, first, ok, c.addrs, c.ok)
		}
	}
}
