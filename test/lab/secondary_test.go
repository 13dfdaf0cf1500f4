package lab

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// TestSecondaryNICLab (seed 002): a node in the routed veth mode whose VM
// port holds one pod address (maxAddresses 1) gets a secondary NIC from
// the provider (secondaryNICs 1, attached through the lab's os-interface
// stand-in) and the next pods' addresses on it. The lab's port security
// allows those addresses only on the secondary port, so a pod on it that
// reaches the legacy VM and is reached back proves its packets leave and
// arrive by the right NIC; the pod on the primary port and it reach each
// other on the node (rule 512).
func TestSecondaryNICLab(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	l := labUp(t, c, "sn", 1, "10.94.0.0/24")
	nodes := startAgents(t, l, "1.0.0", func(cfg *config.Config) {
		cfg.Pool = config.Pool{WarmTarget: 1, BatchSize: 1, MaxFree: 2}
		cfg.Provider = config.Provider{Type: "openstack", Settings: &openstack.Config{
			Endpoint:        fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort),
			ComputeEndpoint: fmt.Sprintf("http://127.0.0.1:%d%s", lab.EndpointPort, lab.ComputePath),
			SubnetID:        l.SubnetID, MaxAddresses: 1, SecondaryNICs: 1}}
	})
	var onPrimary, onNIC labPod
	for i := range 3 {
		p := addPod(t, c, l, nodes[0], fmt.Sprint(i))
		st, err := nodes[0].agent.State()
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range st.Allocations {
			if a.ContainerID != p.id {
				continue
			}
			if a.NIC != nil {
				onNIC = p
			} else {
				onPrimary = p
			}
		}
		if onNIC.ip.IsValid() && onPrimary.ip.IsValid() {
			break
		}
	}
	if !onNIC.ip.IsValid() || !onPrimary.ip.IsValid() {
		t.Fatalf("want a pod on the primary port and one on a secondary NIC: %v, %v", onPrimary.ip, onNIC.ip)
	}
	legacy := netnsutil.Path(l.Legacy.NS)
	serveEcho(t, legacy, l.Legacy.IP)
	expectReach(t, c, []reachable{
		{"pod on the secondary NIC -> legacy VM", onNIC.ns, l.Legacy.IP},
		{"legacy VM -> pod on the secondary NIC", legacy, onNIC.ip},
		{"pod on the primary port -> legacy VM", onPrimary.ns, l.Legacy.IP},
		{"pod on the secondary NIC -> pod on the primary port", onNIC.ns, onPrimary.ip},
		{"pod on the primary port -> pod on the secondary NIC", onPrimary.ns, onNIC.ip},
	})
	rules, _ := netnsutil.Output(l.Nodes[0].NS, "ip", "rule")
	if !strings.Contains(rules, "1536:\tfrom "+onNIC.ip.String()+" lookup") {
		t.Errorf("node rules lack 1536 from %s:\n%s", onNIC.ip, rules)
	}
	if err := l.FabricErr(); err != nil {
		t.Fatalf("fabric: %v", err)
	}
}
