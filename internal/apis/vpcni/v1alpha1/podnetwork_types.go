package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// PodNetwork says which pods it covers (a namespace selector and a pod
// selector) and where their addresses come from: exactly one of an
// OpenStack network, static ranges or AWS subnets. vpcni-controller's pod
// webhook chooses the PodNetwork of each new pod and records its name on
// the pod (AnnotationNetwork); a pod no PodNetwork selects gets no
// annotation and is served from its node's default network.
//
// When several PodNetworks select one pod, the one whose name sorts first
// wins (SelectPodNetwork in internal/controller): a rule the operator can
// read off `kubectl get podnetworks`, that does not change with the order
// the controller's cache happened to list them in.
//
// Status is not kept yet: nothing writes it, so the CRD has no status.
//
// +kubebuilder:object:root=true
// +kubebuilder:resource:scope=Cluster,shortName=pn
// +kubebuilder:printcolumn:name=OpenStack-Network,type=string,JSONPath=.spec.openstack.networkID
// +kubebuilder:printcolumn:name=AWS-Subnets,type=string,JSONPath=.spec.aws.subnetIDs
// +kubebuilder:printcolumn:name=Static-Ranges,type=string,JSONPath=.spec.static.ranges
// +kubebuilder:printcolumn:name=Age,type=date,JSONPath=.metadata.creationTimestamp
type PodNetwork struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec PodNetworkSpec `json:"spec"`
}

// PodNetworkSpec is which pods a PodNetwork covers and where their
// addresses come from.
//
// +kubebuilder:validation:XValidation:rule="[has(self.openstack), has(self.static), has(self.aws)].filter(x, x).size() == 1",message="a PodNetwork takes its addresses from exactly one of openstack, static or aws"
type PodNetworkSpec struct {
	// NamespaceSelector selects the namespaces (by their labels) whose
	// pods this network covers; empty or absent: every namespace.
	// +optional
	NamespaceSelector *metav1.LabelSelector `json:"namespaceSelector,omitempty"`
	// PodSelector selects, within those namespaces, the pods (by their
	// labels) this network covers; empty or absent: every pod.
	// +optional
	PodSelector *metav1.LabelSelector `json:"podSelector,omitempty"`

	// OpenStack takes the pods' addresses from a Neutron network.
	// +optional
	OpenStack *OpenStackPodNetwork `json:"openstack,omitempty"`
	// Static takes the pods' addresses from ranges of the operator's.
	// +optional
	Static *StaticPodNetwork `json:"static,omitempty"`
	// AWS takes the pods' addresses from VPC subnets.
	// +optional
	AWS *AWSPodNetwork `json:"aws,omitempty"`
}

// OpenStackPodNetwork is a Neutron network, the subnets of it the pods'
// addresses come from and the security groups of the ports that hold
// them.
type OpenStackPodNetwork struct {
	// NetworkID is the Neutron network's ID.
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	NetworkID string `json:"networkID"`
	// SubnetIDs are the network's subnets the addresses come from, the
	// one with most free addresses first.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	SubnetIDs []string `json:"subnetIDs"`
	// SecurityGroups are the security groups (IDs) of the ports that
	// hold the pods' addresses; absent: the project's default group, as
	// Neutron gives any new port.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +optional
	SecurityGroups []string `json:"securityGroups,omitempty"`
	// PortPerPod gives each pod a Neutron port of its own (with the
	// security groups) instead of an extra address on a NIC shared with
	// the network's other pods on that node.
	// +optional
	PortPerPod bool `json:"portPerPod,omitempty"`
}

// StaticPodNetwork is ranges of the operator's own.
type StaticPodNetwork struct {
	// Ranges are the prefixes (CIDR) the pods' addresses come from, IPv4
	// or IPv6; a dual-stack pod takes one address of each family from
	// them.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=64
	// +kubebuilder:validation:items:MaxLength=43
	// +kubebuilder:validation:items:XValidation:rule="isCIDR(self) && (cidr(self).ip().family() == 4 || cidr(self).ip().family() == 6)",message="each range must be an IPv4 or IPv6 prefix such as 10.30.0.0/24 or fd00:30::/64"
	Ranges []string `json:"ranges"`
	// Gateway is the pods' gateway on the network's segment, for the L2
	// modes (bridge, macvlan); absent: the routed modes' own.
	// +kubebuilder:validation:MaxLength=39
	// +kubebuilder:validation:XValidation:rule="isIP(self) && (ip(self).family() == 4 || ip(self).family() == 6)",message="gateway must be an IPv4 or IPv6 address"
	// +optional
	Gateway string `json:"gateway,omitempty"`
}

// AWSPodNetwork is VPC subnets and the security groups of the ENIs that
// serve them.
type AWSPodNetwork struct {
	// SubnetIDs are the VPC subnets the addresses come from.
	// +kubebuilder:validation:MinItems=1
	// +kubebuilder:validation:MaxItems=32
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	SubnetIDs []string `json:"subnetIDs"`
	// SecurityGroups are the security groups (IDs) of the ENIs that hold
	// the pods' addresses; absent: the VPC's default group.
	// +kubebuilder:validation:MaxItems=16
	// +kubebuilder:validation:items:MinLength=1
	// +kubebuilder:validation:items:MaxLength=64
	// +optional
	SecurityGroups []string `json:"securityGroups,omitempty"`
}

// PodNetworkList is a list of PodNetworks.
//
// +kubebuilder:object:root=true
type PodNetworkList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []PodNetwork `json:"items"`
}

// AnnotationNetwork on a pod names the PodNetwork it was admitted on,
// written by vpcni-controller's webhook when the pod is created (or by
// hand, which the webhook keeps). Absent: the node's default network.
const AnnotationNetwork = "vpcni.io/network"
