// Package sticky proves addresses that follow a StatefulSet pod: a real
// kube-apiserver and etcd (internal/testbed/apiserver), vpcni-controller's
// StickyKeeper, real vpcnid processes on the nodes of a lab (namespaces,
// the lab's Neutron-compatible endpoint for the ports) and the legacy VM's
// real neighbour cache.
package sticky

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

var fixture *apiserver.Server

func TestMain(m *testing.M) {
	testbed.RequireRoot("the sticky address tests (the cached Kubernetes build, the lab)")
	s, err := apiserver.Start(context.Background(), apiserver.Options{LockWait: 3 * time.Minute,
		CRDs: []string{"../../deploy/vpcni.io_podaddresses.yaml", "../../deploy/vpcni.io_addressreservations.yaml"}})
	if err != nil {
		fmt.Fprintln(os.Stderr, "vpcni-test: API server fixture:", err)
		os.Exit(1)
	}
	fixture = s
	fmt.Printf("vpcni-test: etcd + kube-apiserver up at %s in %s\n", s.URL, s.Started.Round(1e6))
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "vpcni-test: stop the API server fixture:", err)
		code = 1
	}
	os.Exit(code)
}
