package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// SchemeGroupVersion is the API's group and version.
var SchemeGroupVersion = schema.GroupVersion{Group: "vpcni.io", Version: "v1alpha1"}

// Resource is the PodAddress API resource.
var Resource = SchemeGroupVersion.WithResource("podaddresses")

// Kind is the PodAddress object's kind.
const Kind = "PodAddress"

// NodeBlockResource is the NodeBlock API resource, NodeBlockKind its kind.
var NodeBlockResource = SchemeGroupVersion.WithResource("nodeblocks")

// NodeBlockKind is the NodeBlock object's kind.
const NodeBlockKind = "NodeBlock"

// ReservationResource is the AddressReservation API resource.
var ReservationResource = SchemeGroupVersion.WithResource("addressreservations")

// PodNetworkResource is the PodNetwork API resource.
var PodNetworkResource = SchemeGroupVersion.WithResource("podnetworks")

var (
	// SchemeBuilder registers this API's types.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds this API's types to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// addKnownTypes registers the objects and, through AddToGroupVersion, the
// list, get, watch and delete options a client encodes into query
// parameters for this group.
func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(SchemeGroupVersion, &PodAddress{}, &PodAddressList{}, &NodeBlock{}, &NodeBlockList{},
		&AddressReservation{}, &AddressReservationList{}, &PodNetwork{}, &PodNetworkList{})
	metav1.AddToGroupVersion(s, SchemeGroupVersion)
	return nil
}
