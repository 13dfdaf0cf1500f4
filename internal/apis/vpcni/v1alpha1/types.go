package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodAddress is the node agent's public record of one pod address. The
// agent creates it after a pod's ADD and deletes it after the DEL;
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
type PodAddress struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// The schema leaves spec optional, as the CRD vpcni first served did:
	// requiring it now would change a served version's schema.

	// Spec is the pod address and whose it is.
	// +optional
	Spec PodAddressSpec `json:"spec"`
}

// PodAddressSpec is one pod address as the node's agent recorded it.
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
	// Address is the pod's IP address.
	Address string `json:"address"`
	// MAC is the interface's MAC address.
	// +optional
	MAC string `json:"mac,omitempty"`
	// Gateway is the pod's default gateway.
	// +optional
	Gateway string `json:"gateway,omitempty"`
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
