// Package blocks proves per-node blocks against a real kube-apiserver and
// etcd (internal/testbed/apiserver, started once for the package):
// vpcni-controller's BlockAssigner and the agents' static provider in
// blocks mode, in-process, each with its own client as in production.
package blocks

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
	testbed.RequireRoot("the API server tests (the cached Kubernetes build)")
	// Another work tree's run holding the fixture is waited for, within
	// the package's own timeout (make k8s-api: 5m).
	s, err := apiserver.Start(context.Background(), apiserver.Options{LockWait: 3 * time.Minute,
		CRDs: []string{"../../deploy/vpcni.io_nodeblocks.yaml", "../../deploy/vpcni.io_podaddresses.yaml"}})
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
