package k8se2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// checkEBPFMode proves datapath mode ebpf through the DaemonSet, with
// kube-proxy still in charge of Services: the ConfigMap selects ebpf (the
// node's Service CIDR as its serviceCIDRs) and the agent rolls. Mode ebpf
// wires pods as mode veth does, so the running web pods stay and are
// adopted (their map entries and host veth programs); the controller's
// pods and the hostPort pod are new ones, wired in this mode. Then
// pod -> pod, pod -> ClusterIP, legacy VM -> pod, legacy VM -> hostPort and
// legacy VM -> NodePort answer, a pod with bandwidth limits is shaped to
// them (it stays on the routed path), and the agent's own counters show that the
// fast path carried the pods' traffic past the stack (peer_from_uplink,
// peer_local, neigh_out) while the Service and the NATed connections went
// through it (pass_service, pass_nat). A fallback to the plain path
// fails the test: these checks would pass without the fast path.
func checkEBPFMode(t *testing.T, n *node) {
	start := time.Now()
	oldAgent := n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")[0].Metadata.Name
	n.overlay = n.writeOverlayWith("5s", 64, true, fmt.Sprintf("datapath:\n  mode: ebpf\n  ebpf:\n    serviceCIDRs: [%s]\n", n.env["VPCNI_K8S_SERVICE_CIDR"]))
	n.mustKubectl("apply", "-k", n.overlay)
	eventually(t, 3*time.Minute, "vpcnid in ebpf mode", func() (bool, string) {
		st, err := n.agentState()
		if err != nil {
			return false, err.Error()
		}
		return st.Datapath == "ebpf" && st.Ready, fmt.Sprintf("datapath %q ready %v", st.Datapath, st.Ready)
	})
	n.waitNewAgent(oldAgent)
	st, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	if st.FastPath != "on" {
		t.Errorf("/v1/state: fastPath %q, want on", st.FastPath)
	}
	if out := ingressFilters(t, st.Uplink); !strings.Contains(out, "vpcni_uplink") {
		t.Errorf("no vpcni_uplink program on the uplink %s's tc ingress:\n%s", st.Uplink, out)
	}
	agent := n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")[0].Metadata.Name
	log := n.mustKubectl("-n", "vpcni-system", "logs", agent, "-c", "vpcnid")
	if strings.Contains(log, "ebpf fast path unavailable") || !strings.Contains(log, "ebpf fast path loaded") {
		t.Fatalf("the agent in the DaemonSet did not load the fast path:\n%s", log)
	}
	// The pins are the host's, so they outlive the agent's container: the
	// init container's BPF filesystem reached the host (Bidirectional), and
	// the agent pinned there (HostToContainer), not on one of its own.
	var fs unix.Statfs_t
	if err := unix.Statfs(hostBPFDir, &fs); err != nil || uint32(fs.Type) != unix.BPF_FS_MAGIC {
		t.Errorf("%s on the host is not a BPF filesystem (type %#x, %v): the init container's mount did not propagate", hostBPFDir, fs.Type, err)
	}
	if _, err := os.Stat(filepath.Join(hostBPFDir, "vpcni", "pods")); err != nil {
		t.Errorf("the agent's pods map is not pinned on the host's BPF filesystem: %v", err)
	}
	// The overlay scaled the controller (on the pod network) to 0 while the
	// agent rolled; back, its webhook makes the hostPort pod below request
	// vpcni.io/ip.
	n.mustKubectl("-n", "vpcni-system", "scale", "deployment/vpcni-controller", "--replicas=2")
	n.waitReady("vpcni-system", "app.kubernetes.io/name=vpcni-controller", 2, 2*time.Minute)
	n.waitWebhook(time.Minute)
	web := n.waitReady("default", "app=web", 10, 2*time.Minute)
	t.Logf("vpcni-test: ebpf mode through the DaemonSet in %s: %q logged by %s; %d web pods adopted, the controller's pods wired anew",
		time.Since(start).Round(100*time.Millisecond), "ebpf fast path loaded", agent, len(web))

	before := fastPathCounters(t)
	checkPodToPod(t, n, web)
	checkService(t, n, web)
	checkLegacyToPods(t, web)
	checkHostPort(t, n)
	checkNodePort(t, n, web)
	// A pod with bandwidth limits stays on the routed path, where the
	// bandwidth plugin's qdiscs on its host veth shape it (the fast path
	// would bypass them, and its clsact would keep the plugin's ingress
	// qdisc off the link).
	checkBandwidth(t, n)
	after := fastPathCounters(t)
	if after.active != 1 {
		t.Errorf("vpcni_datapath_fastpath_active{mode=\"ebpf\"} = %v, want 1", after.active)
	}
	rose := map[string]float64{}
	for action, v := range after.packets {
		rose[action] = v - before.packets[action]
	}
	for _, action := range []string{"peer_from_uplink", "peer_local", "neigh_out", "pass_nat", "pass_service"} {
		if rose[action] <= 0 {
			t.Errorf("fast path counter %s did not rise across the checks (%v -> %v)", action, before.packets[action], after.packets[action])
		}
	}
	t.Logf("vpcni-test: ebpf fast path active; packets across the checks: %v", rose)
}

// nodePortManifest is a NodePort Service on the web pods.
const nodePortManifest = `apiVersion: v1
kind: Service
metadata:
  name: web-nodeport
spec:
  type: NodePort
  selector: {app: web}
  ports:
    - {port: 80, targetPort: 8080}
`

// checkNodePort: the legacy VM reaches the web pods at the node's address
// and a NodePort (kube-proxy DNATs it, and masquerades it to the node);
// the Service is gone again afterwards.
func checkNodePort(t *testing.T, n *node, web []pod) {
	n.apply(nodePortManifest)
	defer n.mustKubectl("delete", "svc", "web-nodeport", "--wait=true")
	port, err := strconv.ParseUint(strings.TrimSpace(n.mustKubectl("get", "svc", "web-nodeport", "-o", "jsonpath={.spec.ports[0].nodePort}")), 10, 16)
	if err != nil {
		t.Fatalf("the NodePort Service has no nodePort: %v", err)
	}
	addr := netip.AddrPortFrom(n.lab.Nodes[0].IP, uint16(port))
	names := map[string]bool{}
	for _, p := range web {
		names[p.Metadata.Name] = true
	}
	// kube-proxy writes the Service's rules a moment after it exists.
	eventually(t, 15*time.Second, "legacy VM -> node IP:NodePort", func() (bool, string) {
		got, err := fetch(legacyNS, addr, 2*time.Second)
		return err == nil && names[got], fmt.Sprintf("%q %v", got, err)
	})
	answered := map[string]bool{}
	for i := 0; i < 12; i++ {
		got, err := fetch(legacyNS, addr, 3*time.Second)
		if err != nil || !names[got] {
			t.Fatalf("legacy VM -> %s (NodePort): %q %v", addr, got, err)
		}
		answered[got] = true
	}
	t.Logf("vpcni-test: legacy VM -> %s (node IP:NodePort) through kube-proxy: 12 requests, %d different pods answered", addr, len(answered))
}

// fastPathFigures are the agent's fast path metrics, mode ebpf's.
type fastPathFigures struct {
	active  float64
	packets map[string]float64 // by action
}

// fastPathCounters scrapes the agent's metrics where it serves them
// (metricsAddr in the overlay, on the node's loopback: the agent runs on
// the host network) and picks mode ebpf's fast path series.
func fastPathCounters(t *testing.T) fastPathFigures {
	t.Helper()
	out := mustRun(t, nil, "nsenter", "--net=/run/netns/"+nodeNS, "--", "curl", "-fsS", "http://127.0.0.1:19695/metrics")
	f := fastPathFigures{active: -1, packets: map[string]float64{}}
	for _, line := range strings.Split(out, "\n") {
		series, value, ok := strings.Cut(line, " ")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			continue
		}
		if series == `vpcni_datapath_fastpath_active{mode="ebpf"}` {
			f.active = v
		}
		// client_golang writes the labels sorted: action, then mode.
		if action, ok := strings.CutPrefix(series, `vpcni_datapath_fastpath_packets_total{action="`); ok && strings.HasSuffix(action, `",mode="ebpf"}`) {
			f.packets[strings.TrimSuffix(action, `",mode="ebpf"}`)] = v
		}
	}
	if f.active < 0 || len(f.packets) == 0 {
		t.Fatalf("the agent's metrics have no ebpf fast path series:\n%s", out)
	}
	return f
}

// ingressFilters lists the tc filters on dev's ingress in the node.
func ingressFilters(t *testing.T, dev string) string {
	t.Helper()
	return mustRun(t, nil, "nsenter", "--net=/run/netns/"+nodeNS, "--", "tc", "filter", "show", "dev", dev, "ingress")
}
