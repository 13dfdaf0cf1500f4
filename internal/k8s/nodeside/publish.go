package nodeside

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// spec is the attachment's PodAddress. Its pod UID is the API's (for a
// static pod, its mirror pod's), which vpcni-controller compares. Address
// and Gateway are the first family's, which every reader before
// dual-stack reads; Addresses and Gateways are all of them.
func (n *Node) spec(att *alloc.Allocation, pod *corev1.Pod) v1alpha1.PodAddressSpec {
	uid := att.PodUID
	if pod != nil {
		uid = string(pod.UID)
	}
	addrs, gws := addressesOf(att)
	return v1alpha1.PodAddressSpec{
		Node: n.name, PodNamespace: att.PodNamespace, PodName: att.PodName, PodUID: uid,
		ContainerID: att.ContainerID, IfName: att.IfName, Address: att.Address.String(), Addresses: addrs,
		MAC: att.PodMAC(), Gateway: addrString(att.PodGateway()), Gateways: gws, ProviderPort: n.agent.ProviderPort(),
	}
}

// addressesOf spells the attachment's addresses, first family first, and
// the gateway of each in the same place ("" for one the wiring does not
// name); gws is nil when it names none, as the PodAddress then leaves
// gateways out.
func addressesOf(att *alloc.Allocation) (addrs, gws []string) {
	known := false
	for _, a := range att.Addresses() {
		gw := addrString(att.GatewayOf(a))
		known = known || gw != ""
		addrs = append(addrs, a.String())
		gws = append(gws, gw)
	}
	if !known {
		gws = nil
	}
	return addrs, gws
}

// annotate writes the pod's network facts, if they differ.
func (n *Node) annotate(ctx context.Context, pod *corev1.Pod, att *alloc.Allocation) error {
	addrs, gws := addressesOf(att)
	want := map[string]string{
		AnnotationIP:           att.Address.String(),
		AnnotationIPs:          strings.Join(addrs, ","),
		AnnotationMAC:          att.PodMAC(),
		AnnotationGateway:      addrString(att.PodGateway()),
		AnnotationGateways:     strings.Join(gws, ","),
		AnnotationInterface:    att.IfName,
		AnnotationProviderPort: n.agent.ProviderPort(),
	}
	// What is not known yet (a record whose wiring is still being
	// written, a provider not connected) is left as the pod has it: the
	// agent queues the pod again once it knows.
	for k, v := range want {
		if v == "" {
			delete(want, k)
		}
	}
	same := true
	for k, v := range want {
		if pod.Annotations[k] != v {
			same = false
		}
	}
	if same {
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": want}})
	_, err := n.cs.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("annotate pod %s/%s: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}

// addrString is an address as annotations write it; "" when unknown.
func addrString(a netip.Addr) string {
	if !a.IsValid() {
		return ""
	}
	return a.String()
}
