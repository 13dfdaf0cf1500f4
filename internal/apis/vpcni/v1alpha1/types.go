package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodAddress is the node agent's public record of one pod attachment's
// addresses: one address, or a dual-stack pod's IPv4 and IPv6 addresses
// together (one object per attachment either way). The agent creates it
// after a pod's ADD and deletes it after the DEL;
// vpcni-controller deletes the PodAddress of a pod that no longer exists,
// and the node's agent then releases the address.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=pa
// +kubebuilder:printcolumn:name=Address,type=string,JSONPath=.spec.address
// +kubebuilder:printcolumn:name=Node,type=string,JSONPath=.spec.node
// +kubebuilder:printcolumn:name=Namespace,type=string,JSONPath=.spec.podNamespace
// +kubebuilder:printcolumn:name=Pod,type=string,JSONPath=.spec.podName
// +kubebuilder:printcolumn:name=Age,type=date,JSONPath=.metadata.creationTimestamp
// +kubebuilder:printcolumn:name=Addresses,type=string,JSONPath=.spec.addresses,priority=1
type PodAddress struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// The schema leaves spec optional, as the CRD vpcni first served did:
	// requiring it now would change a served version's schema.

	// Spec is the pod address and whose it is.
	// +optional
	Spec PodAddressSpec `json:"spec"`
}

// PodAddressSpec is one pod attachment's addresses as the node's agent
// recorded them.
type PodAddressSpec struct {
	// Node is the name of the node whose agent holds the address.
	Node string `json:"node"`
	// PodNamespace is the namespace of the pod the address was given to.
	PodNamespace string `json:"podNamespace"`
	// PodName is the name of the pod the address was given to.
	PodName string `json:"podName"`
	// PodUID is the pod's UID (for a static pod, its mirror pod's);
	// vpcni-controller takes a pod of that name with another UID for gone.
	// +optional
	PodUID string `json:"podUID,omitempty"`
	// ContainerID is the runtime's ID of the pod sandbox.
	ContainerID string `json:"containerID"`
	// IfName is the interface's name inside the pod.
	IfName string `json:"ifName"`
	// Address is the pod's IP address: of a dual-stack pod, the address of
	// its first family (the agent's ipFamilies order), which is
	// Addresses[0]. Readers that predate dual-stack read this alone.
	Address string `json:"address"`
	// Addresses are all of the pod's addresses, first family first (at
	// most one per family). Absent on an object an agent wrote before
	// dual-stack: Address alone is the pod's then.
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MaxLength=39
	// +kubebuilder:validation:items:XValidation:rule="isIP(self)",message="each address must be an IPv4 or IPv6 address"
	// +listType=atomic
	// +optional
	Addresses []string `json:"addresses,omitempty"`
	// MAC is the interface's MAC address.
	// +optional
	MAC string `json:"mac,omitempty"`
	// Gateway is the pod's default gateway (of its first family).
	// +optional
	Gateway string `json:"gateway,omitempty"`
	// Gateways are the gateways of Addresses, in the same order: the
	// next hop of Addresses[i] is Gateways[i] ("" when it has none).
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MaxLength=39
	// +kubebuilder:validation:items:XValidation:rule="size(self) == 0 || isIP(self)",message="each gateway must be an IPv4 or IPv6 address, or empty"
	// +listType=atomic
	// +optional
	Gateways []string `json:"gateways,omitempty"`
	// ProviderPort is the cloud port the address lives on.
	// +optional
	ProviderPort string `json:"providerPort,omitempty"`
}

// PodAddressList is a list of PodAddresses.
//
// +kubebuilder:object:root=true
type PodAddressList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PodAddress `json:"items"`
}
