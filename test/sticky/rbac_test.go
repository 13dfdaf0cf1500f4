package sticky

import (
	"context"
	"testing"

	"k8s.io/client-go/rest"
)

// vpcni's namespace in deploy/ (kustomization.yaml puts every namespaced
// object there).
const system = "vpcni-system"

// installRBAC creates deploy/namespace.yaml and deploy/rbac.yaml's objects
// (those already there are left), so the keeper and the agents run with
// exactly the rights the deployment grants them.
func installRBAC(t *testing.T) {
	t.Helper()
	if err := fixture.Apply(context.Background(), system, "../../deploy/namespace.yaml", "../../deploy/rbac.yaml"); err != nil {
		t.Fatal(err)
	}
}

// as is the fixture's admin acting as vpcni's service account sa, with
// only the rights RBAC gives that account.
func as(sa string) *rest.Config { return fixture.As(system, sa) }

// kubeconfigAs is as(sa) in a kubeconfig file, for a vpcnid process.
func kubeconfigAs(t *testing.T, sa string) string {
	t.Helper()
	path, err := fixture.KubeconfigAs(t.TempDir(), system, sa)
	if err != nil {
		t.Fatal(err)
	}
	return path
}
