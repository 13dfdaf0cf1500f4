// Package sticky proves addresses that follow a StatefulSet pod: a real
// kube-apiserver and etcd (internal/testbed/apiserver), vpcni-controller's
// StickyKeeper, real vpcnid processes on the nodes of a lab (namespaces,
// the lab's Neutron-compatible endpoint for the ports) and the legacy VM's
// real neighbour cache.
package sticky

import (
	"os"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

var fixture *apiserver.Server

func TestMain(m *testing.M) {
	testbed.RequireRoot("the sticky address tests (the cached Kubernetes build, the lab)")
	os.Exit(apiserver.RunPackage(m, apiserver.Options{LockWait: 3 * time.Minute,
		CRDs: []string{"../../deploy/vpcni.io_podaddresses.yaml", "../../deploy/vpcni.io_addressreservations.yaml"}}, func(s *apiserver.Server) { fixture = s }))
}
