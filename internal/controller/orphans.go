package controller

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
)

// Orphans is vpcni-controller's reconciler: it deletes the PodAddress of
// every pod that no longer exists (same namespace, name and UID), once the
// pod has been gone for Grace — the time a running agent needs to see the
// runtime's DEL and delete it itself. The node's agent then releases the
// address (now, or when it starts again).
type Orphans struct {
	Grace time.Duration

	pas   *k8s.PodAddresses
	log   *slog.Logger
	pods  cache.SharedIndexInformer // metadata only: the controller needs no pod specs
	addrs cache.SharedIndexInformer
	queue workqueue.TypedRateLimitingInterface[string]

	mu        sync.Mutex
	goneSince map[string]time.Time // PodAddress name -> when its pod was first seen missing

	released atomic.Int64
}

// NewOrphans connects the reconciler; Run starts it.
func NewOrphans(cfg *rest.Config, grace time.Duration, log *slog.Logger) (*Orphans, error) {
	c, err := newClients(cfg)
	if err != nil {
		return nil, err
	}
	pas := c.pas
	o := &Orphans{Grace: grace, pas: pas, log: log.With("reconciler", "orphans"),
		queue:     workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		goneSince: map[string]time.Time{}}
	o.pods = metadatainformer.NewSharedInformerFactory(c.md, 10*time.Minute).
		ForResource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Informer()
	// Only namespace, name and UID are compared: the rest of each pod's
	// metadata (managed fields, annotations, labels) is not kept.
	if err := o.pods.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			m.ObjectMeta = metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion}
		}
		return obj, nil
	}); err != nil {
		return nil, err
	}
	o.addrs = pas.Informer("", 5*time.Minute, cache.Indexers{k8s.IndexPod: k8s.PodIndex})
	if err := dropManagedFields(o.addrs); err != nil {
		return nil, err
	}
	enqueue := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		if pa, ok := obj.(*v1alpha1.PodAddress); ok {
			o.queue.Add(pa.Name)
		}
	}
	_, _ = o.addrs.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }})
	// A pod's deletion wakes the PodAddresses that name it.
	_, _ = o.pods.AddEventHandler(cache.ResourceEventHandlerFuncs{DeleteFunc: func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		m, ok := obj.(*metav1.PartialObjectMetadata)
		if !ok {
			return
		}
		list, _ := o.addrs.GetIndexer().ByIndex(k8s.IndexPod, m.Namespace+"/"+m.Name)
		for _, a := range list {
			enqueue(a)
		}
	}})
	return o, nil
}

// Released counts PodAddresses deleted because their pod was gone.
func (o *Orphans) Released() int64 { return o.released.Load() }

// Run reconciles until ctx ends.
func (o *Orphans) Run(ctx context.Context) error {
	defer o.queue.ShutDown() // also when the caches never sync
	go o.pods.Run(ctx.Done())
	go o.addrs.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), o.pods.HasSynced, o.addrs.HasSynced) {
		return fmt.Errorf("caches did not sync: %w", ctx.Err())
	}
	o.log.Info("reconciling PodAddresses of pods that are gone", "grace", o.Grace)
	k8s.RunQueue(ctx, o.queue, o.reconcile, o.log)
	return nil
}

func (o *Orphans) reconcile(ctx context.Context, name string) (time.Duration, error) {
	obj, ok, err := o.addrs.GetIndexer().GetByKey(name)
	if err != nil {
		return 0, err
	}
	if !ok {
		o.forget(name)
		return 0, nil
	}
	pa := obj.(*v1alpha1.PodAddress)
	s := pa.Spec
	if o.podExists(s) {
		o.forget(name)
		return 0, nil
	}
	o.mu.Lock()
	since, seen := o.goneSince[name]
	if !seen {
		since = time.Now()
		o.goneSince[name] = since
	}
	o.mu.Unlock()
	if wait := o.Grace - time.Since(since); wait > 0 {
		return wait, nil
	}
	uid := pa.UID // only this object: not one recreated under its name since
	err = o.pas.Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
		return 0, fmt.Errorf("delete PodAddress %s: %w", name, err)
	}
	o.forget(name)
	if err == nil {
		o.released.Add(1)
		addrs, _ := k8s.AddressesOf(pa)
		o.log.Info("pod is gone: its address goes back to the node's pool", "pod", s.PodNamespace+"/"+s.PodName,
			"addresses", addrs, "node", s.Node, "podaddress", name, "gone_for", time.Since(since).Round(time.Second))
	}
	return 0, nil
}

func (o *Orphans) podExists(s v1alpha1.PodAddressSpec) bool {
	obj, ok, err := o.pods.GetIndexer().GetByKey(s.PodNamespace + "/" + s.PodName)
	if err != nil || !ok {
		return false
	}
	m, isMeta := obj.(*metav1.PartialObjectMetadata)
	return !isMeta || s.PodUID == "" || string(m.UID) == s.PodUID
}

func (o *Orphans) forget(name string) {
	o.mu.Lock()
	delete(o.goneSince, name)
	o.mu.Unlock()
}
