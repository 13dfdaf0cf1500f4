package controller

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/k8s"
)

// Pod annotations of floating IPs: the three a user sets, and the one
// vpcni-controller writes back.
const (
	// AnnotationFloatingIP asks for a floating IP: "auto" (any address of
	// the network; a retained one of this pod's name first) or an IPv4
	// address of the external network.
	AnnotationFloatingIP = "vpcni.io/floating-ip"
	// AnnotationFloatingNetwork is the external network (name or ID);
	// default -floating-network.
	AnnotationFloatingNetwork = "vpcni.io/floating-network"
	// AnnotationFloatingPolicy: "release" (default: deleted with the pod)
	// or "retain" (kept, unassociated, for the next pod of this name).
	AnnotationFloatingPolicy = "vpcni.io/floating-ip-policy"
	// AnnotationFloatingAddress is the floating IP the pod got.
	AnnotationFloatingAddress = "vpcni.io/floating-ip-address"
)

// FloatingIPs is vpcni-controller's floating IP reconciler. Per pod
// (namespace/name): while the pod lives, asks for a floating IP and has a
// PodAddress (its node, address and port), the floating IP points at that
// address on that port (the pod's IPv4 address: floating IPs are IPv4);
// once the pod is terminating, gone, or no longer asks, the floating IP is
// detached and then deleted or kept by its policy.
//
// The address must not leave the port while a floating IP points at it
// (Neutron does not detach it, and the L3 agent keeps forwarding the
// floating address to whoever gets the fixed IP next). The node's agent
// enforces that: its provider keeps an address on the port while a
// floating IP points at it, and retries (see the openstack provider's
// withFloatingIPs). The controller detaches as soon as the pod is
// terminating — the kubelet's CNI DEL comes after that — so the agent
// rarely has to wait.
type FloatingIPs struct {
	// Network is the default external network (-floating-network).
	Network string

	cloud    floatingip.Cloud
	log      *slog.Logger
	cs       kubernetes.Interface
	pods     cache.SharedIndexInformer // metadata: annotations, UID, deletion
	addrs    cache.SharedIndexInformer
	queue    workqueue.TypedRateLimitingInterface[string]
	recorder k8s.Events

	// owners are the pods that may hold a floating IP (seen in Neutron at
	// start, or given one since): only their events cost a Neutron call,
	// not every pod's of the cluster.
	mu     sync.Mutex
	owners map[string]bool
}

// NewFloatingIPs connects the reconciler; Run starts it.
func NewFloatingIPs(cfg *rest.Config, cloud floatingip.Cloud, network string, log *slog.Logger) (*FloatingIPs, error) {
	c, err := newClients(cfg)
	if err != nil {
		return nil, err
	}
	pas := c.pas
	f := &FloatingIPs{Network: network, cloud: cloud, log: log.With("reconciler", "floating-ips"), cs: c.cs,
		queue:    workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[string]()),
		recorder: controllerEvents(), owners: map[string]bool{}}
	f.pods = metadatainformer.NewSharedInformerFactory(c.md, 10*time.Minute).
		ForResource(schema.GroupVersionResource{Version: "v1", Resource: "pods"}).Informer()
	// Only what the reconciler reads is kept of each pod.
	if err := f.pods.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			om := metav1.ObjectMeta{Namespace: m.Namespace, Name: m.Name, UID: m.UID, ResourceVersion: m.ResourceVersion, DeletionTimestamp: m.DeletionTimestamp}
			for _, k := range []string{AnnotationFloatingIP, AnnotationFloatingNetwork, AnnotationFloatingPolicy, AnnotationFloatingAddress} {
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
	f.addrs = pas.Informer("", 10*time.Minute, cache.Indexers{k8s.IndexPod: k8s.PodIndex})
	if err := dropManagedFields(f.addrs); err != nil {
		return nil, err
	}
	enqueue := func(obj any) {
		if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
			obj = d.Obj
		}
		switch o := obj.(type) {
		case *metav1.PartialObjectMetadata:
			f.queue.Add(o.Namespace + "/" + o.Name)
		case *v1alpha1.PodAddress:
			f.queue.Add(o.Spec.PodNamespace + "/" + o.Spec.PodName)
		}
	}
	handler := cache.ResourceEventHandlerFuncs{AddFunc: enqueue, UpdateFunc: func(_, n any) { enqueue(n) }, DeleteFunc: enqueue}
	_, _ = f.pods.AddEventHandler(handler)
	_, _ = f.addrs.AddEventHandler(handler)
	return f, nil
}

// Run reconciles until ctx ends.
func (f *FloatingIPs) Run(ctx context.Context) error {
	defer f.queue.ShutDown()
	defer f.recorder.Send(f.cs)()
	go f.pods.Run(ctx.Done())
	go f.addrs.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), f.pods.HasSynced, f.addrs.HasSynced) {
		return fmt.Errorf("caches did not sync: %w", ctx.Err())
	}
	// Pods gone while no controller ran still have their floating IPs
	// marked in Neutron: each owner gets a look.
	if owned, err := f.cloud.Owned(ctx, ""); err != nil {
		f.log.Warn("cannot list the floating IPs of pods at start; those of pods gone meanwhile are detached at their next event", "err", err)
	} else {
		for _, o := range owned {
			f.setOwner(o.Owner, true)
			f.queue.Add(o.Owner)
		}
	}
	f.log.Info("reconciling floating IPs of pods", "default_network", f.Network)
	k8s.RunQueue(ctx, f.queue, f.reconcile, f.log)
	return nil
}

// spec is what a pod's annotations ask for.
type fipSpec struct {
	address netip.Addr
	network string
	policy  string
}

// parseFloating reads a pod's annotations; ok is false when it asks for
// no floating IP.
func (f *FloatingIPs) parseFloating(ann map[string]string) (s fipSpec, ok bool, err error) {
	v, ok := ann[AnnotationFloatingIP]
	if !ok {
		return s, false, nil
	}
	var errs []error
	if v != "auto" {
		a, perr := netip.ParseAddr(v)
		if perr != nil || !a.Is4() || !a.IsGlobalUnicast() {
			errs = append(errs, fmt.Errorf("%s: %q is neither \"auto\" nor an IPv4 unicast address", AnnotationFloatingIP, v))
		}
		s.address = a
	}
	s.network = ann[AnnotationFloatingNetwork]
	if s.network == "" {
		s.network = f.Network
	}
	if s.network == "" {
		errs = append(errs, fmt.Errorf("%s: not set, and vpcni-controller has no -floating-network default", AnnotationFloatingNetwork))
	}
	switch s.policy = ann[AnnotationFloatingPolicy]; s.policy {
	case "":
		s.policy = floatingip.Release
	case floatingip.Release, floatingip.Retain:
	default:
		errs = append(errs, fmt.Errorf("%s: %q is not one of release, retain", AnnotationFloatingPolicy, s.policy))
	}
	return s, true, errors.Join(errs...)
}

func (f *FloatingIPs) reconcile(ctx context.Context, key string) (time.Duration, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil
	}
	var pod *metav1.PartialObjectMetadata
	if obj, ok, _ := f.pods.GetIndexer().GetByKey(key); ok {
		pod, _ = obj.(*metav1.PartialObjectMetadata)
	}
	live := pod != nil && pod.DeletionTimestamp == nil
	var spec fipSpec
	wants := false
	if live {
		var perr error
		spec, wants, perr = f.parseFloating(pod.Annotations)
		if perr != nil {
			// Nothing is created or changed for a bad request: the
			// Event says what to fix, and an edit of the annotation
			// brings the pod back here.
			f.recorder.Event(podRef(pod), corev1.EventTypeWarning, "VpcniFloatingIPInvalid", perr.Error())
			return 0, nil
		}
	}
	if !wants {
		return 0, f.detach(ctx, key, pod, nil)
	}
	pa := f.podAddress(key, string(pod.UID))
	if pa == nil {
		return 0, nil // the PodAddress's creation brings it back
	}
	fixed, ok := fixedIPv4(pa)
	if !ok || pa.Spec.ProviderPort == "" {
		f.recorder.Eventf(podRef(pod), corev1.EventTypeWarning, "VpcniFloatingIPFailed",
			"the pod's PodAddress %s names no IPv4 address and cloud port (address %q, addresses %q, port %q): a floating IP is an IPv4 address that points at the pod's IPv4 address, so an IPv6-only pod gets none; is the node's provider openstack?",
			pa.Name, pa.Spec.Address, pa.Spec.Addresses, pa.Spec.ProviderPort)
		return 0, nil
	}
	f.setOwner(key, true) // before the call: a timeout may still have created it
	want := floatingip.Want{Owner: key, Network: spec.network, Address: spec.address, Policy: spec.policy, PortID: pa.Spec.ProviderPort, FixedIP: fixed}
	got, err := f.cloud.Ensure(ctx, want)
	if err != nil {
		reason := "VpcniFloatingIPFailed"
		if errors.Is(err, floatingip.ErrInvalid) {
			reason = "VpcniFloatingIPInvalid"
		}
		f.recorder.Event(podRef(pod), corev1.EventTypeWarning, reason, err.Error())
		if errors.Is(err, floatingip.ErrInvalid) {
			return 0, nil
		}
		return 0, err
	}
	// Another floating IP of this pod (the annotation named another
	// address since) goes by its policy.
	if err := f.detach(ctx, key, nil, func(x floatingip.FIP) bool { return x.ID == got.ID }); err != nil {
		return 0, err
	}
	if pod.Annotations[AnnotationFloatingAddress] == got.Address {
		return 0, nil
	}
	if err := f.annotate(ctx, ns, name, pod.UID, &got.Address); err != nil {
		return 0, err
	}
	f.recorder.Eventf(podRef(pod), corev1.EventTypeNormal, "VpcniFloatingIPAssociated",
		"floating IP %s -> %s on port %s (policy %s)", got.Address, fixed, pa.Spec.ProviderPort, spec.policy)
	f.log.Info("floating IP associated", "pod", key, "floating_ip", got.Address, "address", fixed, "port", pa.Spec.ProviderPort)
	return 0, nil
}

// detach detaches the pod's floating IPs but keep, and tells the pod (if
// it is still there) what became of each.
func (f *FloatingIPs) detach(ctx context.Context, key string, pod *metav1.PartialObjectMetadata, keep func(floatingip.FIP) bool) error {
	if !f.isOwner(key) {
		return nil
	}
	done, err := f.cloud.Detach(ctx, key, keep)
	if err == nil && keep == nil {
		f.setOwner(key, false)
	}
	for _, d := range done {
		ref := f.refFor(key, pod)
		what := "released (deleted)"
		if d.Policy == floatingip.Retain {
			what = "retained: it stays in the project, unassociated, for the next pod named " + key
		}
		f.recorder.Eventf(ref, corev1.EventTypeNormal, "VpcniFloatingIPDetached", "floating IP %s detached from %s and %s", d.Address, d.FixedIP, what)
		f.log.Info("floating IP detached", "pod", key, "floating_ip", d.Address, "address", d.FixedIP, "policy", d.Policy)
	}
	if err != nil {
		return err
	}
	if pod != nil && pod.DeletionTimestamp == nil && pod.Annotations[AnnotationFloatingAddress] != "" && keep == nil {
		ns, name, _ := cache.SplitMetaNamespaceKey(key)
		return f.annotate(ctx, ns, name, pod.UID, nil)
	}
	return nil
}

func (f *FloatingIPs) setOwner(key string, on bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if on {
		f.owners[key] = true
	} else {
		delete(f.owners, key)
	}
}

func (f *FloatingIPs) isOwner(key string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.owners[key]
}

// refFor is the pod an Event goes on: the live one, or the one the
// PodAddress recorded (the pod may be gone).
func (f *FloatingIPs) refFor(key string, pod *metav1.PartialObjectMetadata) *corev1.ObjectReference {
	if pod != nil {
		return podRef(pod)
	}
	ns, name, _ := cache.SplitMetaNamespaceKey(key)
	ref := &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: ns, Name: name}
	if list, _ := f.addrs.GetIndexer().ByIndex(k8s.IndexPod, key); len(list) > 0 {
		ref.UID = types.UID(list[0].(*v1alpha1.PodAddress).Spec.PodUID)
	}
	return ref
}

func podRef(pod *metav1.PartialObjectMetadata) *corev1.ObjectReference {
	return &corev1.ObjectReference{Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}
}

// podAddress is the pod's PodAddress of its first interface (eth0, else
// any) recorded for this incarnation of the pod.
func (f *FloatingIPs) podAddress(key, uid string) *v1alpha1.PodAddress {
	list, _ := f.addrs.GetIndexer().ByIndex(k8s.IndexPod, key)
	var best *v1alpha1.PodAddress
	for _, o := range list {
		pa := o.(*v1alpha1.PodAddress)
		if pa.DeletionTimestamp != nil || pa.Spec.PodUID != "" && pa.Spec.PodUID != uid {
			continue
		}
		if best == nil || pa.Spec.IfName == "eth0" {
			best = pa
		}
	}
	return best
}

// fixedIPv4 is the pod's address a floating IP points at: its IPv4 one,
// whichever family is its first. Neutron's floating IPs are IPv4 and NAT
// to an IPv4 fixed IP only; a pod's IPv6 address is reached directly
// (routed, no NAT), so a dual-stack pod's floating IP maps to its IPv4
// address and an IPv6-only pod has nothing to map one to.
func fixedIPv4(pa *v1alpha1.PodAddress) (netip.Addr, bool) {
	addrs, _ := k8s.AddressesOf(pa)
	for _, a := range addrs {
		if a.Is4() {
			return a, true
		}
	}
	return netip.Addr{}, false
}

// annotate writes (or, with nil, removes) the pod's floating address, only
// on the pod of this UID.
func (f *FloatingIPs) annotate(ctx context.Context, ns, name string, uid types.UID, addr *string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"uid":         uid,
		"annotations": map[string]any{AnnotationFloatingAddress: addr},
	}})
	_, err := f.cs.CoreV1().Pods(ns).Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or another pod of that name: its own events decide
	}
	if err != nil {
		return fmt.Errorf("annotate pod %s/%s: %w", ns, name, err)
	}
	return nil
}
