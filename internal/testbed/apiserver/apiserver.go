// Package apiserver runs a real etcd and kube-apiserver — nothing else of
// Kubernetes — on loopback ports of their own, for the tests of
// vpcni-controller and of the agent's cluster side. The binaries are the
// ones scripts/k8s-node.sh builds for the node e2e (cached in
// /var/cache/vpcni-k8s; etcd from Debian's etcd-server).
//
// It never meets the node e2e's fixture: that one runs inside the
// vpcni-k8s-n1 network namespace with its state in /var/tmp/vpcni-k8s;
// this one listens on the root namespace's loopback (127.0.0.1:26443 and
// :22379/:22380, adding no address or route) with its state in
// /var/tmp/vpcni-apiserver. A lock file there serialises two test
// packages (or two work trees) that want it at once. The PIDs are
// recorded, so a run that crashed leaves nothing a later one cannot stop:
// Start stops what the files name (only if /proc says it still runs that
// binary) before it starts afresh, with an empty etcd.
//
// No `testing` here: the package returns errors, tests decide.
package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

// Options place the fixture; the zero value means the defaults below.
type Options struct {
	// Dir holds the lock, PIDs, certificates, etcd's data and the logs.
	Dir string
	// Port is the API server's (HTTPS), EtcdPort etcd's client port; the
	// peer port is EtcdPort+1.
	Port, EtcdPort int
	// APIServer is the kube-apiserver binary; Etcd the etcd one.
	APIServer, Etcd string
	// CRDs are CustomResourceDefinition files to install, each waited for
	// until the API server serves it.
	CRDs []string
	// LockWait bounds the wait for another user of Dir to finish.
	LockWait time.Duration
}

// Defaults of the options: ports no other vpcni fixture uses.
const (
	DefaultDir      = "/var/tmp/vpcni-apiserver"
	DefaultPort     = 26443
	DefaultEtcdPort = 22379
	// K8sCache is where scripts/k8s-node.sh build leaves its binaries.
	K8sCache   = "/var/cache/vpcni-k8s"
	K8sVersion = "1.36.3"
)

func (o *Options) defaults() {
	if o.Dir == "" {
		o.Dir = DefaultDir
	}
	if o.Port == 0 {
		o.Port = DefaultPort
	}
	if o.EtcdPort == 0 {
		o.EtcdPort = DefaultEtcdPort
	}
	if o.APIServer == "" {
		o.APIServer = filepath.Join(K8sCache, K8sVersion, "bin", "kube-apiserver")
	}
	if o.Etcd == "" {
		o.Etcd = "etcd"
	}
	if o.LockWait == 0 {
		o.LockWait = 10 * time.Minute
	}
}

// Server is a running etcd + kube-apiserver.
type Server struct {
	// Config is an admin (system:masters) client configuration.
	Config *rest.Config
	// Kubeconfig is the same as a file, for processes.
	Kubeconfig string
	// URL is the API server's address.
	URL string

	opts Options
	lock *os.File
	// Started is how long Start took.
	Started time.Duration
}

// components in start order; Stop goes the other way.
var components = []string{"etcd", "kube-apiserver"}

// Start brings the fixture up, fresh: an earlier run's processes (by
// recorded PID) are stopped and etcd's data removed first.
func Start(ctx context.Context, o Options) (_ *Server, err error) {
	o.defaults()
	t0 := time.Now()
	if _, err := os.Stat(o.APIServer); err != nil {
		return nil, fmt.Errorf("kube-apiserver %s: %w (run: bash scripts/k8s-node.sh build)", o.APIServer, err)
	}
	etcdBin, err := exec.LookPath(o.Etcd)
	if err != nil {
		return nil, fmt.Errorf("etcd: %w (install Debian's etcd-server: bash scripts/k8s-node.sh build)", err)
	}
	if err := os.MkdirAll(o.Dir, 0o700); err != nil {
		return nil, err
	}
	s := &Server{opts: o, URL: fmt.Sprintf("https://127.0.0.1:%d", o.Port), Kubeconfig: filepath.Join(o.Dir, "admin.kubeconfig")}
	if s.lock, err = lockDir(ctx, o.Dir, o.LockWait); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			s.Stop()
		}
	}()
	for _, c := range slicesBackward(components) {
		if err := StopRecorded(o.Dir, c); err != nil {
			return nil, err
		}
	}
	for _, p := range []int{o.Port, o.EtcdPort, o.EtcdPort + 1} {
		if err := portFree(p); err != nil {
			return nil, err
		}
	}
	if err := os.RemoveAll(filepath.Join(o.Dir, "etcd")); err != nil {
		return nil, err
	}
	pki, err := writePKI(filepath.Join(o.Dir, "pki"))
	if err != nil {
		return nil, fmt.Errorf("pki: %w", err)
	}
	s.Config = &rest.Config{Host: s.URL, TLSClientConfig: rest.TLSClientConfig{CAData: pki.ca, CertData: pki.adminCert, KeyData: pki.adminKey},
		QPS: 200, Burst: 400}
	if err := os.WriteFile(s.Kubeconfig, pki.kubeconfig(s.URL), 0o600); err != nil {
		return nil, err
	}

	client := fmt.Sprintf("http://127.0.0.1:%d", o.EtcdPort)
	peer := fmt.Sprintf("http://127.0.0.1:%d", o.EtcdPort+1)
	if err := s.start("etcd", etcdBin, "--name", "vpcni-apiserver", "--data-dir", filepath.Join(o.Dir, "etcd"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "vpcni-apiserver="+peer, "--unsafe-no-fsync"); err != nil {
		return nil, err
	}
	if err := waitFor(ctx, 30*time.Second, "etcd healthy", func() error {
		resp, err := http.Get(client + "/health")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return errors.New(resp.Status)
		}
		return nil
	}); err != nil {
		return nil, s.withLog(err, "etcd")
	}
	if err := s.start("kube-apiserver", o.APIServer,
		"--etcd-servers="+client,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port="+strconv.Itoa(o.Port),
		"--cert-dir="+filepath.Join(o.Dir, "apiserver"),
		"--tls-cert-file="+pki.file("apiserver.crt"), "--tls-private-key-file="+pki.file("apiserver.key"),
		"--client-ca-file="+pki.file("ca.crt"),
		"--service-account-key-file="+pki.file("sa.pub"), "--service-account-signing-key-file="+pki.file("sa.key"),
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-cluster-ip-range=10.0.0.0/24",
		"--authorization-mode=RBAC", "--profiling=false",
		// Nobody schedules or runs pods here: no admission plugin may
		// wait for a controller that does not exist.
		"--disable-admission-plugins=ServiceAccount"); err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		return nil, err
	}
	rc := cs.Discovery().RESTClient()
	if err := waitFor(ctx, 90*time.Second, "kube-apiserver ready", func() error {
		return rc.Get().AbsPath("/readyz").Do(ctx).Error()
	}); err != nil {
		return nil, s.withLog(err, "kube-apiserver")
	}
	if err := s.installCRDs(ctx, o.CRDs); err != nil {
		return nil, err
	}
	s.Started = time.Since(t0)
	return s, nil
}

// Stop stops both processes (TERM, then KILL after 10 s) and frees the
// lock. etcd's data stays for a look until the next Start.
func (s *Server) Stop() error {
	var errs []error
	for _, c := range slicesBackward(components) {
		errs = append(errs, StopRecorded(s.opts.Dir, c))
	}
	if s.lock != nil {
		s.lock.Close() // closing the file releases the flock
		s.lock = nil
	}
	return errors.Join(errs...)
}

// ReleaseLock lets the lock go and leaves the processes running: what a
// crashed run leaves behind (for the fixture's own test).
func (s *Server) ReleaseLock() {
	if s.lock != nil {
		s.lock.Close()
		s.lock = nil
	}
}

// Log is the path of a component's log.
func (s *Server) Log(component string) string { return filepath.Join(s.opts.Dir, component+".log") }

func (s *Server) withLog(err error, component string) error {
	data, _ := os.ReadFile(s.Log(component))
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	if len(lines) > 15 {
		lines = lines[len(lines)-15:]
	}
	return fmt.Errorf("%w; the end of %s:\n%s", err, s.Log(component), strings.Join(lines, "\n"))
}

// start runs a component in a process group of its own (a Ctrl-C of the
// test does not reach it half-way; Stop or the next Start ends it) and
// records "pid binary" for StopRecorded.
func (s *Server) start(name, bin string, args ...string) error {
	logf, err := os.OpenFile(s.Log(name), os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", name, err)
	}
	exe, _ := filepath.EvalSymlinks(bin)
	if err := os.WriteFile(PIDFile(s.opts.Dir, name), fmt.Appendf(nil, "%d %s\n", cmd.Process.Pid, exe), 0o600); err != nil {
		_ = cmd.Process.Kill()
		return err
	}
	// Reap it when it exits, so /proc no longer shows it and a stop sees it gone.
	go func() { _ = cmd.Wait() }()
	return nil
}

// PIDFile is where a fixture records the process it started as "pid
// binary" (the format StopRecorded reads).
func PIDFile(dir, name string) string { return filepath.Join(dir, name+".pid") }

// StopRecorded stops the process a PID file names, if /proc says it still
// runs the binary recorded with it (a reused PID is someone else's).
func StopRecorded(dir, name string) error {
	f := PIDFile(dir, name)
	data, err := os.ReadFile(f)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	pidText, exe, _ := strings.Cut(strings.TrimSpace(string(data)), " ")
	pid, err := strconv.Atoi(pidText)
	if err != nil || pid <= 1 {
		return fmt.Errorf("%s: no PID in %q; remove it once %s is stopped", f, data, name)
	}
	if running(pid, exe) {
		_ = syscall.Kill(pid, syscall.SIGTERM)
		deadline := time.Now().Add(10 * time.Second)
		for running(pid, exe) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		if running(pid, exe) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			for i := 0; running(pid, exe) && i < 100; i++ {
				time.Sleep(50 * time.Millisecond)
			}
		}
		if running(pid, exe) {
			return fmt.Errorf("%s (pid %d) does not stop", name, pid)
		}
	}
	return os.Remove(f)
}

// running: pid is alive (not a zombie) and runs exe.
func running(pid int, exe string) bool {
	got, err := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	if err != nil || got != exe {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	// The state follows the command's closing parenthesis.
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] != 'Z'
}

func portFree(port int) error {
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return fmt.Errorf("port 127.0.0.1:%d is taken by a process this fixture did not record (ss -ltnp sport = :%d): %w", port, port, err)
	}
	return ln.Close()
}

// lockDir takes an exclusive flock on dir/lock, waiting up to wait for
// another holder (a test package of another work tree).
func lockDir(ctx context.Context, dir string, wait time.Duration) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) || time.Now().After(deadline) || ctx.Err() != nil {
			f.Close()
			return nil, fmt.Errorf("lock %s (another test holds the API server fixture?): %w", f.Name(), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func waitFor(ctx context.Context, limit time.Duration, what string, check func() error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	var last error
	for {
		if last = check(); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: not within %s: %w", what, limit, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

// installCRDs creates each CRD and waits until it is Established (the API
// server serves its resource).
func (s *Server) installCRDs(ctx context.Context, files []string) error {
	dc, err := dynamic.NewForConfig(s.Config)
	if err != nil {
		return err
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var obj map[string]any
		if err := yaml.Unmarshal(data, &obj); err != nil {
			return fmt.Errorf("%s: %w", f, err)
		}
		u := &unstructured.Unstructured{Object: obj}
		if _, err := dc.Resource(crdGVR).Create(ctx, u, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("create CRD %s: %w", f, err)
		}
		if err := waitFor(ctx, 30*time.Second, "CRD "+u.GetName()+" established", func() error {
			got, err := dc.Resource(crdGVR).Get(ctx, u.GetName(), metav1.GetOptions{})
			if err != nil {
				return err
			}
			conds, _, _ := unstructured.NestedSlice(got.Object, "status", "conditions")
			for _, c := range conds {
				if m, ok := c.(map[string]any); ok && m["type"] == "Established" && m["status"] == "True" {
					return nil
				}
			}
			return errors.New("not established yet")
		}); err != nil {
			return err
		}
	}
	return nil
}

func slicesBackward(s []string) []string {
	out := make([]string, len(s))
	for i, v := range s {
		out[len(s)-1-i] = v
	}
	return out
}
