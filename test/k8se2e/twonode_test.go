package k8se2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/api"
)

// twoNodeWeb is one web Deployment per node (pinned by hostname), a
// ClusterIP Service and a NodePort Service for each: every Service's
// backends are on one node only, so a client on the other node, or the
// legacy VM at the other node's address, proves the cross-node path.
const twoNodeWeb = `apiVersion: apps/v1
kind: Deployment
metadata:
  name: web-%[1]s
spec:
  replicas: 3
  selector:
    matchLabels: {app: web-%[1]s}
  template:
    metadata:
      labels: {app: web-%[1]s, tier: web}
    spec:
      terminationGracePeriodSeconds: 1
      nodeSelector: {kubernetes.io/hostname: %[2]s}
      containers:
        - name: web
          image: %[3]s
          imagePullPolicy: Never
          command: [/bin/sh, -c, 'mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www']
          readinessProbe:
            tcpSocket: {port: 8080}
            periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata:
  name: web-%[1]s
spec:
  selector: {app: web-%[1]s}
  ports:
    - {port: 80, targetPort: 8080}
---
apiVersion: v1
kind: Service
metadata:
  name: np-%[1]s
spec:
  type: NodePort
  selector: {app: web-%[1]s}
  ports:
    - {port: 80, targetPort: 8080, nodePort: %[4]d}
`

// twoNodeHostPort is a pod with a hostPort, pinned to one node.
const twoNodeHostPort = `apiVersion: v1
kind: Pod
metadata:
  name: hostport-%[1]s
  labels: {app: hostport-%[1]s}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: %[2]s}
  containers:
    - name: web
      image: %[3]s
      imagePullPolicy: Never
      command: [/bin/sh, -c, 'mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www']
      ports: [{containerPort: 8080, hostPort: %[4]d, protocol: TCP}]
      readinessProbe:
        tcpSocket: {port: 8080}
        periodSeconds: 1
`

// TestTwoNodes runs vpcni on two real kubelets: the control plane and a
// kubelet in lab node 1, a second kubelet (its own containerd,
// kube-proxy, mount namespace and cgroups) in lab node 2 registered at node
// 1's API server, both on the lab's VPC. vpcni is installed once through
// the DaemonSet (kubectl apply -k, the same overlay as TestKubernetesNode),
// which then runs on both nodes. It checks: both nodes turn Ready (not
// before vpcni), pods on each node get addresses on that node's VM port,
// pod <-> pod across nodes, a pod -> a ClusterIP whose only backends are on
// the other node, NodePort from the legacy VM at each node's address (to
// backends on either node), and a hostPort on each node from the legacy VM.
// Then, on the same cluster, Kubernetes' own Granular Checks and HostPort
// conformance tests (conformanceSubset): `make test` runs this.
func TestTwoNodes(t *testing.T) {
	start := time.Now()
	conformanceBuild(t, "build")
	n := upDualStack(t, 2)
	names := n.nodeNames()
	ips := []netip.Addr{n.lab.Nodes[0].IP, n.lab.Nodes[1].IP}
	if names[1] == "" || names[0] == names[1] {
		t.Fatalf("node names %q", names)
	}
	if got := n.joined[0].env["VPCNI_K8S_NODE_IP"]; got != ips[1].String() {
		t.Fatalf("the joined node advertises %s, the lab gave it %s", got, ips[1])
	}
	for i, name := range names {
		if n.nodeReadyNamed(name) {
			t.Fatalf("node %d (%s) is Ready before any CNI was installed", i+1, name)
		}
	}
	t.Logf("vpcni-test: two nodes registered (%s at %s, %s at %s), both NotReady without a CNI, in %s",
		names[0], ips[0], names[1], ips[1], time.Since(start).Round(100*time.Millisecond))

	n.overlay = n.writeOverlay("5s", 64, true)
	n.installAll()
	for i, name := range names {
		st, err := n.agentStateOn(i)
		if err != nil || !st.Ready {
			t.Fatalf("the agent on %s: %+v %v", name, st, err)
		}
	}

	busybox := n.env["VPCNI_K8S_BUSYBOX_IMAGE"]
	sides := []string{"a", "b"}
	nodePorts := []int{30081, 30082}
	t0 := time.Now()
	for i, s := range sides {
		n.apply(fmt.Sprintf(twoNodeWeb, s, names[i], busybox, nodePorts[i]))
	}
	web := make([][]pod, 2)
	for i, s := range sides {
		web[i] = n.waitReady("default", "app=web-"+s, 3, 3*time.Minute)
	}
	t.Logf("vpcni-test: 3 web pods on each node Ready in %s", time.Since(t0).Round(100*time.Millisecond))

	t.Run("addresses", func(t *testing.T) {
		seen := map[string]string{}
		subnet := netip.PrefixFrom(ips[0], 24).Masked()
		for i, ps := range web {
			onPort := n.portIPsOf(i)
			for _, p := range ps {
				full := n.podNode(p.Metadata.Name)
				if full != names[i] {
					t.Errorf("%s runs on %q, want %s", p.Metadata.Name, full, names[i])
				}
				ip, err := netip.ParseAddr(p.Status.PodIP)
				if err != nil || !subnet.Contains(ip) {
					t.Errorf("%s: address %q not in the VPC subnet %s", p.Metadata.Name, p.Status.PodIP, subnet)
					continue
				}
				if other, dup := seen[ip.String()]; dup {
					t.Errorf("%s and %s both have %s", other, p.Metadata.Name, ip)
				}
				seen[ip.String()] = p.Metadata.Name
				if !onPort[ip.String()] {
					t.Errorf("%s: %s is not on %s's VM port in the cloud", p.Metadata.Name, ip, names[i])
				}
			}
		}
		t.Logf("vpcni-test: %d pods on two nodes: distinct VPC addresses, each on its own node's VM port", len(seen))
	})

	t.Run("dual-stack", func(t *testing.T) { checkDualStack(t, n, web, names) })

	t.Run("cross-node-pod-to-pod", func(t *testing.T) {
		pairs := 0
		for i := range web {
			for _, p := range web[i] {
				for _, q := range web[1-i] {
					out, err := n.get(p.Metadata.Name, q.Status.PodIP+":8080")
					if err != nil || out != q.Metadata.Name {
						t.Errorf("%s (%s) -> %s (%s): %q %v", p.Metadata.Name, names[i], q.Metadata.Name, q.Status.PodIP, out, err)
					}
					pairs++
				}
			}
		}
		t.Logf("vpcni-test: pod <-> pod across the nodes: %d pairs answered with the right hostname", pairs)
	})

	t.Run("clusterip-backed-by-other-node", func(t *testing.T) {
		for i, s := range sides {
			// The client is on node i, the Service's backends on the other.
			other := sides[1-i]
			clusterIP := strings.TrimSpace(n.mustKubectl("get", "svc", "web-"+other, "-o", "jsonpath={.spec.clusterIP}"))
			want := map[string]bool{}
			for _, q := range web[1-i] {
				want[q.Metadata.Name] = true
			}
			answered := map[string]bool{}
			for k := 0; k < 9; k++ {
				out, err := n.get(web[i][0].Metadata.Name, clusterIP+":80")
				if err != nil || !want[out] {
					t.Fatalf("%s on %s -> ClusterIP %s (web-%s, backends on %s): %q %v", web[i][0].Metadata.Name, names[i], clusterIP, other, names[1-i], out, err)
				}
				answered[out] = true
			}
			t.Logf("vpcni-test: pod on %s (web-%s) -> ClusterIP %s backed only by %s: 9 requests, %d backends answered", names[i], s, clusterIP, names[1-i], len(answered))
		}
	})

	t.Run("nodeport-from-legacy-vm", func(t *testing.T) {
		for i := range sides {
			want := map[string]bool{}
			for _, q := range web[i] {
				want[q.Metadata.Name] = true
			}
			// Each NodePort at both nodes' addresses: its backends are on
			// node i, so one of the two is forwarded across the VPC.
			for j, ip := range ips {
				addr := netip.AddrPortFrom(ip, uint16(nodePorts[i]))
				var got string
				eventually(t, 15*time.Second, "legacy VM -> "+addr.String(), func() (bool, string) {
					var err error
					got, err = fetch(legacyNS, addr, 2*time.Second)
					return err == nil && want[got], fmt.Sprintf("%q %v", got, err)
				})
				t.Logf("vpcni-test: legacy VM -> NodePort %s (node %s; backends on %s) answered by %s", addr, names[j], names[i], got)
			}
		}
	})

	t.Run("hostport-from-legacy-vm", func(t *testing.T) {
		for i, s := range sides {
			addr := netip.AddrPortFrom(ips[i], hostPort)
			if got, err := fetch(legacyNS, addr, 2*time.Second); err == nil {
				t.Fatalf("%s answers %q before any pod maps it: the check would prove nothing", addr, got)
			}
			n.apply(fmt.Sprintf(twoNodeHostPort, s, names[i], busybox, hostPort))
			p := n.waitReady("default", "app=hostport-"+s, 1, 2*time.Minute)[0]
			var got string
			eventually(t, 15*time.Second, "legacy VM -> "+addr.String(), func() (bool, string) {
				var err error
				got, err = fetch(legacyNS, addr, 2*time.Second)
				return err == nil && got == p.Metadata.Name, fmt.Sprintf("%q %v", got, err)
			})
			t.Logf("vpcni-test: legacy VM -> %s (hostPort on %s) answered by pod %s at %s", addr, names[i], got, p.Status.PodIP)
		}
	})
	t.Logf("vpcni-test: two-node checks done in %s", time.Since(start).Round(100*time.Millisecond))
	if t.Failed() {
		t.Log("vpcni-test: the upstream Granular Checks and HostPort NOT RUN: vpcni's own checks failed above")
		return
	}
	// Kubernetes' own tests last, on the same two nodes (their pods
	// beside the ones above): its results beside make conformance's, in
	// a directory of their own.
	n.runUpstreamE2E(conformanceSubset, conformanceSkip,
		filepath.Join(envOr("VPCNI_CONFORMANCE_RESULTS", "/var/tmp/vpcni-conformance"), "twonode-subset"), false)
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

func (n *node) nodeReadyNamed(name string) bool {
	out, err := n.kubectl("get", "node", name, "-o", `jsonpath={.status.conditions[?(@.type=="Ready")].status}`)
	return err == nil && strings.TrimSpace(out) == "True"
}

// podNode is the node a pod runs on.
func (n *node) podNode(name string) string {
	return strings.TrimSpace(n.mustKubectl("get", "pod", name, "-o", "jsonpath={.spec.nodeName}"))
}

// podNodes counts the pods (of vpcni-system) per node.
func (n *node) podNodes(ps []pod) map[string]int {
	on := map[string]int{}
	for _, p := range ps {
		out := n.mustKubectl("-n", p.Metadata.Namespace, "get", "pod", p.Metadata.Name, "-o", "jsonpath={.spec.nodeName}")
		on[strings.TrimSpace(out)]++
	}
	return on
}

// agentStateOn asks node i's agent through its socket: for a joined node,
// from inside its namespaces (k8s-node.sh on), where its private socket
// dir is.
func (n *node) agentStateOn(i int) (*api.State, error) {
	if i == 0 {
		return n.agentState()
	}
	out, err := run(n.t, []string{"NODE=" + n.joined[i-1].env["VPCNI_K8S_NODE"]}, "bash", filepath.Join(repo, "scripts/k8s-node.sh"),
		"on", filepath.Join(binDir, "vpcnictl"), "status", "--socket", hostSocketDir+"/vpcnid.sock", "-o", "json")
	if err != nil {
		return nil, err
	}
	st := &api.State{}
	return st, json.Unmarshal([]byte(out), st)
}

// portIPsOf is portIPs of lab node i.
func (n *node) portIPsOf(i int) map[string]bool {
	var body struct {
		Port struct {
			FixedIPs []struct {
				IP string `json:"ip_address"`
			} `json:"fixed_ips"`
		} `json:"port"`
	}
	out := mustRun(n.t, nil, "curl", "-fsS", n.lab.URL+"v2.0/ports/"+n.lab.Nodes[i].PortID)
	if err := json.Unmarshal([]byte(out), &body); err != nil {
		n.t.Fatal(err)
	}
	m := map[string]bool{}
	for _, f := range body.Port.FixedIPs {
		m[f.IP] = true
	}
	return m
}

// twoNodeDualService is a Service of both families (PreferDualStack) in
// front of one node's web pods.
const twoNodeDualService = `apiVersion: v1
kind: Service
metadata:
  name: web-%[1]s-dual
spec:
  ipFamilyPolicy: PreferDualStack
  ipFamilies: [IPv4, IPv6]
  selector: {app: web-%[1]s}
  ports:
    - {port: 80, targetPort: 8080}
`

// checkDualStack: on the dual-stack cluster every web pod has an address
// of each family, both on its node's VM port; pods reach each other
// across the nodes by IPv6, the legacy VM reaches each by IPv6, and a pod
// on one node reaches a dual-stack Service backed by the other node's pods
// on both of its cluster IPs.
func checkDualStack(t *testing.T, n *node, web [][]pod, names []string) {
	subnet6 := netip.MustParsePrefix(labSubnet6)
	v6 := make([][]netip.Addr, len(web))
	for i, ps := range web {
		onPort := n.portIPsOf(i)
		for _, p := range ps {
			if len(p.Status.PodIPs) != 2 {
				t.Fatalf("%s has pod IPs %v, want one of each family", p.Metadata.Name, p.Status.PodIPs)
			}
			first, err1 := netip.ParseAddr(p.Status.PodIPs[0].IP)
			second, err2 := netip.ParseAddr(p.Status.PodIPs[1].IP)
			if err1 != nil || err2 != nil || !first.Is4() || !subnet6.Contains(second) {
				t.Fatalf("%s: pod IPs %v, want an IPv4 address, then one of %s", p.Metadata.Name, p.Status.PodIPs, subnet6)
			}
			if !onPort[second.String()] {
				t.Errorf("%s: %s is not on %s's VM port in the cloud", p.Metadata.Name, second, names[i])
			}
			v6[i] = append(v6[i], second)
		}
	}
	pairs := 0
	for i := range web {
		for _, p := range web[i] {
			q, addr := web[1-i][0], netip.AddrPortFrom(v6[1-i][0], 8080)
			if out, err := n.get(p.Metadata.Name, addr.String()); err != nil || out != q.Metadata.Name {
				t.Errorf("%s (%s) -> %s at %s: %q %v", p.Metadata.Name, names[i], q.Metadata.Name, addr, out, err)
			}
			pairs++
		}
	}
	for i := range web {
		for k, p := range web[i] {
			addr := netip.AddrPortFrom(v6[i][k], 8080)
			var got string
			eventually(t, 15*time.Second, "legacy VM -> "+addr.String(), func() (bool, string) {
				var err error
				got, err = fetch(legacyNS, addr, 2*time.Second)
				return err == nil && got == p.Metadata.Name, fmt.Sprintf("%q %v", got, err)
			})
		}
	}
	t.Logf("vpcni-test: dual-stack: %d pods with an IPv4 and an IPv6 address on their node's VM port; %d pod -> pod across the nodes by IPv6; legacy VM (%s) -> every pod by IPv6",
		len(web[0])+len(web[1]), pairs, n.lab.Legacy.IP6)

	n.apply(fmt.Sprintf(twoNodeDualService, "b"))
	ips := strings.Fields(n.mustKubectl("get", "svc", "web-b-dual", "-o", "jsonpath={.spec.clusterIPs[*]}"))
	if len(ips) != 2 {
		t.Fatalf("Service web-b-dual (PreferDualStack) got cluster IPs %v, want one of each family", ips)
	}
	want := map[string]bool{}
	for _, q := range web[1] {
		want[q.Metadata.Name] = true
	}
	for _, ip := range ips {
		a := netip.MustParseAddr(ip)
		addr := netip.AddrPortFrom(a, 80)
		var got string
		eventually(t, 15*time.Second, "pod on "+names[0]+" -> "+addr.String(), func() (bool, string) {
			var err error
			got, err = n.get(web[0][0].Metadata.Name, addr.String())
			return err == nil && want[got], fmt.Sprintf("%q %v", got, err)
		})
		t.Logf("vpcni-test: dual-stack Service: pod on %s -> cluster IP %s (backends on %s) answered by %s", names[0], addr, names[1], got)
	}
}
