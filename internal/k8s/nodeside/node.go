// Package nodeside is the agent's (vpcnid's) side in Kubernetes: per pod
// address a PodAddress and the pod's annotations, Events on pods and on
// the node, the node's pool figures, its vpcni.io/ip capacity and
// not-ready taint, the API server's health for STATUS, and the agent's
// view of AddressReservations. It runs in vpcnid only; what it shares
// with vpcni-controller is in internal/k8s.
package nodeside

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/vpcni/vpcni/internal/agent"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
)

// Annotations the agent writes on pods (like kube-ovn's) and nodes. A
// dual-stack pod's ip-address and gateway are its first family's (the
// agent's ipFamilies order), so a reader of one address still reads one;
// ip-addresses and gateways list all of them, comma-separated, first
// family first (a single-family pod's list has its one address).
const (
	AnnotationIP           = "vpcni.io/ip-address"
	AnnotationIPs          = "vpcni.io/ip-addresses"
	AnnotationMAC          = "vpcni.io/mac-address"
	AnnotationGateway      = "vpcni.io/gateway"
	AnnotationGateways     = "vpcni.io/gateways"
	AnnotationInterface    = "vpcni.io/interface"
	AnnotationProviderPort = "vpcni.io/provider-port"

	AnnotationPoolFree      = "vpcni.io/pool-free"
	AnnotationPoolAllocated = "vpcni.io/pool-allocated"
	AnnotationPoolCooling   = "vpcni.io/pool-cooling"
	AnnotationPoolCapacity  = "vpcni.io/pool-capacity"
)

// Agent is what the node side needs of vpcnid.
type Agent interface {
	Allocation(containerID, ifName string) (*alloc.Allocation, error)
	Allocations() ([]*alloc.Allocation, error)
	Release(containerID, ifName string, created time.Time, why string) error
	Pool() agent.PoolFigures
	ProviderPort() string
}

// Options tunes the node side.
type Options struct {
	// Orphaned is how long an attachment must exist before the agent may
	// conclude that its pod is gone (an informer can lag behind a new pod).
	Orphaned time.Duration
	// PoolEvery is how often the node's pool annotations are refreshed.
	PoolEvery time.Duration
	// ProbeEvery is how often the API server is probed for STATUS.
	ProbeEvery time.Duration
	// IPResource: advertise vpcni.io/ip on the node (and warn on pods
	// that do not request it).
	IPResource bool
	// NotReadyTaint: taint the node until the pool first reaches its warm
	// target.
	NotReadyTaint bool
}

func (o *Options) defaults() {
	if o.Orphaned == 0 {
		o.Orphaned = time.Minute
	}
	if o.PoolEvery == 0 {
		o.PoolEvery = 10 * time.Second
	}
	if o.ProbeEvery == 0 {
		o.ProbeEvery = 10 * time.Second
	}
}

type attKey struct{ containerID, ifName string }

// LogValue names the attachment in the queue's log lines.
func (k attKey) LogValue() slog.Value {
	return slog.GroupValue(slog.String("container", k.containerID), slog.String("ifName", k.ifName))
}

// Node is the agent's Kubernetes side; it implements agent.Cluster.
type Node struct {
	name  string
	opts  Options
	cs    kubernetes.Interface
	pas   *k8s.PodAddresses
	agent Agent
	log   *slog.Logger
	host  string

	pods     cache.SharedIndexInformer
	addrs    cache.SharedIndexInformer
	node     cache.SharedIndexInformer // this node only
	capacity nodeCapacity
	queue    workqueue.TypedRateLimitingInterface[attKey]
	recorder k8s.Events
	warnings nodeWarnings // NodeWarning's, folded per reason

	mu       sync.Mutex
	probeErr error
	nodeErr  error
	synced   bool
	// warned: pods told once that they request no vpcni.io/ip.
	warned map[types.UID]bool
	// notServed: pods told once that their address is not of their
	// PodNetwork.
	notServed map[types.UID]bool
}

// NewNode connects to the API server described by cfg. Run starts it.
func New(cfg *rest.Config, nodeName string, a Agent, log *slog.Logger, opts Options) (*Node, error) {
	opts.defaults()
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "vpcnid/" + nodeName
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	pas, err := k8s.NewPodAddresses(cfg)
	if err != nil {
		return nil, err
	}
	n := &Node{name: nodeName, opts: opts, cs: cs, pas: pas, agent: a, log: log.With("component", "kubernetes"), host: cfg.Host,
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[attKey]()),
		probeErr: errors.New("the Kubernetes API server was not reached yet"),
		capacity: nodeCapacity{cs: cs, ipResource: opts.IPResource, notReadyTaint: opts.NotReadyTaint},
		warned:   map[types.UID]bool{}}
	// Only this node's pods: the agent never holds the cluster's.
	pf := informers.NewSharedInformerFactoryWithOptions(cs, 10*time.Minute, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", nodeName).String()
	}))
	n.pods = pf.Core().V1().Pods().Informer()
	if err := n.pods.SetTransform(slimPod); err != nil {
		return nil, err
	}
	nf := informers.NewSharedInformerFactoryWithOptions(cs, 10*time.Minute, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("metadata.name", nodeName).String()
	}))
	n.node = nf.Core().V1().Nodes().Informer()
	n.addrs = pas.Informer(k8s.LabelNode+"="+k8s.NodeLabel(nodeName), 10*time.Minute, nil)
	for _, inf := range []cache.SharedIndexInformer{n.node, n.addrs} {
		if err := inf.SetTransform(withoutManagedFields); err != nil {
			return nil, err
		}
	}
	_, _ = n.addrs.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    n.enqueueAddr,
		UpdateFunc: func(_, o any) { n.enqueueAddr(o) },
		DeleteFunc: n.enqueueAddr,
	})
	_, _ = n.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{
		// A pod the agent already wired may reach the informer after the
		// ADD: annotate it then.
		AddFunc: n.enqueuePod,
	})
	n.recorder = k8s.NewEvents(corev1.EventSource{Component: "vpcnid", Host: nodeName})
	return n, nil
}

func (n *Node) enqueueAddr(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	pa, ok := obj.(*v1alpha1.PodAddress)
	if !ok || pa.Spec.Node != n.name {
		return
	}
	n.queue.Add(attKey{pa.Spec.ContainerID, pa.Spec.IfName})
}

func (n *Node) enqueuePod(obj any) {
	pod, ok := obj.(*corev1.Pod)
	n.mu.Lock()
	synced := n.synced
	n.mu.Unlock()
	// The initial list is covered by Run, which queues every attachment
	// once the caches are synced: no store scan per listed pod.
	if !ok || !synced {
		return
	}
	atts, err := n.agent.Allocations()
	if err != nil {
		return
	}
	for _, a := range atts {
		if a.PodNamespace == pod.Namespace && a.PodName == pod.Name {
			n.queue.Add(attKey{a.ContainerID, a.IfName})
		}
	}
}

// Run serves until ctx ends.
func (n *Node) Run(ctx context.Context) {
	defer n.recorder.Send(n.cs)()
	// Changed queues keys from the start; the queue's own goroutine (for
	// AddAfter) ends only when it is shut down.
	defer n.queue.ShutDown()
	go n.probe(ctx)
	// A node name Kubernetes does not know (a host name that is not the
	// node's name) would make every pod look gone: nothing is reconciled
	// until the node exists.
	if !n.waitNode(ctx) {
		return
	}
	go n.pods.Run(ctx.Done())
	go n.addrs.Run(ctx.Done())
	go n.node.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), n.pods.HasSynced, n.addrs.HasSynced, n.node.HasSynced) {
		return
	}
	n.mu.Lock()
	n.synced = true
	n.mu.Unlock()
	n.log.Info("connected to Kubernetes", "server", n.host, "node", n.name)
	// Everything the agent holds is checked once: a PodAddress missing
	// (published late, or deleted by vpcni-controller while the agent was
	// down) or left over.
	if atts, err := n.agent.Allocations(); err == nil {
		for _, a := range atts {
			n.queue.Add(attKey{a.ContainerID, a.IfName})
		}
	}
	go n.poolLoop(ctx)
	k8s.RunQueue(ctx, n.queue, n.reconcile, n.log)
}

// waitNode waits until the Node object of this agent's node exists.
func (n *Node) waitNode(ctx context.Context) bool {
	for {
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, err := n.cs.CoreV1().Nodes().Get(c, n.name, metav1.GetOptions{})
		cancel()
		n.mu.Lock()
		n.nodeErr = nil
		if apierrors.IsNotFound(err) {
			n.nodeErr = fmt.Errorf("Kubernetes has no node %q: set nodeName (or $VPCNI_NODE_NAME) to this node's name", n.name)
		}
		nodeErr := n.nodeErr
		n.mu.Unlock()
		if err == nil {
			return true
		}
		if nodeErr != nil {
			n.log.Error("not reconciling pods", "err", nodeErr)
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Second):
		}
	}
}

// reconcile brings one attachment's Kubernetes side in line with the
// agent's record: PodAddress and annotations while it exists, no
// PodAddress once it is gone, and a release when vpcni-controller found
// its pod gone.
func (n *Node) reconcile(ctx context.Context, k attKey) (again time.Duration, err error) {
	att, err := n.agent.Allocation(k.containerID, k.ifName)
	if err != nil {
		return 0, err
	}
	name := k8s.PodAddressName(n.name, k.containerID, k.ifName)
	_, published, err := n.addrs.GetIndexer().GetByKey(name)
	if err != nil {
		return 0, err
	}
	if att == nil {
		if !published {
			return 0, nil
		}
		err := n.pas.Delete(ctx, name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("delete PodAddress %s: %w", name, err)
		}
		return 0, nil
	}
	if att.PodName == "" {
		return 0, nil // not a Kubernetes pod
	}
	if att.Wiring == nil {
		// The ADD is in flight, or the record predates wirings: its MAC
		// and gateway are not known yet. The agent queues the attachment
		// again once the record holds them.
		return 0, nil
	}
	pod := n.pod(att)
	if !published {
		if pod == nil {
			// No pod and no PodAddress: vpcni-controller found the pod gone
			// and deleted it (perhaps while the agent was down), or the
			// pod went before the agent published it. Either way the
			// runtime will not DEL it any more.
			if age := time.Since(att.Created); age < n.opts.Orphaned {
				return n.opts.Orphaned - age, nil
			}
			// The caches may lag or be wrong: only the API server's own
			// answer, no such pod and no such PodAddress, releases.
			gone, err := n.confirmGone(ctx, att, name)
			if err != nil || !gone {
				return n.opts.Orphaned, err
			}
			return 0, n.agent.Release(k.containerID, k.ifName, att.Created, "its pod "+att.PodNamespace+"/"+att.PodName+" no longer exists and its PodAddress was deleted")
		}
		if err := n.pas.Create(ctx, k8s.NewPodAddress(n.spec(att, pod))); err != nil && !apierrors.IsAlreadyExists(err) {
			return 0, fmt.Errorf("create PodAddress %s: %w", name, err)
		}
	}
	if pod == nil {
		return 0, nil
	}
	n.warnUnrequested(pod)
	n.warnNetworkNotServed(pod, att)
	return 0, n.annotate(ctx, pod, att)
}

// warnUnrequested says once, on the pod, that the scheduler does not count
// its address: vpcni-controller's webhook, which adds the request, fails
// open (a cluster must not stop creating pods because it is down).
func (n *Node) warnUnrequested(pod *corev1.Pod) {
	if !n.opts.IPResource || !k8s.OnPodNetwork(pod) || k8s.RequestsIP(pod) {
		return
	}
	n.mu.Lock()
	seen := n.warned[pod.UID]
	n.warned[pod.UID] = true
	n.mu.Unlock()
	if seen {
		return
	}
	n.recorder.Eventf(pod, corev1.EventTypeWarning, EventIPNotRequested,
		"the pod requests no %s: vpcni-controller's admission webhook was down or not installed when it was created, so the scheduler does not count its address (vpcnid on %s subtracts it from the node's %s instead). Check the vpcni-controller pods and the MutatingWebhookConfiguration vpcni", k8s.IPResource, n.name, k8s.IPResource)
}

// unrequested counts the addresses in use by pods the scheduler does not
// count (no vpcni.io/ip request, or a pod not seen (yet)), and forgets
// warnings about pods that hold no address any more.
func (n *Node) unrequested() (int, error) {
	atts, err := n.agent.Allocations()
	if err != nil {
		return 0, err
	}
	count, live := 0, map[types.UID]bool{}
	for _, a := range atts {
		pod := n.pod(a)
		if pod == nil {
			count++
			continue
		}
		live[pod.UID] = true
		if !k8s.RequestsIP(pod) {
			count++
		}
	}
	n.mu.Lock()
	for uid := range n.warned {
		if !live[uid] {
			delete(n.warned, uid)
		}
	}
	for uid := range n.notServed {
		if !live[uid] {
			delete(n.notServed, uid)
		}
	}
	n.mu.Unlock()
	return count, nil
}

// syncCapacity advertises vpcni.io/ip and keeps the not-ready taint; it
// reports whether the taint is still wanted.
func (n *Node) syncCapacity(ctx context.Context, p agent.PoolFigures) (bool, error) {
	obj, ok, err := n.node.GetIndexer().GetByKey(n.name)
	if err != nil || !ok {
		return true, fmt.Errorf("node %s not in the cache (%v)", n.name, err)
	}
	unrequested, err := n.unrequested()
	if err != nil {
		return true, err
	}
	return n.capacity.sync(ctx, obj.(*corev1.Node), p, unrequested)
}

// pod is the attachment's pod, nil if the informer has no such pod (or a
// pod of that name that is another pod).
func (n *Node) pod(att *alloc.Allocation) *corev1.Pod {
	obj, ok, err := n.pods.GetIndexer().GetByKey(att.PodNamespace + "/" + att.PodName)
	if err != nil || !ok {
		return nil
	}
	if pod := obj.(*corev1.Pod); isPodOf(pod, att) {
		return pod
	}
	return nil
}

// isPodOf says whether pod is the pod the attachment was made for: the
// runtime's UID, which for a static pod is the kubelet's own (its mirror
// pod in the API names it in an annotation); without a UID (records from
// before vpcni kept it), a pod created before the attachment.
func isPodOf(pod *corev1.Pod, att *alloc.Allocation) bool {
	if att.PodUID != "" {
		return string(pod.UID) == att.PodUID || pod.Annotations[corev1.MirrorPodAnnotationKey] == att.PodUID
	}
	return !pod.CreationTimestamp.Time.After(att.Created.Add(time.Minute))
}

// confirmGone asks the API server itself whether the attachment's pod and
// its PodAddress are both gone.
func (n *Node) confirmGone(ctx context.Context, att *alloc.Allocation, name string) (bool, error) {
	pod, err := n.cs.CoreV1().Pods(att.PodNamespace).Get(ctx, att.PodName, metav1.GetOptions{})
	switch {
	case err == nil && isPodOf(pod, att):
		return false, nil
	case err != nil && !apierrors.IsNotFound(err):
		return false, fmt.Errorf("check pod %s/%s: %w", att.PodNamespace, att.PodName, err)
	}
	_, err = n.pas.Get(ctx, name)
	switch {
	case err == nil:
		return false, nil
	case !apierrors.IsNotFound(err):
		return false, fmt.Errorf("check PodAddress %s: %w", name, err)
	}
	return true, nil
}

// Changed implements agent.Cluster.
func (n *Node) Changed(containerID, ifName string) { n.queue.Add(attKey{containerID, ifName}) }

// Events the agent puts on pods and on its Node, each saying what to do.
const (
	// EventSetupFailed: ADD failed (the runtime retries it).
	EventSetupFailed = "VpcniSetupFailed"
	// EventTeardownFailed: DEL failed; the address stays the pod's until
	// the runtime's retry succeeds.
	EventTeardownFailed = "VpcniTeardownFailed"
	// EventDatapathUnhealthy: the agent's health probe found a pod's
	// wiring broken.
	EventDatapathUnhealthy = "VpcniDatapathUnhealthy"
	// EventDegraded / EventRecovered: the node's agent has served from
	// its pool for 30 s while the cloud fails, and is whole again.
	EventDegraded  = "VpcniDegraded"
	EventRecovered = "VpcniRecovered"
	// EventNotReady: the agent's pool has not been ready for a minute
	// (the provider not connected, or refusing to start; no address left
	// and none to be had).
	EventNotReady = "VpcniNotReady"
	// EventConflistShadowed: another network configuration sorts before
	// the one vpcnid installed, so the runtime gives new pods that network.
	EventConflistShadowed = "VpcniConflistShadowed"
)

func (n *Node) podRef(podNamespace, podName string) *corev1.ObjectReference {
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: podNamespace, Name: podName}
	if obj, ok, _ := n.pods.GetIndexer().GetByKey(podNamespace + "/" + podName); ok {
		ref.UID = obj.(*corev1.Pod).UID
	}
	return ref
}

// nodeRef is the Node as the kubelet names it in its own events (its UID
// is its name there), so kubectl describe node shows vpcni's beside them.
func (n *Node) nodeRef() *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", Name: n.name, UID: types.UID(n.name)}
}

// Failed implements agent.Cluster: a warning event on the pod, with the
// reason and what to do.
func (n *Node) Failed(verb, podNamespace, podName string, aerr *api.Error) {
	msg := aerr.Msg
	if aerr.Details != "" {
		msg += ": " + aerr.Details
	}
	if verb == "DEL" {
		n.recorder.Eventf(n.podRef(podNamespace, podName), corev1.EventTypeWarning, EventTeardownFailed,
			"vpcni on node %s could not take the pod's network down (CNI error %d): %s; its address stays allocated until the runtime's retry of the DEL succeeds (the agent's log says more)", n.name, aerr.Code, msg)
		return
	}
	n.recorder.Eventf(n.podRef(podNamespace, podName), corev1.EventTypeWarning, EventSetupFailed, "vpcni on node %s could not set up the pod's network (CNI error %d): %s", n.name, aerr.Code, msg)
}

// ConflistShadowed puts a warning event on the Node: vpcnid installed its
// network configuration as ours, but the runtime uses the first of before
// (the other networks' files that sort ahead of it).
func (n *Node) ConflistShadowed(ours string, before []string) {
	n.recorder.Eventf(n.nodeRef(), corev1.EventTypeWarning, EventConflistShadowed,
		"vpcni on node %s installed its CNI network configuration %s, but the runtime uses %s, which sorts first in the CNI conf dir: new pods get that network, not vpcni's; remove %s (another CNI's?) or give vpcni's a name that sorts first (vpcnid -conflist-name)",
		n.name, ours, before[0], strings.Join(before, ", "))
}

// Unhealthy implements agent.Cluster: a warning event on the pod.
func (n *Node) Unhealthy(podNamespace, podName, problem string) {
	n.recorder.Eventf(n.podRef(podNamespace, podName), corev1.EventTypeWarning, EventDatapathUnhealthy,
		"vpcni on node %s found the pod's datapath broken: %s; on the node, vpcnictl trace %s/%s names each piece and what to do", n.name, problem, podNamespace, podName)
}

// stateEvents turns the agent's state into Node events, on changes only:
// degraded once it has lasted degradedFor (a flaky cloud's single failed
// call is no news) and recovered after a told degradation; not ready once
// it has lasted a minute (every start is not ready for a moment), again
// only if the kind of reason changes (its figures move all the time).
type stateEvents struct {
	degradedSince time.Time
	toldDegraded  bool
	notReadySince time.Time
	toldNotReady  string
}

const degradedFor = 30 * time.Second

// reasonKind is a reason without its figures.
var figures = regexp.MustCompile(`[0-9]+(\.[0-9]+)?`)

func reasonKind(r string) string { return figures.ReplaceAllString(r, "N") }

func (n *Node) stateEvents(st *stateEvents, p agent.PoolFigures, now time.Time) {
	degraded := p.Ready && p.Degraded
	switch {
	case degraded && st.degradedSince.IsZero():
		st.degradedSince = now
	case !degraded && st.toldDegraded:
		n.recorder.Eventf(n.nodeRef(), corev1.EventTypeNormal, EventRecovered, "vpcni on node %s is no longer degraded", n.name)
		fallthrough
	case !degraded:
		st.degradedSince, st.toldDegraded = time.Time{}, false
	}
	if degraded && !st.toldDegraded && now.Sub(st.degradedSince) >= degradedFor {
		n.recorder.Eventf(n.nodeRef(), corev1.EventTypeWarning, EventDegraded,
			"vpcni on node %s has been degraded for %s: %s; pods on the node keep working, new pods get addresses only while its pool lasts (vpcnictl status and vpcnictl doctor on the node)", n.name, now.Sub(st.degradedSince).Round(time.Second), p.Reason)
		st.toldDegraded = true
	}
	if p.Ready {
		st.notReadySince, st.toldNotReady = time.Time{}, ""
		return
	}
	if st.notReadySince.IsZero() {
		st.notReadySince = now
	}
	if kind := reasonKind(p.Reason); now.Sub(st.notReadySince) >= time.Minute && st.toldNotReady != kind {
		n.recorder.Eventf(n.nodeRef(), corev1.EventTypeWarning, EventNotReady,
			"vpcni on node %s has not been ready for %s: %s; no pod can start on its network (vpcnictl doctor on the node checks each prerequisite)", n.name, now.Sub(st.notReadySince).Round(time.Second), p.Reason)
		st.toldNotReady = kind
	}
}

// Ready implements agent.Cluster.
func (n *Node) Ready() error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.probeErr != nil {
		return fmt.Errorf("cannot reach the Kubernetes API server %s: %w", n.host, n.probeErr)
	}
	if n.nodeErr != nil {
		return n.nodeErr
	}
	if !n.synced {
		return fmt.Errorf("still reading this node's pods from the Kubernetes API server %s", n.host)
	}
	return nil
}

func (n *Node) probe(ctx context.Context) {
	for {
		c, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := n.cs.CoreV1().RESTClient().Get().AbsPath("/version").Do(c).Error()
		cancel()
		if ctx.Err() != nil {
			return
		}
		n.mu.Lock()
		if (err == nil) != (n.probeErr == nil) {
			if err != nil {
				n.log.Warn("Kubernetes API server unreachable", "server", n.host, "err", err)
			} else {
				n.log.Info("Kubernetes API server reachable again", "server", n.host)
			}
		}
		n.probeErr = err
		n.mu.Unlock()
		select {
		case <-ctx.Done():
			return
		case <-time.After(n.opts.ProbeEvery):
		}
	}
}

// poolLoop keeps the node's pool annotations, its vpcni.io/ip resource
// and its not-ready taint current. While the taint is on it looks every
// second: the pool filling is what lets pods onto the node.
func (n *Node) poolLoop(ctx context.Context) {
	var last map[string]string
	var st stateEvents
	for {
		every := n.opts.PoolEvery
		p := n.agent.Pool()
		n.stateEvents(&st, p, time.Now())
		n.flushWarnings(time.Now())
		want := map[string]string{
			AnnotationPoolFree:      strconv.Itoa(p.Free),
			AnnotationPoolAllocated: strconv.Itoa(p.Allocated),
			AnnotationPoolCooling:   strconv.Itoa(p.Cooling),
			AnnotationPoolCapacity:  strconv.Itoa(p.Capacity),
		}
		if p.ProviderPort != "" {
			want[AnnotationProviderPort] = p.ProviderPort
		}
		if !sameMap(want, last) {
			patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": want}})
			c, cancel := context.WithTimeout(ctx, 10*time.Second)
			_, err := n.cs.CoreV1().Nodes().Patch(c, n.name, types.MergePatchType, patch, metav1.PatchOptions{})
			cancel()
			if err == nil {
				last = want
			} else if ctx.Err() == nil {
				n.log.Warn("could not annotate the node with its pool", "node", n.name, "err", err)
			}
		}
		c, cancel := context.WithTimeout(ctx, 10*time.Second)
		tainted, err := n.syncCapacity(c, p)
		cancel()
		// A conflict is the kubelet's status update between our read of
		// the node and the taint's compare-and-swap: retried in a second.
		if err != nil && ctx.Err() == nil && !apierrors.IsConflict(err) {
			n.log.Warn("could not update the node's IP capacity or taint", "node", n.name, "err", err)
		}
		if tainted || err != nil {
			every = min(every, time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(every):
		}
	}
}

func sameMap(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if w, ok := b[k]; !ok || w != v {
			return false
		}
	}
	return true
}
