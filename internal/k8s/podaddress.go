// Package k8s connects vpcni to Kubernetes: the agent's side (pod
// annotations, events, node pool figures, one PodAddress object per pod
// address) and vpcni-controller's reconciler, which releases the addresses
// of pods that are gone.
//
// A PodAddress (vpcni.io/v1alpha1, cluster-scoped) is the agent's public
// record of one allocation. The agent creates it after a pod's ADD and
// deletes it after the DEL. vpcni-controller deletes the PodAddress of a
// pod that no longer exists; the agent then releases the address — at once
// when it runs, or at its next start when it was down. The agent stays the
// only writer to its node's cloud port, so the controller never races it
// there.
package k8s

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"regexp"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// Annotations the agent writes on pods (like kube-ovn's) and nodes.
const (
	AnnotationIP           = "vpcni.io/ip-address"
	AnnotationMAC          = "vpcni.io/mac-address"
	AnnotationGateway      = "vpcni.io/gateway"
	AnnotationInterface    = "vpcni.io/interface"
	AnnotationProviderPort = "vpcni.io/provider-port"

	AnnotationPoolFree      = "vpcni.io/pool-free"
	AnnotationPoolAllocated = "vpcni.io/pool-allocated"
	AnnotationPoolCooling   = "vpcni.io/pool-cooling"
	AnnotationPoolCapacity  = "vpcni.io/pool-capacity"

	// LabelNode selects a node's PodAddresses.
	LabelNode = "vpcni.io/node"
	// IndexPod indexes PodAddresses by "namespace/name" of their pod.
	IndexPod = "pod"
)

// PodAddressResource is the PodAddress API resource.
var PodAddressResource = schema.GroupVersionResource{Group: "vpcni.io", Version: "v1alpha1", Resource: "podaddresses"}

// PodAddressSpec is one pod address as the agent recorded it.
type PodAddressSpec struct {
	Node         string `json:"node"`
	PodNamespace string `json:"podNamespace"`
	PodName      string `json:"podName"`
	PodUID       string `json:"podUID,omitempty"`
	ContainerID  string `json:"containerID"`
	IfName       string `json:"ifName"`
	Address      string `json:"address"`
	MAC          string `json:"mac,omitempty"`
	Gateway      string `json:"gateway,omitempty"`
	ProviderPort string `json:"providerPort,omitempty"`
}

// PodAddressName names the object of one attachment on one node: stable,
// short, and a valid object name whatever the container ID looks like.
func PodAddressName(node, containerID, ifName string) string {
	sum := sha256.Sum256([]byte(node + "\x00" + containerID + "\x00" + ifName))
	return "pa-" + hex.EncodeToString(sum[:10])
}

// NodeLabel is the LabelNode value of a node: its name, or a hash of it
// where the name is no valid label value (longer than 63 characters).
func NodeLabel(node string) string {
	if len(node) <= 63 && labelValue.MatchString(node) {
		return node
	}
	sum := sha256.Sum256([]byte(node))
	return "h-" + hex.EncodeToString(sum[:16])
}

var labelValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)

// ToUnstructured builds the object.
func (s PodAddressSpec) ToUnstructured() *unstructured.Unstructured {
	data, _ := json.Marshal(s)
	spec := map[string]any{}
	_ = json.Unmarshal(data, &spec)
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": PodAddressResource.GroupVersion().String(),
		"kind":       "PodAddress",
		"metadata": map[string]any{
			"name":   PodAddressName(s.Node, s.ContainerID, s.IfName),
			"labels": map[string]any{LabelNode: NodeLabel(s.Node)},
		},
		"spec": spec,
	}}
	return u
}

// SpecOf reads a PodAddress's spec.
func SpecOf(obj any) (PodAddressSpec, error) {
	var s PodAddressSpec
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return s, fmt.Errorf("not a PodAddress: %T", obj)
	}
	data, err := json.Marshal(u.Object["spec"])
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal(data, &s); err != nil {
		return s, fmt.Errorf("PodAddress %s: %w", u.GetName(), err)
	}
	return s, nil
}

// podIndex indexes PodAddresses by their pod.
func podIndex(obj any) ([]string, error) {
	s, err := SpecOf(obj)
	if err != nil {
		return nil, nil
	}
	return []string{s.PodNamespace + "/" + s.PodName}, nil
}

// RestConfig is the kubeconfig's cluster, or the pod's own service account
// when kubeconfig is empty.
func RestConfig(kubeconfig string) (*rest.Config, error) {
	if kubeconfig == "" {
		kubeconfig = os.Getenv("KUBECONFIG")
	}
	if kubeconfig != "" {
		cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s: %w", kubeconfig, err)
		}
		return cfg, nil
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("not in a pod and no kubeconfig given: %w", err)
	}
	return cfg, nil
}
