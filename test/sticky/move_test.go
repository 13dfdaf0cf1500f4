package sticky

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	k8stypes "k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	_ "github.com/vpcni/vpcni/internal/builtin/clouds"
	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/controller"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

const namespace = "sticky"

// deadGrace is the keeper's grace for a node not Ready (production: 1m).
const deadGrace = 2 * time.Second

// node is vpcnid on one lab node, in Kubernetes mode, and a runtime there.
type node struct {
	host  lab.Host
	agent *testbed.Agent
	cni   *testbed.CNI
}

// pod is one incarnation of a pod: its API object and its attachment.
type pod struct {
	obj   *corev1.Pod
	netns string
	node  *node
	addr  netip.Addr
}

type env struct {
	t      *testing.T
	cs     kubernetes.Interface
	dyn    dynamic.Interface
	lab    *lab.Lab
	nodes  []*node
	runDir string
	n      int // attachments made, for unique container IDs
}

func setup(t *testing.T) *env {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	bin, err := testbed.Binaries()
	if err != nil {
		t.Fatal(err)
	}
	prefix := fmt.Sprintf("vpcnistk%d", os.Getpid()%100000)
	l, err := lab.Up(ctx, lab.Config{Prefix: prefix, Nodes: 2, Subnet: netip.MustParsePrefix("10.97.0.0/24")})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	e := &env{t: t, lab: l, runDir: filepath.Join("/run/vpcni-testbed", prefix)}
	_ = testbed.StopRecorded(e.runDir)
	_ = os.RemoveAll(e.runDir)
	t.Cleanup(func() { _ = testbed.StopRecorded(e.runDir); _ = os.RemoveAll(e.runDir) })
	if e.cs, err = kubernetes.NewForConfig(fixture.Config); err != nil {
		t.Fatal(err)
	}
	if e.dyn, err = dynamic.NewForConfig(fixture.Config); err != nil {
		t.Fatal(err)
	}
	_, err = e.cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: namespace}}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(e.cleanupAPI)
	installRBAC(t)

	// vpcni-controller's reconciler, as the leader runs it, with the
	// controller's service account's rights.
	kctx, kstop := context.WithCancel(context.Background())
	// It reaches the lab's Neutron from here, as the controller's pod
	// would from the cluster network.
	// Its cloud is read from a -cloud-config file, as the controller's.
	cloudCfg := filepath.Join(t.TempDir(), "cloud.yaml")
	if err := os.WriteFile(cloudCfg, fmt.Appendf(nil, "openstack:\n  endpoint: %s\n  subnetID: %s\n", l.URL, l.SubnetID), 0o600); err != nil {
		t.Fatal(err)
	}
	fc, err := cloudconfig.Load(cloudCfg)
	if err != nil {
		t.Fatal(err)
	}
	keeper, err := controller.NewStickyKeeper(as("vpcni-controller"), controller.StickyOptions{Cloud: fc.Open(nil), Grace: deadGrace},
		slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		t.Fatal(err)
	}
	kdone := make(chan error, 1)
	go func() { kdone <- keeper.Run(kctx) }()
	t.Cleanup(func() {
		kstop()
		if err := <-kdone; err != nil && kctx.Err() == nil {
			t.Errorf("StickyKeeper: %v", err)
		}
	})

	apiHost := strings.TrimPrefix(fixture.URL, "https://")
	agentKubeconfig := kubeconfigAs(t, "vpcni-agent")
	for _, h := range l.Nodes {
		if _, err := e.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: h.Name}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		e.setReady(h.Name, corev1.ConditionTrue) // as its kubelet would
		// The API server on the node's own loopback, as a node reaches it.
		fw, err := testbed.Forward(h.NS, apiHost, apiHost)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fw.Close() })
		cfg := config.Defaults()
		cfg.NodeName = h.Name
		cfg.SocketPath = filepath.Join(e.runDir, h.Name, "vpcnid.sock")
		cfg.StateDir = filepath.Join(e.runDir, h.Name, "state")
		cfg.MetricsAddr = ""
		cfg.Kubernetes = config.Kubernetes{Mode: "on", Kubeconfig: agentKubeconfig}
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{
			Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID}}
		a, err := testbed.StartAgentIn(e.runDir, h.NS, bin, cfg)
		if err != nil {
			t.Fatalf("vpcnid on %s: %v", h.Name, err)
		}
		t.Cleanup(func() {
			if t.Failed() {
				log, _ := os.ReadFile(a.LogPath)
				t.Logf("%s's vpcnid log:\n%s", h.Name, log)
			}
			_ = a.Stop()
		})
		cni, err := testbed.NewCNIIn(h.NS, []string{bin}, filepath.Join(e.runDir, h.Name, "cni-cache"), testbed.VpcniConfList("1.1.0", "vpcni", cfg.SocketPath))
		if err != nil {
			t.Fatal(err)
		}
		e.nodes = append(e.nodes, &node{host: h, agent: a, cni: cni})
	}
	return e
}

func (e *env) cleanupAPI() {
	ctx := context.Background()
	zero := int64(0)
	_ = e.cs.AppsV1().StatefulSets(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	_ = e.cs.CoreV1().Pods(namespace).DeleteCollection(ctx, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
	_ = e.dyn.Resource(v1alpha1.ReservationResource).Namespace(namespace).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	_ = e.dyn.Resource(v1alpha1.Resource).DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
	for _, n := range e.nodes {
		_ = e.cs.CoreV1().Nodes().Delete(ctx, n.host.Name, metav1.DeleteOptions{})
	}
}

// setReady sets the Node's Ready condition, as a kubelet (True) or the
// node lifecycle controller (Unknown, when the kubelet stops) does.
//
// It returns the transition time as stored: whole seconds (the API's
// time format), so up to a second before the call.
func (e *env) setReady(name string, status corev1.ConditionStatus) time.Time {
	e.t.Helper()
	ctx := context.Background()
	n, err := e.cs.CoreV1().Nodes().Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status, Reason: "Test",
		LastTransitionTime: now, LastHeartbeatTime: now}}
	if _, err := e.cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{}); err != nil {
		e.t.Fatal(err)
	}
	return now.Time
}

// statefulSet creates a StatefulSet (no controller manager runs: the test
// makes its pods), annotated vpcni.io/sticky-ip or not.
func (e *env) statefulSet(name string, sticky bool, replicas int32) *appsv1.StatefulSet {
	e.t.Helper()
	labels := map[string]string{"app": name}
	s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace, Annotations: map[string]string{}},
		Spec: appsv1.StatefulSetSpec{Replicas: &replicas, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}}}
	if sticky {
		s.Annotations[v1alpha1.AnnotationStickyIP] = "true"
	}
	s, err := e.cs.AppsV1().StatefulSets(namespace).Create(context.Background(), s, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

// createPod creates the API object of set's pod ordinal on node n, as the
// StatefulSet controller and the scheduler would.
func (e *env) createPod(set *appsv1.StatefulSet, ordinal int, n *node) *pod {
	e.t.Helper()
	yes := true
	p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-%d", set.Name, ordinal), Namespace: namespace,
		Labels: set.Spec.Template.Labels, OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet",
			Name: set.Name, UID: set.UID, Controller: &yes, BlockOwnerDeletion: &yes}}},
		Spec: corev1.PodSpec{NodeName: n.host.Name, Containers: set.Spec.Template.Spec.Containers}}
	p, err := e.cs.CoreV1().Pods(namespace).Create(context.Background(), p, metav1.CreateOptions{})
	if err != nil {
		e.t.Fatal(err)
	}
	e.n++
	netns := fmt.Sprintf("%s-p%d", e.lab.Prefix, e.n)
	if err := netnsutil.Add(netns); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = netnsutil.Delete(netns) })
	return &pod{obj: p, netns: netns, node: n}
}

func (p *pod) runtime() *libcni.RuntimeConf {
	return &libcni.RuntimeConf{ContainerID: "c-" + p.netns, NetNS: netnsutil.Path(p.netns), IfName: "eth0",
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", p.obj.Name}, {"K8S_POD_UID", string(p.obj.UID)}}}
}

// add runs the pod's ADD; retry > 0 retries a CNI error 11 (as the
// kubelet does) for that long, counting the attempts.
func (p *pod) add(ctx context.Context, retry time.Duration) (tries int, err error) {
	end := time.Now().Add(retry)
	for {
		tries++
		var res types.Result
		res, err = p.node.cni.Add(ctx, p.runtime())
		var te *types.Error
		if errors.As(err, &te) && te.Code == api.CodeTryAgainLater && time.Now().Before(end) {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			return tries, err
		}
		r, err := current.NewResultFromResult(res)
		if err != nil {
			return tries, err
		}
		p.addr, _ = netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
		return tries, nil
	}
}

// remove is the pod's end: its DEL on the node, then the API object
// (force-deleted: no kubelet confirms it here).
func (e *env) remove(ctx context.Context, p *pod) error {
	if err := p.node.cni.Del(ctx, p.runtime()); err != nil {
		return fmt.Errorf("DEL %s on %s: %w", p.obj.Name, p.node.host.Name, err)
	}
	zero := int64(0)
	return e.cs.CoreV1().Pods(namespace).Delete(ctx, p.obj.Name, metav1.DeleteOptions{GracePeriodSeconds: &zero,
		Preconditions: &metav1.Preconditions{UID: &p.obj.UID}})
}

// reservation reads pod name's AddressReservation (nil: none).
func (e *env) reservation(name string) *v1alpha1.AddressReservation {
	e.t.Helper()
	u, err := e.dyn.Resource(v1alpha1.ReservationResource).Namespace(namespace).Get(context.Background(), name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		e.t.Fatal(err)
	}
	ar := &v1alpha1.AddressReservation{}
	ar.Name = u.GetName()
	ar.Spec.Address, _, _ = unstructured.NestedString(u.Object, "spec", "address")
	ar.Spec.StatefulSet, _, _ = unstructured.NestedString(u.Object, "spec", "statefulSet")
	ar.Spec.Node, _, _ = unstructured.NestedString(u.Object, "spec", "node")
	return ar
}

// portHolding is the lab node whose VM port holds a as a fixed IP ("" if none).
func (e *env) portHolding(a netip.Addr) []string {
	var on []string
	for _, n := range e.nodes {
		for _, p := range e.lab.API.PortsOf(n.host.InstanceID) {
			for _, f := range p.FixedIPs {
				if f.IPAddress == a.String() {
					on = append(on, n.host.Name)
				}
			}
		}
	}
	return on
}

func waitFor(t *testing.T, limit time.Duration, what string, cond func() error) {
	t.Helper()
	end := time.Now().Add(limit)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(end) {
			t.Fatalf("%s: not within %s: %v", what, limit, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestStickyMove: pod web-0 of a StatefulSet annotated vpcni.io/sticky-ip
// starts on n1, its address recorded in its AddressReservation; a second
// web-0 on n2 while the first lives gets CNI error 11 and nothing; web-0
// is deleted and re-created on n2 and gets the same address, on n2's VM
// port now, and the legacy VM (its neighbour entry pointing at n1's MAC)
// reaches it again — the figure is the outage it sees, from the start of
// the old pod's deletion. A pod of a StatefulSet without the annotation
// gets no reservation and a fresh address on its next node; scaling the
// sticky set down deletes the reservation.
func TestStickyMove(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	n1, n2 := e.nodes[0], e.nodes[1]
	web := e.statefulSet("web", true, 2)
	db := e.statefulSet("db", false, 1)

	old := e.createPod(web, 0, n1)
	waitFor(t, 10*time.Second, "the controller reserves web-0's address", func() error {
		if e.reservation("web-0") == nil {
			return errors.New("no AddressReservation sticky/web-0")
		}
		return nil
	})
	if _, err := old.add(ctx, 0); err != nil {
		t.Fatalf("ADD web-0 on n1: %v", err)
	}
	addr := old.addr
	waitFor(t, 10*time.Second, "web-0's address recorded", func() error {
		if got := e.reservation("web-0").Spec.Address; got != addr.String() {
			return fmt.Errorf("reservation says %q, web-0 has %s", got, addr)
		}
		return nil
	})
	dbOld := e.createPod(db, 0, n1)
	if _, err := dbOld.add(ctx, 0); err != nil {
		t.Fatalf("ADD db-0 on n1: %v", err)
	}

	// A second live web-0 (the old one not gone) never gets the address.
	twin := e.createPodObjectless(old.obj, n2)
	if _, err := twin.add(ctx, 0); err == nil {
		t.Fatalf("a second web-0 on n2 got %s while web-0 on n1 holds %s", twin.addr, addr)
	} else if te := (*types.Error)(nil); !errors.As(err, &te) || te.Code != api.CodeTryAgainLater || !strings.Contains(te.Msg, "AddressReservation") {
		t.Fatalf("a second web-0 on n2: %v; want CNI error 11 naming the reservation", err)
	}
	if on := e.portHolding(addr); !slices.Equal(on, []string{n1.host.Name}) {
		t.Fatalf("%s is on the ports of %v, want n1's only", addr, on)
	}

	// The legacy VM talks to web-0 on n1.
	p, err := lab.StartPinger(netnsutil.Path(e.lab.Legacy.NS), addr, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if err := p.WaitAnswered(5 * time.Second); err != nil {
		t.Fatalf("legacy VM -> web-0 %s on n1: %v", addr, err)
	}
	time.Sleep(time.Second) // some traffic first, as a client that talks to the pod would have

	// The move: web-0 deleted on n1, re-created on n2.
	start := time.Now()
	if err := e.remove(ctx, old); err != nil {
		t.Fatal(err)
	}
	deleted := time.Now()
	moved := e.createPod(web, 0, n2)
	tries, err := moved.add(ctx, 10*time.Second)
	if err != nil {
		t.Fatalf("ADD of the re-created web-0 on n2 (%d tries): %v", tries, err)
	}
	up := time.Now()
	if moved.addr != addr {
		t.Fatalf("web-0 re-created on n2 got %s, not its reserved %s", moved.addr, addr)
	}
	var reached time.Time
	waitFor(t, 30*time.Second, "the legacy VM reaches web-0 on n2", func() error {
		var ok bool
		if reached, ok = p.FirstAnsweredAfter(deleted); !ok {
			return errors.New("no answer yet")
		}
		return nil
	})
	outage := reached.Sub(start)
	fmt.Printf("sticky-move detail: address=%s n1->n2 del_ms=%d add_ms=%d add_tries=%d outage_ms=%d\n", addr,
		deleted.Sub(start).Milliseconds(), up.Sub(deleted).Milliseconds(), tries, outage.Milliseconds())
	fmt.Printf("sticky-move: with_garp_ms=%d\n", outage.Milliseconds())
	if outage >= time.Second {
		t.Errorf("the legacy VM reached the moved web-0 after %s; the goal is < 1 s", outage)
	}
	if on := e.portHolding(addr); !slices.Equal(on, []string{n2.host.Name}) {
		t.Errorf("after the move %s is on the ports of %v, want n2's only", addr, on)
	}
	if got := e.reservation("web-0"); got == nil || got.Spec.Address != addr.String() {
		t.Errorf("after the move the reservation is %+v, want %s kept", got, addr)
	}

	// No reservation for the set without the annotation; its pod starts
	// on n2 with another address (its old one cools in n1's pool).
	if ar := e.reservation("db-0"); ar != nil {
		t.Errorf("db (no %s) got a reservation: %+v", v1alpha1.AnnotationStickyIP, ar.Spec)
	}
	if err := e.remove(ctx, dbOld); err != nil {
		t.Fatal(err)
	}
	dbNew := e.createPod(db, 0, n2)
	if _, err := dbNew.add(ctx, 0); err != nil {
		t.Fatalf("ADD db-0 on n2: %v", err)
	}
	if dbNew.addr == dbOld.addr {
		t.Errorf("db-0 (not sticky) got its old %s again on n2", dbOld.addr)
	}

	// Scaled to 0: the reservation goes (the pod does not come back).
	if _, err := e.cs.AppsV1().StatefulSets(namespace).Patch(ctx, "web", k8stypes.MergePatchType, []byte(`{"spec":{"replicas":0}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := e.remove(ctx, moved); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "web scaled to 0 gives up web-0's reservation", func() error {
		if ar := e.reservation("web-0"); ar != nil {
			return fmt.Errorf("still there: %+v", ar.Spec)
		}
		return nil
	})
	if on := e.portHolding(addr); len(on) != 0 {
		t.Errorf("web-0 gone for good, yet %s is on the ports of %v", addr, on)
	}
}

// createPodObjectless is another attachment for an existing pod object on
// node n: a second incarnation of the same pod name racing the first.
func (e *env) createPodObjectless(obj *corev1.Pod, n *node) *pod {
	e.t.Helper()
	e.n++
	netns := fmt.Sprintf("%s-p%d", e.lab.Prefix, e.n)
	if err := netnsutil.Add(netns); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { _ = netnsutil.Delete(netns) })
	return &pod{obj: obj, netns: netns, node: n}
}

// TestStickyDeadNode: pod cache-0 (sticky) runs on n1; n1 dies (its vpcnid
// stops, its Node turns Ready=Unknown) without ever deleting the pod's
// attachment. The pod is force-deleted and re-created on n2, whose ADDs get
// CNI error 11 while n1's port holds the address; once n1 has been dead for
// the grace, the controller takes the address off n1's port and the
// re-created pod gets it on n2, where the legacy VM reaches it.
func TestStickyDeadNode(t *testing.T) {
	e := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	n1, n2 := e.nodes[0], e.nodes[1]
	set := e.statefulSet("cache", true, 1)
	old := e.createPod(set, 0, n1)
	waitFor(t, 10*time.Second, "the controller reserves cache-0's address", func() error {
		if e.reservation("cache-0") == nil {
			return errors.New("no AddressReservation sticky/cache-0")
		}
		return nil
	})
	if _, err := old.add(ctx, 0); err != nil {
		t.Fatalf("ADD cache-0 on n1: %v", err)
	}
	addr := old.addr
	waitFor(t, 10*time.Second, "cache-0's address and node recorded", func() error {
		if ar := e.reservation("cache-0"); ar.Spec.Address != addr.String() || ar.Spec.Node != n1.host.Name {
			return fmt.Errorf("reservation says %q on %q, cache-0 has %s on %s", ar.Spec.Address, ar.Spec.Node, addr, n1.host.Name)
		}
		return nil
	})

	// n1 dies: no DEL ever comes from it.
	if err := n1.agent.Stop(); err != nil {
		t.Fatal(err)
	}
	died := e.setReady(n1.host.Name, corev1.ConditionUnknown)
	zero := int64(0)
	if err := e.cs.CoreV1().Pods(namespace).Delete(ctx, "cache-0", metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil {
		t.Fatal(err)
	}
	moved := e.createPod(set, 0, n2)
	// Before the grace ends the address stays where it is: n2 gets 11.
	if _, err := moved.add(ctx, 0); err == nil {
		t.Fatalf("cache-0 on n2 got %s at once, while dead n1's port holds %s and its grace runs", moved.addr, addr)
	}
	tries, err := moved.add(ctx, 30*time.Second)
	if err != nil {
		t.Fatalf("ADD of cache-0 on n2 after n1 died (%d tries): %v", tries, err)
	}
	up := time.Since(died)
	if moved.addr != addr {
		t.Fatalf("cache-0 re-created on n2 got %s, not its reserved %s", moved.addr, addr)
	}
	if up < deadGrace {
		t.Errorf("cache-0 got its address on n2 %s after n1 turned not Ready: sooner than the grace (%s)", up, deadGrace)
	}
	if on := e.portHolding(addr); !slices.Equal(on, []string{n2.host.Name}) {
		t.Errorf("after the takeover %s is on the ports of %v, want n2's only", addr, on)
	}
	fmt.Printf("sticky-move detail: dead node takeover address=%s grace_ms=%d from_death_ms=%d add_tries=%d\n",
		addr, deadGrace.Milliseconds(), up.Milliseconds(), tries)
	p, err := lab.StartPinger(netnsutil.Path(e.lab.Legacy.NS), addr, 10*time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Stop()
	if err := p.WaitAnswered(5 * time.Second); err != nil {
		t.Errorf("legacy VM -> cache-0 %s on n2: %v", addr, err)
	}
	waitFor(t, 10*time.Second, "the reservation names n2", func() error {
		if ar := e.reservation("cache-0"); ar.Spec.Node != n2.host.Name {
			return fmt.Errorf("reservation names %q", ar.Spec.Node)
		}
		return nil
	})
}
