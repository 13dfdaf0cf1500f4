package k8se2e

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/netnsutil"
)

// TestAWSNode: vpcni with the aws provider on a real Kubernetes node of an
// AWS-style lab (the lab's EC2 endpoint, the node's instance metadata with
// its role's credentials), installed through the DaemonSet as on EC2. The
// node's vpcni.io/ip is the instance type's capacity (t3.medium: 3 ENIs ×
// 5 secondary addresses); 8 pods fill the primary ENI and spill onto an
// ENI the agent attaches. The legacy VM reaches every pod by its address,
// each pod reaches a host outside the VPC with its node's address (SNAT
// is on by default with this provider), and a pod on the secondary ENI
// reaches one on the primary through the node.
func TestAWSNode(t *testing.T) {
	n := upNodesOn(t, 1, "aws")
	n.overlay = n.writeOverlay("5s", 0, true)
	n.dropNodeChainedPlugins()
	n.installAll()
	// t3.medium: 3 ENIs x (6 addresses - the ENI's own), read from
	// DescribeInstanceTypes; the node advertises it less the addresses of
	// pods that request none (the controller's, started before its webhook).
	eventually(t, time.Minute, "vpcni.io/ip allocatable = the instance type's capacity (15) less unrequested pods", func() (bool, string) {
		st, err := n.agentState()
		if err != nil {
			return false, err.Error()
		}
		_, unrequested := n.podNetwork()
		v, ok := ipAllocatable(n.getNode())
		return st.Pool.Capacity == 15 && ok && v == int64(15-unrequested),
			fmt.Sprintf("agent capacity %d (%s), vpcni.io/ip %d (set: %v), unrequested pods %d", st.Pool.Capacity, st.Pool.CapacityReason, v, ok, unrequested)
	})

	const pods = 8
	n.apply(fmt.Sprintf(webManifest, pods, n.env["VPCNI_K8S_BUSYBOX_IMAGE"]))
	web := n.waitReady("default", "app=web", pods, 3*time.Minute)
	st, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	var onENI, onPrimary []string
	for _, a := range st.Allocations {
		if a.NIC != nil {
			onENI = append(onENI, a.Address.String())
		} else {
			onPrimary = append(onPrimary, a.Address.String())
		}
	}
	if len(onENI) == 0 || len(onPrimary) == 0 {
		t.Fatalf("want pods on the primary ENI and on a secondary one: primary %v, secondary %v", onPrimary, onENI)
	}
	t.Logf("vpcni-test: aws: %d pods on the primary ENI, %d on a secondary ENI", len(onPrimary), len(onENI))
	checkLegacyToPods(t, web)

	// A host outside the VPC says whom it sees.
	extNS := labPrefix + "-external"
	ext := netip.MustParseAddr("203.0.113.254")
	ln, err := netnsutil.Listen(netnsutil.Path(extNS), netip.AddrPortFrom(ext, 8081).String())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		fmt.Fprintln(w, host)
	}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { srv.Close() })
	nodeIP := n.lab.Nodes[0].IP.String()
	var secondary, primary string
	for _, p := range web {
		got, err := n.get(p.Metadata.Name, ext.String()+":8081")
		if err != nil || got != nodeIP {
			t.Errorf("pod %s (%s) -> outside the VPC: seen as %q (%v), want the node's %s", p.Metadata.Name, p.Status.PodIP, got, err, nodeIP)
		}
		switch ip := p.Status.PodIP; {
		case strings.Contains(" "+strings.Join(onENI, " ")+" ", " "+ip+" ") && secondary == "":
			secondary = p.Metadata.Name
		case primary == "":
			primary = ip
		}
	}
	if secondary != "" && primary != "" {
		if got, err := n.get(secondary, primary+":8080"); err != nil || got == "" {
			t.Errorf("pod %s on the secondary ENI -> pod %s on the primary: %q %v", secondary, primary, got, err)
		}
	}
}

// awsNetManifest is a PodNetwork on the lab's subnet (no security groups:
// the VPC's default group) and the namespace it selects.
const awsNetManifest = `apiVersion: vpcni.io/v1alpha1
kind: PodNetwork
metadata:
  name: %[1]s
spec:
  namespaceSelector:
    matchLabels: {vpcni-e2e/network: %[1]s}
  aws:
    subnetIDs: [%[2]s]
---
apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
  labels: {vpcni-e2e/network: %[1]s}
`

// TestAWSPodNetworks: PodNetworks on a real node with the aws provider,
// whose t3.medium has 3 ENIs, the node's own pods one or two of them. Each
// PodNetwork's Deployment runs on an ENI of the network's own, reachable
// from the legacy VM, until the instance has no ENI slot left; then the
// node advertises no room for the next PodNetwork, whose pod stays
// Pending, unschedulable for "Insufficient pn.vpcni.io/<name>", rather
// than fail on the node.
func TestAWSPodNetworks(t *testing.T) {
	n := upNodesOn(t, 1, "aws")
	n.overlay = n.writeOverlay("5s", 0, true)
	n.dropNodeChainedPlugins()
	n.installAll()
	start := time.Now()
	var st *api.State
	eventually(t, time.Minute, "the agent's pool warm on the instance type's capacity (15)", func() (bool, string) {
		var err error
		if st, err = n.agentState(); err != nil {
			return false, err.Error()
		}
		return st.Pool.Capacity == 15 && st.Pool.Free >= 4, fmt.Sprintf("capacity %d, free %d", st.Pool.Capacity, st.Pool.Free)
	})
	taken := map[string]string{} // ENI -> who holds it
	for _, a := range st.Allocations {
		taken[a.Interface] = "the node's own pods"
	}
	// The room of a PodNetwork not served yet is the instance's free ENI
	// slots times the 5 addresses of one.
	first := "pn-eni-0"
	n.apply(fmt.Sprintf(awsNetManifest, first, n.lab.SubnetID))
	t.Cleanup(func() { n.deleteNetworks(first) })
	res, _ := k8s.NetworkResource(first)
	var room int64
	eventually(t, time.Minute, "node advertising "+string(res), func() (bool, string) {
		q, ok := n.getNode().Status.Allocatable[res]
		room = q.Value()
		return ok && room <= 10, fmt.Sprintf("allocatable %s (set %v)", q.String(), ok)
	})
	free := int(room / 5)
	if free == 0 {
		t.Fatalf("the node's own pods hold all 3 ENIs (%s=0): no slot left for a PodNetwork", res)
	}
	t.Logf("vpcni-test: PodNetwork %s on subnet %s: node advertises %s=%d (%d free ENI slots × 5) %s after it was created", first, n.lab.SubnetID, res, room, free, time.Since(start).Round(100*time.Millisecond))

	for i := range free {
		name := fmt.Sprintf("pn-eni-%d", i)
		if i > 0 {
			n.apply(fmt.Sprintf(awsNetManifest, name, n.lab.SubnetID))
			t.Cleanup(func() { n.deleteNetworks(name) })
		}
		n.apply(fmt.Sprintf(staticNetWeb, name, 2, n.env["VPCNI_K8S_BUSYBOX_IMAGE"]))
		pods := n.waitReady(name, "app=pnweb", 2, 2*time.Minute)
		st, err := n.agentState()
		if err != nil {
			t.Fatal(err)
		}
		eni := ""
		for _, p := range pods {
			i := slices.IndexFunc(st.Allocations, func(x alloc.Allocation) bool { return x.Address.String() == p.Status.PodIP })
			if i < 0 {
				t.Fatalf("the agent holds no allocation for %s (%s)", p.Metadata.Name, p.Status.PodIP)
			}
			l := st.Allocations[i].Lease
			switch {
			case st.Allocations[i].PodNetwork != name || l.NIC == nil:
				t.Errorf("%s (%s) is on %+v of PodNetwork %q: want an ENI of %s's own", p.Metadata.Name, p.Status.PodIP, l, st.Allocations[i].PodNetwork, name)
			case taken[l.Interface] != "" && taken[l.Interface] != name:
				t.Errorf("%s (%s) is on ENI %s, which %s hold", p.Metadata.Name, p.Status.PodIP, l.Interface, taken[l.Interface])
			case eni != "" && l.Interface != eni:
				t.Errorf("%s's pods are on ENIs %s and %s, want one", name, eni, l.Interface)
			}
			eni = l.Interface
			taken[eni] = name
		}
		checkLegacyToPods(t, pods)
		t.Logf("vpcni-test: PodNetwork %s: pods %s on ENI %s of its own, reachable from the legacy VM, %s after the first PodNetwork was created", name, podIPs(pods), eni, time.Since(start).Round(100*time.Millisecond))
	}

	// The last slot is taken: the next network has no room here.
	full := fmt.Sprintf("pn-eni-%d", free)
	resFull, _ := k8s.NetworkResource(full)
	n.apply(fmt.Sprintf(awsNetManifest, full, n.lab.SubnetID))
	t.Cleanup(func() { n.deleteNetworks(full) })
	n.waitNetworkRoom(t, resFull, 0)
	n.apply(fmt.Sprintf(staticNetWeb, full, 1, n.env["VPCNI_K8S_BUSYBOX_IMAGE"]))
	var why string
	eventually(t, time.Minute, "PodNetwork "+full+"'s pod Pending, unschedulable", func() (bool, string) {
		ps := n.fullPods("-n", full, "-l", "app=pnweb")
		if len(ps) != 1 {
			return false, fmt.Sprintf("%d pods", len(ps))
		}
		why = unschedulable(&ps[0])
		return ps[0].Spec.NodeName == "" && why != "", fmt.Sprintf("phase %s node %q: %s", ps[0].Status.Phase, ps[0].Spec.NodeName, why)
	})
	if !strings.Contains(why, "Insufficient "+string(resFull)) {
		t.Errorf("PodNetwork %s's pod Pending for another reason: %s", full, why)
	}
	t.Logf("vpcni-test: PodNetwork %s, no ENI slot left on the instance: node advertises %s=0; its pod Pending: %s", full, resFull, why)
}

// deleteNetworks deletes the PodNetworks named and their namespaces.
func (n *node) deleteNetworks(names ...string) {
	for _, name := range names {
		_, _ = n.kubectl("delete", "namespace", name, "--wait=true", "--timeout=1m")
		_, _ = n.kubectl("delete", "podnetwork", name, "--wait=true", "--timeout=30s")
	}
}

// waitNetworkRoom waits until the node advertises res (a PodNetwork's
// resource) as want, in capacity and allocatable.
func (n *node) waitNetworkRoom(t *testing.T, res corev1.ResourceName, want int64) {
	t.Helper()
	eventually(t, 2*time.Minute, fmt.Sprintf("node advertising %s=%d", res, want), func() (bool, string) {
		nd := n.getNode()
		c, okC := nd.Status.Capacity[res]
		a, okA := nd.Status.Allocatable[res]
		return okC && okA && c.Value() == want && a.Value() == want, fmt.Sprintf("capacity %s, allocatable %s", c.String(), a.String())
	})
}
