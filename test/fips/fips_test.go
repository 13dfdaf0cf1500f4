// Package fips proves floating IPs for pods end to end: a real
// kube-apiserver + etcd (internal/testbed/apiserver) holding the pods and
// their PodAddresses, the vpcni-controller binary (as the service account
// deploy/rbac.yaml sets up; -cloud-config on the lab's Neutron endpoint), and the lab itself (vpcnid on a node, the
// real plugin through libcni, the router namespace's DNAT/SNAT for
// associated floating IPs, the external host 203.0.113.254 behind it).
package fips

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	types100 "github.com/containernetworking/cni/pkg/types/100"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/controller"
	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/lab/neutronapi"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

var (
	fixture *apiserver.Server
	binDir  string
)

func TestMain(m *testing.M) {
	testbed.RequireRoot("the floating IP e2e (lab namespaces, the API server fixture)")
	var err error
	if binDir, err = testbed.Binaries(); err != nil {
		fmt.Println("vpcni-test:", err)
		os.Exit(1)
	}
	os.Exit(apiserver.RunPackage(m, apiserver.Options{LockWait: 3 * time.Minute,
		CRDs: []string{"../../deploy/vpcni.io_podaddresses.yaml"}}, func(s *apiserver.Server) { fixture = s }))
}

const ns = "fip"

// world is the test's cluster and VPC.
type world struct {
	t   *testing.T
	l   *lab.Lab
	cs  kubernetes.Interface
	dyn dynamic.Interface
	cni *testbed.CNI
	// agentLog is vpcnid's log file.
	agentLog string
}

// TestFloatingIPLifecycle: a pod asking for a floating IP is reached from
// the external host through it; deleting the pod detaches it before the
// pod's address leaves the node's port — even with the runtime's DEL
// first, so the agent tries to give the address back while the floating
// IP still points at it — and then the policy applies: release deletes
// it, retain keeps it. A bad annotation gets an Event and no floating IP.
func TestFloatingIPLifecycle(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	w := up(t, c)
	startController(t, c, w.l)

	for _, policy := range []string{floatingip.Release, floatingip.Retain} {
		t.Run(policy, func(t *testing.T) {
			w.t = t
			name := "web-" + policy
			addr := at(w.l.Subnet, map[string]byte{floatingip.Release: 50, floatingip.Retain: 51}[policy])
			pod := w.createPod(c, name, map[string]string{controller.AnnotationFloatingIP: "auto", controller.AnnotationFloatingPolicy: policy})
			podNS := w.addPod(c, pod, addr)

			fip := w.waitAnnotation(c, name)
			t0 := time.Now()
			w.waitEvent(c, name, "VpcniFloatingIPAssociated")
			ext := netnsutil.Path(w.l.External.NS)
			if err := probeWithin(c, 10*time.Second, ext, fip); err != nil {
				t.Fatalf("external host -> floating IP %s -> pod %s: %v", fip, addr, err)
			}
			t.Logf("vpcni-test: external host reaches pod %s through floating IP %s", addr, fip)

			// The runtime's DEL first (the agent gives the requested
			// address straight back to the cloud), then the pod's
			// deletion: the provider must hold the address until the
			// controller has detached the floating IP.
			before := len(w.l.API.Events())
			if err := w.cni.Del(c, testbed.Runtime(name, podNS, "eth0", nil)); err != nil {
				t.Fatalf("DEL %s: %v", name, err)
			}
			if !detachedBefore(w.l.API.Events()[before:], fip, addr) {
				t.Fatalf("the address %s left the port while floating IP %s pointed at it", addr, fip)
			}
			w.deletePod(c, name)
			ev := w.waitRemoved(c, before, addr)
			t.Logf("vpcni-test: %s: Neutron's order of events after the DEL: %s", policy, strings.Join(ev, " -> "))
			if !detachedBefore(w.l.API.Events()[before:], fip, addr) {
				t.Fatalf("floating IP %s was not detached before %s left the port: %v", fip, addr, ev)
			}
			// The race was real: the agent tried to give the address
			// back while the floating IP pointed at it, and was told no.
			if log, err := os.ReadFile(w.agentLog); err != nil || !strings.Contains(string(log), addr.String()+" (floating IP "+fip.String()+")") {
				t.Fatalf("vpcnid's log shows no release of %s held back for floating IP %s (%v): the DEL did not race the detach", addr, fip, err)
			}
			if err := probeWithin(c, 0, ext, fip); err == nil {
				t.Fatalf("floating IP %s still reaches something after pod %s is gone", fip, name)
			}
			kept := w.fipByAddress(fip)
			switch policy {
			case floatingip.Release:
				if kept != nil {
					t.Fatalf("policy release: floating IP %s still exists: %+v", fip, *kept)
				}
			case floatingip.Retain:
				if kept == nil || kept.Port() != "" || kept.Description != floatingip.Mark(ns+"/"+name, floatingip.Retain) {
					t.Fatalf("policy retain: floating IP %s = %+v, want kept, unassociated, marked for %s/%s", fip, kept, ns, name)
				}
			}
			msg := w.waitEvent(c, name, "VpcniFloatingIPDetached")
			if policy == floatingip.Retain && !strings.Contains(msg, "retained") || policy == floatingip.Release && !strings.Contains(msg, "released") {
				t.Errorf("the pod's VpcniFloatingIPDetached event says %q, want it to say %s", msg, policy)
			}
			t.Logf("vpcni-test: %s: DEL and pod deletion -> floating IP detached, then the address off the port, in %.1fs (event: %s)", policy, time.Since(t0).Seconds(), msg)
		})
	}

	t.Run("bad-annotations", func(t *testing.T) {
		w.t = t
		fipsBefore := w.fipCount()
		w.createPod(c, "bad", map[string]string{controller.AnnotationFloatingIP: "not-an-address", controller.AnnotationFloatingPolicy: "keep"})
		msg := w.waitEvent(c, "bad", "VpcniFloatingIPInvalid")
		for _, want := range []string{"not-an-address", "keep"} {
			if !strings.Contains(msg, want) {
				t.Errorf("the event %q does not name %q", msg, want)
			}
		}
		// A named address outside the external network: Neutron's 400,
		// told on the pod, nothing created.
		pod := w.createPod(c, "outside", map[string]string{controller.AnnotationFloatingIP: "192.0.2.77"})
		w.addPod(c, pod, at(w.l.Subnet, 52))
		msg = w.waitEvent(c, "outside", "VpcniFloatingIPInvalid")
		if !strings.Contains(msg, "192.0.2.77") {
			t.Errorf("the event %q does not name the address", msg)
		}
		if n := w.fipCount(); n != fipsBefore {
			t.Fatalf("bad annotations changed the floating IPs: %d before, %d after", fipsBefore, n)
		}
		if p, err := w.cs.CoreV1().Pods(ns).Get(c, "outside", metav1.GetOptions{}); err != nil || p.Annotations[controller.AnnotationFloatingAddress] != "" {
			t.Fatalf("pod outside: %v, annotation %q; want no floating address written", err, p.Annotations[controller.AnnotationFloatingAddress])
		}
	})
}

func up(t *testing.T, c context.Context) *world {
	l, err := lab.Up(c, lab.Config{Prefix: fmt.Sprintf("vpcnifip%d", os.Getpid()%100000), Nodes: 1, Subnet: netip.MustParsePrefix("10.94.7.0/24")})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	runDir := t.TempDir()
	h := l.Nodes[0]
	cfg := config.Defaults()
	cfg.NodeName = h.Name
	cfg.SocketPath = filepath.Join(runDir, "vpcnid.sock")
	cfg.StateDir = filepath.Join(runDir, "state")
	cfg.MetricsAddr = ""
	cfg.Pool = config.Pool{WarmTarget: 1, BatchSize: 1, MaxFree: 2}
	cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort), SubnetID: l.SubnetID}}
	cni, err := testbed.NewCNIIn(h.NS, []string{binDir}, filepath.Join(runDir, "cache"), testbed.VpcniConfList("1.0.0", "vpcni-lab", cfg.SocketPath))
	if err != nil {
		t.Fatal(err)
	}
	agent, err := testbed.StartAgentIn(runDir, h.NS, binDir, cfg)
	if err != nil {
		t.Fatalf("vpcnid: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			if log, err := os.ReadFile(agent.LogPath); err == nil {
				t.Logf("vpcnid log:\n%s", log)
			}
		}
		_ = agent.Stop()
	})
	cs, err := kubernetes.NewForConfig(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	return &world{t: t, l: l, cs: cs, dyn: dyn, cni: cni, agentLog: agent.LogPath}
}

func at(p netip.Prefix, last byte) netip.Addr {
	b := p.Addr().As4()
	b[3] = last
	return netip.AddrFrom4(b)
}

// createPod creates a pod on node n1 (no kubelet runs: the test plays
// its part).
func (w *world) createPod(c context.Context, name string, ann map[string]string) *corev1.Pod {
	w.t.Helper()
	p, err := w.cs.CoreV1().Pods(ns).Create(c, &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Annotations: ann},
		Spec:       corev1.PodSpec{NodeName: w.l.Nodes[0].Name, Containers: []corev1.Container{{Name: "c", Image: "none"}}},
	}, metav1.CreateOptions{})
	if err != nil {
		w.t.Fatalf("create pod %s: %v", name, err)
	}
	return p
}

// addPod runs ADD on n1 for the pod, asking for addr (a requested address:
// DEL gives it straight back to the cloud), serves an echo in it and
// records its PodAddress as the agent does in a cluster.
func (w *world) addPod(c context.Context, pod *corev1.Pod, addr netip.Addr) string {
	w.t.Helper()
	nsName := w.l.Prefix + "-" + pod.Name
	if err := netnsutil.Add(nsName); err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { _ = netnsutil.Delete(nsName) })
	path := netnsutil.Path(nsName)
	rt := testbed.Runtime(pod.Name, path, "eth0", nil)
	rt.Args = append(rt.Args, [2]string{"IP", addr.String()})
	res, err := w.cni.Add(c, rt)
	if err != nil {
		w.t.Fatalf("ADD %s IP=%s: %v", pod.Name, addr, err)
	}
	r, err := types100.GetResult(res)
	if err != nil || r.IPs[0].Address.IP.String() != addr.String() {
		w.t.Fatalf("ADD %s: %v, %v; want %s", pod.Name, r, err, addr)
	}
	srv, err := netnsutil.ServeEcho(path, testbed.HostPort(addr, 7777))
	if err != nil {
		w.t.Fatal(err)
	}
	w.t.Cleanup(func() { srv.Close() })
	w.createPodAddress(c, pod, addr)
	return path
}

func (w *world) createPodAddress(c context.Context, pod *corev1.Pod, addr netip.Addr) {
	w.t.Helper()
	node := w.l.Nodes[0]
	pa := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": v1alpha1.Kind,
		"metadata": map[string]any{"name": k8s.PodAddressName(node.Name, pod.Name, "eth0"), "labels": map[string]any{k8s.LabelNode: node.Name}},
		"spec": map[string]any{"node": node.Name, "podNamespace": ns, "podName": pod.Name, "podUID": string(pod.UID),
			"containerID": pod.Name, "ifName": "eth0", "address": addr.String(), "providerPort": node.PortID},
	}}
	if _, err := w.dyn.Resource(v1alpha1.Resource).Create(c, pa, metav1.CreateOptions{}); err != nil {
		w.t.Fatalf("PodAddress of %s: %v", pod.Name, err)
	}
}

// deletePod deletes as the API server and kubelet would: a graceful
// delete marks it terminating (the controller acts on that), then the
// agent's PodAddress goes and the pod is removed.
func (w *world) deletePod(c context.Context, name string) {
	w.t.Helper()
	grace := int64(30)
	if err := w.cs.CoreV1().Pods(ns).Delete(c, name, metav1.DeleteOptions{GracePeriodSeconds: &grace}); err != nil {
		w.t.Fatal(err)
	}
	_ = w.dyn.Resource(v1alpha1.Resource).Delete(c, k8s.PodAddressName(w.l.Nodes[0].Name, name, "eth0"), metav1.DeleteOptions{})
	zero := int64(0)
	if err := w.cs.CoreV1().Pods(ns).Delete(c, name, metav1.DeleteOptions{GracePeriodSeconds: &zero}); err != nil && !apierrors.IsNotFound(err) {
		w.t.Fatal(err)
	}
}

// waitAnnotation waits for the controller's vpcni.io/floating-ip-address.
func (w *world) waitAnnotation(c context.Context, name string) netip.Addr {
	w.t.Helper()
	var got netip.Addr
	err := until(c, 20*time.Second, func() error {
		p, err := w.cs.CoreV1().Pods(ns).Get(c, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		a, err := netip.ParseAddr(p.Annotations[controller.AnnotationFloatingAddress])
		if err != nil {
			return fmt.Errorf("pod %s has no %s yet", name, controller.AnnotationFloatingAddress)
		}
		got = a
		return nil
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return got
}

// waitEvent waits for an Event of that reason on the pod and returns its
// message.
func (w *world) waitEvent(c context.Context, pod, reason string) string {
	w.t.Helper()
	var msg string
	err := until(c, 20*time.Second, func() error {
		list, err := w.cs.CoreV1().Events(ns).List(c, metav1.ListOptions{FieldSelector: "involvedObject.name=" + pod + ",reason=" + reason})
		if err != nil {
			return err
		}
		if len(list.Items) == 0 {
			return fmt.Errorf("no %s event on pod %s", reason, pod)
		}
		msg = list.Items[len(list.Items)-1].Message
		return nil
	})
	if err != nil {
		w.t.Fatal(err)
	}
	return msg
}

// waitRemoved waits until addr has left the node's port and returns the
// endpoint's events since before, as text.
func (w *world) waitRemoved(c context.Context, before int, addr netip.Addr) []string {
	w.t.Helper()
	err := until(c, 30*time.Second, func() error {
		if onPort(w.l, w.l.Nodes[0].PortID, addr) {
			return fmt.Errorf("%s is still on n1's port: does the agent retry the release?", addr)
		}
		return nil
	})
	var out []string
	for _, e := range w.l.API.Events()[before:] {
		out = append(out, fmt.Sprintf("%s(%s %s)", e.Kind, e.FIP, e.Address))
	}
	if err != nil {
		w.t.Fatalf("%v; events: %v", err, out)
	}
	return out
}

// detachedBefore: in the journal, the floating IP left the fixed IP before
// the fixed IP left the port (and it did leave, if it did).
func detachedBefore(ev []neutronapi.Event, fip, addr netip.Addr) bool {
	detached := slices.IndexFunc(ev, func(e neutronapi.Event) bool {
		return e.Kind == "fip-disassociated" && e.FIP == fip.String() && e.Address == addr.String()
	})
	removed := slices.IndexFunc(ev, func(e neutronapi.Event) bool { return e.Kind == "fixed-ip-removed" && e.Address == addr.String() })
	return removed < 0 || detached >= 0 && detached < removed
}

func onPort(l *lab.Lab, portID string, addr netip.Addr) bool {
	p, ok := l.API.Port(portID)
	return ok && slices.ContainsFunc(p.FixedIPs, func(f neutronapi.FixedIP) bool { return f.IPAddress == addr.String() })
}

func (w *world) fipByAddress(a netip.Addr) *neutronapi.FloatingIP {
	w.l.API.Lock()
	defer w.l.API.Unlock()
	for _, f := range w.l.API.FloatingIPs() {
		if f.FloatingIPAddress == a.String() {
			return &f
		}
	}
	return nil
}

func (w *world) fipCount() int {
	w.l.API.Lock()
	defer w.l.API.Unlock()
	return len(w.l.API.FloatingIPs())
}

// probeWithin is one TCP round trip to addr:7777 from the namespace at
// path, retried for up to d (0: once, 2 s).
func probeWithin(c context.Context, d time.Duration, from string, addr netip.Addr) error {
	deadline := time.Now().Add(d)
	for {
		pc, cancel := context.WithTimeout(c, 2*time.Second)
		err := netnsutil.Probe(pc, from, testbed.HostPort(addr, 7777))
		cancel()
		if err == nil || time.Now().After(deadline) {
			return err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// until polls check every 50 ms for up to d.
func until(c context.Context, d time.Duration, check func() error) error {
	deadline := time.Now().Add(d)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || c.Err() != nil {
			return errors.Join(err, c.Err())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startController runs the vpcni-controller binary as its service
// account (deploy/rbac.yaml, impersonated), with -cloud-config pointing at
// the lab's endpoint, until the test ends; its log is shown then.
func startController(t *testing.T, c context.Context, l *lab.Lab) {
	t.Helper()
	const sysNS = "vpcni-system"
	if err := fixture.Apply(c, sysNS, "../../deploy/namespace.yaml", "../../deploy/rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	kc, err := fixture.KubeconfigAs(dir, sysNS, "vpcni-controller")
	if err != nil {
		t.Fatal(err)
	}
	cloudCfg := filepath.Join(dir, "cloud.yaml")
	if err := os.WriteFile(cloudCfg, []byte("openstack:\n  endpoint: "+l.URL+"\n  timeout: 15s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(binDir, "vpcni-controller")
	if _, err := os.Stat(bin); err != nil {
		bin = filepath.Join(dir, "vpcni-controller")
		if out, err := exec.Command("go", "build", "-o", bin, "github.com/vpcni/vpcni/cmd/vpcni-controller").CombinedOutput(); err != nil {
			t.Fatalf("build vpcni-controller: %v\n%s", err, out)
		}
	}
	testbed.StartLogged(t, bin, "-kubeconfig", kc, "-id", "fips", "-lease-namespace", sysNS, "-lease-duration", "3s",
		"-webhook-addr", "", "-health-addr", "", "-cloud-config", cloudCfg, "-floating-network", l.Prefix+"-external")
}
