package k8s

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// StickyKeeper is vpcni-controller's side of addresses that follow a
// StatefulSet pod: it keeps one AddressReservation per pod of every
// StatefulSet annotated vpcni.io/sticky-ip: "true", named as the pod.
//
//   - A pod of such a StatefulSet gets its reservation when the controller
//     first sees the pod, normally before its node's ADD, so that ADD
//     already treats the address as the pod's.
//   - The address the pod first gets (its PodAddress) is recorded in the
//     reservation once and never changed (the CRD refuses a change).
//   - The reservation is deleted when its StatefulSet is deleted, loses
//     the annotation, is replaced by another of the same name (UID), or is
//     scaled to the pod's ordinal or fewer replicas: a pod that will not
//     come back keeps nothing. A pod deleted to be re-created keeps it,
//     whichever node it lands on.
//
// It is level-triggered: each key (namespace/pod name) is recomputed from
// the pod, its StatefulSet, its PodAddresses and the reservation.
type StickyKeeper struct {
	res   *reservations
	log   *slog.Logger
	queue workqueue.TypedRateLimitingInterface[string]

	pods  cache.SharedIndexInformer // metadata only
	sets  cache.SharedIndexInformer
	addrs cache.SharedIndexInformer
	ars   cache.SharedIndexInformer

	created, recorded, deleted atomic.Int64
}

// NewStickyKeeper connects the reconciler; Run starts it.
func NewStickyKeeper(cfg *rest.Config, log *slog.Logger) (*StickyKeeper, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "vpcni-controller"
	res, err := newReservations(cfg)
	if err != nil {
		return nil, err
	}
	pas, err := newPodAddresses(cfg)
	if err != nil {
		return nil, err
	}
	md, err := metadata.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, err
	}
	k := &StickyKeeper{res: res, log: log.With("reconciler", "sticky"),
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]())}
	k.pods = metadatainformer.NewSharedInformerFactory(md, 10*time.Minute).
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
	k.sets = informers.NewSharedInformerFactory(cs, 10*time.Minute).Apps().V1().StatefulSets().Informer()
	k.addrs = pas.informer("", 10*time.Minute, cache.Indexers{IndexPod: podIndex})
	k.ars = res.informer(10 * time.Minute)

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
	return k, nil
}

// Figures counts reservations created, addresses recorded and
// reservations deleted by this process.
func (k *StickyKeeper) Figures() (created, recorded, deleted int64) {
	return k.created.Load(), k.recorded.Load(), k.deleted.Load()
}

// Run reconciles until ctx ends.
func (k *StickyKeeper) Run(ctx context.Context) error {
	defer k.queue.ShutDown()
	for _, inf := range []cache.SharedIndexInformer{k.pods, k.sets, k.addrs, k.ars} {
		go inf.Run(ctx.Done())
	}
	if !cache.WaitForCacheSync(ctx.Done(), k.pods.HasSynced, k.sets.HasSynced, k.addrs.HasSynced, k.ars.HasSynced) {
		return fmt.Errorf("caches did not sync: %w", ctx.Err())
	}
	k.log.Info("keeping the addresses of StatefulSet pods annotated " + v1alpha1.AnnotationStickyIP)
	runQueue(ctx, k.queue, k.reconcile, k.log)
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
		k.log.Info("AddressReservation deleted", "pod", key, "address", ar.Spec.Address, "why", why)
		return 0, nil
	}
	addr := k.addressOf(pod, key)
	if ar == nil {
		if pod == nil {
			return 0, nil // a pod never seen gets its reservation when it appears
		}
		ar = &v1alpha1.AddressReservation{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: v1alpha1.AddressReservationSpec{StatefulSet: set, Ordinal: ordinal, Address: addr}}
		if err := k.res.Create(ctx, ar); err != nil && !apierrors.IsAlreadyExists(err) {
			return 0, fmt.Errorf("create AddressReservation %s: %w", key, err)
		}
		k.created.Add(1)
		k.log.Info("AddressReservation created", "pod", key, "statefulSet", set, "address", addr)
		return 0, nil
	}
	if ar.Spec.Address == "" && addr != "" {
		up := ar.DeepCopy()
		up.Spec.Address = addr
		if err := k.res.Update(ctx, up); err != nil {
			return 0, fmt.Errorf("record %s in AddressReservation %s: %w", addr, key, err)
		}
		k.recorded.Add(1)
		k.log.Info("address recorded in AddressReservation", "pod", key, "address", addr)
	}
	return 0, nil
}

// addressOf is the address of the pod's PodAddress (this pod's, by UID
// when the PodAddress names one), "" if it has none yet.
func (k *StickyKeeper) addressOf(pod *metav1.PartialObjectMetadata, key string) string {
	if pod == nil {
		return ""
	}
	list, _ := k.addrs.GetIndexer().ByIndex(IndexPod, key)
	for _, o := range list {
		pa := o.(*v1alpha1.PodAddress)
		if pa.Spec.PodUID == "" || pa.Spec.PodUID == string(pod.UID) {
			return pa.Spec.Address
		}
	}
	return ""
}
