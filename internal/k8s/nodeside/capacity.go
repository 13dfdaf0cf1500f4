package nodeside

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcni/vpcni/internal/agent"
	"github.com/vpcni/vpcni/internal/k8s"
)

const (
	// TaintNotReady keeps pods off a node whose pool has not yet reached
	// its warm target (a new node, or an agent that restarted without
	// addresses): they would only wait for the cloud there.
	TaintNotReady = "vpcni.io/not-ready"
	// EventIPNotRequested is the Warning on a pod on the pod network that
	// requests no vpcni.io/ip (k8s.IPResource).
	EventIPNotRequested = "VpcniIPNotRequested"
)

// ipCapacity is what the node advertises as vpcni.io/ip: every address it
// may hold (those its pods use, those it holds free or cooling, those it
// may still obtain), less the addresses used by pods the scheduler does
// not count because they request none (admitted while the webhook was
// down, or created before it existed). The scheduler subtracts what the
// pods it placed request. A provider that knows no bound (Capacity 0)
// leaves the kubelet's pod limit as the bound.
func ipCapacity(p agent.PoolFigures, podLimit int64, unrequested int) int64 {
	total := int64(p.Capacity)
	if total <= 0 {
		total = podLimit
	}
	return max(0, total-int64(unrequested))
}

// poolWarm: the pool has reached its warm target, or holds all it may
// (a node whose pods use every address it may hold is as warm as it gets;
// tainting it would keep it tainted).
func poolWarm(p agent.PoolFigures) bool {
	return p.Free >= p.WarmTarget || (p.Capacity > 0 && p.Free+p.Cooling+p.Allocated >= p.Capacity)
}

// nodeCapacity keeps the scheduler's view of one node: the vpcni.io/ip
// resource in its status and the not-ready taint on its spec.
type nodeCapacity struct {
	cs            kubernetes.Interface
	ipResource    bool
	notReadyTaint bool
	// warmed: the pool reached its warm target once since the agent
	// started; the taint is never put back in this run (a pool drained by
	// pods is what the resource is for, not a not-ready node).
	warmed bool
}

// sync brings node (as last seen) in line with the pool. It reports
// whether the taint is still wanted, so the caller looks again soon. The
// two parts are independent: a resource that cannot be written (no right
// to nodes/status, say) must not keep a warm node tainted.
func (c *nodeCapacity) sync(ctx context.Context, node *corev1.Node, p agent.PoolFigures, unrequested int) (tainted bool, err error) {
	rerr := c.syncResource(ctx, node, p, unrequested)
	if !c.warmed && poolWarm(p) {
		c.warmed = true
	}
	want := c.notReadyTaint && !c.warmed
	return want, errors.Join(rerr, c.syncTaint(ctx, node, want))
}

// networkResources is what the node advertises per PodNetwork
// (k8s.NetworkResource): the addresses of it the node may hold (0: none,
// the scheduler places no pod of it here), the kubelet's pod limit when
// that is unknown; nil for every resource of a
// PodNetwork the node may no longer serve, which the patch removes.
func networkResources(node *corev1.Node, p agent.PoolFigures, podLimit int64) map[string]any {
	out := map[string]any{}
	for name, room := range p.Networks {
		r, ok := k8s.NetworkResource(name)
		if !ok {
			continue
		}
		v := int64(room)
		if v < 0 {
			v = podLimit // unknown: the kubelet's pod limit bounds it
		}
		want := resource.NewQuantity(v, resource.DecimalSI)
		capQ, hasCap := node.Status.Capacity[r]
		allocQ, hasAlloc := node.Status.Allocatable[r]
		if !hasCap || !hasAlloc || capQ.Cmp(*want) != 0 || allocQ.Cmp(*want) != 0 {
			out[string(r)] = want.String()
		}
	}
	for r := range node.Status.Capacity {
		name, ours := strings.CutPrefix(string(r), k8s.NetworkResourcePrefix)
		if _, wanted := p.Networks[name]; ours && !wanted {
			out[string(r)] = nil
		}
	}
	return out
}

func (c *nodeCapacity) syncResource(ctx context.Context, node *corev1.Node, p agent.PoolFigures, unrequested int) error {
	podLimit := int64(110) // the kubelet's default maxPods
	if q, ok := node.Status.Capacity[corev1.ResourcePods]; ok {
		podLimit = q.Value()
	}
	if !c.ipResource {
		p.Networks = nil // off: every pn.vpcni.io/<name> goes with vpcni.io/ip
	}
	if nets := networkResources(node, p, podLimit); len(nets) > 0 {
		patch, _ := json.Marshal(map[string]any{"status": map[string]any{"capacity": nets, "allocatable": nets}})
		if _, err := c.cs.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
			return fmt.Errorf("advertise the PodNetworks' resources %v on node %s: %w", nets, node.Name, err)
		}
	}
	var want *resource.Quantity
	if c.ipResource {
		want = resource.NewQuantity(ipCapacity(p, podLimit, unrequested), resource.DecimalSI)
	}
	capQ, hasCap := node.Status.Capacity[k8s.IPResource]
	allocQ, hasAlloc := node.Status.Allocatable[k8s.IPResource]
	switch {
	case want != nil && !p.Connected && hasCap:
		// The provider's bound is not known yet (an agent restarting
		// while the cloud is unreachable): what the node advertised stays.
		return nil
	case want == nil && !hasCap && !hasAlloc:
		return nil
	case want != nil && hasCap && hasAlloc && capQ.Cmp(*want) == 0 && allocQ.Cmp(*want) == 0:
		return nil
	}
	// Allocatable too: the kubelet derives it from capacity, but only at
	// its next status update; the scheduler reads allocatable.
	var v any // nil removes the resource
	if want != nil {
		v = want.String()
	}
	patch, _ := json.Marshal(map[string]any{"status": map[string]any{
		"capacity":    map[string]any{string(k8s.IPResource): v},
		"allocatable": map[string]any{string(k8s.IPResource): v},
	}})
	if _, err := c.cs.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{}, "status"); err != nil {
		return fmt.Errorf("advertise %s=%v on node %s: %w", k8s.IPResource, v, node.Name, err)
	}
	return nil
}

func (c *nodeCapacity) syncTaint(ctx context.Context, node *corev1.Node, want bool) error {
	var taints []corev1.Taint
	has := false
	for _, t := range node.Spec.Taints {
		if t.Key == TaintNotReady {
			has = true
			continue
		}
		taints = append(taints, t)
	}
	if has == want {
		return nil
	}
	if want {
		taints = append(taints, corev1.Taint{Key: TaintNotReady, Effect: corev1.TaintEffectNoSchedule})
	}
	if taints == nil {
		taints = []corev1.Taint{}
	}
	// The whole list is written (a merge patch replaces lists), so the
	// node's resourceVersion makes it a compare-and-swap: a taint another
	// writer added meanwhile is not lost; the caller retries on conflict.
	patch, _ := json.Marshal(map[string]any{
		"metadata": map[string]any{"resourceVersion": node.ResourceVersion},
		"spec":     map[string]any{"taints": taints},
	})
	if _, err := c.cs.CoreV1().Nodes().Patch(ctx, node.Name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("%s taint %s on node %s: %w", map[bool]string{true: "set", false: "remove"}[want], TaintNotReady, node.Name, err)
	}
	return nil
}
