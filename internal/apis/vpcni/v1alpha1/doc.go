// Package v1alpha1 is the vpcni.io/v1alpha1 API: the PodAddress object
// (cluster-scoped), one per pod address, written by the node's vpcnid and
// deleted by vpcni-controller once its pod is gone; and the NodeBlock
// (cluster-scoped), one aligned block of a cluster-wide range given to one
// node, written only by vpcni-controller; and the AddressReservation
// (namespaced, named as its pod), the address a StatefulSet pod keeps
// across re-creation, written only by vpcni-controller; and the PodNetwork
// (cluster-scoped), which pods take their addresses from which network,
// written by the operator and read by vpcni-controller's pod webhook.
//
// The Go types here are the one definition of that API: the deep copies in
// zz_generated.deepcopy.go and the CRD in deploy/ are generated from them
// (`make generate`; `make verify-generate` fails when either is stale).
//
// +kubebuilder:object:generate=true
// +groupName=vpcni.io
package v1alpha1

// The generator is pinned here, and only here; `go run pkg@version` builds
// it in its own module, so its dependencies stay out of go.mod.
//go:generate go run sigs.k8s.io/controller-tools/cmd/controller-gen@v0.23.0 object crd paths=. output:crd:artifacts:config=../../../../deploy
