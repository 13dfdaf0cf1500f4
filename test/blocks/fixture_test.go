package blocks

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

// The fixture itself (on ports and a state dir of its own, beside the
// package's): it comes up with the CRDs served, stops, and a second Start
// after a "crash" (processes left running, PID files kept) stops the
// leftovers by their recorded PIDs and comes up again on a fresh etcd.
func TestStartStopAndLeftovers(t *testing.T) {
	ctx := context.Background()
	opts := apiserver.Options{Dir: t.TempDir(), Port: 26453, EtcdPort: 22389, CRDs: []string{"../../deploy/vpcni.io_nodeblocks.yaml"}}
	s, err := apiserver.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("up in %s", s.Started)
	cs := kubernetes.NewForConfigOrDie(s.Config)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, nsObj("left-behind"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.Discovery().ServerResourcesForGroupVersion("vpcni.io/v1alpha1"); err != nil {
		t.Fatalf("CRD not served: %v", err)
	}
	data, err := os.ReadFile(filepath.Join(opts.Dir, "kube-apiserver.pid"))
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(string(data)) // "<pid> <exe>"
	if len(f) == 0 {
		t.Fatalf("kube-apiserver.pid is empty")
	}
	oldPID, err := strconv.Atoi(f[0])
	if err != nil {
		t.Fatalf("kube-apiserver.pid: %v", err)
	}
	// A crashed run: the lock goes with its process, the servers run on.
	s.ReleaseLock()
	s2, err := apiserver.Start(ctx, opts)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Stop()
	if _, err := os.Stat("/proc/" + strconv.Itoa(oldPID)); err == nil {
		exe, _ := os.Readlink("/proc/" + strconv.Itoa(oldPID) + "/exe")
		if strings.HasSuffix(exe, "kube-apiserver") {
			t.Errorf("the earlier kube-apiserver (pid %d) still runs", oldPID)
		}
	}
	cs = kubernetes.NewForConfigOrDie(s2.Config)
	if _, err := cs.CoreV1().Namespaces().Get(ctx, "left-behind", metav1.GetOptions{}); err == nil {
		t.Error("the second start kept the first one's etcd data")
	} else if !apierrors.IsNotFound(err) {
		t.Errorf("get namespace left-behind: %v, want not found", err)
	}
	if err := s2.Stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(opts.Dir, "etcd.pid")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("etcd's PID file after Stop: %v, want none", err)
	}
}

func nsObj(name string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
}
