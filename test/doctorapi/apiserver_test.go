// Package doctorapi runs vpcnictl doctor's API server check against a
// real kube-apiserver (internal/testbed/apiserver, on ports and a state
// dir of its own): the agent's credentials accepted and its Node found,
// then each way it goes wrong — a Node of another name, a token the
// server refuses, credentials RBAC does not let read Nodes — named, with
// the clock compared by the server's Date header. Root only.
package doctorapi

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/vpcni/vpcni/internal/doctor"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

func TestMain(m *testing.M) {
	testbed.RequireRoot("the doctor API server test")
	os.Exit(m.Run())
}

func TestAPIServerCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	s, err := apiserver.Start(ctx, apiserver.Options{Dir: t.TempDir(), Port: 26473, EtcdPort: 22409})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Stop(); err != nil {
			t.Errorf("stop the API server: %v", err)
		}
	})
	t.Logf("API server up in %s", s.Started)
	cs := kubernetes.NewForConfigOrDie(s.Config)
	if _, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "dr-n1"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The agent's client configuration, as vpcnid makes it from
	// kubernetes.kubeconfig.
	rc, err := k8s.RestConfig(s.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, rc *rest.Config, node string, want doctor.Status, says string) {
		t.Helper()
		clock := &doctor.DateClock{}
		r := doctor.APIServer(ctx, rc, nil, node, clock)
		t.Logf("%s -> %s %s: %s (fix: %s)", what, r.Name, r.Status, r.Detail, r.Fix)
		if r.Status != want || !strings.Contains(r.Detail, says) {
			t.Errorf("%s: %s %q, want %s saying %q", what, r.Status, r.Detail, want, says)
		}
		if want != doctor.OK && r.Fix == "" {
			t.Errorf("%s: no fix", what)
		}
		if sk := clock.Skew("apiserver"); sk.Status != doctor.OK {
			t.Errorf("%s: the API server's clock on this very machine: %+v", what, sk)
		}
	}
	check("admin credentials, Node there", rc, "dr-n1", doctor.OK, "Node dr-n1 found")
	check("nodeName of no Node", rc, "dr-n9", doctor.Fail, "has no Node dr-n9")

	bad := rest.AnonymousClientConfig(rc)
	bad.BearerToken = "not-a-token"
	check("a token the server refuses", bad, "dr-n1", doctor.Fail, "refused the credentials")

	// Authenticated, but RBAC grants this user nothing.
	nobody := rest.CopyConfig(rc)
	nobody.Impersonate = rest.ImpersonationConfig{UserName: "vpcni-doctor-nobody"}
	check("credentials without RBAC", nobody, "dr-n1", doctor.Fail, "may not read Nodes")
}
