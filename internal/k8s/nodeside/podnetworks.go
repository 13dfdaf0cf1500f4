package nodeside

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
)

// PodNetworks is the agent's view of the cluster's PodNetworks (a watch of
// them all: a cluster has a handful) and of which one each pod of the node
// is on (the pod's vpcni.io/network, from the node's pod cache). It
// implements agent.PodNetworks.
type PodNetworks struct {
	inf  cache.SharedIndexInformer
	c    *k8s.PodNetworks
	node *Node
}

// NewPodNetworks connects to the API server; Run starts the watch. node
// is the agent's Kubernetes side, whose pod cache tells each pod's network.
func NewPodNetworks(cfg *rest.Config, node *Node) (*PodNetworks, error) {
	c, err := k8s.NewPodNetworks(cfg)
	if err != nil {
		return nil, err
	}
	inf := c.Informer(10 * time.Minute)
	if err := inf.SetTransform(withoutManagedFields); err != nil {
		return nil, err
	}
	return &PodNetworks{inf: inf, c: c, node: node}, nil
}

// Run watches until ctx ends.
func (p *PodNetworks) Run(ctx context.Context) { p.inf.Run(ctx.Done()) }

// NetworkOf is the PodNetwork on pod namespace/name: from the node's pod
// cache, or — for a pod the cache has not seen yet (the runtime can be
// quicker than the watch), or an older pod of the same name it still
// holds (uid tells them apart) — from the API server. Only when that
// fails and PodNetworks exist does it fail: a pod that may be on one must
// not come up on another network.
func (p *PodNetworks) NetworkOf(ctx context.Context, namespace, name, uid string) (string, error) {
	if obj, ok, _ := p.node.pods.GetIndexer().GetByKey(namespace + "/" + name); ok {
		if pod, ok := obj.(*corev1.Pod); ok && (uid == "" || string(pod.UID) == uid) {
			return pod.Annotations[v1alpha1.AnnotationNetwork], nil
		}
	}
	pod, err := p.node.cs.CoreV1().Pods(namespace).Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		// Not a pod of the API (a sandbox a test or the runtime made by
		// hand): the node's default network.
		return "", nil
	}
	if err != nil {
		if p.inf.HasSynced() && len(p.inf.GetStore().ListKeys()) == 0 {
			// No PodNetwork exists: the pod is on the default network
			// whatever it says, and the ADD need not wait for the API
			// server to come back.
			return "", nil
		}
		return "", fmt.Errorf("get pod %s/%s: %w", namespace, name, err)
	}
	if uid != "" && string(pod.UID) != uid {
		return "", fmt.Errorf("pod %s/%s is %s in the API server, not %s as the runtime says: it was recreated under the same name", namespace, name, pod.UID, uid)
	}
	return pod.Annotations[v1alpha1.AnnotationNetwork], nil
}

// Spec is PodNetwork name's section for provider type typ, from the watch
// or, before it has it, from the API server.
func (p *PodNetworks) Spec(ctx context.Context, name, typ string) (json.RawMessage, error) {
	var pn *v1alpha1.PodNetwork
	if obj, ok, _ := p.inf.GetStore().GetByKey(name); ok {
		pn, _ = obj.(*v1alpha1.PodNetwork)
	}
	if pn == nil {
		got, err := p.c.Get(ctx, name)
		if apierrors.IsNotFound(err) {
			return nil, fmt.Errorf("no PodNetwork %s exists (kubectl get podnetworks): create it, or recreate the pod without %s", name, v1alpha1.AnnotationNetwork)
		}
		if err != nil {
			return nil, fmt.Errorf("get PodNetwork %s: %w", name, err)
		}
		pn = got
	}
	var section any
	switch typ {
	case "openstack":
		if pn.Spec.OpenStack != nil {
			section = pn.Spec.OpenStack
		}
	case "static":
		if pn.Spec.Static != nil {
			section = pn.Spec.Static
		}
	case "aws":
		if pn.Spec.AWS != nil {
			section = pn.Spec.AWS
		}
	}
	if section == nil {
		return nil, fmt.Errorf("PodNetwork %s has no %s section: this node's provider is %s", name, typ, typ)
	}
	return json.Marshal(section)
}

// Names lists the watched PodNetworks with a section for provider type
// typ, sorted (none before the first list arrived).
func (p *PodNetworks) Names(typ string) []string {
	var out []string
	for _, obj := range p.inf.GetStore().List() {
		pn, ok := obj.(*v1alpha1.PodNetwork)
		if !ok {
			continue
		}
		s := pn.Spec
		if typ == "openstack" && s.OpenStack != nil || typ == "static" && s.Static != nil || typ == "aws" && s.AWS != nil {
			out = append(out, pn.Name)
		}
	}
	slices.Sort(out)
	return out
}
