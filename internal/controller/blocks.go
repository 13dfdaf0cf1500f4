package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/k8s/nodeblocks"
)

// BlockOptions configure the BlockAssigner.
type BlockOptions struct {
	// Families are the cluster-wide ranges and the block size of each
	// family: IPv4's, IPv6's, or both for dual-stack nodes (one set of
	// each family at most).
	Families []ipam.Blocks
	// Grace is how long a Node must be gone before its blocks are given
	// back (a node re-registering under its name keeps them).
	Grace time.Duration
}

// BlockAssigner is vpcni-controller's reconciler of per-node blocks, the
// one writer of NodeBlocks. A node's agent asks for blocks through its
// Node's annotations, one count per family (nodeblocks.WantedKey); the
// assigner creates NodeBlocks of that family for it until it has that
// many. Where the ranges are of one family, vpcni.io/blocks-wanted counts
// too, for that family whichever it is (agents older than per-family
// counts write it alone); dual-stack ranges never read it. A Node gone for Grace gives
// its blocks back, each once no PodAddress of that node has an address
// in it (the orphans reconciler deletes those of pods that are gone).
//
// No two nodes ever share an address: a NodeBlock's name is its block, so
// the API server refuses a second writer's create of the same block
// (AlreadyExists: the assigner takes the next free one), and deletions
// carry the UID and resourceVersion seen (Conflict: look again).
//
// The key of the queue is a node name.
type BlockAssigner struct {
	opts   BlockOptions
	client *nodeblocks.Client
	log    *slog.Logger
	nodes  cache.SharedIndexInformer // metadata only
	blocks cache.SharedIndexInformer
	addrs  cache.SharedIndexInformer
	queue  workqueue.TypedRateLimitingInterface[string]
	cs     kubernetes.Interface
	// recorder puts Events on Nodes: a block assigned (Normal), the
	// ranges full (Warning, with the fix), a block held back (Normal).
	recorder k8s.Events

	mu        sync.Mutex
	goneSince map[string]time.Time
	// recent are blocks this assigner created that its cache may not
	// show yet, so the next reconcile neither hands them out again nor
	// gives their node another.
	recent map[netip.Prefix]recentBlock

	assigned, reclaimed, conflicts atomic.Int64
}

type recentBlock struct {
	node string
	at   time.Time
}

// Index names of the assigner's caches.
const (
	indexNode = "node"
)

// NewBlockAssigner connects the reconciler; Run starts it.
func NewBlockAssigner(cfg *rest.Config, opts BlockOptions, log *slog.Logger) (*BlockAssigner, error) {
	if len(opts.Families) == 0 {
		return nil, errors.New("block assigner: no block ranges")
	}
	seen := map[family.Family]bool{}
	for _, f := range opts.Families {
		if f.Count() == 0 {
			return nil, errors.New("block assigner: no block ranges")
		}
		fam := familyOf(f)
		if seen[fam] {
			return nil, fmt.Errorf("block assigner: two sets of %s block ranges: give each family's ranges in one set", fam)
		}
		seen[fam] = true
	}
	c, err := newClients(cfg)
	if err != nil {
		return nil, err
	}
	client, err := nodeblocks.NewClient(c.cfg)
	if err != nil {
		return nil, err
	}
	pas := c.pas
	b := &BlockAssigner{opts: opts, client: client, log: log.With("reconciler", "blocks"), cs: c.cs,
		recorder:  controllerEvents(),
		queue:     workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		goneSince: map[string]time.Time{}, recent: map[netip.Prefix]recentBlock{}}
	b.nodes = metadatainformer.NewSharedInformerFactory(c.md, 10*time.Minute).
		ForResource(schema.GroupVersionResource{Version: "v1", Resource: "nodes"}).Informer()
	// Of a Node only its name and the request are needed.
	if err := b.nodes.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			om := metav1.ObjectMeta{Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion}
			for _, k := range []string{v1alpha1.AnnotationBlocksWanted, v1alpha1.AnnotationBlocksWantedIPv4, v1alpha1.AnnotationBlocksWantedIPv6} {
				if v, ok := m.Annotations[k]; ok {
					if om.Annotations == nil {
						om.Annotations = map[string]string{}
					}
					om.Annotations[k] = v
				}
			}
			m.ObjectMeta = om
		}
		return obj, nil
	}); err != nil {
		return nil, err
	}
	b.blocks = client.Informer("", 10*time.Minute, cache.Indexers{indexNode: func(obj any) ([]string, error) {
		if nb, ok := obj.(*v1alpha1.NodeBlock); ok {
			return []string{nb.Spec.Node}, nil
		}
		return nil, nil
	}})
	b.addrs = pas.Informer("", 10*time.Minute, cache.Indexers{indexNode: func(obj any) ([]string, error) {
		if pa, ok := obj.(*v1alpha1.PodAddress); ok {
			return []string{pa.Spec.Node}, nil
		}
		return nil, nil
	}})
	for _, inf := range []cache.SharedIndexInformer{b.blocks, b.addrs} {
		if err := dropManagedFields(inf); err != nil {
			return nil, err
		}
	}
	enqueue := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		switch o := obj.(type) {
		case *metav1.PartialObjectMetadata:
			b.queue.Add(o.Name)
		case *v1alpha1.NodeBlock:
			b.queue.Add(o.Spec.Node)
		case *v1alpha1.PodAddress:
			b.queue.Add(o.Spec.Node)
		}
	}
	handler := cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: enqueue}
	_, _ = b.nodes.AddEventHandler(handler)
	_, _ = b.blocks.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) },
		DeleteFunc: func(obj any) {
			// A block given back may be what another node waits for.
			for _, n := range b.nodes.GetStore().ListKeys() {
				b.queue.Add(n)
			}
			enqueue(obj)
		}})
	// Only the deletion of a PodAddress can free a gone node's block.
	_, _ = b.addrs.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: enqueue})
	return b, nil
}

// Assigned counts NodeBlocks created, Reclaimed those deleted because
// their node was gone, Conflicts the creates and deletes the API server
// refused because another writer got there first.
func (b *BlockAssigner) Assigned() int64  { return b.assigned.Load() }
func (b *BlockAssigner) Reclaimed() int64 { return b.reclaimed.Load() }
func (b *BlockAssigner) Conflicts() int64 { return b.conflicts.Load() }

// Run reconciles until ctx ends.
func (b *BlockAssigner) Run(ctx context.Context) error {
	defer b.queue.ShutDown()
	defer b.recorder.Send(b.cs)()
	go b.nodes.Run(ctx.Done())
	go b.blocks.Run(ctx.Done())
	go b.addrs.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), b.nodes.HasSynced, b.blocks.HasSynced, b.addrs.HasSynced) {
		return fmt.Errorf("caches did not sync: %w", ctx.Err())
	}
	for _, f := range b.opts.Families {
		b.log.Info("assigning per-node blocks", "family", familyOf(f), "ranges", f.Ranges, "size", "/"+strconv.Itoa(f.Bits),
			"blocks", f.Count(), "reclaim_grace", b.opts.Grace)
	}
	k8s.RunQueue(ctx, b.queue, b.reconcile, b.log)
	return nil
}

func (b *BlockAssigner) reconcile(ctx context.Context, node string) (time.Duration, error) {
	obj, exists, err := b.nodes.GetIndexer().GetByKey(node)
	if err != nil {
		return 0, err
	}
	if !exists {
		return b.reclaim(ctx, node)
	}
	b.mu.Lock()
	delete(b.goneSince, node)
	b.mu.Unlock()
	m := obj.(*metav1.PartialObjectMetadata)
	// Blocks first: a node waiting for one matters more than a status.
	var retry time.Duration
	for _, f := range b.opts.Families {
		wanted, err := b.wanted(m, familyOf(f))
		if err != nil {
			// The agent writes it; a person who broke it by hand reads this.
			b.log.Warn("node asks for blocks with a bad count; ignored", "node", node, "error", err)
			continue
		}
		after, err := b.assignUpTo(ctx, m, f, wanted)
		if err != nil {
			return 0, err
		}
		if after > 0 {
			retry = after
		}
	}
	have := b.nodeBlocks(node)
	// A node that came back within the grace: its blocks are its own again.
	for _, nb := range have {
		if err := b.setCondition(ctx, nb, metav1.Condition{Type: v1alpha1.ConditionAssigned, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonRequested, Message: "node " + node + " takes its pods' addresses from this block"},
			v1alpha1.ConditionReclaimable); err != nil {
			return 0, err
		}
	}
	return retry, nil
}

// wanted is how many blocks of family fam the node asks for (an error: a
// count a person broke by hand). With ranges of one family,
// vpcni.io/blocks-wanted counts too: agents of one family write it, and
// those older than per-family counts only it. Dual-stack ranges ignore
// it: left on a node from when the cluster was IPv6 only, it would read
// as a request for IPv4 blocks nobody made.
func (b *BlockAssigner) wanted(m *metav1.PartialObjectMetadata, fam family.Family) (int, error) {
	keys := []string{nodeblocks.WantedKey(fam)}
	if len(b.opts.Families) == 1 {
		keys = append(keys, v1alpha1.AnnotationBlocksWanted)
	}
	wanted := 0
	for _, k := range keys {
		v, ok := m.Annotations[k]
		if !ok {
			continue
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("annotation %s: %q is not a count of blocks", k, v)
		}
		wanted = max(wanted, n)
	}
	return wanted, nil
}

// assignUpTo creates NodeBlocks of f's family for the node until it has
// wanted of them; the ranges full, it says so on the Node and asks to be
// run again in a minute.
func (b *BlockAssigner) assignUpTo(ctx context.Context, m *metav1.PartialObjectMetadata, f ipam.Blocks, wanted int) (time.Duration, error) {
	fam := familyOf(f)
	for n := len(ofFamily(b.nodeBlocks(m.Name), fam)) + b.recentOf(m.Name, fam); n < wanted; n++ {
		if err := b.assign(ctx, m, f); err != nil {
			if errors.Is(err, errRangesFull) {
				const fix = "add a range to -block-ranges, or use smaller blocks (-block-size, -block-size-v6)"
				b.log.Warn("no free block for node: the ranges are full", "node", m.Name, "family", fam, "has", n, "wants", wanted,
					"ranges", f.Ranges, "fix", fix)
				b.recorder.Eventf(nodeRef(m), corev1.EventTypeWarning, EventNoFreeBlock,
					"no free /%d block in %v for node %s (it has %d, asks for %d): %s", f.Bits, f.Ranges, m.Name, n, wanted, fix)
				return time.Minute, nil
			}
			return 0, err
		}
	}
	return 0, nil
}

// familyOf is the family of a set of ranges (NewBlocks keeps them to one).
func familyOf(f ipam.Blocks) family.Family { return family.Of(f.Ranges[0].Addr()) }

// ofFamily keeps the NodeBlocks of family fam (one whose CIDR does not
// parse is of none).
func ofFamily(nbs []*v1alpha1.NodeBlock, fam family.Family) []*v1alpha1.NodeBlock {
	return slices.DeleteFunc(nbs, func(nb *v1alpha1.NodeBlock) bool {
		p, err := netip.ParsePrefix(nb.Spec.CIDR)
		return err != nil || family.Of(p.Addr()) != fam
	})
}

var errRangesFull = errors.New("no free block in the ranges")

// Reasons of the Events the assigner puts on Nodes.
const (
	EventBlockAssigned = "VpcniBlockAssigned"
	EventNoFreeBlock   = "VpcniNoFreeBlock"
)

// nodeRef is the object an Event about a Node refers to (Events on Nodes
// live in the default namespace, as the kubelet's do).
func nodeRef(m *metav1.PartialObjectMetadata) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Node", APIVersion: "v1", Name: m.Name, UID: m.UID}
}

// assign creates one NodeBlock for node, on the first block of f no NodeBlock
// (cached, or just created here) overlaps. If another writer created the
// same block first, the API server says AlreadyExists: that block is taken,
// the next one is tried.
func (b *BlockAssigner) assign(ctx context.Context, m *metav1.PartialObjectMetadata, f ipam.Blocks) error {
	node := m.Name
	used := b.usedBlocks()
	for range 64 {
		p, ok := f.Free(used)
		if !ok {
			return errRangesFull
		}
		nb := &v1alpha1.NodeBlock{
			TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: v1alpha1.NodeBlockKind},
			ObjectMeta: metav1.ObjectMeta{Name: v1alpha1.BlockName(p), Labels: map[string]string{v1alpha1.LabelNode: v1alpha1.NodeLabel(node)}},
			Spec:       v1alpha1.NodeBlockSpec{Node: node, CIDR: p.String()},
		}
		created, err := b.client.Create(ctx, nb)
		if apierrors.IsAlreadyExists(err) {
			b.conflicts.Add(1)
			used = append(used, p)
			continue
		}
		if err != nil {
			return fmt.Errorf("create NodeBlock %s for node %s: %w", nb.Name, node, err)
		}
		b.mu.Lock()
		b.recent[p] = recentBlock{node: node, at: time.Now()}
		b.mu.Unlock()
		b.assigned.Add(1)
		b.log.Info("block assigned", "node", node, "block", p)
		b.recorder.Eventf(nodeRef(m), corev1.EventTypeNormal, EventBlockAssigned, "block %s assigned to node %s (NodeBlock %s)", p, node, created.Name)
		return b.setCondition(ctx, created, metav1.Condition{Type: v1alpha1.ConditionAssigned, Status: metav1.ConditionTrue,
			Reason: v1alpha1.ReasonRequested, Message: "node " + node + " takes its pods' addresses from this block"})
	}
	return errors.New("64 blocks in a row were taken by another writer: is a second vpcni-controller assigning without the leader lease?")
}

// reclaim gives a gone node's blocks back, once it has been gone for Grace
// and no PodAddress of it uses them.
func (b *BlockAssigner) reclaim(ctx context.Context, node string) (time.Duration, error) {
	have := b.nodeBlocks(node)
	if len(have) == 0 {
		if b.recentOf(node, 0) > 0 {
			return time.Second, nil // the cache will show them
		}
		b.mu.Lock()
		delete(b.goneSince, node)
		b.mu.Unlock()
		return 0, nil
	}
	b.mu.Lock()
	since, seen := b.goneSince[node]
	if !seen {
		since = time.Now()
		b.goneSince[node] = since
	}
	b.mu.Unlock()
	if wait := b.opts.Grace - time.Since(since); wait > 0 {
		return wait, nil
	}
	addrs, err := b.addrs.GetIndexer().ByIndex(indexNode, node)
	if err != nil {
		return 0, err
	}
	pending := false
	for _, nb := range have {
		p, perr := netip.ParsePrefix(nb.Spec.CIDR)
		var users []string
		for _, obj := range addrs {
			// A block that does not parse may be anyone's.
			if pa := obj.(*v1alpha1.PodAddress); perr != nil || usesBlock(pa, p) {
				users = append(users, pa.Name)
			}
		}
		if len(users) > 0 {
			pending = true
			slices.Sort(users)
			if err := b.setCondition(ctx, nb, metav1.Condition{Type: v1alpha1.ConditionReclaimable, Status: metav1.ConditionFalse,
				Reason: v1alpha1.ReasonPodAddressesInUse,
				Message: fmt.Sprintf("node %s is gone; %d PodAddresses of it still use the block (%s): it is given back once they are deleted",
					node, len(users), users[0])}); err != nil {
				return 0, err
			}
			continue
		}
		uid, rv := nb.UID, nb.ResourceVersion
		err := b.client.Delete(ctx, nb.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		switch {
		case apierrors.IsNotFound(err):
		case apierrors.IsConflict(err):
			b.conflicts.Add(1)
			return 0, fmt.Errorf("NodeBlock %s changed while it was being reclaimed; looking again: %w", nb.Name, err)
		case err != nil:
			return 0, fmt.Errorf("reclaim NodeBlock %s of gone node %s: %w", nb.Name, node, err)
		default:
			b.reclaimed.Add(1)
			b.log.Info("block reclaimed: its node is gone and no PodAddress uses it", "node", node, "block", nb.Spec.CIDR,
				"gone_for", time.Since(since).Round(time.Second))
		}
	}
	if pending {
		// The PodAddresses' deletions wake the node; this is a safety net.
		return time.Minute, nil
	}
	return 0, nil
}

// setCondition writes cond into nb's status (and drops the types in
// drop), unless it is there already. The write carries the
// resourceVersion read: a Conflict means the cache was behind (most often
// this assigner's own write just after the create); the newer object's
// event brings the node back to the queue, so it is no failure.
func (b *BlockAssigner) setCondition(ctx context.Context, nb *v1alpha1.NodeBlock, cond metav1.Condition, drop ...string) error {
	old := meta.FindStatusCondition(nb.Status.Conditions, cond.Type)
	same := old != nil && old.Status == cond.Status && old.Reason == cond.Reason && old.Message == cond.Message
	dropping := slices.ContainsFunc(drop, func(t string) bool { return meta.FindStatusCondition(nb.Status.Conditions, t) != nil })
	if same && !dropping {
		return nil
	}
	nb = nb.DeepCopy()
	cond.ObservedGeneration = nb.Generation
	meta.SetStatusCondition(&nb.Status.Conditions, cond)
	for _, t := range drop {
		meta.RemoveStatusCondition(&nb.Status.Conditions, t)
	}
	_, err := b.client.UpdateStatus(ctx, nb)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		b.conflicts.Add(1)
		return nil
	case err != nil:
		return fmt.Errorf("status of NodeBlock %s: %w", nb.Name, err)
	}
	return nil
}

// nodeBlocks are the node's NodeBlocks in the cache.
func (b *BlockAssigner) nodeBlocks(node string) []*v1alpha1.NodeBlock {
	objs, _ := b.blocks.GetIndexer().ByIndex(indexNode, node)
	out := make([]*v1alpha1.NodeBlock, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(*v1alpha1.NodeBlock))
	}
	slices.SortFunc(out, func(x, y *v1alpha1.NodeBlock) int { return strings.Compare(x.Name, y.Name) })
	return out
}

// recentOf counts the node's blocks of family fam (0: of either) created
// here that the cache does not show yet; entries the cache shows, or older
// than a minute, are dropped.
func (b *BlockAssigner) recentOf(node string, fam family.Family) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := 0
	for p, r := range b.recent {
		_, cached, _ := b.blocks.GetIndexer().GetByKey(v1alpha1.BlockName(p))
		if cached || time.Since(r.at) > time.Minute {
			delete(b.recent, p)
			continue
		}
		if r.node == node && (fam == 0 || family.Of(p.Addr()) == fam) {
			n++
		}
	}
	return n
}

// usedBlocks: every block a NodeBlock holds, whatever its node, plus the
// ones created here the cache does not show yet. A NodeBlock whose CIDR
// does not parse holds nothing it can be matched with; it is logged.
func (b *BlockAssigner) usedBlocks() []netip.Prefix {
	var used []netip.Prefix
	for _, o := range b.blocks.GetStore().List() {
		nb := o.(*v1alpha1.NodeBlock)
		p, err := netip.ParsePrefix(nb.Spec.CIDR)
		if err != nil {
			b.log.Warn("NodeBlock with a bad CIDR: delete it by hand", "nodeblock", nb.Name, "cidr", nb.Spec.CIDR)
			continue
		}
		used = append(used, p.Masked())
	}
	b.mu.Lock()
	for p := range b.recent {
		used = append(used, p)
	}
	b.mu.Unlock()
	return used
}

// Figures are the assigner's state for metrics: blocks by state, the
// nodes waiting for a block, and the counters.
type Figures struct {
	Blocks, Assigned, Free, NodesWaiting int
	Created, Reclaimed, Conflicts        int64
}

// Figures reads the caches: the blocks of the ranges that are assigned
// (any NodeBlock overlapping them) and free, and the nodes whose request
// is not met.
func (b *BlockAssigner) Figures() Figures {
	f := Figures{Created: b.assigned.Load(), Reclaimed: b.reclaimed.Load(), Conflicts: b.conflicts.Load()}
	used := b.usedBlocks()
	for _, fb := range b.opts.Families {
		f.Blocks += fb.Count()
		fb.All(func(p netip.Prefix) bool {
			if slices.ContainsFunc(used, p.Overlaps) {
				f.Assigned++
			}
			return true
		})
	}
	f.Free = f.Blocks - f.Assigned
	for _, obj := range b.nodes.GetStore().List() {
		m := obj.(*metav1.PartialObjectMetadata)
		for _, fb := range b.opts.Families {
			fam := familyOf(fb)
			if wanted, err := b.wanted(m, fam); err == nil && len(ofFamily(b.nodeBlocks(m.Name), fam)) < wanted {
				f.NodesWaiting++
				break
			}
		}
	}
	return f
}

// usesBlock says whether a PodAddress holds an address of block: any of
// its families' (a dual-stack pod's IPv6 address, in addresses only,
// keeps its IPv6 block). An address that does not parse may be anywhere:
// it keeps every block.
func usesBlock(pa *v1alpha1.PodAddress, block netip.Prefix) bool {
	addrs, err := k8s.AddressesOf(pa)
	return err != nil || slices.ContainsFunc(addrs, block.Contains)
}
