package k8se2e

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
	"testing"
	"time"

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
