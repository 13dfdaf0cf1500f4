// Package staticguard proves on the real kernel that the static provider
// never hands out an address that the node, another Node or another host
// on the segment holds: network namespaces of its own (vpc26n the node,
// vpc26f a foreign host) joined by a veth pair, the provider's ARP probe
// on the node's end, and the Nodes read from a real kube-apiserver
// (internal/testbed/apiserver).
package staticguard

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

var fixture *apiserver.Server

func TestMain(m *testing.M) {
	testbed.RequireRoot("the static provider's segment guard (network namespaces, ARP)")
	os.Exit(apiserver.RunPackage(m, apiserver.Options{LockWait: 3 * time.Minute}, func(s *apiserver.Server) { fixture = s }))
}

const (
	nodeNS, foreignNS = "vpc26n", "vpc26f"
	nodeIf, foreignIf = "vpc26a", "vpc26b"
)

func ip(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

// segment makes the two namespaces and the veth between them, removing
// an earlier run's leftovers first and everything at the end.
func segment(t *testing.T) {
	clean := func() {
		for _, ns := range []string{nodeNS, foreignNS} {
			_ = exec.Command("ip", "netns", "del", ns).Run() // gone already is fine
		}
	}
	clean()
	t.Cleanup(clean)
	ip(t, "netns", "add", nodeNS)
	ip(t, "netns", "add", foreignNS)
	ip(t, "link", "add", nodeIf, "netns", nodeNS, "type", "veth", "peer", "name", foreignIf, "netns", foreignNS)
	ip(t, "-n", nodeNS, "addr", "add", "10.26.0.2/24", "dev", nodeIf)
	ip(t, "-n", foreignNS, "addr", "add", "10.26.0.3/24", "dev", foreignIf)
	ip(t, "-n", foreignNS, "addr", "add", "10.26.0.6/24", "dev", foreignIf)
	// IPv6 beside: nodad, so each address answers at once.
	ip(t, "-n", nodeNS, "addr", "add", "fd00:26::2/64", "dev", nodeIf, "nodad")
	ip(t, "-n", foreignNS, "addr", "add", "fd00:26::3/64", "dev", foreignIf, "nodad")
	ip(t, "-n", foreignNS, "addr", "add", "fd00:26::6/64", "dev", foreignIf, "nodad")
	ip(t, "-n", nodeNS, "link", "set", nodeIf, "up")
	ip(t, "-n", foreignNS, "link", "set", foreignIf, "up")
}

// openUplink opens the provider's uplink inside the node's namespace
// (its sockets stay there).
func openUplink(t *testing.T, timeout time.Duration) *static.Uplink {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	h, err := netns.GetFromName(nodeNS)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		t.Fatal(err)
	}
	u, uerr := static.OpenUplink(nodeIf, timeout)
	if err := netns.Set(orig); err != nil {
		panic(fmt.Sprintf("back to the test's namespace: %v", err)) // the thread is unusable
	}
	if uerr != nil {
		t.Fatal(uerr)
	}
	t.Cleanup(func() { u.Close() })
	return u
}

// otherNode registers a Node that holds 10.26.0.4 and 10.26.0.5.
func otherNode(t *testing.T, ctx context.Context) {
	cs, err := kubernetes.NewForConfig(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "vpc26-other"}}
	_ = cs.CoreV1().Nodes().Delete(ctx, n.Name, metav1.DeleteOptions{}) // an earlier run's
	if n, err = cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cs.CoreV1().Nodes().Delete(context.Background(), "vpc26-other", metav1.DeleteOptions{}) })
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: "10.26.0.4"}, {Type: corev1.NodeExternalIP, Address: "10.26.0.5"},
		{Type: corev1.NodeHostName, Address: "vpc26-other"}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestNeverHandsOutAHeldAddress: range 10.26.0.0/28 (gateway .1), the
// node at .2 on its uplink, another Node at .4 and .5, a foreign host on
// the segment at .3 and .6. The provider hands out .7–.14 and nothing
// else; each foreign address is said once with the foreign host's MAC;
// asking for .3 by name is refused naming that MAC; once the foreign host
// lets .6 go, the recheck hands it out.
func TestNeverHandsOutAHeldAddress(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	segment(t)
	otherNode(t, ctx)
	foreignMAC := strings.Fields(ip(t, "-n", foreignNS, "-br", "link", "show", foreignIf))[2]

	var mu sync.Mutex
	var notices []provider.Notice
	nodes, err := static.ClusterNodes(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := &static.Config{Ranges: []static.Range{{CIDR: "10.26.0.0/28"}, {CIDR: "fd00:26::/124"}}}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := static.New(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	// Without the guard the same range hands out the node's own address
	// first: what the guard is for, and what makes this test able to fail.
	bare, err := static.New(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if got, err := bare.Assign(ctx, provider.AssignRequest{Count: 1}); err != nil || got[0].Address.String() != "10.26.0.2" {
		t.Fatalf("unguarded Assign(1) = %v, %v; want the node's 10.26.0.2", got, err)
	}
	const recheck = 2 * time.Second
	p.SetGuard(static.Guard{Segment: openUplink(t, cfg.Probe.TimeoutDuration()), Probe: true, Nodes: nodes, Recheck: recheck,
		Notify: func(n provider.Notice) { mu.Lock(); notices = append(notices, n); mu.Unlock() }})

	start := time.Now()
	got, err := p.Assign(ctx, provider.AssignRequest{Count: 8})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("Assign(8): %v", err)
	}
	var addrs []string
	for _, l := range got {
		addrs = append(addrs, l.Address.String())
	}
	want := []string{"10.26.0.7", "10.26.0.8", "10.26.0.9", "10.26.0.10", "10.26.0.11", "10.26.0.12", "10.26.0.13", "10.26.0.14"}
	if !slices.Equal(addrs, want) {
		t.Fatalf("Assign(8) = %v, want %v (never the gateway .1, the node's .2, the other Node's .4/.5, the foreign host's .3/.6)", addrs, want)
	}
	t.Logf("Assign(8) = %v in %s (probe timeout %s)", addrs, took.Round(time.Millisecond), cfg.Probe.TimeoutDuration())

	mu.Lock()
	said := map[string]bool{}
	for _, n := range notices {
		if n.Reason != provider.ReasonAddressInUse || !strings.Contains(n.Message, foreignMAC) {
			t.Errorf("notice %+v: want %s naming MAC %s", n, provider.ReasonAddressInUse, foreignMAC)
		}
		said[strings.Fields(n.Message)[0]] = true
		t.Logf("notice: %s", n.Message)
	}
	mu.Unlock()
	if !said["10.26.0.3"] || !said["10.26.0.6"] || len(said) != 2 {
		t.Fatalf("notices said %v, want exactly 10.26.0.3 and 10.26.0.6", said)
	}

	if _, err := p.Assign(ctx, provider.AssignRequest{Count: 1}); !errors.Is(err, provider.ErrExhausted) {
		t.Fatalf("Assign(1) with only held addresses left = %v, want ErrExhausted", err)
	}
	_, err = p.Assign(ctx, provider.AssignRequest{Addresses: []netip.Addr{netip.MustParseAddr("10.26.0.3")}})
	if !errors.Is(err, provider.ErrTaken) || !strings.Contains(err.Error(), foreignMAC) {
		t.Fatalf("Assign(10.26.0.3) = %v, want ErrTaken naming %s", err, foreignMAC)
	}
	t.Logf("Assign(10.26.0.3): %v", err)
	_, err = p.Assign(ctx, provider.AssignRequest{Addresses: []netip.Addr{netip.MustParseAddr("10.26.0.4"), netip.MustParseAddr("10.26.0.2")}})
	if !errors.Is(err, provider.ErrTaken) || !strings.Contains(err.Error(), "Node's address") || !strings.Contains(err.Error(), "node's own address") {
		t.Fatalf("Assign(10.26.0.4, 10.26.0.2) = %v, want both refused as node addresses", err)
	}
	t.Logf("Assign(10.26.0.4, 10.26.0.2): %v", err)

	// The foreign host lets .6 go; after the recheck it is probed again,
	// silent now, and handed out.
	ip(t, "-n", foreignNS, "addr", "del", "10.26.0.6/24", "dev", foreignIf)
	time.Sleep(recheck) // the set-aside time itself is what is tested
	got, err = p.Assign(ctx, provider.AssignRequest{Count: 1})
	if err != nil || len(got) != 1 || got[0].Address.String() != "10.26.0.6" {
		t.Fatalf("Assign(1) after the recheck = %v, %v; want 10.26.0.6", got, err)
	}
	if _, err := p.Assign(ctx, provider.AssignRequest{Addresses: []netip.Addr{netip.MustParseAddr("10.26.0.3")}}); !errors.Is(err, provider.ErrTaken) {
		t.Fatalf("Assign(10.26.0.3) after the recheck = %v, want ErrTaken (the host still answers)", err)
	}

	// IPv6, probed by a DAD neighbour solicitation: the range's ::0 and
	// gateway ::1 are out of it, the node's ::2 is skipped, and the
	// foreign host's ::3 and ::6 (it answers with a neighbour
	// advertisement) are said and never handed out.
	mu.Lock()
	notices = nil
	mu.Unlock()
	start = time.Now()
	got, err = p.Assign(ctx, provider.AssignRequest{Count: 11, Family: family.V6})
	took = time.Since(start)
	addrs = nil
	for _, l := range got {
		addrs = append(addrs, l.Address.String())
	}
	want = []string{"fd00:26::4", "fd00:26::5", "fd00:26::7", "fd00:26::8", "fd00:26::9", "fd00:26::a", "fd00:26::b", "fd00:26::c", "fd00:26::d", "fd00:26::e", "fd00:26::f"}
	if err != nil || !slices.Equal(addrs, want) {
		t.Fatalf("IPv6 Assign(11) = %v, %v; want %v (never the node's ::2, the foreign host's ::3/::6)", addrs, err, want)
	}
	t.Logf("IPv6 Assign(11) = %v in %s (probe timeout %s)", addrs, took.Round(time.Millisecond), cfg.Probe.TimeoutDuration())
	mu.Lock()
	said = map[string]bool{}
	for _, n := range notices {
		if n.Reason != provider.ReasonAddressInUse || n.Kind != "neighbour_advertisement" || !strings.Contains(n.Message, foreignMAC) {
			t.Errorf("notice %+v: want %s (neighbour_advertisement) naming MAC %s", n, provider.ReasonAddressInUse, foreignMAC)
		}
		said[strings.Fields(n.Message)[0]] = true
		t.Logf("notice: %s", n.Message)
	}
	mu.Unlock()
	if !said["fd00:26::3"] || !said["fd00:26::6"] || len(said) != 2 {
		t.Fatalf("IPv6 notices said %v, want exactly fd00:26::3 and fd00:26::6", said)
	}
	_, err = p.Assign(ctx, provider.AssignRequest{Family: family.V6, Addresses: []netip.Addr{netip.MustParseAddr("fd00:26::3")}})
	if !errors.Is(err, provider.ErrTaken) || !strings.Contains(err.Error(), foreignMAC) {
		t.Fatalf("Assign(fd00:26::3) = %v, want ErrTaken naming %s", err, foreignMAC)
	}
}
