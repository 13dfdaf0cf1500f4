package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// NodeBlock is one aligned block of a cluster-wide range, given to one
// node: that node's pods take their addresses only from its blocks, so
// one configuration serves every node and no two nodes hand out the same
// address. vpcni-controller is the only writer: it creates a node's
// blocks when the node's agent asks (the Node annotation
// vpcni.io/blocks-wanted) and deletes them once the node is gone for good
// and no PodAddress of it uses them any more.
//
// The object's name is the block (BlockName: "10.20.0.64-26"), so the API
// server itself refuses a second object for the same block: two writers
// racing for one block cannot both win. The spec never changes.
//
// The API server holds the name to the block, so uniqueness by name is
// uniqueness by block whoever writes:
// +kubebuilder:validation:XValidation:rule="self.metadata.name == self.spec.cidr.replace('/', '-').replace(':', '-')",message="a NodeBlock's name is its CIDR with '/' (and ':') as '-', e.g. 10.20.0.64-26"
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=nb
// +kubebuilder:subresource:status
// +kubebuilder:printcolumn:name=CIDR,type=string,JSONPath=.spec.cidr
// +kubebuilder:printcolumn:name=Node,type=string,JSONPath=.spec.node
// +kubebuilder:printcolumn:name=Routed,type=string,JSONPath=`.status.conditions[?(@.type=="Routed")].reason`
// +kubebuilder:printcolumn:name=Age,type=date,JSONPath=.metadata.creationTimestamp
type NodeBlock struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec NodeBlockSpec `json:"spec"`
	// +optional
	Status NodeBlockStatus `json:"status,omitempty"`
}

// NodeBlockSpec is the block and the node it belongs to.
//
// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="a block's node and cidr never change: delete the NodeBlock and create another"
type NodeBlockSpec struct {
	// Node is the name of the node whose pods take addresses from the block.
	// +kubebuilder:validation:MinLength=1
	Node string `json:"node"`
	// CIDR is the block, e.g. 10.20.0.64/26: no host bits.
	// +kubebuilder:validation:MaxLength=43
	// +kubebuilder:validation:XValidation:rule="isCIDR(self) && cidr(self) == cidr(self).masked()",message="cidr must be a CIDR without host bits, e.g. 10.20.0.64/26"
	CIDR string `json:"cidr"`
}

// NodeBlockStatus is what vpcni-controller last saw of the block.
type NodeBlockStatus struct {
	// Conditions: Assigned (the node may use the block), Reclaimable
	// (its node is gone; False while PodAddresses of it still use the
	// block, with how many) and, with a routed pod subnet on OpenStack,
	// Routed (True: the router's route and the VM port's pair are set;
	// False: why not, with the fix).
	// +listType=map
	// +listMapKey=type
	// +optional
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// NodeBlockList is a list of NodeBlocks.
//
// +kubebuilder:object:root=true
type NodeBlockList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []NodeBlock `json:"items"`
}

// Condition types and reasons of a NodeBlock.
const (
	ConditionAssigned    = "Assigned"
	ConditionReclaimable = "Reclaimable"
	ConditionRouted      = "Routed"

	ReasonRequested         = "RequestedByNode"
	ReasonNodeGone          = "NodeGone"
	ReasonPodAddressesInUse = "PodAddressesInUse"
)
