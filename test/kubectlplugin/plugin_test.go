// Package kubectlplugin runs kubectl-vpcni, the built binary, against a
// real kube-apiserver (internal/testbed/apiserver, on ports and a state
// dir of its own: 26483, etcd 22419/22420): the agent pod found on a node,
// directly and from a pod; each way the lookup fails, named (no such node,
// no agent there, vpcni in another namespace or nowhere, the agent
// crash-looping, a pod not scheduled); RBAC — deploy/examples'
// kubectl-vpcni-rbac.yaml as shipped is enough, and a service account's
// token without pods/exec, or without pods, is told which permission it
// lacks; `kubectl vpcni nodes`; and kubectl finding the plugin on PATH.
// No kubelet here: the exec goes as far as the API server's connection to
// the node (the real node e2e, test/k8se2e, runs vpcnictl through it).
// Root only.
package kubectlplugin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/vpcni/vpcni/internal/kubectlplugin"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

const ns = "vpcni-system"

var (
	srv    *apiserver.Server
	binDir string
)

func TestMain(m *testing.M) {
	testbed.RequireRoot("the kubectl plugin tests")
	dir, err := testbed.Binaries()
	if err != nil {
		println("vpcni-test:", err.Error())
		os.Exit(1)
	}
	binDir = dir
	os.Exit(apiserver.RunPackage(m, apiserver.Options{Dir: "/var/tmp/vpcni-kubectl-plugin", Port: 26483, EtcdPort: 22419},
		func(s *apiserver.Server) { srv = s }))
}

// cluster makes what a vpcni install looks like to the API: nodes with
// the agent's figures, the DaemonSet's pods (no kubelet runs them: their
// status is written here), and workload pods.
//
//	n1: agent vpcnid-a running; pod default/web-1
//	n2: agent vpcnid-b crash-looping
//	n3: no agent (the DaemonSet does not cover it)
//	default/pending-1: not scheduled
func cluster(t *testing.T, ctx context.Context, cs kubernetes.Interface) {
	t.Helper()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	must(err)
	for _, name := range []string{"n1", "n2", "n3"} {
		n, err := cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name,
			Annotations: map[string]string{kubectlplugin.AnnotationPoolFree: "4", kubectlplugin.AnnotationPoolAllocated: "6",
				kubectlplugin.AnnotationPoolCooling: "0", kubectlplugin.AnnotationPoolCapacity: "64"}}}, metav1.CreateOptions{})
		must(err)
		n.Status.Capacity = corev1.ResourceList{kubectlplugin.IPResource: resource.MustParse("64")}
		n.Status.Allocatable = corev1.ResourceList{kubectlplugin.IPResource: resource.MustParse("62")}
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue,
			LastHeartbeatTime: metav1.Now(), LastTransitionTime: metav1.Now(), Reason: "KubeletReady"}}
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		must(err)
	}
	pod := func(namespace, name, node string, labels map[string]string, container string, st *corev1.ContainerStatus) {
		p, err := cs.CoreV1().Pods(namespace).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: container, Image: "vpcni/vpcni"}}}}, metav1.CreateOptions{})
		must(err)
		if st == nil {
			return
		}
		st.Name, st.Image, st.ImageID = container, "vpcni/vpcni", "sha256:0"
		p.Status.Phase = corev1.PodRunning
		if st.State.Running == nil {
			p.Status.Phase = corev1.PodPending
		}
		p.Status.ContainerStatuses = []corev1.ContainerStatus{*st}
		_, err = cs.CoreV1().Pods(namespace).UpdateStatus(ctx, p, metav1.UpdateOptions{})
		must(err)
	}
	agent := map[string]string{"app.kubernetes.io/name": "vpcnid"}
	pod(ns, "vpcnid-a", "n1", agent, "vpcnid", &corev1.ContainerStatus{Ready: true,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}})
	pod(ns, "vpcnid-b", "n2", agent, "vpcnid", &corev1.ContainerStatus{RestartCount: 7,
		State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: "CrashLoopBackOff", Message: "back-off 5m0s restarting failed container"}}})
	pod("default", "web-1", "n1", map[string]string{"app": "web"}, "web", &corev1.ContainerStatus{Ready: true,
		State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: metav1.Now()}}})
	pod("default", "pending-1", "", map[string]string{"app": "web"}, "web", nil)
}

// plugin runs the built kubectl-vpcni with kubeconfig and args.
func plugin(t *testing.T, kubeconfig string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "kubectl-vpcni"), append([]string{"--kubeconfig", kubeconfig}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		code = ee.ExitCode()
	default:
		t.Fatalf("kubectl-vpcni %s: %v", strings.Join(args, " "), err)
	}
	t.Logf("kubectl-vpcni %s -> exit %d\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
	return out.String(), errOut.String(), code
}

// fails checks that a run exits 1 saying each of says on stderr.
func fails(t *testing.T, kubeconfig string, args []string, says ...string) {
	t.Helper()
	_, stderr, code := plugin(t, kubeconfig, args...)
	if code != 1 {
		t.Errorf("kubectl-vpcni %s: exit %d, want 1", strings.Join(args, " "), code)
	}
	for _, s := range says {
		if !strings.Contains(stderr, s) {
			t.Errorf("kubectl-vpcni %s: stderr does not say %q:\n%s", strings.Join(args, " "), s, stderr)
		}
	}
}

// execReached: the agent pod was found and the API server authorized the
// exec, then could not reach the node's kubelet (there is none here). What
// the API server says then is its own; it is no lookup or RBAC error.
func execReached(t *testing.T, kubeconfig, pod string, args ...string) {
	t.Helper()
	_, stderr, code := plugin(t, kubeconfig, args...)
	if code != 1 || !strings.Contains(stderr, "run vpcnictl in "+ns+"/"+pod+" (container vpcnid, node n1)") ||
		strings.Contains(stderr, "forbidden") || strings.Contains(stderr, "not allowed") {
		t.Errorf("kubectl-vpcni %s: exit %d, want 1 at the exec in %s past RBAC:\n%s", strings.Join(args, " "), code, pod, stderr)
	}
}

// writeKubeconfig writes a kubeconfig for the fixture: with a bearer
// token, or the admin's certificate impersonating user in groups.
func writeKubeconfig(t *testing.T, name, token, user string, groups ...string) string {
	t.Helper()
	ai := &clientcmdapi.AuthInfo{Token: token}
	if token == "" {
		ai = &clientcmdapi.AuthInfo{ClientCertificateData: srv.Config.CertData, ClientKeyData: srv.Config.KeyData,
			Impersonate: user, ImpersonateGroups: groups}
	}
	cfg := clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{"fixture": {Server: srv.URL, CertificateAuthorityData: srv.Config.CAData}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{name: ai},
		Contexts:       map[string]*clientcmdapi.Context{"fixture": {Cluster: "fixture", AuthInfo: name}},
		CurrentContext: "fixture",
	}
	path := filepath.Join(t.TempDir(), name+".kubeconfig")
	if err := clientcmd.WriteToFile(cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// serviceAccountToken makes a service account in ns, grants it rules in
// ns (none: nothing), and returns a kubeconfig with a token of its own.
func serviceAccountToken(t *testing.T, ctx context.Context, cs kubernetes.Interface, name string, rules []rbacv1.PolicyRule) string {
	t.Helper()
	if _, err := cs.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if rules != nil {
		if _, err := cs.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, err := cs.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: name},
			Subjects: []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: name, Namespace: ns}}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	exp := int64(3600)
	tr, err := cs.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return writeKubeconfig(t, name, tr.Status.Token, "")
}

func TestPlugin(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	cluster(t, ctx, cs)
	admin := srv.Kubeconfig

	t.Run("find the agent", func(t *testing.T) {
		execReached(t, admin, "vpcnid-a", "--node", "n1", "status")
		execReached(t, admin, "vpcnid-a", "--pod", "default/web-1", "doctor", "-o", "json")
		// trace NS/POD finds the pod's node itself.
		execReached(t, admin, "vpcnid-a", "trace", "default/web-1")
		// KUBECONFIG, as kubectl reads it.
		cmd := exec.Command(filepath.Join(binDir, "kubectl-vpcni"), "--node", "n1", "status")
		cmd.Env = append(os.Environ(), "KUBECONFIG="+admin)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), "run vpcnictl in "+ns+"/vpcnid-a") {
			t.Errorf("with $KUBECONFIG: %s", out)
		}
	})

	t.Run("lookup errors", func(t *testing.T) {
		fails(t, admin, []string{"--node", "n2", "status"}, "agent not running: agent pod vpcni-system/vpcnid-b on node n2 is Pending",
			"container vpcnid waiting: CrashLoopBackOff: back-off 5m0s", "kubectl -n vpcni-system logs vpcnid-b -c vpcnid")
		fails(t, admin, []string{"--node", "n3", "status"}, "no vpcni agent pod on node n3: the DaemonSet has 2 pods in namespace vpcni-system, none there")
		fails(t, admin, []string{"--node", "n9", "status"}, `no such node: node "n9" not found`)
		fails(t, admin, []string{"-n", "kube-system", "--node", "n1", "status"},
			"no vpcni agent pod in namespace kube-system", "vpcni's agents run in namespace vpcni-system; pass -n vpcni-system")
		fails(t, admin, []string{"--selector", "app.kubernetes.io/name=nothing", "--node", "n1", "status"}, "is vpcni installed, and in this namespace?")
		fails(t, admin, []string{"--pod", "default/pending-1", "status"}, "pod default/pending-1 is not on a node yet")
		fails(t, admin, []string{"trace", "default/nope"}, "no such pod: pod default/nope not found")
		fails(t, admin, []string{"--context", "elsewhere", "--node", "n1", "status"}, `context "elsewhere" does not exist`)
	})

	t.Run("rbac", func(t *testing.T) {
		// The example as shipped, for a user in its group.
		if err := srv.Apply(ctx, ns, "../../deploy/examples/kubectl-vpcni-rbac.yaml"); err != nil {
			t.Fatal(err)
		}
		operator := writeKubeconfig(t, "alice", "", "alice", "vpcni-operators", "system:authenticated")
		execReached(t, operator, "vpcnid-a", "--node", "n1", "status")
		execReached(t, operator, "vpcnid-a", "trace", "default/web-1")
		if out, _, code := plugin(t, operator, "nodes"); code != 0 || !strings.Contains(out, "vpcnid-a") {
			t.Errorf("kubectl vpcni nodes with the example's RBAC: exit %d\n%s", code, out)
		}
		fails(t, operator, []string{"--node", "n9", "status"}, `node "n9" not found`)

		// Service account tokens: one may find the agent but not exec,
		// one may not even list pods.
		noExec := serviceAccountToken(t, ctx, cs, "no-exec", []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}}})
		fails(t, noExec, []string{"--node", "n1", "status"}, "forbidden by RBAC: create pods/exec in namespace vpcni-system is not allowed for your credentials")
		fails(t, noExec, []string{"nodes"}, "forbidden by RBAC: list nodes cluster-wide is not allowed")
		nothing := serviceAccountToken(t, ctx, cs, "nothing", nil)
		fails(t, nothing, []string{"--node", "n1", "status"}, "forbidden by RBAC: list pods in namespace vpcni-system is not allowed")
		fails(t, nothing, []string{"trace", "default/web-1"}, "forbidden by RBAC: get pods in namespace default is not allowed")
	})

	t.Run("nodes", func(t *testing.T) {
		out, _, code := plugin(t, admin, "nodes")
		if code != 0 {
			t.Fatalf("exit %d", code)
		}
		for _, row := range [][]string{
			{"n1", "True", "62/64", "4", "6", "0", "64", "no", "vpcnid-a", "Ready", "0"},
			{"n2", "True", "62/64", "4", "6", "0", "64", "no", "vpcnid-b", "CrashLoopBackOff", "7"},
			{"n3", "True", "62/64", "4", "6", "0", "64", "no", "-", "none", "0"},
		} {
			if !hasRow(out, row) {
				t.Errorf("no row %q in\n%s", row, out)
			}
		}
		out, _, code = plugin(t, admin, "nodes", "-o", "json")
		var sums []kubectlplugin.NodeSummary
		if err := json.Unmarshal([]byte(out), &sums); code != 0 || err != nil || len(sums) != 3 {
			t.Fatalf("-o json: exit %d, %v\n%s", code, err, out)
		}
		if s := sums[1]; s.Name != "n2" || s.Agent != "vpcnid-b" || s.AgentStatus != "CrashLoopBackOff" || s.IPAllocatable != "62" || s.PoolFree != "4" {
			t.Errorf("-o json: n2 is %+v", s)
		}
	})

	t.Run("kubectl finds the plugin", func(t *testing.T) {
		kubectl := filepath.Join(apiserver.K8sCache, apiserver.K8sVersion, "bin", "kubectl")
		cmd := exec.Command(kubectl, "vpcni", "--kubeconfig", admin, "nodes")
		cmd.Env = append(os.Environ(), "PATH="+binDir+":"+os.Getenv("PATH"))
		out, err := cmd.CombinedOutput()
		if err != nil || !hasRow(string(out), []string{"n1", "True", "62/64"}) {
			t.Errorf("kubectl vpcni nodes: %v\n%s", err, out)
		}
		cmd = exec.Command(kubectl, "plugin", "list")
		cmd.Env = append(os.Environ(), "PATH="+binDir+":"+os.Getenv("PATH"))
		out, _ = cmd.CombinedOutput()
		if !strings.Contains(string(out), filepath.Join(binDir, "kubectl-vpcni")) {
			t.Errorf("kubectl plugin list does not list kubectl-vpcni:\n%s", out)
		}
	})
}

// hasRow says whether a line of a table has these fields, in order, first.
func hasRow(table string, fields []string) bool {
	for _, line := range strings.Split(table, "\n") {
		f := strings.Fields(line)
		if len(f) >= len(fields) && strings.Join(f[:len(fields)], " ") == strings.Join(fields, " ") {
			return true
		}
	}
	return false
}
