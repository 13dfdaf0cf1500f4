// Package blocks proves per-node blocks against a real kube-apiserver and
// etcd (internal/testbed/apiserver, started once for the package):
// vpcni-controller's BlockAssigner and the agents' static provider in
// blocks mode, in-process, each with its own client as in production;
// and, on the same fixture, the PodNetwork CRD with the pod webhook that
// chooses a pod's network.
package blocks

import (
	"os"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

var fixture *apiserver.Server

func TestMain(m *testing.M) {
	testbed.RequireRoot("the API server tests (the cached Kubernetes build)")
	// Another work tree's run holding the fixture is waited for, within
	// the package's own timeout (make k8s-api: 5m).
	os.Exit(apiserver.RunPackage(m, apiserver.Options{LockWait: 3 * time.Minute,
		CRDs: []string{"../../deploy/vpcni.io_nodeblocks.yaml", "../../deploy/vpcni.io_podaddresses.yaml",
			"../../deploy/vpcni.io_podnetworks.yaml"}}, func(s *apiserver.Server) { fixture = s }))
}
