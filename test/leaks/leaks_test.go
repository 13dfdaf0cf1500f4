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

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/attributestags"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/extraroutes"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
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
	os.Exit(testbed.WithNeutron(func() int {
		return apiserver.RunPackage(m, apiserver.Options{LockWait: 3 * time.Minute,
			CRDs: []string{"../../deploy/vpcni.io_podaddresses.yaml", "../../deploy/vpcni.io_nodeblocks.yaml", "../../deploy/vpcni.io_addressreservations.yaml"}},
			func(s *apiserver.Server) { fixture = s })
	}))
}

const (
	ns         = "leaks"
	liveNode   = "leaks-live"
	goneNode   = "leaks-gone"
	blockRange = "10.94.0.0/16"
	grace      = 6 * time.Second
	healthAddr = "127.0.0.1:29698"
)

// TestLeakAuditAndCollector: two nodes with pods, floating IPs,
// reservation and NIC ports; a third VM port with vpcni's marks that is
// another cluster's; a route and a pair of blocks nobody has. Shown:
//
//   - vpcnictl audit finds the route and pair orphaned, the other
//     cluster's addresses unclaimed, everything else held, each by name;
//   - the controller claims (tags) what this cluster holds;
//   - then a node and a pod go: the audit finds each leak they leave (a
//     fixed IP, a reservation port, a NIC port, a floating IP);
//   - the controller marks them and releases none before the grace (the
//     resources checked in Neutron a second before it ends), keeps the
//     one a slow agent claims after its mark, releases the others (the
//     floating IP before the address it points at) with no release
//     refused; the routes reconciler removed the route and the pair;
//     nothing held and nothing unclaimed is touched; the audit then finds
//     no orphan.
func TestLeakAuditAndCollector(t *testing.T) {
	e := neutrontest.Endpoint{NC: openstack.NoAuthClient(endpoint, http.Client{Timeout: 60 * time.Second}), URL: endpoint, Mode: "fixed-ips"}
	bed := e.NewFloatingBed(t, "10.95.0.0/24", "198.51.100.0/26")
	c := bed.Ctx
	nc := e.NC
	t.Cleanup(func() { deleteFIPsOn(e, bed.Ext.ID) }) // before the bed's own cleanup
	sn := bed.Subnet
	liveIP, goneIP := netip.MustParseAddr("10.95.0.11"), netip.MustParseAddr("10.95.0.12")
	live, gone := e.NewNode(t, sn, liveIP), e.NewNode(t, sn, goneIP)
	other := e.NewNode(t, sn, netip.MustParseAddr("10.95.0.13")) // another cluster's node
	for port, inst := range map[string]string{live.PortID: "inst-live", gone.PortID: "inst-gone"} {
		if _, err := ports.Update(c, nc, port, ports.UpdateOpts{DeviceID: ptr(inst)}).Extract(); err != nil {
			t.Fatal(err)
		}
	}

	// The agents' work: marked addresses on the three ports.
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
	foreign := assign(1, other.Provider)[0]
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
	// Both nodes are Nodes (the live one asks for a block of the routed
	// pod subnet).
	for name, ip := range map[string]netip.Addr{liveNode: liveIP, goneNode: goneIP} {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if name == liveNode {
			n.Annotations = map[string]string{v1alpha1.AnnotationBlocksWanted: "1"}
		}
		n, err := cs.CoreV1().Nodes().Create(c, n, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: ip.String()}}
		if _, err := cs.CoreV1().Nodes().UpdateStatus(c, n, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	newPod := func(name, node string) *corev1.Pod {
		t.Helper()
		p, err := cs.CoreV1().Pods(ns).Create(c, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name},
			Spec: corev1.PodSpec{NodeName: node, Containers: []corev1.Container{{Name: "c", Image: "none"}}}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	podAddress := func(name, node string, addr netip.Addr, portID string) {
		t.Helper()
		p := newPod(name, node)
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
	// A live pod on the node that will go: its address is never touched.
	podAddress("moved", goneNode, movedAddr, gone.PortID)
	newPod("gone-pod", goneNode)

	// Floating IPs: the web pod's, gone-pod's (pointing at an address of
	// the gone node that leaks with it) and one retained, detached, for a
	// pod to come.
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

	// Reservation ports (address-pairs mode) and NICs (secondary or
	// passthrough mode), each of both nodes.
	netID := networkOf(t, e, sn.ID)
	newPort := func(name, owner, device string, addrs int) string {
		t.Helper()
		var fixed []ports.IP
		for range addrs {
			fixed = append(fixed, ports.IP{SubnetID: sn.ID})
		}
		p, err := ports.Create(c, nc, ports.CreateOpts{NetworkID: netID, Name: name, DeviceOwner: owner, DeviceID: device, FixedIPs: fixed}).Extract()
		if err != nil {
			t.Fatalf("port %s: %v", name, err)
		}
		return p.ID
	}
	heldRes := newPort("vpcni-res-live", "network:vpcni", live.PortID, 1)
	leakRes := newPort("vpcni-res-gone", "network:vpcni", gone.PortID, 1)
	heldNIC := newPort("vpcni-secondary-inst-live", "", "inst-live", 2)
	leakNIC := newPort("vpcni-secondary-inst-gone", "", "inst-gone", 2)
	// A PodNetwork's NICs, on a network and subnet of their own: found by
	// their tag, not by the pods' subnet.
	pnSubnet := e.NewSubnet(t, "10.97.7.0/24", 20)
	newNetNIC := func(device string) string {
		t.Helper()
		p, err := ports.Create(c, nc, ports.CreateOpts{NetworkID: networkOf(t, e, pnSubnet.ID), Name: "vpcni-network-" + device, DeviceID: device,
			Description: "vpcni NIC of instance " + device + " for pod network web [vpcni-network=web]",
			FixedIPs:    []ports.IP{{SubnetID: pnSubnet.ID}, {SubnetID: pnSubnet.ID}}}).Extract()
		if err != nil {
			t.Fatalf("PodNetwork NIC of %s: %v", device, err)
		}
		if err := attributestags.Add(c, nc, "ports", p.ID, openstack.NICTag).ExtractErr(); err != nil {
			t.Fatal(err)
		}
		return p.ID
	}
	heldNetNIC, leakNetNIC := newNetNIC("inst-live"), newNetNIC("inst-gone")

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
	if err := fixture.Apply(c, "vpcni-system", "../../deploy/namespace.yaml", "../../deploy/rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	kc, err := fixture.KubeconfigAs(dir, "vpcni-system", "vpcni-controller")
	if err != nil {
		t.Fatal(err)
	}
	key := func(f leaks.Finding) string {
		if f.Kind == leaks.ReservationPort || f.Kind == leaks.NICPort || f.Kind == leaks.FloatingIP {
			return string(f.Kind) + " " + f.Resource
		}
		return string(f.Kind) + " " + f.Address
	}
	check := func(rep ctl.AuditReport, want map[string]leaks.Verdict) {
		t.Helper()
		got := map[string]leaks.Finding{}
		for _, f := range rep.Findings {
			got[key(f)] = f
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
	held := func(keys ...string) map[string]leaks.Verdict {
		m := map[string]leaks.Verdict{}
		for _, k := range keys {
			m[k] = leaks.Held
		}
		return m
	}
	fixed := func(a netip.Addr) string { return "fixed-ip " + a.String() }
	always := held(fixed(webAddr), fixed(poolAddr), fixed(movedAddr), "reservation-port "+heldRes, "nic-port "+heldNIC, "nic-port "+heldNetNIC,
		"floating-ip "+webFIP.ID, "floating-ip "+keptFIP.ID)
	always[fixed(foreign)] = leaks.Unclaimed

	// The dry run before any controller ran, as the controller's service
	// account: the route and pair orphaned, the other cluster's address
	// unclaimed, the rest held.
	rep := audit(t, kc, cloudCfg)
	before := held(fixed(leakB), fixed(leakC), fixed(slowAddr), "reservation-port "+leakRes, "nic-port "+leakNIC, "nic-port "+leakNetNIC, "floating-ip "+leakFIP.ID)
	before["route "+leakRoute.String()], before["block-pair "+leakPair.String()] = leaks.Orphan, leaks.Orphan
	check(rep, always)
	check(rep, before)
	if rep.Orphans != 2 || rep.Unclaimed != 1 || rep.Held != 15 {
		t.Errorf("audit: held=%d orphans=%d unclaimed=%d, want 15, 2, 1", rep.Held, rep.Orphans, rep.Unclaimed)
	}
	table := run(t, filepath.Join(binDir, "vpcnictl"), "audit", "-kubeconfig", kc, "-cloud-config", cloudCfg, "-block-ranges", blockRange)
	t.Logf("vpcni-test: vpcnictl audit, before the controller:\n%s", table)
	if !strings.Contains(table, "KIND") || !strings.Contains(table, "audit: held=15 orphans=2 unclaimed=1") {
		t.Errorf("audit table without its header or summary")
	}
	if t.Failed() {
		t.FailNow()
	}

	// The controller claims what this cluster holds.
	ctrl := startController(t, kc, cloudCfg)
	claims := []string{gone.PortID, leakRes, leakNIC}
	for start := time.Now(); !(tagged(t, e, "ports", claims...) && tagged(t, e, "floatingips", leakFIP.ID)); time.Sleep(200 * time.Millisecond) {
		if time.Since(start) > 30*time.Second {
			t.Fatalf("the controller did not claim %v and %s", claims, leakFIP.ID)
		}
	}
	if tagged(t, e, "ports", other.PortID) {
		t.Fatal("the other cluster's port was claimed")
	}
	// The other cluster's address is told to an operator, on the
	// controller's Lease.
	for start := time.Now(); ; time.Sleep(200 * time.Millisecond) {
		evs, err := cs.CoreV1().Events("vpcni-system").List(c, metav1.ListOptions{FieldSelector: "reason=" + leaks.EventUnclaimed})
		if err != nil {
			t.Fatal(err)
		}
		if len(evs.Items) > 0 && evs.Items[0].InvolvedObject.Kind == "Lease" {
			t.Logf("vpcni-test: Event %s on Lease %s: %s", evs.Items[0].Reason, evs.Items[0].InvolvedObject.Name, evs.Items[0].Message)
			break
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("no %s Event on the controller's Lease: %+v", leaks.EventUnclaimed, evs.Items)
		}
	}

	// A node and a pod go: what they held leaks.
	if err := cs.CoreV1().Nodes().Delete(c, goneNode, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := cs.CoreV1().Pods(ns).Delete(c, "gone-pod", metav1.DeleteOptions{GracePeriodSeconds: ptr(int64(0))}); err != nil {
		t.Fatal(err)
	}
	rep = audit(t, kc, cloudCfg)
	leaked := map[string]leaks.Verdict{fixed(leakB): leaks.Orphan, fixed(leakC): leaks.Orphan, fixed(slowAddr): leaks.Orphan,
		"reservation-port " + leakRes: leaks.Orphan, "nic-port " + leakNIC: leaks.Orphan, "nic-port " + leakNetNIC: leaks.Orphan, "floating-ip " + leakFIP.ID: leaks.Orphan}
	check(rep, always)
	check(rep, leaked)
	t.Logf("vpcni-test: vpcnictl audit after the node and the pod went:\n%s", run(t, filepath.Join(binDir, "vpcnictl"), "audit", "-kubeconfig", kc, "-cloud-config", cloudCfg, "-block-ranges", blockRange))

	// Phase one: marked, released not yet — not even the one a slow
	// agent claims only now.
	waitLog(t, ctrl, "orphan marked.*address="+regexp.QuoteMeta(slowAddr.String())+" ", 30*time.Second)
	marked := time.Now()
	podAddress("slow", goneNode, slowAddr, gone.PortID)
	still := func() bool {
		on := portIPs(t, e, gone.PortID)
		_, resErr := ports.Get(c, nc, leakRes).Extract()
		_, nicErr := ports.Get(c, nc, leakNIC).Extract()
		_, netNICErr := ports.Get(c, nc, leakNetNIC).Extract()
		_, fipErr := floatingips.Get(c, nc, leakFIP.ID).Extract()
		return slices.Contains(on, leakB) && slices.Contains(on, leakC) && resErr == nil && nicErr == nil && netNICErr == nil && fipErr == nil
	}
	time.Sleep(time.Until(marked.Add(grace - 1500*time.Millisecond)))
	if !still() {
		t.Fatalf("a leak was released before the grace (%s) had passed", grace)
	}
	// Phase two: after the grace.
	deadline := time.Now().Add(90 * time.Second)
	for {
		on := portIPs(t, e, gone.PortID)
		_, resErr := ports.Get(c, nc, leakRes).Extract()
		_, nicErr := ports.Get(c, nc, leakNIC).Extract()
		if _, err := ports.Get(c, nc, leakNetNIC).Extract(); err == nil {
			nicErr = nil // both NICs gone, or not yet
		}
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
	t.Logf("vpcni-test: every leak released %s after the slow agent's address was marked (grace %s)", time.Since(marked).Round(100*time.Millisecond), grace)
	log := ctrl.Output()
	released := regexp.MustCompile(`orphan released"[^\n]*? kind=(\S+) address=(\S+)`).FindAllStringSubmatch(log, -1)
	var order []string
	for _, m := range released {
		order = append(order, m[1]+" "+m[2])
	}
	if len(order) != 6 || !slices.Contains(order, "floating-ip "+leakFIP.Address) ||
		slices.Index(order, "floating-ip "+leakFIP.Address) > slices.Index(order, fixed(leakB)) {
		t.Errorf("releases %v: want 6 (two fixed IPs, a reservation port, two NIC ports, a floating IP), the floating IP before %s", order, leakB)
	}
	if strings.Contains(log, "releasing an orphan failed") {
		t.Error("a release was refused")
	}

	// Nothing held was touched.
	if on := portIPs(t, e, gone.PortID); !slices.Contains(on, movedAddr) || !slices.Contains(on, slowAddr) || !slices.Contains(on, goneIP) {
		t.Errorf("gone node's port lost a held address: %v (want %s, %s, %s)", on, goneIP, movedAddr, slowAddr)
	}
	if on := portIPs(t, e, live.PortID); !slices.Contains(on, webAddr) || !slices.Contains(on, poolAddr) {
		t.Errorf("live node's port lost an address: %v", on)
	}
	if on := portIPs(t, e, other.PortID); !slices.Contains(on, foreign) {
		t.Errorf("the other cluster's port lost its address: %v", on)
	}
	for _, id := range []string{heldRes, heldNIC} {
		if _, err := ports.Get(c, nc, id).Extract(); err != nil {
			t.Errorf("held port %s: %v", id, err)
		}
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
	if after.Orphans != 0 || after.Unclaimed != 1 {
		t.Errorf("audit after the collector: %d orphans, %d unclaimed, want 0 and 1", after.Orphans, after.Unclaimed)
	}
	check(after, always)
	check(after, held(fixed(slowAddr)))
	metrics := get(t, "http://"+healthAddr+"/metrics")
	for _, m := range []string{`vpcni_leak_released_total{kind="fixed-ip"} 2`, `vpcni_leak_released_total{kind="floating-ip"} 1`,
		`vpcni_leak_released_total{kind="reservation-port"} 1`, `vpcni_leak_released_total{kind="nic-port"} 2`,
		`vpcni_leak_holdings{kind="fixed-ip",verdict="orphan"} 0`, `vpcni_leak_holdings{kind="fixed-ip",verdict="unclaimed"} 1`} {
		if !strings.Contains(metrics, m) {
			t.Errorf("metrics lack %s", m)
		}
	}
	t.Logf("vpcni-test: vpcnictl audit, after:\n%s", run(t, filepath.Join(binDir, "vpcnictl"), "audit", "-kubeconfig", kc, "-cloud-config", cloudCfg, "-block-ranges", blockRange))
}

// tagged says whether every resource of kind carries a vpcni cluster tag.
func tagged(t *testing.T, e neutrontest.Endpoint, kind string, ids ...string) bool {
	t.Helper()
	for _, id := range ids {
		tags, err := attributestags.List(context.Background(), e.NC, kind, id).Extract()
		if err != nil {
			t.Fatalf("tags of %s %s: %v", kind, id, err)
		}
		if !slices.ContainsFunc(tags, func(s string) bool { return strings.HasPrefix(s, "vpcni-cluster=") }) {
			return false
		}
	}
	return true
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
	sn, err := subnets.Get(context.Background(), e.NC, subnetID).Extract()
	if err != nil {
		t.Fatalf("subnet %s: %v", subnetID, err)
	}
	return sn.NetworkID
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
