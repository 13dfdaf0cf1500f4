package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// AddressReservation keeps a StatefulSet pod's address across its
// re-creation, on any node. Its namespace and name are the pod's (web-0 in
// namespace shop: AddressReservation shop/web-0), so there is at most one
// per pod name and the agent finds it from the pod's CNI_ARGS alone.
//
// vpcni-controller creates it for each pod of a StatefulSet annotated
// vpcni.io/sticky-ip: "true", records the address the pod first gets
// (from its PodAddress), and deletes it when the StatefulSet is deleted,
// loses the annotation, or is scaled below the pod's ordinal. An agent
// whose ADD is for a pod with a reservation asks for the reserved address
// (and gives it straight back to the cloud at DEL, so the next node can
// take it); while another node still holds it the ADD fails with CNI
// error 11 and the runtime retries. When that node is dead (its Node gone,
// or not Ready, for longer than the controller's grace) the controller
// takes the address off its port itself (needs -cloud-config).
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:shortName=ar
// +kubebuilder:printcolumn:name=Address,type=string,JSONPath=.spec.address
// +kubebuilder:printcolumn:name=Node,type=string,JSONPath=.spec.node
// +kubebuilder:printcolumn:name=StatefulSet,type=string,JSONPath=.spec.statefulSet
// +kubebuilder:printcolumn:name=Age,type=date,JSONPath=.metadata.creationTimestamp
// +kubebuilder:printcolumn:name=Addresses,type=string,JSONPath=.spec.addresses,priority=1
type AddressReservation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec AddressReservationSpec `json:"spec"`
}

// AddressReservationSpec is the pod's StatefulSet and, once it got them,
// its addresses.
//
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.address) || size(oldSelf.address) == 0 || (has(self.address) && self.address == oldSelf.address)",message="a reservation's address never changes once recorded: delete the AddressReservation to give it up"
// +kubebuilder:validation:XValidation:rule="!has(oldSelf.addresses) || (has(self.addresses) && oldSelf.addresses.all(a, a in self.addresses))",message="a reservation's addresses never change once recorded (another family's may be added): delete the AddressReservation to give them up"
// +kubebuilder:validation:XValidation:rule="!has(self.addresses) || size(self.addresses) == 0 || (has(self.address) && self.address in self.addresses)",message="address must be one of addresses"
type AddressReservationSpec struct {
	// StatefulSet is the name of the pod's StatefulSet (same namespace).
	// +kubebuilder:validation:MinLength=1
	StatefulSet string `json:"statefulSet"`
	// Ordinal is the pod's ordinal in the StatefulSet (web-3: 3); the
	// reservation goes when the StatefulSet is scaled to Ordinal or fewer
	// replicas.
	// +kubebuilder:validation:Minimum=0
	Ordinal int32 `json:"ordinal"`
	// Address is the pod's address, empty until it first got one: of a
	// dual-stack pod, the one of its first family (an IPv6-only pod's is
	// IPv6). Readers that predate dual-stack read this alone.
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="size(self) == 0 || (isIP(self) && ip.isCanonical(self))",message="address must be an IPv4 or IPv6 address in its canonical form"
	// +optional
	Address string `json:"address,omitempty"`
	// Addresses are all of the pod's reserved addresses, at most one per
	// family, Address among them. Absent on a reservation recorded before
	// dual-stack: Address alone is reserved then. Once recorded an address
	// stays; a family the pod did not have yet may be added.
	// +kubebuilder:validation:MaxItems=2
	// +kubebuilder:validation:items:MaxLength=39
	// +kubebuilder:validation:items:XValidation:rule="isIP(self) && ip.isCanonical(self) && (ip(self).family() == 4 || ip(self).family() == 6)",message="each address must be an IPv4 or IPv6 address in its canonical form"
	// +kubebuilder:validation:XValidation:rule="self.all(a, self.exists_one(b, ip(b).family() == ip(a).family()))",message="at most one address per family"
	// +listType=atomic
	// +optional
	Addresses []string `json:"addresses,omitempty"`
	// Node is the node whose pod last held the address and Port its cloud
	// port (from the pod's PodAddress), empty once the controller took
	// the address off a dead node's port: where to take it from when that
	// node dies with it.
	// +optional
	Node string `json:"node,omitempty"`
	// +optional
	Port string `json:"port,omitempty"`
}

// AddressReservationList is a list of AddressReservations.
//
// +kubebuilder:object:root=true
type AddressReservationList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AddressReservation `json:"items"`
}

// AnnotationStickyIP on a StatefulSet ("true") makes its pods' addresses
// follow them: each pod name keeps its first address.
const AnnotationStickyIP = "vpcni.io/sticky-ip"
