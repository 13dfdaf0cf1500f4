package apiserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
	"sigs.k8s.io/yaml"
)

// Apply creates the objects of YAML files (documents split by "---"), as
// `kubectl apply` would, namespaced ones in namespace. Objects already
// there are left as they are.
func (s *Server) Apply(ctx context.Context, namespace string, files ...string) error {
	dc, err := discovery.NewDiscoveryClientForConfig(s.Config)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(s.Config)
	if err != nil {
		return err
	}
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(memory.NewMemCacheClient(dc))
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		for _, doc := range bytes.Split(data, []byte("\n---")) {
			var obj map[string]any
			if err := yaml.Unmarshal(doc, &obj); err != nil {
				return fmt.Errorf("%s: %w", f, err)
			}
			if len(obj) == 0 {
				continue
			}
			u := &unstructured.Unstructured{Object: obj}
			gvk := u.GroupVersionKind()
			m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", f, gvk, err)
			}
			var rc dynamic.ResourceInterface = dyn.Resource(m.Resource)
			if m.Scope.Name() == "namespace" {
				rc = dyn.Resource(m.Resource).Namespace(namespace)
			}
			if _, err := rc.Create(ctx, u, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
				return fmt.Errorf("%s: create %s %s: %w", f, gvk.Kind, u.GetName(), err)
			}
		}
	}
	return nil
}

// As is the fixture's admin impersonating service account namespace/sa:
// its requests get exactly the RBAC that account is granted.
func (s *Server) As(namespace, sa string) *rest.Config {
	cfg := rest.CopyConfig(s.Config)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: "system:serviceaccount:" + namespace + ":" + sa,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"}}
	return cfg
}

// KubeconfigAs writes As(namespace, sa) into dir as a kubeconfig, for a
// process: it gets exactly the RBAC that account is granted.
func (s *Server) KubeconfigAs(dir, namespace, sa string) (string, error) {
	c := s.As(namespace, sa)
	b := base64.StdEncoding.EncodeToString
	groups := make([]string, len(c.Impersonate.Groups))
	for i, g := range c.Impersonate.Groups {
		groups[i] = fmt.Sprintf("%q", g)
	}
	kc := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: fixture
  cluster: {server: %s, certificate-authority-data: %s}
users:
- name: %s
  user:
    client-certificate-data: %s
    client-key-data: %s
    as: %s
    as-groups: [%s]
contexts:
- name: fixture
  context: {cluster: fixture, user: %s}
current-context: fixture
`, c.Host, b(c.CAData), sa, b(c.CertData), b(c.KeyData), c.Impersonate.UserName, strings.Join(groups, ", "), sa)
	path := filepath.Join(dir, sa+".kubeconfig")
	return path, os.WriteFile(path, []byte(kc), 0o600)
}

// RunPackage is a test package's TestMain around the fixture: it starts
// the API server with opts (waiting for another run that holds it), hands
// it to set, runs the tests and stops it, and returns the exit code.
func RunPackage(m interface{ Run() int }, opts Options, set func(*Server)) int {
	s, err := Start(context.Background(), opts)
	if err != nil {
		fmt.Fprintln(os.Stderr, "vpcni-test: API server fixture:", err)
		return 1
	}
	set(s)
	fmt.Printf("vpcni-test: etcd + kube-apiserver up at %s in %s\n", s.URL, s.Started.Round(time.Millisecond))
	code := m.Run()
	if err := s.Stop(); err != nil {
		fmt.Fprintln(os.Stderr, "vpcni-test: stop the API server fixture:", err)
		code = 1
	}
	return code
}
