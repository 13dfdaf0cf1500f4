package controller

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/k8s"
)

// StickyKeeper is vpcni-controller's side of addresses that follow a
// StatefulSet pod: it keeps one AddressReservation per pod of every
// StatefulSet annotated vpcni.io/sticky-ip: "true", named as the pod.
//
//   - A pod of such a StatefulSet gets its reservation when the controller
//     first sees the pod, normally before its node's ADD, so that ADD
//     already treats the address as the pod's.
//   - The address the pod first gets (its PodAddress) is recorded in the
//     reservation once and never changed (the CRD refuses a change); the
//     node and port holding it follow the pod's PodAddress.
//   - The reservation is deleted when its StatefulSet is deleted, loses
//     the annotation, or is scaled so that the pod's ordinal is no longer
//     among its replicas, and when a pod of that name exists that the
//     StatefulSet does not control: a pod that will not come back keeps
//     nothing. A pod deleted to be re-created keeps it, whichever node it
//     lands on.
//   - With a cloud (StickyOptions.Cloud), an address whose node is dead
//     and whose pod is gone is taken off that node's port (takeOver).
//
// It is level-triggered: each key (namespace/pod name) is recomputed from
// the pod, its StatefulSet, its PodAddresses and the reservation.
type StickyKeeper struct {
	opts  StickyOptions
	res   *k8s.AddressReservations
	log   *slog.Logger
	queue workqueue.TypedRateLimitingInterface[string]

	pods  cache.SharedIndexInformer // metadata only
	sets  cache.SharedIndexInformer
	addrs cache.SharedIndexInformer
	ars   cache.SharedIndexInformer
	nodes cache.SharedIndexInformer

	cs       kubernetes.Interface
	recorder k8s.Events

	mu        sync.Mutex
	goneSince map[string]time.Time // nodes missing from the cache, since

	created, recorded, deleted, takenOver atomic.Int64
}

// StickyCloud is the cloud as the keeper needs it: TakeOff removes pod
// addresses from a dead node's port, as that node's own release would —
// only addresses vpcni put there, in one write conditional on the port as
// read. Each cloud implements it (cloudconfig.Cloud).
type StickyCloud interface {
	TakeOff(ctx context.Context, port string, addrs []netip.Addr) error
}

// StickyOptions: how the keeper treats a dead node.
type StickyOptions struct {
	// Cloud takes a reserved address off a dead node's port (nil: the
	// keeper waits for that node to give it back, which a dead node never
	// does — the pod's ADDs get CNI error 11 until then).
	Cloud StickyCloud
	// Grace is how long a Node must be gone, or its Ready condition False
	// or Unknown, before it counts as dead (default 1m). A Node that has
	// no Ready condition yet (its kubelet never reported) is alive.
	Grace time.Duration
}

// NewStickyKeeper connects the reconciler; Run starts it.
func NewStickyKeeper(cfg *rest.Config, opts StickyOptions, log *slog.Logger) (*StickyKeeper, error) {
	if opts.Grace == 0 {
		opts.Grace = time.Minute
	}
	c, err := newClients(cfg)
	if err != nil {
		return nil, err
	}
	res, err := k8s.NewAddressReservations(c.cfg)
	if err != nil {
		return nil, err
	}
	pas, cs := c.pas, c.cs
	k := &StickyKeeper{opts: opts, res: res, cs: cs, recorder: controllerEvents(), log: log.With("reconciler", "sticky"), goneSince: map[string]time.Time{},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	k.pods = metadatainformer.NewSharedInformerFactory(c.md, 10*time.Minute).
		ForResource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Informer()
	// Only what decides a reservation is kept: the owner and the UID.
	if err := k.pods.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			m.ObjectMeta = metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name, UID: m.UID,
				ResourceVersion: m.ResourceVersion, OwnerReferences: m.OwnerReferences}
		}
		return obj, nil
	}); err != nil {
		return nil, err
	}
	f := informers.NewSharedInformerFactory(cs, 10*time.Minute)
	k.sets = f.Apps().V1().StatefulSets().Informer()
	k.nodes = f.Core().V1().Nodes().Informer()
	k.addrs = pas.Informer("", 10*time.Minute, cache.Indexers{k8s.IndexPod: k8s.PodIndex})
	k.ars = res.Informer(10 * time.Minute)
	for _, inf := range []cache.SharedIndexInformer{k.sets, k.addrs, k.ars} {
		if err := dropManagedFields(inf); err != nil {
			return nil, err
		}
	}
	// Of a Node only its Ready condition decides (dead): a whole Node
	// (its images, volumes, the kubelet's other conditions) is kilobytes,
	// a thousand of them megabytes the keeper never reads.
	if err := k.nodes.SetTransform(func(obj any) (any, error) {
		if n, ok := obj.(*corev1.Node); ok {
			lean := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: n.Name, UID: n.UID, ResourceVersion: n.ResourceVersion}}
			if c := readyCondition(n); c != nil {
				lean.Status.Conditions = []corev1.NodeCondition{*c}
			}
			return lean, nil
		}
		return obj, nil
	}); err != nil {
		return nil, err
	}

	key := func(obj any) (namespace, name string, ok bool) {
		if d, isD := obj.(cache.DeletedFinalStateUnknown); isD {
			obj = d.Obj
		}
		switch o := obj.(type) {
		case *metav1.PartialObjectMetadata:
			return o.Namespace, o.Name, true
		case *v1alpha1.AddressReservation:
			return o.Namespace, o.Name, true
		case *v1alpha1.PodAddress:
			return o.Spec.PodNamespace, o.Spec.PodName, true
		}
		return "", "", false
	}
	enqueue := func(obj any) {
		if ns, name, ok := key(obj); ok {
			k.queue.Add(ns + "/" + name)
		}
	}
	h := cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: enqueue}
	_, _ = k.pods.AddEventHandler(h)
	_, _ = k.addrs.AddEventHandler(h)
	_, _ = k.ars.AddEventHandler(h)
	// A StatefulSet's change (scaled, annotated, deleted) wakes its
	// reservations; its pods wake themselves.
	setChanged := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		s, ok := obj.(*appsv1.StatefulSet)
		if !ok {
			return
		}
		for _, o := range k.ars.GetStore().List() {
			if ar := o.(*v1alpha1.AddressReservation); ar.Namespace == s.Namespace && ar.Spec.StatefulSet == s.Name {
				enqueue(ar)
			}
		}
		// And its pods: a set annotated after its pods started (or seen
		// after them) reserves their addresses now.
		for _, o := range k.pods.GetStore().List() {
			if m := o.(*metav1.PartialObjectMetadata); m.Namespace == s.Namespace {
				if set, _, ok := statefulSetOf(m); ok && set == s.Name {
					enqueue(m)
				}
			}
		}
	}
	_, _ = k.sets.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: setChanged,
		UpdateFunc: func(_, n any) { setChanged(n) }, DeleteFunc: setChanged})
	// A node's change (its Ready condition, its deletion) wakes the
	// reservations whose address it holds.
	nodeChanged := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		n, ok := obj.(*corev1.Node)
		if !ok {
			return
		}
		for _, o := range k.ars.GetStore().List() {
			if ar := o.(*v1alpha1.AddressReservation); ar.Spec.Node == n.Name {
				enqueue(ar)
			}
		}
	}
	// Only a change of Ready: a kubelet's heartbeat updates every Node
	// every few minutes (10 s on old kubelets), and each wake reads every
	// reservation.
	_, _ = k.nodes.AddEventHandler(cache.ResourceEventHandlerFuncs{
		UpdateFunc: func(o, n any) {
			on, ok1 := o.(*corev1.Node)
			nn, ok2 := n.(*corev1.Node)
			if ok1 && ok2 && readyStatus(on) == readyStatus(nn) {
				return
			}
			nodeChanged(n)
		}, DeleteFunc: nodeChanged})
	return k, nil
}

// Figures counts reservations created, addresses recorded and
// reservations deleted by this process.
func (k *StickyKeeper) Figures() (created, recorded, deleted, takenOver int64) {
	return k.created.Load(), k.recorded.Load(), k.deleted.Load(), k.takenOver.Load()
}

// Run reconciles until ctx ends.
func (k *StickyKeeper) Run(ctx context.Context) error {
	defer k.queue.ShutDown()
	defer k.recorder.Send(k.cs)()
	for _, inf := range []cache.SharedIndexInformer{k.pods, k.sets, k.addrs, k.ars, k.nodes} {
		go inf.Run(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), k.pods.HasSynced, k.sets.HasSynced, k.addrs.HasSynced, k.ars.HasSynced, k.nodes.HasSynced) {
		return fmt.Errorf("caches did not sync: %w", ctx.Err())
	}
	k.log.Info("keeping the addresses of StatefulSet pods annotated "+v1alpha1.AnnotationStickyIP,
		"deadNodeGrace", k.opts.Grace, "takeOverFromDeadNodes", k.opts.Cloud != nil)
	k8s.RunQueue(ctx, k.queue, k.reconcile, k.log)
	return nil
}

// statefulSetOf is the StatefulSet that controls the pod and the pod's
// ordinal (its name is <set>-<ordinal>), ok false for any other pod.
func statefulSetOf(m *metav1.PartialObjectMetadata) (set string, ordinal int32, ok bool) {
	ref := metav1.GetControllerOfNoCopy(m)
	if ref == nil || ref.Kind != "StatefulSet" || !strings.HasPrefix(ref.APIVersion, "apps/") {
		return "", 0, false
	}
	n, ok := strings.CutPrefix(m.Name, ref.Name+"-")
	if !ok {
		return "", 0, false
	}
	o, err := strconv.ParseInt(n, 10, 32)
	if err != nil || o < 0 {
		return "", 0, false
	}
	return ref.Name, int32(o), true
}

// keeps: the StatefulSet wants its pod with this ordinal to keep its address.
func keeps(s *appsv1.StatefulSet, ordinal int32) bool {
	if s == nil || s.DeletionTimestamp != nil || s.Annotations[v1alpha1.AnnotationStickyIP] != "true" {
		return false
	}
	replicas := int32(1)
	if s.Spec.Replicas != nil {
		replicas = *s.Spec.Replicas
	}
	start := int32(0)
	if s.Spec.Ordinals != nil {
		start = s.Spec.Ordinals.Start
	}
	return ordinal >= start && ordinal < start+replicas
}

func (k *StickyKeeper) reconcile(ctx context.Context, key string) (time.Duration, error) {
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	var ar *v1alpha1.AddressReservation
	if o, ok, _ := k.ars.GetStore().GetByKey(key); ok {
		ar = o.(*v1alpha1.AddressReservation)
	}
	var pod *metav1.PartialObjectMetadata
	if o, ok, _ := k.pods.GetStore().GetByKey(key); ok {
		pod = o.(*metav1.PartialObjectMetadata)
	}
	set, ordinal, owned := "", int32(0), false
	if pod != nil {
		set, ordinal, owned = statefulSetOf(pod)
	}
	if !owned && ar != nil {
		// The pod is away (being re-created): the reservation says whose it is.
		set, ordinal, owned = ar.Spec.StatefulSet, ar.Spec.Ordinal, pod == nil
	}
	var sts *appsv1.StatefulSet
	if owned {
		if o, ok, _ := k.sets.GetStore().GetByKey(ns + "/" + set); ok {
			sts = o.(*appsv1.StatefulSet)
		}
	}
	if !owned || !keeps(sts, ordinal) {
		if ar == nil {
			return 0, nil
		}
		why := "its StatefulSet is gone or no longer annotated " + v1alpha1.AnnotationStickyIP
		if sts != nil && sts.DeletionTimestamp == nil && sts.Annotations[v1alpha1.AnnotationStickyIP] == "true" {
			why = fmt.Sprintf("its StatefulSet was scaled below ordinal %d", ordinal)
		}
		if !owned {
			why = "pod " + key + " is no longer a pod of StatefulSet " + ar.Spec.StatefulSet
		}
		uid, rv := ar.UID, ar.ResourceVersion
		err := k.res.Delete(ctx, ns, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid, ResourceVersion: &rv}})
		if err != nil && !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("delete AddressReservation %s: %w", key, err)
		}
		k.deleted.Add(1)
		reserved, _ := k8s.ReservedAddressesOf(ar)
		k.log.Info("AddressReservation deleted", "pod", key, "addresses", reserved, "why", why)
		return 0, nil
	}
	pa := k.podAddressOf(pod, key)
	var held []netip.Addr // the pod's addresses now, first family first
	if pa != nil {
		held, _ = k8s.AddressesOf(pa)
	}
	if ar == nil {
		if pod == nil {
			return 0, nil // a pod never seen gets its reservation when it appears
		}
		ar = &v1alpha1.AddressReservation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.AddressReservationSpec{StatefulSet: set, Ordinal: ordinal}}
		if pa != nil {
			ar.Spec, _ = recordAddresses(ar.Spec, held, pa.Spec.Node, pa.Spec.ProviderPort)
		}
		if err := k.res.Create(ctx, ar); err != nil && !apierrors.IsAlreadyExists(err) {
			return 0, fmt.Errorf("create AddressReservation %s: %w", key, err)
		}
		k.created.Add(1)
		k.log.Info("AddressReservation created", "pod", key, "statefulSet", set, "addresses", held)
		return 0, nil
	}
	// Where the addresses are now: the pod's PodAddress, when it holds
	// every reserved address (or the reservation none yet).
	if pa != nil {
		if spec, changed := recordAddresses(ar.Spec, held, pa.Spec.Node, pa.Spec.ProviderPort); changed {
			up := ar.DeepCopy()
			up.Spec = spec
			if err := k.res.Update(ctx, up); err != nil {
				return 0, fmt.Errorf("record %v on node %s in AddressReservation %s: %w", held, pa.Spec.Node, key, err)
			}
			if ar.Spec.Address == "" && spec.Address != "" {
				k.recorded.Add(1)
			}
			k.log.Info("AddressReservation updated", "pod", key, "addresses", held, "node", pa.Spec.Node, "port", pa.Spec.ProviderPort)
			return 0, nil
		}
	}
	if reserved, _ := k8s.ReservedAddressesOf(ar); pa == nil && len(reserved) > 0 && ar.Spec.Node != "" {
		return k.takeOver(ctx, ar)
	}
	return 0, nil
}

// recordAddresses is the reservation once it records the pod's addresses
// (held, its PodAddress's, first family first) and where they are now
// (node, port), and whether that is a change to write. Nothing changes
// unless the PodAddress holds every address already reserved: a pod
// that got other addresses (its ADD did not see the reservation yet)
// does not move the reservation, which keeps its own.
//
// Address is the first address recorded and never changes (the CRD's
// rule); addresses is written once the pod has more than one — a
// dual-stack pod's, including a family a reservation recorded before
// dual-stack did not have yet — in the PodAddress's order. A
// single-family reservation keeps address alone, as a controller before
// dual-stack wrote it and still reads and updates it.
func recordAddresses(s v1alpha1.AddressReservationSpec, held []netip.Addr, node, port string) (v1alpha1.AddressReservationSpec, bool) {
	reserved, err := k8s.ReservedAddressesOf(&v1alpha1.AddressReservation{Spec: s})
	if err != nil {
		return s, false // the CRD refuses such: nothing to compare it with
	}
	for _, r := range reserved {
		if !slices.Contains(held, r) {
			return s, false
		}
	}
	fams := map[family.Family]bool{}
	for _, a := range held {
		if fams[family.Of(a)] {
			return s, false // one address per family: the CRD refuses two
		}
		fams[family.Of(a)] = true
	}
	out := s
	out.Node, out.Port = node, port
	if out.Address == "" && len(held) > 0 {
		out.Address = held[0].String()
	}
	if len(held) > 1 || len(s.Addresses) > 0 {
		out.Addresses = k8s.AddressStrings(held)
	}
	changed := out.Address != s.Address || !slices.Equal(out.Addresses, s.Addresses) || out.Node != s.Node || out.Port != s.Port
	return out, changed
}

// EventStickyAddressStuck is the Warning on a sticky pod whose reserved
// address a dead node holds while the controller cannot take it off.
const EventStickyAddressStuck = "VpcniStickyAddressStuck"

// takeOver frees the reserved addresses held by a node that is dead, so
// the node the pod starts on next can take them: off the dead node's port
// (the marked fixed IPs, If-Match; every family's in one write), then the
// reservation forgets the node. A node not dead yet is looked at again
// when its grace ends.
func (k *StickyKeeper) takeOver(ctx context.Context, ar *v1alpha1.AddressReservation) (time.Duration, error) {
	wait, why := k.dead(ar.Spec.Node)
	if wait > 0 || why == "" {
		return wait, nil
	}
	key := ar.Namespace + "/" + ar.Name
	reserved, err := k8s.ReservedAddressesOf(ar)
	if err != nil {
		return 0, fmt.Errorf("AddressReservation %s: %w", key, err)
	}
	if len(reserved) == 0 {
		return 0, nil // nothing recorded: nothing held
	}
	words := addressWords(reserved)
	if k.opts.Cloud == nil {
		k.log.Warn("reserved address held by a dead node: no -cloud-config to take it off its port; the pod's ADDs fail with CNI error 11 until the node gives it back",
			"pod", key, "addresses", reserved, "node", ar.Spec.Node, "why", why)
		k.recorder.Eventf(&corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ar.Namespace, Name: ar.Name}, corev1.EventTypeWarning, EventStickyAddressStuck,
			"the pod's reserved %s held by node %s, which is dead (%s), and vpcni-controller has no -cloud-config to take it off that node's port: the pod's ADDs fail (CNI error 11) until the node gives it back — give the controller -cloud-config (an openstack section with subnetID, or an aws section), bring the node back, or delete AddressReservation %s to let the pod take another address",
			words, ar.Spec.Node, why, key)
		return 0, nil
	}
	if ar.Spec.Port == "" {
		return 0, fmt.Errorf("reserved %s of %s: node %s is dead (%s) but the reservation names no port to take it from", words, key, ar.Spec.Node, why)
	}
	if err := k.opts.Cloud.TakeOff(ctx, ar.Spec.Port, reserved); err != nil {
		return 0, fmt.Errorf("take %v off dead node %s's port %s: %w", reserved, ar.Spec.Node, ar.Spec.Port, err)
	}
	up := ar.DeepCopy()
	up.Spec.Node, up.Spec.Port = "", ""
	if err := k.res.Update(ctx, up); err != nil {
		return 0, fmt.Errorf("AddressReservation %s: %v was taken off node %s's port, but the reservation still names it: %w", key, reserved, ar.Spec.Node, err)
	}
	k.takenOver.Add(1)
	k.log.Info("reserved address taken off a dead node's port", "pod", key, "addresses", reserved, "node", ar.Spec.Node, "port", ar.Spec.Port, "why", why)
	return 0, nil
}

// addressWords names reserved addresses in a message: "address 10.0.0.7
// is", "addresses 10.0.0.7 and fd00::7 are".
func addressWords(addrs []netip.Addr) string {
	s := k8s.AddressStrings(addrs)
	if len(s) == 1 {
		return "address " + s[0] + " is"
	}
	return "addresses " + strings.Join(s, " and ") + " are"
}

func readyCondition(n *corev1.Node) *corev1.NodeCondition {
	for i := range n.Status.Conditions {
		if n.Status.Conditions[i].Type == corev1.NodeReady {
			return &n.Status.Conditions[i]
		}
	}
	return nil
}

// readyStatus is the Node's Ready status and since when ("" without one).
func readyStatus(n *corev1.Node) string {
	if c := readyCondition(n); c != nil {
		return string(c.Status) + " " + c.LastTransitionTime.String()
	}
	return ""
}

// dead says why node counts as dead ("" : it does not), or how long until
// it may.
func (k *StickyKeeper) dead(node string) (wait time.Duration, why string) {
	now := time.Now()
	o, ok, _ := k.nodes.GetStore().GetByKey(node)
	k.mu.Lock()
	defer k.mu.Unlock()
	if !ok {
		since, seen := k.goneSince[node]
		if !seen {
			since = now
			k.goneSince[node] = now
		}
		if left := k.opts.Grace - now.Sub(since); left > 0 {
			return left, ""
		}
		return 0, fmt.Sprintf("its Node is gone (seen missing for %s)", now.Sub(since).Round(time.Second))
	}
	delete(k.goneSince, node)
	for _, c := range o.(*corev1.Node).Status.Conditions {
		if c.Type != corev1.NodeReady || c.Status == corev1.ConditionTrue {
			continue
		}
		if left := k.opts.Grace - now.Sub(c.LastTransitionTime.Time); left > 0 {
			return left, ""
		}
		return 0, fmt.Sprintf("its Node is Ready=%s since %s (%s)", c.Status, c.LastTransitionTime.UTC().Format(time.RFC3339), c.Reason)
	}
	return 0, ""
}

// podAddressOf is the pod's PodAddress (this pod's, by UID when the
// PodAddress names one), nil if it has none yet.
func (k *StickyKeeper) podAddressOf(pod *metav1.PartialObjectMetadata, key string) *v1alpha1.PodAddress {
	if pod == nil {
		return nil
	}
	list, _ := k.addrs.GetIndexer().ByIndex(k8s.IndexPod, key)
	for _, o := range list {
		pa := o.(*v1alpha1.PodAddress)
		if pa.Spec.PodUID == "" || pa.Spec.PodUID == string(pod.UID) {
			return pa
		}
	}
	return nil
}
