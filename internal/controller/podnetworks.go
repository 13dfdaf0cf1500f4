package controller

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/metadata/metadatainformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
)

// EventPodNetworkConflict is the Event on the PodNetwork that won a pod
// that other PodNetworks select too.
const EventPodNetworkConflict = "VpcniPodNetworkConflict"

// PodNetworkChoice is the PodNetwork a new pod goes on ("" for none: the
// node's default network) and the other PodNetworks that select it too,
// by name.
type PodNetworkChoice struct {
	Network string
	Others  []string
}

// PodNetworkChooser chooses a new pod's PodNetwork from its namespace and
// its labels. The webhook owns the interface; PodNetworkCache is the one
// that runs.
type PodNetworkChooser interface {
	Choose(ctx context.Context, namespace string, podLabels map[string]string) (PodNetworkChoice, error)
}

// podNetworkSelector is one PodNetwork's selectors, parsed once when the
// PodNetwork is cached, not at each admission.
type podNetworkSelector struct {
	name      string
	uid       string
	namespace labels.Selector
	pod       labels.Selector
}

// compilePodNetwork parses pn's selectors; an absent selector selects
// everything, as an empty one does.
func compilePodNetwork(pn *v1alpha1.PodNetwork) (podNetworkSelector, error) {
	s := podNetworkSelector{name: pn.Name, uid: string(pn.UID), namespace: labels.Everything(), pod: labels.Everything()}
	var errs []error
	if pn.Spec.NamespaceSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(pn.Spec.NamespaceSelector)
		if err != nil {
			errs = append(errs, fmt.Errorf("namespaceSelector: %w", err))
		}
		s.namespace = sel
	}
	if pn.Spec.PodSelector != nil {
		sel, err := metav1.LabelSelectorAsSelector(pn.Spec.PodSelector)
		if err != nil {
			errs = append(errs, fmt.Errorf("podSelector: %w", err))
		}
		s.pod = sel
	}
	if err := errors.Join(errs...); err != nil {
		return podNetworkSelector{}, fmt.Errorf("PodNetwork %s selects no pod: %w", pn.Name, err)
	}
	return s, nil
}

// selectPodNetwork is the selection rule: of the PodNetworks whose
// namespace selector selects the namespace's labels and whose pod selector
// selects the pod's, the one whose name sorts first. nets must be sorted
// by name. Alphabetical, not "most specific": two selectors cannot always
// be ordered by how specific they are, a name can, and the operator reads
// the order off `kubectl get podnetworks`.
func selectPodNetwork(nets []podNetworkSelector, nsLabels, podLabels map[string]string) (PodNetworkChoice, string) {
	var c PodNetworkChoice
	var uid string
	for _, n := range nets {
		if !n.namespace.Matches(labels.Set(nsLabels)) || !n.pod.Matches(labels.Set(podLabels)) {
			continue
		}
		if c.Network == "" {
			c.Network, uid = n.name, n.uid
		} else {
			c.Others = append(c.Others, n.name)
		}
	}
	return c, uid
}

// conflictEvery is how often one conflict (the same winner over the same
// others) is told again, in the log and as an Event: a Deployment of 100
// replicas is one conflict, not 100.
const conflictEvery = 10 * time.Minute

// errNotListed is Choose's answer before the caches are filled.
var errNotListed = errors.New("the PodNetworks are not listed yet (vpcni-controller is starting, or the PodNetwork CRD is not installed)")

// PodNetworkCache chooses pods' PodNetworks from caches of the PodNetworks
// and of the namespaces' labels: the webhook makes no API call for an
// admission, except for a namespace the cache has not seen yet (created
// a moment before its first pod).
type PodNetworkCache struct {
	log      *slog.Logger
	recorder record.EventRecorder
	// nets is every valid PodNetwork's selectors, sorted by name, swapped
	// whole on each change so an admission reads it without a lock.
	nets atomic.Pointer[[]podNetworkSelector]
	// nsLabels looks a namespace's labels up.
	nsLabels func(ctx context.Context, name string) (map[string]string, error)

	mu   sync.Mutex
	told map[string]time.Time // conflict key → when last told; as many as distinct overlaps

	// listed is set once the caches hold their first lists: before, a
	// choice would miss PodNetworks not read yet.
	listed    atomic.Bool
	informers []cache.SharedIndexInformer
	md        metadata.Interface
	events    k8s.Events
}

// newPodNetworkCache is a cache with no PodNetworks yet (setPodNetworks
// fills it) that reads namespaces' labels from nsLabels and records Events
// to recorder; it chooses at once (NewPodNetworkCache's waits for Run's
// first lists).
func newPodNetworkCache(log *slog.Logger, recorder record.EventRecorder, nsLabels func(context.Context, string) (map[string]string, error)) *PodNetworkCache {
	c := &PodNetworkCache{log: log, recorder: recorder, nsLabels: nsLabels, told: map[string]time.Time{}}
	c.nets.Store(&[]podNetworkSelector{})
	c.listed.Store(true)
	return c
}

// setPodNetworks replaces the cached PodNetworks; one whose selectors do
// not parse selects no pod, and is logged.
func (c *PodNetworkCache) setPodNetworks(pns []*v1alpha1.PodNetwork) {
	nets := make([]podNetworkSelector, 0, len(pns))
	for _, pn := range pns {
		s, err := compilePodNetwork(pn)
		if err != nil {
			c.log.Warn("PodNetwork ignored", "err", err)
			continue
		}
		nets = append(nets, s)
	}
	slices.SortFunc(nets, func(a, b podNetworkSelector) int { return strings.Compare(a.name, b.name) })
	c.nets.Store(&nets)
}

// Choose implements PodNetworkChooser.
func (c *PodNetworkCache) Choose(ctx context.Context, namespace string, podLabels map[string]string) (PodNetworkChoice, error) {
	if !c.listed.Load() {
		return PodNetworkChoice{}, errNotListed
	}
	nets := *c.nets.Load()
	if len(nets) == 0 {
		return PodNetworkChoice{}, nil
	}
	nsLabels, err := c.nsLabels(ctx, namespace)
	if err != nil {
		return PodNetworkChoice{}, fmt.Errorf("namespace %s: %w", namespace, err)
	}
	choice, uid := selectPodNetwork(nets, nsLabels, podLabels)
	if len(choice.Others) > 0 {
		c.tellConflict(namespace, choice, uid)
	}
	return choice, nil
}

// tellConflict logs a conflict and records an Event on the winning
// PodNetwork, once per conflictEvery for each conflict.
func (c *PodNetworkCache) tellConflict(namespace string, choice PodNetworkChoice, uid string) {
	key := choice.Network + "/" + strings.Join(choice.Others, ",")
	now := time.Now()
	c.mu.Lock()
	last, seen := c.told[key]
	if seen && now.Sub(last) < conflictEvery {
		c.mu.Unlock()
		return
	}
	c.told[key] = now
	c.mu.Unlock()
	msg := fmt.Sprintf("pods (first in namespace %s) are selected by PodNetworks %s and %s: they go on %s, whose name sorts first",
		namespace, choice.Network, strings.Join(choice.Others, ", "), choice.Network)
	c.log.Warn("PodNetworks overlap", "network", choice.Network, "others", choice.Others, "namespace", namespace)
	if c.recorder != nil {
		ref := &corev1.ObjectReference{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "PodNetwork", Name: choice.Network, UID: types.UID(uid)}
		c.recorder.Event(ref, corev1.EventTypeWarning, EventPodNetworkConflict, msg)
	}
}

// namespaceResource is read as metadata: the labels are all the webhook
// needs of a namespace.
var namespaceResource = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// NewPodNetworkCache connects the cache of PodNetworks and namespaces;
// Run fills it.
func NewPodNetworkCache(cfg *rest.Config, log *slog.Logger) (*PodNetworkCache, error) {
	cl, err := newClients(cfg)
	if err != nil {
		return nil, err
	}
	pns, err := k8s.NewPodNetworks(cl.cfg)
	if err != nil {
		return nil, err
	}
	log = log.With("reconciler", "podnetworks")
	events := controllerEvents()
	nsInf := metadatainformer.NewSharedInformerFactory(cl.md, 10*time.Minute).ForResource(namespaceResource).Informer()
	// Only the name and labels are read.
	if err := nsInf.SetTransform(func(obj any) (any, error) {
		if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
			m.ObjectMeta = metav1.ObjectMeta{Name: m.Name, Labels: m.Labels, ResourceVersion: m.ResourceVersion}
		}
		return obj, nil
	}); err != nil {
		return nil, err
	}
	c := newPodNetworkCache(log, events, nil)
	c.md, c.events = cl.md, events
	c.nsLabels = func(ctx context.Context, name string) (map[string]string, error) {
		if obj, ok, _ := nsInf.GetStore().GetByKey(name); ok {
			if m, ok := obj.(*metav1.PartialObjectMetadata); ok {
				return m.Labels, nil
			}
		}
		m, err := c.md.Resource(namespaceResource).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, err
		}
		return m.Labels, nil
	}
	pnInf := pns.Informer(10 * time.Minute)
	if err := dropManagedFields(pnInf); err != nil {
		return nil, err
	}
	// Every change rebuilds the whole list: PodNetworks are few (one per
	// network of the cluster) and change rarely.
	rebuild := func(any) {
		var list []*v1alpha1.PodNetwork
		for _, obj := range pnInf.GetStore().List() {
			if pn, ok := obj.(*v1alpha1.PodNetwork); ok {
				list = append(list, pn)
			}
		}
		c.setPodNetworks(list)
	}
	if _, err := pnInf.AddEventHandler(cache.ResourceEventHandlerFuncs{AddFunc: rebuild,
		UpdateFunc: func(_, n any) { rebuild(n) }, DeleteFunc: rebuild}); err != nil {
		return nil, err
	}
	c.informers = []cache.SharedIndexInformer{pnInf, nsInf}
	c.listed.Store(false)
	return c, nil
}

// listWait is how long the first lists may take before Run says so.
const listWait = 30 * time.Second

// Run starts the caches and the Events to cs; Choose answers once the
// caches hold their first lists. They run until ctx ends.
func (c *PodNetworkCache) Run(ctx context.Context, cs kubernetes.Interface) {
	stopEvents := c.events.Send(cs)
	defer stopEvents()
	var synced []cache.InformerSynced
	for _, inf := range c.informers {
		go inf.RunWithContext(ctx)
		synced = append(synced, inf.HasSynced)
	}
	// Said once, not at each admission: without the CRD every pod would log it.
	slow := time.AfterFunc(listWait, func() {
		if !c.listed.Load() {
			c.log.Warn("PodNetworks or namespaces not listed yet: new pods get no PodNetwork until they are (is the PodNetwork CRD installed?)", "waited", listWait)
		}
	})
	defer slow.Stop()
	if cache.WaitForCacheSync(ctx.Done(), synced...) {
		c.listed.Store(true)
		c.log.Info("PodNetworks listed", "networks", len(*c.nets.Load()))
	}
	<-ctx.Done()
}
