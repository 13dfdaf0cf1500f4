package blocks

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/controller"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/k8s/nodeblocks"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/static"
)

var logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// assigner runs a BlockAssigner (as the leading vpcni-controller does)
// until the test ends, on ranges of one family.
func assigner(t *testing.T, ranges string, bits int, grace time.Duration) *controller.BlockAssigner {
	t.Helper()
	return assignerOf(t, grace, blocksOf(t, ranges, bits))
}

// blocksOf is ranges (comma-separated, one family) cut into /bits blocks.
func blocksOf(t *testing.T, ranges string, bits int) ipam.Blocks {
	t.Helper()
	var prefixes []netip.Prefix
	for _, r := range strings.Split(ranges, ",") {
		prefixes = append(prefixes, netip.MustParsePrefix(r))
	}
	b, err := ipam.NewBlocks(prefixes, bits)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// assignerOf runs a BlockAssigner on each family's blocks.
func assignerOf(t *testing.T, grace time.Duration, families ...ipam.Blocks) *controller.BlockAssigner {
	t.Helper()
	a, err := controller.NewBlockAssigner(fixture.Config, controller.BlockOptions{Families: families, Grace: grace}, logger)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- a.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("assigner: %v", err)
		}
	})
	return a
}

// agent is one node's static provider in blocks mode, with its own
// NodeBlock source, as vpcnid builds it.
type agent struct {
	node string
	p    *static.Provider
	src  *nodeblocks.Source
}

// newAgent is node's agent on rangeCIDR (comma-separated: a range of each
// family for a dual-stack node).
func newAgent(t *testing.T, node, rangeCIDR, wait string) *agent {
	t.Helper()
	return newAgentAs(t, fixture.Config, node, rangeCIDR, wait)
}

// newAgentAs is newAgent with the agent's client configuration cfg.
func newAgentAs(t *testing.T, cfg *rest.Config, node, rangeCIDR, wait string) *agent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	src, err := nodeblocks.NewSource(cfg, node)
	if err != nil {
		t.Fatal(err)
	}
	if err := src.StartUntil(ctx, ctx); err != nil {
		t.Fatal(err)
	}
	sc := &static.Config{Blocks: &static.Blocks{Wait: wait}}
	for _, r := range strings.Split(rangeCIDR, ",") { // one per family, for a dual-stack node
		sc.Ranges = append(sc.Ranges, static.Range{CIDR: r})
	}
	sc.Defaults()
	if err := sc.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := static.NewInBlocks(sc, t.TempDir(), src)
	if err != nil {
		t.Fatal(err)
	}
	return &agent{node: node, p: p, src: src}
}

func (a *agent) assign(t *testing.T, n int) []netip.Addr {
	t.Helper()
	leases, err := a.p.Assign(context.Background(), provider.AssignRequest{Count: n})
	if err != nil {
		t.Fatalf("%s: assign %d: %v", a.node, n, err)
	}
	if len(leases) != n {
		t.Fatalf("%s: assign %d gave %d", a.node, n, len(leases))
	}
	return provider.Addresses(leases)
}

func (a *agent) held(t *testing.T) []netip.Addr {
	leases, err := a.p.Held(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return provider.Addresses(leases)
}

func clientset(t *testing.T) kubernetes.Interface {
	return kubernetes.NewForConfigOrDie(fixture.Config)
}

func createNode(t *testing.T, name string) {
	t.Helper()
	_, err := clientset(t).CoreV1().Nodes().Create(context.Background(), &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
}

func deleteNode(t *testing.T, name string) {
	t.Helper()
	if err := clientset(t).CoreV1().Nodes().Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// nodeBlocks lists the NodeBlocks from the API server: node -> blocks.
func nodeBlocks(t *testing.T) (map[string][]netip.Prefix, []v1alpha1.NodeBlock) {
	t.Helper()
	c, err := nodeblocks.NewClient(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]netip.Prefix{}
	for _, nb := range l.Items {
		p := netip.MustParsePrefix(nb.Spec.CIDR)
		if nb.Name != v1alpha1.BlockName(p) || nb.Labels[v1alpha1.LabelNode] != v1alpha1.NodeLabel(nb.Spec.Node) {
			t.Errorf("NodeBlock %s: name or label does not match its spec %+v (labels %v)", nb.Name, nb.Spec, nb.Labels)
		}
		out[nb.Spec.Node] = append(out[nb.Spec.Node], p)
	}
	return out, l.Items
}

// disjoint fails the test if two NodeBlocks overlap.
func disjoint(t *testing.T, items []v1alpha1.NodeBlock) {
	t.Helper()
	for i, x := range items {
		for _, y := range items[:i] {
			if netip.MustParsePrefix(x.Spec.CIDR).Overlaps(netip.MustParsePrefix(y.Spec.CIDR)) {
				t.Errorf("blocks overlap: %s (%s) and %s (%s)", x.Spec.CIDR, x.Spec.Node, y.Spec.CIDR, y.Spec.Node)
			}
		}
	}
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s: %v", what, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func inBlocks(blocks []netip.Prefix, a netip.Addr) bool {
	return slices.ContainsFunc(blocks, func(b netip.Prefix) bool { return b.Contains(a) })
}

// Three agents configured alike get disjoint blocks and take addresses
// only from their own; one whose block fills asks for, and gets, a fourth
// block; every block says Assigned.
func TestThreeNodesOneConfig(t *testing.T) {
	t.Cleanup(func() { cleanupBlocks(t) }) // last: after the assigners stopped
	const rng = "10.30.0.0/24"
	a := assigner(t, rng, 28, time.Minute)
	var agents []*agent
	for i := range 3 {
		node := fmt.Sprintf("one-config-%d", i+1)
		createNode(t, node)
		agents = append(agents, newAgent(t, node, rng, "15s"))
	}
	t0 := time.Now()
	owner := map[netip.Addr]string{}
	for _, ag := range agents {
		for _, addr := range ag.assign(t, 10) {
			if o, dup := owner[addr]; dup {
				t.Fatalf("%s given to %s and %s", addr, o, ag.node)
			}
			owner[addr] = ag.node
		}
	}
	t.Logf("3 nodes: a block each and 10 addresses each in %s", time.Since(t0).Round(time.Millisecond))
	byNode, items := nodeBlocks(t)
	if len(items) != 3 {
		t.Fatalf("%d NodeBlocks, want 3: %v", len(items), byNode)
	}
	disjoint(t, items)
	// The first block holds 14 pod addresses (the range's network address
	// and gateway are in it): 10 more for node 1 need a second block.
	t0 = time.Now()
	more := agents[0].assign(t, 10)
	t.Logf("4th block asked for and used in %s", time.Since(t0).Round(time.Millisecond))
	byNode, items = nodeBlocks(t)
	if len(items) != 4 || len(byNode[agents[0].node]) != 2 {
		t.Fatalf("after node 1 filled its block: %v, want 4 blocks, 2 of them node 1's", byNode)
	}
	disjoint(t, items)
	for _, addr := range more {
		if o, dup := owner[addr]; dup {
			t.Fatalf("%s given to %s and %s", addr, o, agents[0].node)
		}
		owner[addr] = agents[0].node
	}
	for _, ag := range agents {
		held := ag.held(t)
		for _, addr := range held {
			if !inBlocks(byNode[ag.node], addr) {
				t.Errorf("%s holds %s, outside its blocks %v", ag.node, addr, byNode[ag.node])
			}
			if addr == netip.MustParseAddr("10.30.0.0") || addr == netip.MustParseAddr("10.30.0.1") {
				t.Errorf("%s holds the range's network address or gateway %s", ag.node, addr)
			}
		}
	}
	// What each node advertises (vpcni.io/ip): the range's 253 usable
	// addresses less those in the other nodes' blocks.
	waitFor(t, 10*time.Second, "capacities that leave out the other nodes' blocks", func() error {
		for i, want := range []int{253 - 32, 253 - (14 + 16 + 16)} {
			if got := agents[i].p.Info(); got.Capacity != want {
				return fmt.Errorf("%s: capacity %d, want %d (%s)", agents[i].node, got.Capacity, want, got.CapacityReason)
			}
		}
		return nil
	})
	node, err := clientset(t).CoreV1().Nodes().Get(context.Background(), agents[0].node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := node.Annotations[v1alpha1.AnnotationBlocksWanted]; got != "2" {
		t.Errorf("node 1 asks for %q blocks, want 2", got)
	}
	waitFor(t, 10*time.Second, "every block's Assigned condition", func() error {
		_, items := nodeBlocks(t)
		for _, nb := range items {
			if !meta.IsStatusConditionTrue(nb.Status.Conditions, v1alpha1.ConditionAssigned) {
				return fmt.Errorf("%s: %+v", nb.Name, nb.Status.Conditions)
			}
		}
		return nil
	})
	if a.Assigned() != 4 {
		t.Errorf("assigner created %d blocks, want 4", a.Assigned())
	}
}

// A node gone for good gives its block back only after the grace and only
// once no PodAddress of it uses the block; a node that comes back within
// the grace keeps its block; a reclaimed block goes to the next node.
func TestGoneNodeGivesBlocksBack(t *testing.T) {
	t.Cleanup(func() { cleanupBlocks(t) }) // last: after the assigners stopped
	const rng = "10.31.0.0/27"
	const grace = 2 * time.Second
	a := assigner(t, rng, 28, grace)
	createNode(t, "gone-1")
	createNode(t, "back-1")
	gone, back := newAgent(t, "gone-1", rng, "15s"), newAgent(t, "back-1", rng, "15s")
	addrs := gone.assign(t, 2)
	back.assign(t, 1)
	byNode, _ := nodeBlocks(t)
	goneBlock := byNode["gone-1"]
	if len(goneBlock) != 1 || len(byNode["back-1"]) != 1 {
		t.Fatalf("blocks %v", byNode)
	}
	// The range holds two blocks: both are taken.
	createNode(t, "late-1")
	late := newAgent(t, "late-1", rng, "2s")
	if _, err := late.p.Assign(context.Background(), provider.AssignRequest{Count: 1}); !errors.Is(err, provider.ErrExhausted) {
		t.Fatalf("a third node in a range of two blocks: %v, want ErrExhausted", err)
	}
	pas := []string{podAddress(t, "gone-1", addrs[0]), podAddress(t, "gone-1", addrs[1])}
	waitFor(t, 10*time.Second, "a Warning Event on the node left without a block", func() error {
		return nodeEvent(t, "late-1", controller.EventNoFreeBlock, "no free /28 block in [10.31.0.0/27] for node late-1")
	})

	deleteNode(t, "gone-1")
	deleteNode(t, "back-1")
	createNode(t, "back-1") // re-registered within the grace
	// The condition is written only once the grace has passed.
	waitFor(t, 10*time.Second, "the gone node's block reports its PodAddresses", func() error {
		return reclaimable(t, goneBlock[0], "2 PodAddresses")
	})
	deletePodAddress(t, pas[0])
	waitFor(t, 10*time.Second, "the gone node's block reports its last PodAddress", func() error {
		return reclaimable(t, goneBlock[0], "1 PodAddresses")
	})
	if a.Reclaimed() != 0 {
		t.Fatal("a block was reclaimed while a PodAddress still used it")
	}
	t0 := time.Now()
	deletePodAddress(t, pas[1])
	waitFor(t, 10*time.Second, "the gone node's block reclaimed", func() error {
		byNode, _ := nodeBlocks(t)
		if len(byNode["gone-1"]) != 0 {
			return fmt.Errorf("blocks %v", byNode)
		}
		return nil
	})
	t.Logf("block reclaimed %s after the last PodAddress went", time.Since(t0).Round(time.Millisecond))
	byNode, items := nodeBlocks(t)
	if len(byNode["back-1"]) != 1 {
		t.Errorf("the node that came back within the grace lost its block: %v", byNode)
	}
	for _, nb := range items {
		if meta.FindStatusCondition(nb.Status.Conditions, v1alpha1.ConditionReclaimable) != nil {
			t.Errorf("%s of a live node still has a Reclaimable condition", nb.Name)
		}
	}
	// The freed block goes to the node that waited.
	got := late.assign(t, 1)
	if !goneBlock[0].Contains(got[0]) {
		t.Errorf("the late node got %s, not from the reclaimed block %s", got[0], goneBlock[0])
	}
	if a.Reclaimed() != 1 {
		t.Errorf("reclaimed %d blocks, want 1", a.Reclaimed())
	}
}

// Two assigners at once (as two controllers would without the lease) and
// many nodes asking at the same moment: no two blocks overlap, whoever
// loses a race for a block takes the next one, and every node gets what it
// asked for.
func TestConcurrentAssignersNeverDoubleAssign(t *testing.T) {
	t.Cleanup(func() { cleanupBlocks(t) }) // last: after the assigners stopped
	// Room for every node to get twice what it asks for (see below).
	const rng = "10.32.0.0/23"
	const nodes, want = 8, 3
	a1 := assigner(t, rng, 29, time.Minute)
	a2 := assigner(t, rng, 29, time.Minute)
	var names []string
	for i := range nodes {
		names = append(names, fmt.Sprintf("race-%d", i+1))
		createNode(t, names[i])
	}
	var sources []*nodeblocks.Source
	for _, n := range names {
		sources = append(sources, newAgent(t, n, rng, "15s").src)
	}
	var wg sync.WaitGroup
	for _, s := range sources {
		wg.Go(func() {
			for n := 1; n <= want; n++ {
				if err := s.Want(context.Background(), family.V4, n, true); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	waitFor(t, 20*time.Second, "every node's blocks", func() error {
		byNode, _ := nodeBlocks(t)
		for _, n := range names {
			if len(byNode[n]) < want {
				return fmt.Errorf("%s has %v", n, byNode[n])
			}
		}
		return nil
	})
	byNode, items := nodeBlocks(t)
	disjoint(t, items)
	extra := len(items) - nodes*want
	t.Logf("%d nodes x %d blocks by two assigners: %d created (%d + %d), %d extra, %d lost races (conflicts)",
		nodes, want, len(items), a1.Assigned(), a2.Assigned(), extra, a1.Conflicts()+a2.Conflicts())
	if int(a1.Assigned()+a2.Assigned()) != len(items) {
		t.Errorf("the assigners say they created %d blocks, the API server holds %d", a1.Assigned()+a2.Assigned(), len(items))
	}
	// Two writers may each give a node a block for one request (the loser
	// of the count does not see the other's yet); never more than that.
	for _, n := range names {
		if len(byNode[n]) > 2*want {
			t.Errorf("%s has %d blocks for %d asked", n, len(byNode[n]), want)
		}
	}
}

func dyn(t *testing.T) dynamic.Interface {
	return dynamic.NewForConfigOrDie(fixture.Config)
}

// podAddress creates a PodAddress as the node's agent does.
func podAddress(t *testing.T, node string, addr netip.Addr) string {
	t.Helper()
	pa := &v1alpha1.PodAddress{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.Kind},
		ObjectMeta: metav1.ObjectMeta{Name: k8s.PodAddressName(node, "c-"+addr.String(), "eth0"),
			Labels: map[string]string{v1alpha1.LabelNode: v1alpha1.NodeLabel(node)}},
		Spec: v1alpha1.PodAddressSpec{Node: node, PodNamespace: "default", PodName: "p-" + strings.ReplaceAll(addr.String(), ".", "-"),
			ContainerID: "c-" + addr.String(), IfName: "eth0", Address: addr.String()},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(pa)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := dyn(t).Resource(v1alpha1.Resource).Create(context.Background(), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	return pa.Name
}

func deletePodAddress(t *testing.T, name string) {
	t.Helper()
	if err := dyn(t).Resource(v1alpha1.Resource).Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
}

// reclaimable: the block's Reclaimable condition is False and says msg.
func reclaimable(t *testing.T, block netip.Prefix, msg string) error {
	c, err := nodeblocks.NewClient(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	nb, err := c.Get(context.Background(), v1alpha1.BlockName(block))
	if err != nil {
		return err
	}
	cond := meta.FindStatusCondition(nb.Status.Conditions, v1alpha1.ConditionReclaimable)
	if cond == nil || cond.Status != metav1.ConditionFalse || cond.Reason != v1alpha1.ReasonPodAddressesInUse || !strings.Contains(cond.Message, msg) {
		return fmt.Errorf("conditions %+v, want Reclaimable False saying %q", nb.Status.Conditions, msg)
	}
	return nil
}

// cleanupBlocks removes every NodeBlock, PodAddress and Node, so each test
// starts from an empty cluster (the fixture is shared by the package).
func cleanupBlocks(t *testing.T) {
	ctx := context.Background()
	for _, r := range []string{"nodeblocks", "podaddresses"} {
		gvr := v1alpha1.SchemeGroupVersion.WithResource(r)
		if err := dyn(t).Resource(gvr).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil && !apierrors.IsNotFound(err) {
			t.Errorf("clean %s: %v", r, err)
		}
	}
	if err := clientset(t).CoreV1().Nodes().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{}); err != nil {
		t.Errorf("clean nodes: %v", err)
	}
}

// nodeEvent: an Event with reason on the Node says msg.
func nodeEvent(t *testing.T, node, reason, msg string) error {
	l, err := clientset(t).CoreV1().Events("default").List(context.Background(), metav1.ListOptions{FieldSelector: "involvedObject.name=" + node})
	if err != nil {
		return err
	}
	var seen []string
	for _, e := range l.Items {
		if e.Reason == reason && e.InvolvedObject.Kind == "Node" && strings.Contains(e.Message, msg) {
			return nil
		}
		seen = append(seen, e.Reason+": "+e.Message)
	}
	return fmt.Errorf("events on %s: %q", node, seen)
}
