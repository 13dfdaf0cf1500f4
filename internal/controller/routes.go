package controller

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/k8s/nodeblocks"
	"github.com/vpcni/vpcni/internal/routes"
)

// RouteOptions configure the RouteReconciler.
type RouteOptions struct {
	// Resync is how often the router and the VM ports are read again
	// when nothing in the cluster changed (a route or pair removed by
	// hand makes no Kubernetes event).
	Resync time.Duration
}

// RouteReconciler is vpcni-controller's (the leader's) keeper of the
// routed pod subnet: from the NodeBlocks and their Nodes' InternalIPs it
// has routes.Reconciler put one router route and one VM-port pair per
// block, within the router's budget, and publishes each block's outcome
// as the NodeBlock's Routed condition, Events on the Node and metrics.
//
// The budget is the router's, so the whole set is planned at once: the
// queue has a single key.
type RouteReconciler struct {
	opts   RouteOptions
	rec    *routes.Reconciler
	client *nodeblocks.Client
	log    *slog.Logger
	nodes  cache.SharedIndexInformer
	blocks cache.SharedIndexInformer
	queue  workqueue.TypedRateLimitingInterface[string]
	cs     kubernetes.Interface
	// recorder puts Events on Nodes: a block routed (Normal), a block
	// waiting for the router's or the port's room (Warning, with the fix).
	recorder k8s.Events

	mu   sync.Mutex
	seen map[string]string // NodeBlock -> the state and message last published
	// wrote: NodeBlock -> when this process last wrote its condition.
	wrote map[string]time.Time
	last  routes.Result
	syncs int64
}

// The key of the RouteReconciler's queue: the one router.
const routerKey = "router"

// Reasons of the Events the RouteReconciler puts on Nodes.
const (
	EventBlockRouted        = "VpcniBlockRouted"
	EventRouteBudget        = "VpcniRouteBudgetExhausted"
	EventAddressPairsFull   = "VpcniAddressPairsExhausted"
	EventNodeAddressUnknown = "VpcniNodeAddressUnknown"
)

// NewRouteReconciler connects the reconciler; Run starts it.
func NewRouteReconciler(cfg *rest.Config, rec *routes.Reconciler, opts RouteOptions, log *slog.Logger) (*RouteReconciler, error) {
	if opts.Resync <= 0 {
		opts.Resync = 30 * time.Second
	}
	cfg = clientConfig(cfg)
	client, err := nodeblocks.NewClient(cfg)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	r := &RouteReconciler{opts: opts, rec: rec, client: client, cs: cs, log: log.With("reconciler", "routes"),
		recorder: controllerEvents(), seen: map[string]string{}, wrote: map[string]time.Time{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	r.nodes = informers.NewSharedInformerFactory(cs, 10*time.Minute).Core().V1().Nodes().Informer()
	// Of a Node only its name, UID and addresses matter here.
	if err := r.nodes.SetTransform(func(obj any) (any, error) {
		if n, ok := obj.(*corev1.Node); ok {
			return &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion},
				Status: corev1.NodeStatus{Addresses: n.Status.Addresses}}, nil
		}
		return obj, nil
	}); err != nil {
		return nil, err
	}
	r.blocks = client.Informer("", 10*time.Minute, nil)
	if err := dropManagedFields(r.blocks); err != nil {
		return nil, err
	}
	enqueue := func(any) { r.queue.Add(routerKey) }
	handler := cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(o, n any) {
		// Its own status writes come back as updates: only a change of
		// what is planned from (a Node's addresses) wakes the queue.
		if on, ok := o.(*corev1.Node); ok {
			if nn, ok := n.(*corev1.Node); ok && internalIP(on, family.V4) == internalIP(nn, family.V4) && internalIP(on, family.V6) == internalIP(nn, family.V6) {
				return
			}
		}
		if _, ok := o.(*v1alpha1.NodeBlock); ok {
			return
		}
		enqueue(n)
	}, DeleteFunc: enqueue}
	_, _ = r.nodes.AddEventHandler(handler)
	_, _ = r.blocks.AddEventHandler(handler)
	return r, nil
}

// Run reconciles until ctx ends.
func (r *RouteReconciler) Run(ctx context.Context) error {
	defer r.queue.ShutDown()
	defer r.recorder.Send(r.cs)()
	go r.nodes.Run(ctx.Done())
	go r.blocks.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), r.nodes.HasSynced, r.blocks.HasSynced) {
		return fmt.Errorf("caches did not sync: %w", ctx.Err())
	}
	r.log.Info("routing the nodes' blocks through the Neutron router", "resync", r.opts.Resync)
	r.queue.Add(routerKey)
	k8s.RunQueue(ctx, r.queue, r.reconcile, r.log)
	return nil
}

// Last is the outcome of the last pass that got through, and how many
// passes did.
func (r *RouteReconciler) Last() (routes.Result, int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last, r.syncs
}

// internalIP is the node's InternalIP of family fam: a block's next hop
// is of the block's family (an IPv6 block goes via the node's IPv6
// address, which Neutron would not check for us).
func internalIP(n *corev1.Node, fam family.Family) netip.Addr {
	for _, a := range n.Status.Addresses {
		if a.Type == corev1.NodeInternalIP {
			if ip, err := netip.ParseAddr(a.Address); err == nil && family.Of(ip) == fam {
				return ip
			}
		}
	}
	return netip.Addr{}
}

func (r *RouteReconciler) reconcile(ctx context.Context, _ string) (time.Duration, error) {
	var blocks []routes.Block
	byName := map[string]*v1alpha1.NodeBlock{}
	for _, o := range r.blocks.GetStore().List() {
		nb := o.(*v1alpha1.NodeBlock)
		p, err := netip.ParsePrefix(nb.Spec.CIDR)
		if err != nil {
			continue // the assigner logs it
		}
		b := routes.Block{Name: nb.Name, CIDR: p.Masked(), Node: nb.Spec.Node, Created: nb.CreationTimestamp.Time}
		obj, exists, _ := r.nodes.GetStore().GetByKey(nb.Spec.Node)
		if exists {
			b.NodeIP = internalIP(obj.(*corev1.Node), family.Of(p.Addr()))
		} else {
			b.NodeGone = true
		}
		blocks = append(blocks, b)
		byName[nb.Name] = nb
	}
	res, err := r.rec.Sync(ctx, blocks)
	if err != nil {
		return 0, err
	}
	r.mu.Lock()
	prevFix := r.last.Fix
	r.last = res
	r.syncs++
	r.mu.Unlock()
	if res.Waiting > 0 && res.Fix != prevFix {
		r.log.Warn("blocks wait for room on the router", "waiting", res.Waiting, "routes", res.Routes, "others", res.Others,
			"max_routes", res.Limit, "fix", res.Fix)
	}
	for name, nb := range byName {
		st := res.States[name]
		if err := r.publish(ctx, nb, st, res.Messages[name]); err != nil {
			return 0, err
		}
	}
	r.mu.Lock()
	for name := range r.seen {
		if byName[name] == nil {
			delete(r.seen, name)
		}
	}
	for name := range r.wrote {
		if byName[name] == nil {
			delete(r.wrote, name)
		}
	}
	r.mu.Unlock()
	return r.opts.Resync, nil
}

// publish writes the Routed condition (if it changed) and, when state or
// message changed (a waiting block's fix follows the count of blocks), an
// Event on the block's Node.
//
// A block whose state stays and whose message alone changed is written
// at most once per Resync: while nodes join a full router, every pass
// changes the fix of every waiting block ("raise max_routes to N+1"), and
// rewriting each at each pass made the writes grow with the square of the
// nodes (at 1,000 nodes on a router of 30 routes: 970 condition writes
// and 970 Events a pass, pass after pass, for as long as nodes came).
// The metrics and the log carry the current fix at once.
func (r *RouteReconciler) publish(ctx context.Context, nb *v1alpha1.NodeBlock, st routes.State, msg string) error {
	status := metav1.ConditionFalse
	if st == routes.Routed {
		status = metav1.ConditionTrue
	}
	cond := metav1.Condition{Type: v1alpha1.ConditionRouted, Status: status, Reason: string(st), Message: msg, ObservedGeneration: nb.Generation}
	if old := meta.FindStatusCondition(nb.Status.Conditions, cond.Type); old == nil || old.Status != cond.Status || old.Reason != cond.Reason || old.Message != cond.Message {
		r.mu.Lock()
		recent := time.Since(r.wrote[nb.Name]) < r.opts.Resync
		r.mu.Unlock()
		if old != nil && old.Status == cond.Status && old.Reason == cond.Reason && recent {
			return nil // the figures only: the pass after Resync writes them
		}
		r.mu.Lock()
		r.wrote[nb.Name] = time.Now()
		r.mu.Unlock()
		nb = nb.DeepCopy()
		meta.SetStatusCondition(&nb.Status.Conditions, cond)
		_, err := r.client.UpdateStatus(ctx, nb)
		switch {
		case apierrors.IsNotFound(err), apierrors.IsConflict(err):
			// Gone, or the assigner wrote first: its update brings the
			// block back to the queue only through the resync, so soon.
			return nil
		case err != nil:
			return fmt.Errorf("Routed condition of NodeBlock %s: %w", nb.Name, err)
		}
	}
	r.mu.Lock()
	prev, had := r.seen[nb.Name]
	r.seen[nb.Name] = string(st) + ": " + msg
	r.mu.Unlock()
	if had && prev == string(st)+": "+msg {
		return nil
	}
	ref := &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: nb.Spec.Node}
	switch st {
	case routes.Routed:
		r.recorder.Eventf(ref, corev1.EventTypeNormal, EventBlockRouted, "block %s: %s", nb.Spec.CIDR, msg)
	case routes.NoRouteBudget:
		r.recorder.Eventf(ref, corev1.EventTypeWarning, EventRouteBudget, "block %s: %s", nb.Spec.CIDR, msg)
	case routes.NoPairBudget:
		r.recorder.Eventf(ref, corev1.EventTypeWarning, EventAddressPairsFull, "block %s: %s", nb.Spec.CIDR, msg)
	case routes.NoNodeAddress:
		r.recorder.Eventf(ref, corev1.EventTypeWarning, EventNodeAddressUnknown, "block %s: %s", nb.Spec.CIDR, msg)
	}
	return nil
}
