package sticky

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// vpcni's namespace in deploy/ (kustomization.yaml puts every namespaced
// object there).
const system = "vpcni-system"

// installRBAC creates deploy/namespace.yaml and deploy/rbac.yaml's objects
// (those already there are left), so the keeper and the agents run with
// exactly the rights the deployment grants them.
func installRBAC(t *testing.T, cs kubernetes.Interface) {
	t.Helper()
	ctx := context.Background()
	for _, f := range []string{"../../deploy/namespace.yaml", "../../deploy/rbac.yaml"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range bytes.Split(data, []byte("\n---")) {
			if len(bytes.TrimSpace(doc)) == 0 {
				continue
			}
			obj, _, err := scheme.Codecs.UniversalDeserializer().Decode(doc, nil, nil)
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			switch o := obj.(type) {
			case *corev1.Namespace:
				_, err = cs.CoreV1().Namespaces().Create(ctx, o, metav1.CreateOptions{})
			case *corev1.ServiceAccount:
				_, err = cs.CoreV1().ServiceAccounts(system).Create(ctx, o, metav1.CreateOptions{})
			case *rbacv1.ClusterRole:
				_, err = cs.RbacV1().ClusterRoles().Create(ctx, o, metav1.CreateOptions{})
			case *rbacv1.ClusterRoleBinding:
				_, err = cs.RbacV1().ClusterRoleBindings().Create(ctx, o, metav1.CreateOptions{})
			case *rbacv1.Role:
				_, err = cs.RbacV1().Roles(system).Create(ctx, o, metav1.CreateOptions{})
			case *rbacv1.RoleBinding:
				_, err = cs.RbacV1().RoleBindings(system).Create(ctx, o, metav1.CreateOptions{})
			default:
				t.Fatalf("%s: a %T this test does not install", f, obj)
			}
			if err != nil && !apierrors.IsAlreadyExists(err) {
				t.Fatalf("%s: %v", f, err)
			}
		}
	}
}

// as is the fixture's admin acting as vpcni's service account sa, with
// only the rights RBAC gives that account.
func as(sa string) *rest.Config {
	cfg := rest.CopyConfig(fixture.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + system + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + system, "system:authenticated"}}
	return cfg
}

// kubeconfigAs is as(sa) in a kubeconfig file, for a vpcnid process.
func kubeconfigAs(t *testing.T, sa string) string {
	t.Helper()
	c, enc := as(sa), base64.StdEncoding.EncodeToString
	groups := ""
	for _, g := range c.Impersonate.Groups {
		groups += fmt.Sprintf("%q, ", g)
	}
	kc := fmt.Sprintf("apiVersion: v1\nkind: Config\ncurrent-context: f\n"+
		"clusters: [{name: f, cluster: {server: %q, certificate-authority-data: %s}}]\n"+
		"contexts: [{name: f, context: {cluster: f, user: u}}]\n"+
		"users: [{name: u, user: {client-certificate-data: %s, client-key-data: %s, as: %q, as-groups: [%s]}}]\n",
		c.Host, enc(c.CAData), enc(c.CertData), enc(c.KeyData), c.Impersonate.UserName, groups)
	path := filepath.Join(t.TempDir(), sa+".kubeconfig")
	if err := os.WriteFile(path, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
