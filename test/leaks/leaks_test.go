// Package leaks proves the leak audit and the two-phase collector against
// the real parts: neutron-server (scripts/neutron.sh, noauth) holding the
// ports, floating IPs and the router, a real kube-apiserver + etcd
// (internal/testbed/apiserver) holding Nodes, pods and PodAddresses, the
// openstack provider putting marked addresses on VM ports as an agent
// does, and the vpcnictl and vpcni-controller binaries.
package leaks

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/extraroutes"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/ctl"
	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/leaks"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/neutrontest"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

// endpoint is scripts/neutron.sh's neutron-server (noauth).
const endpoint = "http://127.0.0.1:19696/"

var (
	fixture *apiserver.Server
	binDir  string
)

func TestMain(m *testing.M) {
	testbed.RequireRoot("the leak audit e2e (neutron-server, the API server fixture)")
	var err error
	if binDir, err = testbed.Binaries(); err != nil {
		fmt.Println("vpcni-test:", err)
		os.Exit(1)
	}
	started := false
	if exec.Command("bash", "../../scripts/neutron.sh", "status").Run() != nil {
		cmd := exec.Command("bash", "../../scripts/neutron.sh", "up")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Println("vpcni-test: could not start neutron-server:", err)
			_ = exec.Command("bash", "../../scripts/neutron.sh", "down").Run()
			os.Exit(1)
		}
		started = true
	}
	code := apiserver.RunPackage(m, apiserver.Options{LockWait: 3 * time.Minute,
		CRDs: []string{"../../deploy/vpcni.io_podaddresses.yaml", "../../deploy/vpcni.io_nodeblocks.yaml", "../../deploy/vpcni.io_addressreservations.yaml"}},
		func(s *apiserver.Server) { fixture = s })
	if started {
		cmd := exec.Command("bash", "../../scripts/neutron.sh", "down")
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
		_ = cmd.Run()
	}
	os.Exit(code)
}

const (
	ns         = "leaks"
	liveNode   = "leaks-live"
	blockRange = "10.94.0.0/16"
	grace      = 6 * time.Second
	healthAddr = "127.0.0.1:29697"
)

// TestLeakAuditAndCollector plants a leak of each kind beside what is
// held — a live pod's address on a gone node's port among them — and
// shows: vpcnictl audit finds each leak and names each holder; the
// controller marks the orphans and releases none of them on sight; an
// orphan a slow agent claims within the grace is kept; the others are
// released only after the grace (the floating IP before the fixed IP it
// points at), the route and pair by the routes reconciler; nothing held
// is touched; the audit then finds no orphan.
func TestLeakAuditAndCollector(t *testing.T) {
	e := neutrontest.Endpoint{NC: openstack.NoAuthClient(endpoint, http.Client{Timeout: 60 * time.Second}), URL: endpoint, Mode: "fixed-ips"}
	bed := e.NewFloatingBed(t, "10.95.0.0/24", "198.51.100.0/26")
	c := bed.Ctx
	nc := e.NC
	t.Cleanup(func() { deleteFIPsOn(e, bed.Ext.ID) }) // before the bed's own cleanup
	sn := bed.Subnet
	liveIP, goneIP := netip.MustParseAddr("10.95.0.11"), netip.MustParseAddr("10.95.0.12")
	live, gone := e.NewNode(t, sn, liveIP), e.NewNode(t, sn, goneIP)

	// The agents' work: marked addresses on both ports.
	assign := func(n int, p provider.Provider) []netip.Addr {
		ls, err := p.Assign(c, provider.AssignRequest{Count: n})
		if err != nil || len(ls) != n {
			t.Fatalf("assign %d: %v %v", n, ls, err)
		}
		var out []netip.Addr
		for _, l := range ls {
			out = append(out, l.Address)
		}
		return out
	}
	la := assign(2, live.Provider)
	ga := assign(4, gone.Provider)
	webAddr, poolAddr := la[0], la[1]
	movedAddr, leakB, leakC, slowAddr := ga[0], ga[1], ga[2], ga[3]

	cs, err := kubernetes.NewForConfig(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	dyn, err := dynamic.NewForConfig(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Only the live node is a Node (and asks for a block of the routed
	// pod subnet); the other's Node is gone.
	n, err := cs.CoreV1().Nodes().Create(c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: liveNode,
		Annotations: map[string]string{v1alpha1.AnnotationBlocksWanted: "1"}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: liveIP.String()}}
	if _, err := cs.CoreV1().Nodes().UpdateStatus(c, n, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	podAddress := func(name, node string, addr netip.Addr, portID string) {
		t.Helper()
		p, err := cs.CoreV1().Pods(ns).Create(c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pa := &unstructured.Unstructured{Object: map[string]any{
			"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": v1alpha1.Kind,
			"metadata": map[string]any{"name": k8s.PodAddressName(node, name, "eth0"), "labels": map[string]any{k8s.LabelNode: node}},
			"spec": map[string]any{"node": node, "podNamespace": ns, "podName": name, "podUID": string(p.UID),
				"containerID": name, "ifName": "eth0", "address": addr.String(), "providerPort": portID},
		}}
		if _, err := dyn.Resource(v1alpha1.Resource).Create(c, pa, metav1.CreateOptions{}); err != nil {
			t.Fatalf("PodAddress of %s: %v", name, err)
		}
	}
	podAddress("web", liveNode, webAddr, live.PortID)
	// A live pod whose address is on the gone node's port: never touched.
	podAddress("moved", "leaks-gone", movedAddr, gone.PortID)

	// Floating IPs: the live pod's (held), a gone pod's pointing at a
	// leaked address (orphan: detached and deleted, then the address can
	// go), and one retained, detached, for a pod to come (held by policy).
	fipOf := func(owner, policy, port string, fixed netip.Addr) floatingip.FIP {
		t.Helper()
		f, err := bed.Cloud.Ensure(c, floatingip.Want{Owner: owner, Network: bed.Ext.ID, Policy: policy, PortID: port, FixedIP: fixed})
		if err != nil {
			t.Fatalf("floating IP for %s: %v", owner, err)
		}
		return f
	}
	webFIP := fipOf(ns+"/web", floatingip.Release, live.PortID, webAddr)
	leakFIP := fipOf(ns+"/gone-pod", floatingip.Release, gone.PortID, leakB)
	keptFIP := fipOf(ns+"/kept", floatingip.Retain, live.PortID, poolAddr)
	if _, err := bed.Cloud.Detach(c, ns+"/kept", nil); err != nil {
		t.Fatal(err)
	}

	// Reservation ports (address-pairs mode): one of the live node's VM
	// port, one whose VM port is gone.
	netID := networkOf(t, e, sn.ID)
	resPort := func(name, vm string) string {
		t.Helper()
		p, err := ports.Create(c, nc, ports.CreateOpts{NetworkID: netID, Name: name, DeviceOwner: "network:vpcni", DeviceID: vm,
			FixedIPs: []ports.IP{{SubnetID: sn.ID}}}).Extract()
		if err != nil {
			t.Fatalf("reservation port: %v", err)
		}
		return p.ID
	}
	heldRes := resPort("vpcni-held", live.PortID)
	leakRes := resPort("vpcni-leaked", "0b7c1a52-5d0e-4c53-9c1b-6e2f0a9d0000")

	// NICs (secondary or passthrough): one of the live node's instance,
	// one of an instance that is gone.
	if _, err := ports.Update(c, nc, live.PortID, ports.UpdateOpts{DeviceID: ptr("inst-live")}).Extract(); err != nil {
		t.Fatal(err)
	}
	nicPort := func(instance, device string) string {
		t.Helper()
		p, err := ports.Create(c, nc, ports.CreateOpts{NetworkID: netID, Name: "vpcni-secondary-" + instance, DeviceID: device,
			FixedIPs: []ports.IP{{SubnetID: sn.ID}, {SubnetID: sn.ID}}}).Extract()
		if err != nil {
			t.Fatalf("NIC port: %v", err)
		}
		return p.ID
	}
	heldNIC := nicPort("inst-live", "inst-live")
	leakNIC := nicPort("inst-gone", "")

	// The routed pod subnet: a route and a pair of blocks no NodeBlock has.
	leakRoute := netip.MustParsePrefix("10.94.1.0/26")
	leakPair := netip.MustParsePrefix("10.94.2.0/26")
	if _, err := extraroutes.Add(c, nc, bed.RouterID, extraroutes.Opts{Routes: &[]routers.Route{{DestinationCIDR: leakRoute.String(), NextHop: goneIP.String()}}}).Extract(); err != nil {
		t.Fatalf("plant a route: %v", err)
	}
	gp, err := ports.Get(c, nc, gone.PortID).Extract()
	if err != nil {
		t.Fatal(err)
	}
	rev := gp.RevisionNumber
	if _, err := ports.Update(c, nc, gone.PortID, ports.UpdateOpts{RevisionNumber: &rev,
		AllowedAddressPairs: &[]ports.AddressPair{{IPAddress: leakPair.String()}}}).Extract(); err != nil {
		t.Fatalf("plant a pair: %v", err)
	}

	dir := t.TempDir()
	cloudCfg := filepath.Join(dir, "cloud.yaml")
	if err := os.WriteFile(cloudCfg, fmt.Appendf(nil, "openstack:\n  endpoint: %s\n  subnetID: %s\n  timeout: 30s\nroutes:\n  routerID: %s\n  maxRoutes: 30\n  resync: 1s\n", endpoint, sn.ID, bed.RouterID), 0o600); err != nil {
		t.Fatal(err)
	}
	kc, err := fixture.KubeconfigAs(dir, "vpcni-system", "vpcni-controller")
	if err != nil {
		t.Fatal(err)
	}
	if err := fixture.Apply(c, "vpcni-system", "../../deploy/namespace.yaml", "../../deploy/rbac.yaml"); err != nil {
		t.Fatal(err)
	}

	// The dry run, as the controller's service account: every leak found,
	// every holder named.
	rep := audit(t, kc, cloudCfg)
	want := map[string]leaks.Verdict{
		"fixed-ip " + webAddr.String(): leaks.Held, "fixed-ip " + poolAddr.String(): leaks.Held, "fixed-ip " + movedAddr.String(): leaks.Held,
		"fixed-ip " + leakB.String(): leaks.Orphan, "fixed-ip " + leakC.String(): leaks.Orphan, "fixed-ip " + slowAddr.String(): leaks.Orphan,
		"reservation-port " + heldRes: leaks.Held, "reservation-port " + leakRes: leaks.Orphan,
		"nic-port " + heldNIC: leaks.Held, "nic-port " + leakNIC: leaks.Orphan,
		"floating-ip " + webFIP.ID: leaks.Held, "floating-ip " + keptFIP.ID: leaks.Held, "floating-ip " + leakFIP.ID: leaks.Orphan,
		"route " + leakRoute.String(): leaks.Orphan, "block-pair " + leakPair.String(): leaks.Orphan,
	}
	check := func(rep ctl.AuditReport, want map[string]leaks.Verdict) {
		t.Helper()
		got := map[string]leaks.Finding{}
		for _, f := range rep.Findings {
			k := string(f.Kind) + " " + f.Address
			if f.Kind == leaks.ReservationPort || f.Kind == leaks.NICPort || f.Kind == leaks.FloatingIP {
				k = string(f.Kind) + " " + f.Resource
			}
			got[k] = f
		}
		for k, v := range want {
			f, ok := got[k]
			switch {
			case !ok:
				t.Errorf("audit: %s not reported", k)
			case f.Verdict != v:
				t.Errorf("audit: %s is %s (%s), want %s", k, f.Verdict, f.Reason, v)
			}
		}
	}
	check(rep, want)
	if rep.Orphans != 8 {
		t.Errorf("audit: %d orphans, want 8: %+v", rep.Orphans, rep.Findings)
	}
	if got := rep.Counts[leaks.FixedIP][leaks.Held]; got != 3 {
		t.Errorf("audit: %d held fixed IPs, want 3", got)
	}
	table := run(t, filepath.Join(binDir, "vpcnictl"), "audit", "-kubeconfig", kc, "-cloud-config", cloudCfg, "-block-ranges", blockRange)
	t.Logf("vpcni-test: vpcnictl audit (before the controller):\n%s", table)
	if !strings.Contains(table, "KIND") || !strings.Contains(table, "audit: held=7 orphans=8") {
		t.Errorf("audit table without its header or summary:\n%s", table)
	}
	if t.Failed() {
		t.FailNow()
	}

	// The controller, leak collector on with a short grace.
	ctrlLog := startController(t, kc, cloudCfg)
	// Phase one: marked, not released — not even the one a slow agent
	// claims only now.
	waitLog(t, ctrlLog, "orphan marked.*address="+regexp.QuoteMeta(slowAddr.String())+" ", 30*time.Second)
	marked := time.Now()
	podAddress("slow", "leaks-gone", slowAddr, gone.PortID)
	if on := portIPs(t, e, gone.PortID); !slices.Contains(on, leakB) || !slices.Contains(on, leakC) {
		t.Fatalf("released on first sight: gone port holds %v", on)
	}
	// Phase two: after the grace.
	deadline := time.Now().Add(90 * time.Second)
	for {
		on := portIPs(t, e, gone.PortID)
		_, resErr := ports.Get(c, nc, leakRes).Extract()
		_, nicErr := ports.Get(c, nc, leakNIC).Extract()
		_, fipErr := floatingips.Get(c, nc, leakFIP.ID).Extract()
		r, err := routers.Get(c, nc, bed.RouterID).Extract()
		if err != nil {
			t.Fatal(err)
		}
		routeGone := !slices.ContainsFunc(r.Routes, func(x routers.Route) bool { return x.DestinationCIDR == leakRoute.String() })
		if !slices.Contains(on, leakB) && !slices.Contains(on, leakC) && resErr != nil && nicErr != nil && fipErr != nil && routeGone && !pairOn(t, e, gone.PortID, leakPair) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("leaks not all released in 90s: gone port %v, reservation port err %v, NIC port err %v, floating IP err %v, route gone %v", on, resErr, nicErr, fipErr, routeGone)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("vpcni-test: every leak released %s after the slow agent's address was marked", time.Since(marked).Round(100*time.Millisecond))
	// Each release came a grace after its mark.
	released := regexp.MustCompile(`orphan released"[^\n]*? kind=(\S+) address=(\S+)[^\n]* orphan_for=(\S+)`).FindAllStringSubmatch(ctrlLog.Output(), -1)
	if len(released) != 5 {
		t.Errorf("%d releases logged, want 5 (two fixed IPs, a reservation port, a NIC port, a floating IP)", len(released))
	}
	for _, m := range released {
		d, err := time.ParseDuration(m[3])
		if err != nil || d < grace {
			t.Errorf("%s %s released after %s, before the grace %s", m[1], m[2], m[3], grace)
		}
	}
	// Nothing held was touched.
	if on := portIPs(t, e, gone.PortID); !slices.Contains(on, movedAddr) || !slices.Contains(on, slowAddr) || !slices.Contains(on, goneIP) {
		t.Errorf("gone node's port lost a held address: %v (want %s, %s, %s)", on, goneIP, movedAddr, slowAddr)
	}
	if on := portIPs(t, e, live.PortID); !slices.Contains(on, webAddr) || !slices.Contains(on, poolAddr) {
		t.Errorf("live node's port lost an address: %v", on)
	}
	if _, err := ports.Get(c, nc, heldRes).Extract(); err != nil {
		t.Errorf("held reservation port: %v", err)
	}
	if _, err := ports.Get(c, nc, heldNIC).Extract(); err != nil {
		t.Errorf("held NIC port: %v", err)
	}
	if f, err := floatingips.Get(c, nc, webFIP.ID).Extract(); err != nil || f.FixedIP != webAddr.String() {
		t.Errorf("live pod's floating IP: %+v, %v", f, err)
	}
	if f, err := floatingips.Get(c, nc, keptFIP.ID).Extract(); err != nil || f.PortID != "" {
		t.Errorf("retained floating IP: %+v, %v", f, err)
	}
	// The live node's block routed: the audit sees its route and pair held.
	var after ctl.AuditReport
	for start := time.Now(); ; time.Sleep(500 * time.Millisecond) {
		after = audit(t, kc, cloudCfg)
		if after.Counts[leaks.Route][leaks.Held] == 1 && after.Counts[leaks.BlockPair][leaks.Held] == 1 {
			break
		}
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the live node's block is not routed: %+v", after.Counts)
		}
	}
	if after.Orphans != 0 {
		t.Errorf("audit after the collector: %d orphans: %+v", after.Orphans, after.Findings)
	}
	check(after, map[string]leaks.Verdict{"fixed-ip " + slowAddr.String(): leaks.Held, "fixed-ip " + movedAddr.String(): leaks.Held})
	metrics := get(t, "http://"+healthAddr+"/metrics")
	for _, m := range []string{`vpcni_leak_released_total{kind="fixed-ip"} 2`, `vpcni_leak_released_total{kind="floating-ip"} 1`,
		`vpcni_leak_released_total{kind="reservation-port"} 1`, `vpcni_leak_released_total{kind="nic-port"} 1`, `vpcni_leak_holdings{kind="fixed-ip",verdict="orphan"} 0`} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %s", m)
		}
	}
	t.Logf("vpcni-test: vpcnictl audit (after):\n%s", run(t, filepath.Join(binDir, "vpcnictl"), "audit", "-kubeconfig", kc, "-cloud-config", cloudCfg, "-block-ranges", blockRange))
}

func ptr[T any](v T) *T { return &v }

func audit(t *testing.T, kc, cloudCfg string) ctl.AuditReport {
	t.Helper()
	out := run(t, filepath.Join(binDir, "vpcnictl"), "audit", "-o", "json", "-kubeconfig", kc, "-cloud-config", cloudCfg, "-block-ranges", blockRange)
	var rep ctl.AuditReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("audit JSON: %v\n%s", err, out)
	}
	return rep
}

func run(t *testing.T, bin string, args ...string) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s%s", filepath.Base(bin), strings.Join(args, " "), err, out, stderr.String())
	}
	return string(out)
}

func startController(t *testing.T, kc, cloudCfg string) *testbed.Logged {
	t.Helper()
	return testbed.StartLogged(t, filepath.Join(binDir, "vpcni-controller"), "-kubeconfig", kc, "-id", "leaks", "-lease-namespace", "vpcni-system",
		"-lease-duration", "3s", "-webhook-addr", "", "-health-addr", healthAddr, "-cloud-config", cloudCfg,
		"-block-ranges", blockRange, "-block-size", "26", "-sticky-ips=false", "-floating-ips=false",
		"-leak-grace", grace.String(), "-leak-period", "1s")
}

func waitLog(t *testing.T, log *testbed.Logged, pattern string, within time.Duration) {
	t.Helper()
	re := regexp.MustCompile(pattern)
	for start := time.Now(); !re.MatchString(log.Output()); time.Sleep(100 * time.Millisecond) {
		if time.Since(start) > within {
			t.Fatalf("no %q in the controller's log within %s", pattern, within)
		}
	}
}

func portIPs(t *testing.T, e neutrontest.Endpoint, id string) []netip.Addr {
	t.Helper()
	p, err := ports.Get(context.Background(), e.NC, id).Extract()
	if err != nil {
		t.Fatal(err)
	}
	var out []netip.Addr
	for _, f := range p.FixedIPs {
		out = append(out, netip.MustParseAddr(f.IPAddress))
	}
	return out
}

func pairOn(t *testing.T, e neutrontest.Endpoint, id string, cidr netip.Prefix) bool {
	t.Helper()
	p, err := ports.Get(context.Background(), e.NC, id).Extract()
	if err != nil {
		t.Fatal(err)
	}
	return slices.ContainsFunc(p.AllowedAddressPairs, func(ap ports.AddressPair) bool { return ap.IPAddress == cidr.String() })
}

func networkOf(t *testing.T, e neutrontest.Endpoint, subnetID string) string {
	t.Helper()
	pages, err := ports.List(e.NC, ports.ListOpts{FixedIPs: []ports.FixedIPOpts{{SubnetID: subnetID}}}).AllPages(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	all, err := ports.ExtractPorts(pages)
	if err != nil || len(all) == 0 {
		t.Fatalf("ports of subnet %s: %v", subnetID, err)
	}
	return all[0].NetworkID
}

func deleteFIPsOn(e neutrontest.Endpoint, netID string) {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	pages, err := floatingips.List(e.NC, floatingips.ListOpts{FloatingNetworkID: netID}).AllPages(c)
	if err != nil {
		return
	}
	all, _ := floatingips.ExtractFloatingIPs(pages)
	for _, f := range all {
		_ = floatingips.Delete(c, e.NC, f.ID).ExtractErr()
	}
}

func get(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(bufio.NewReader(resp.Body))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
