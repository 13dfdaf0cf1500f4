package labagents

import (
	"context"
	"fmt"
	"net/http"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/libcni"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/rules"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

const (
	webCIDR  = "10.91.1.0/24" // PodNetwork web's subnet, on a network of its own
	system   = "vpcni-system" // vpcni's namespace in deploy/
	httpPort = 80
	sshPort  = 22
)

// TestPodNetworkSecurityGroups: a PodNetwork's security groups, enforced
// by Neutron's own agent. PodNetwork web puts the pods of namespace web on
// a network and subnet of their own behind security group web, which
// admits TCP 80 from the legacy VM and nothing else. vpcnid (Kubernetes
// mode, a real kube-apiserver; the pod's network recorded on it as the
// webhook records it) serves web's pod from a NIC of its own on web's
// network, with group web, attached through the lab's hypervisor; the
// linuxbridge agent guards that NIC's tap with group web's iptables rules.
// The legacy VM reaches the web pod on 80 and is dropped on 22 — the drop
// counted by the rule of the agent's chain for that port — while a pod on
// the default network answers on both; a rule added to group web in
// Neutron lets 22 through without touching the pod; the web pod reaches
// the default pod across the router; its DEL gives the NIC back.
func TestPodNetworkSecurityGroups(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 6*time.Minute)
	defer cancel()
	t0 := time.Now()
	nc, w, vms := upWorld(t, c, map[string]netip.Addr{"n1": at(211), "legacy": at(230)})
	n1, legacy := vms["n1"], vms["legacy"]

	// PodNetwork web's network: its own subnet on the router, and group
	// web, which admits TCP 80 from the legacy VM only.
	webNet, err := networks.Create(c, nc, networks.CreateOpts{Name: prefix + "-web"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	webPrefix := netip.MustParsePrefix(webCIDR)
	webGW, dhcp := webPrefix.Addr().Next().String(), false
	webSubnet, err := subnets.Create(c, nc, subnets.CreateOpts{Name: prefix + "-web", NetworkID: webNet.ID, IPVersion: gophercloud.IPv4,
		CIDR: webCIDR, GatewayIP: &webGW, EnableDHCP: &dhcp}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := routers.AddInterface(c, nc, w.routerID, routers.AddInterfaceOpts{SubnetID: webSubnet.ID}).Extract(); err != nil {
		t.Fatalf("router interface on web's subnet: %v", err)
	}
	sgWeb, err := groups.Create(c, nc, groups.CreateOpts{Name: prefix + "-web", Description: "vpcni e2e: PodNetwork web"}).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := rules.Create(c, nc, rules.CreateOpts{Direction: rules.DirIngress, EtherType: rules.EtherType4, SecGroupID: sgWeb.ID,
		Protocol: rules.ProtocolTCP, PortRangeMin: httpPort, PortRangeMax: httpPort, RemoteIPPrefix: legacy.ip.String() + "/32"}).Extract(); err != nil {
		t.Fatal(err)
	}

	// The cluster: a real API server with vpcni's CRDs and RBAC, node n1,
	// PodNetwork web selecting namespace web, and the two pods as the
	// webhook admits them (web's pod with vpcni.io/network: web).
	api, err := apiserver.Start(c, apiserver.Options{LockWait: 3 * time.Minute, CRDs: crdFiles(t)})
	if err != nil {
		t.Fatalf("API server: %v", err)
	}
	t.Cleanup(func() { _ = api.Stop() })
	if err := api.Apply(c, system, "../../deploy/namespace.yaml", "../../deploy/rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	nodeName := n1.ns
	if _, err := cs.CoreV1().Nodes().Create(c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	for _, team := range []string{"web", "db"} {
		if _, err := cs.CoreV1().Namespaces().Create(c, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: team, Labels: map[string]string{"team": team}}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
	}
	pns, err := k8s.NewPodNetworks(api.Config)
	if err != nil {
		t.Fatal(err)
	}
	if err := pns.Create(c, &v1alpha1.PodNetwork{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: v1alpha1.PodNetworkSpec{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "web"}},
		OpenStack:         &v1alpha1.OpenStackPodNetwork{NetworkID: webNet.ID, SubnetIDs: []string{webSubnet.ID}, SecurityGroups: []string{sgWeb.ID}}}}); err != nil {
		t.Fatal(err)
	}
	// PodNetwork db: the default network and subnet, but a group set of
	// its own (the open group), so a NIC of its own.
	if err := pns.Create(c, &v1alpha1.PodNetwork{ObjectMeta: metav1.ObjectMeta{Name: "db"}, Spec: v1alpha1.PodNetworkSpec{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "db"}},
		OpenStack:         &v1alpha1.OpenStackPodNetwork{NetworkID: w.netID, SubnetIDs: []string{w.subnetID}, SecurityGroups: []string{w.sgID}}}}); err != nil {
		t.Fatal(err)
	}
	// PodNetwork extra: a third group set, for which the VM has no NIC
	// slot left (maxNICs 3).
	if err := pns.Create(c, &v1alpha1.PodNetwork{ObjectMeta: metav1.ObjectMeta{Name: "extra"}, Spec: v1alpha1.PodNetworkSpec{
		NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"team": "extra"}},
		OpenStack:         &v1alpha1.OpenStackPodNetwork{NetworkID: w.netID, SubnetIDs: []string{w.subnetID}, SecurityGroups: []string{sgWeb.ID}}}}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*corev1.Pod{
		{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "web", Annotations: map[string]string{v1alpha1.AnnotationNetwork: "web"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "db-0", Namespace: "db", Annotations: map[string]string{v1alpha1.AnnotationNetwork: "db"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "extra-0", Namespace: "db", Annotations: map[string]string{v1alpha1.AnnotationNetwork: "extra"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "plain-0", Namespace: "default"}},
	} {
		p.Spec = corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: "none"}}}
		if _, err := cs.CoreV1().Pods(p.Namespace).Create(c, p, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	// vpcnid on n1: its VM port on the default network, PodNetworks from
	// the API server, NICs through the lab's hypervisor.
	hv, err := startHypervisor(w, n1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { hv.Close() })
	runDir := t.TempDir()
	apiHost := strings.TrimPrefix(api.URL, "https://")
	for _, addr := range []string{neutronAddr, apiHost, strings.TrimPrefix(strings.TrimSuffix(hv.URL(), computePrefix+"/"), "http://")} {
		fw, err := testbed.Forward(n1.ns, addr, addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fw.Close() })
	}
	kubeconfig, err := api.KubeconfigAs(runDir, system, "vpcni-agent")
	if err != nil {
		t.Fatal(err)
	}
	cfg := nodeConfig(runDir, n1, nodeName)
	cfg.Kubernetes = config.Kubernetes{Mode: "on", Kubeconfig: kubeconfig}
	cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{Endpoint: endpoint, SubnetID: w.subnetID,
		ComputeEndpoint: hv.URL(), MaxNICs: 3}} // the VM port and two NICs
	agent, cni := startNode(t, runDir, n1, cfg)
	add := func(namespace, name string) (netip.Addr, string, func(context.Context) error) {
		t.Helper()
		ns := prefix + "-pod-" + name
		if err := netnsutil.Add(ns); err != nil {
			t.Fatal(err)
		}
		rt := podRuntime(name, netnsutil.Path(ns), namespace)
		res, err := cni.Add(c, rt)
		if err != nil {
			t.Fatalf("ADD of %s/%s: %v", namespace, name, err)
		}
		r, err := types100.GetResult(res)
		if err != nil {
			t.Fatal(err)
		}
		ip, _ := netip.AddrFromSlice(r.IPs[0].Address.IP.To4())
		for _, port := range []int{httpPort, sshPort} {
			srv, err := netnsutil.ServeEcho(netnsutil.Path(ns), netip.AddrPortFrom(ip, uint16(port)).String())
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { srv.Close() })
		}
		return ip, netnsutil.Path(ns), func(ctx context.Context) error { return cni.Del(ctx, rt) }
	}
	plainIP, plainNS, _ := add("default", "plain-0")
	webIP, webNS, delWeb := add("web", "web-0")
	dbIP, dbNS, _ := add("db", "db-0")
	if !netip.MustParsePrefix(subnetCIDR).Contains(plainIP) || !webPrefix.Contains(webIP) {
		t.Fatalf("pod addresses: default pod %s (want in %s), web pod %s (want in %s)", plainIP, subnetCIDR, webIP, webCIDR)
	}
	st, err := agent.State()
	if err != nil {
		t.Fatal(err)
	}
	var nicPort, dbPort string
	for _, a := range st.Allocations {
		switch {
		case a.Address == webIP && a.PodNetwork == "web" && a.NIC != nil:
			nicPort = a.Interface
		case a.Address == dbIP && a.PodNetwork == "db" && a.NIC != nil:
			dbPort = a.Interface
		}
	}
	// A third PodNetwork finds no NIC slot: the ADD says so, and so does
	// an Event on the Node.
	ns := prefix + "-pod-extra-0"
	if err := netnsutil.Add(ns); err != nil {
		t.Fatal(err)
	}
	_, err = cni.Add(c, podRuntime("extra-0", netnsutil.Path(ns), "db"))
	nicLimit := err != nil && strings.Contains(err.Error(), "no room for another NIC for pod network extra")
	if !nicLimit {
		t.Errorf("ADD of a pod on a third PodNetwork with maxNICs 3: %v; want it refused for want of a NIC slot", err)
	} else {
		t.Logf("vpcni-test: a third PodNetwork on n1 (maxNICs 3): %v", err)
	}
	if _, err := eventually(20*time.Second, func() error {
		evs, err := cs.CoreV1().Events("default").List(c, metav1.ListOptions{FieldSelector: "involvedObject.name=" + nodeName + ",reason=VpcniPodNetworkExhausted"})
		if err == nil && len(evs.Items) == 0 {
			err = fmt.Errorf("no VpcniPodNetworkExhausted Event on node %s", nodeName)
		}
		if err == nil {
			t.Logf("vpcni-test: Event on node %s: %s: %s", nodeName, evs.Items[0].Reason, evs.Items[0].Message)
		}
		return err
	}); err != nil {
		nicLimit = false
		t.Error(err)
	}
	// The node tells the scheduler its room per PodNetwork: web and db
	// on their NICs, none for extra (no NIC slot left).
	if _, err := eventually(30*time.Second, func() error {
		n, err := cs.CoreV1().Nodes().Get(c, nodeName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		got := map[string]string{}
		for r, q := range n.Status.Allocatable {
			if name, ok := strings.CutPrefix(string(r), "pn.vpcni.io/"); ok {
				got[name] = q.String()
			}
		}
		if got["extra"] != "0" || got["web"] == "" || got["web"] == "0" || got["db"] == "" || got["db"] == "0" {
			return fmt.Errorf("node %s advertises %v; want room on web and db, none on extra", nodeName, got)
		}
		t.Logf("vpcni-test: node %s advertises per PodNetwork %v", nodeName, got)
		return nil
	}); err != nil {
		t.Error(err)
	}
	if nicPort == "" || dbPort == "" || nicPort == dbPort || len(st.PodNetworks) != 2 || st.PodNetworks[1].Name != "web" || st.PodNetworks[1].Pool.Allocated != 1 {
		t.Fatalf("vpcnid's state: allocations %+v, podNetworks %+v; want web's and db's pods each on a NIC of its PodNetwork", st.Allocations, st.PodNetworks)
	}
	port, err := ports.Get(c, nc, nicPort).Extract()
	if err != nil {
		t.Fatal(err)
	}
	if port.NetworkID != webNet.ID || len(port.SecurityGroups) != 1 || port.SecurityGroups[0] != sgWeb.ID {
		t.Fatalf("web pod's NIC port %s: network %s, groups %v; want web's network %s and group web %s", port.ID, port.NetworkID, port.SecurityGroups, webNet.ID, sgWeb.ID)
	}
	t.Logf("vpcni-test: default pod %s on the VM port; web pod %s on NIC port %s (%s), network %s, group web; %s; db pod %s on NIC port %s",
		plainIP, webIP, port.ID, port.Description, webNet.ID, st.PodNetworks[1].Source, dbIP, dbPort)
	for _, id := range []string{port.ID, dbPort} {
		ac, acancel := context.WithTimeout(c, time.Minute)
		err = w.waitActive(ac, &vm{name: "NIC " + id, portID: id})
		acancel()
		if err != nil {
			t.Fatal(err)
		}
	}

	legacyNS := netnsutil.Path(legacy.ns)
	reach := func(from string, to netip.Addr, port int) func() error {
		return func() error {
			ctx, cancel := context.WithTimeout(c, time.Second)
			defer cancel()
			return netnsutil.Probe(ctx, from, netip.AddrPortFrom(to, uint16(port)).String())
		}
	}
	for _, port := range []int{httpPort, sshPort} {
		if _, err := eventually(30*time.Second, reach(legacyNS, plainIP, port)); err != nil {
			t.Errorf("legacy VM -> default pod %s:%d (group open): %v", plainIP, port, err)
		}
	}
	d, err := eventually(30*time.Second, reach(legacyNS, webIP, httpPort))
	sgAllowed := err == nil
	if err != nil {
		t.Errorf("legacy VM -> web pod %s:80 (group web admits it): %v", webIP, err)
	} else {
		t.Logf("vpcni-test: legacy VM -> web pod %s:80 through the router: answered %.1fs after its NIC was ACTIVE", webIP, d.Seconds())
	}
	chain := "neutron-linuxbri-i" + port.ID[:10]
	before, err := fallbackDrops(chain)
	if err != nil {
		t.Fatal(err)
	}
	_, err = dropped(reach(legacyNS, webIP, sshPort))
	after, cerr := fallbackDrops(chain)
	sgBlocked := err == nil && cerr == nil && after > before
	if !sgBlocked {
		t.Errorf("legacy VM -> web pod %s:22 (group web does not admit it): %v; the agent's %s dropped %d packets before, %d after (%v)", webIP, err, chain, before, after, cerr)
	} else {
		t.Logf("vpcni-test: legacy VM -> web pod %s:22 dropped by the linuxbridge agent: %s's fallback rule counted %d packets more", webIP, chain, after-before)
	}
	if _, err := eventually(20*time.Second, reach(webNS, plainIP, httpPort)); err != nil {
		t.Errorf("web pod %s -> default pod %s:80 across the router: %v", webIP, plainIP, err)
	}

	// Each pod leaves by its own port: the agent's egress chain of each
	// port counts its pod's packets, and no other port's does.
	serve(t, legacyNS, legacy.ip)
	egress := map[string]string{"VM port": n1.portID, "web's NIC": port.ID, "db's NIC": dbPort}
	ownPort := true
	for _, from := range []struct {
		pod, ns, port string
		ip            netip.Addr
	}{{"default pod", plainNS, "VM port", plainIP}, {"web pod", webNS, "web's NIC", webIP}, {"db pod", dbNS, "db's NIC", dbIP}} {
		before := map[string]int{}
		for name, id := range egress {
			if before[name], err = egressPackets(id); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := eventually(20*time.Second, reach(from.ns, legacy.ip, echoPort)); err != nil {
			t.Errorf("%s %s -> legacy VM: %v", from.pod, from.ip, err)
		}
		var counts []string
		for _, name := range []string{"VM port", "web's NIC", "db's NIC"} {
			id := egress[name]
			after, err := egressPackets(id)
			if err != nil {
				t.Fatal(err)
			}
			if sent := after - before[name]; (name == from.port) != (sent > 0) {
				ownPort = false
				t.Errorf("%s %s -> legacy VM: %s's egress chain counted %d packets", from.pod, from.ip, name, sent)
			} else {
				counts = append(counts, fmt.Sprintf("%s +%d", name, sent))
			}
		}
		t.Logf("vpcni-test: %s %s -> legacy VM: the agent's egress chains: %s", from.pod, from.ip, strings.Join(counts, ", "))
	}

	// A rule added in Neutron lets 22 through; the pod is not touched.
	if _, err := rules.Create(c, nc, rules.CreateOpts{Direction: rules.DirIngress, EtherType: rules.EtherType4, SecGroupID: sgWeb.ID,
		Protocol: rules.ProtocolTCP, PortRangeMin: sshPort, PortRangeMax: sshPort, RemoteIPPrefix: legacy.ip.String() + "/32"}).Extract(); err != nil {
		t.Fatal(err)
	}
	d, err = eventually(30*time.Second, reach(legacyNS, webIP, sshPort))
	ruleChange := err == nil
	if err != nil {
		t.Errorf("legacy VM -> web pod %s:22 after group web admits it: %v", webIP, err)
	} else {
		t.Logf("vpcni-test: group web's new rule: legacy VM -> web pod %s:22 answered %.1fs after the rule was created", webIP, d.Seconds())
	}

	// DEL: the NIC held web's only pod, so it goes.
	if err := delWeb(c); err != nil {
		t.Fatalf("DEL of web-0: %v", err)
	}
	d, err = eventually(30*time.Second, func() error {
		if _, err := ports.Get(c, nc, port.ID).Extract(); !gophercloud.ResponseCodeIs(err, http.StatusNotFound) {
			return fmt.Errorf("NIC port %s still there (%v)", port.ID, err)
		}
		return nil
	})
	nicReleased := err == nil
	if err != nil {
		t.Errorf("after web-0's DEL: %v", err)
	} else {
		t.Logf("vpcni-test: web-0's DEL: its NIC detached and its port deleted %.1fs after", d.Seconds())
	}
	fmt.Printf("pod-networks: networks=2 subnets=2 pod_networks=2 sg_allowed=%s sg_blocked=%s sg_rule_change=%s own_port=%s nic_limit=%s nic_released=%s e2e_s=%.1f\n",
		yes(sgAllowed), yes(sgBlocked), yes(ruleChange), yes(ownPort), yes(nicLimit), yes(nicReleased), time.Since(t0).Seconds())
}

// podRuntime is a pod's CNI call as the kubelet makes it.
func podRuntime(name, netns, namespace string) *libcni.RuntimeConf {
	rt := testbed.Runtime("lagt-"+name, netns, "eth0", nil)
	rt.Args = [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", namespace}, {"K8S_POD_NAME", name}}
	return rt
}

// fallbackDrops is the packet count of the rule by which the linuxbridge
// agent's ingress chain for a port sends what no rule of its groups
// admits to neutron-linuxbri-sg-fallback (which drops it).
func fallbackDrops(chain string) (int, error) {
	return chainPackets(chain, "neutron-linuxbri-sg-fallback")
}

// chainPackets is the packet count of the rule of an iptables chain that
// jumps to target.
func chainPackets(chain, target string) (int, error) {
	out, err := exec.Command("iptables", "-t", "filter", "-L", chain, "-v", "-x", "-n").CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("iptables -L %s: %w: %s", chain, err, out)
	}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line)
		if len(f) > 2 && f[2] == target {
			return strconv.Atoi(f[0])
		}
	}
	return 0, fmt.Errorf("no rule to %s in %s:\n%s", target, chain, out)
}

// egressPackets counts the packets the linuxbridge agent's egress chain
// for a port has seen from it: every one but DHCP passes the chain's jump
// to the port's anti-spoofing chain.
func egressPackets(portID string) (int, error) {
	return chainPackets("neutron-linuxbri-o"+portID[:10], "neutron-linuxbri-s"+portID[:10])
}

// crdFiles are vpcni's CRDs in deploy/.
func crdFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("../../deploy/vpcni.io_*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("vpcni's CRDs in deploy/: %v %v", files, err)
	}
	return files
}

func yes(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
