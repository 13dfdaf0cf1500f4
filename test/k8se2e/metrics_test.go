package k8se2e

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/netnsutil"
)

// checkMetricsServices scrapes vpcni the way Prometheus finds it: the
// endpoints of the headless Services vpcni-agent-metrics and
// vpcni-controller-metrics, fetched from the legacy VM (another host of
// the VPC, as a Prometheus outside the node would be). The agent's
// endpoint must be the node's own address on agentPort (metricsAddr
// ${VPCNI_HOST_IP}, from status.hostIP) and serve its pool with the
// capacity the agent reports; the node's loopback must not answer there
// (metrics are on the node's address, not on every address). Every
// controller replica must answer on 9697.
func checkMetricsServices(t *testing.T, n *node, agentPort int) {
	nodeIP := n.lab.Nodes[0].IP
	agents := serviceEndpoints(t, n, "vpcni-agent-metrics", 1)
	if want := netip.AddrPortFrom(nodeIP, uint16(agentPort)); agents[0] != want {
		t.Fatalf("vpcni-agent-metrics: endpoint %s, want the node's address %s", agents[0], want)
	}
	body := scrape(t, legacyNS, agents[0])
	st, err := n.agentState()
	if err != nil {
		t.Fatal(err)
	}
	capacity := regexp.MustCompile(`(?m)^vpcni_pool_capacity (\d+)$`).FindStringSubmatch(body)
	if capacity == nil || st.Pool.Capacity <= 0 || capacity[1] != strconv.Itoa(st.Pool.Capacity) {
		t.Errorf("the agent's metrics: vpcni_pool_capacity %v, want the capacity vpcnictl status reports, %d", capacity, st.Pool.Capacity)
	}
	if !strings.Contains(body, `vpcni_pool_addresses{state="allocated"}`) {
		t.Errorf("the agent's metrics lack vpcni_pool_addresses:\n%s", body)
	}
	loopback := netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(agentPort))
	if err := netnsutil.Do(netnsutil.Path(nodeNS), func() error {
		c, err := net.DialTimeout("tcp4", loopback.String(), time.Second)
		if err == nil {
			c.Close()
			return fmt.Errorf("%s answers", loopback)
		}
		return nil
	}); err != nil {
		t.Errorf("the agent serves metrics on the node's loopback too (%v): want only the node's address", err)
	}

	controllers := serviceEndpoints(t, n, "vpcni-controller-metrics", 2)
	for _, ep := range controllers {
		if ep.Port() != 9697 {
			t.Errorf("vpcni-controller-metrics: endpoint %s, want port 9697", ep)
		}
		if body := scrape(t, legacyNS, ep); !strings.Contains(body, "process_resident_memory_bytes") {
			t.Errorf("controller %s: /metrics lacks process_resident_memory_bytes:\n%s", ep, body)
		}
	}
	t.Logf("vpcni-test: metrics Services: agent at %s (vpcni_pool_capacity %s, loopback refused), controllers at %v, all scraped from the legacy VM", agents[0], capacity[1], controllers)
}

// serviceEndpoints waits for want ready endpoints of Service name in
// vpcni-system and returns them, sorted.
func serviceEndpoints(t *testing.T, n *node, name string, want int) []netip.AddrPort {
	t.Helper()
	var eps []netip.AddrPort
	eventually(t, time.Minute, "Service "+name+" lists its pods", func() (bool, string) {
		var list struct {
			Items []struct {
				Endpoints []struct {
					Addresses  []string `json:"addresses"`
					Conditions struct {
						Ready *bool `json:"ready"`
					} `json:"conditions"`
				} `json:"endpoints"`
				Ports []struct {
					Name string `json:"name"`
					Port int    `json:"port"`
				} `json:"ports"`
			} `json:"items"`
		}
		if err := n.getJSON(&list, "-n", "vpcni-system", "get", "endpointslices", "-l", "kubernetes.io/service-name="+name); err != nil {
			return false, err.Error()
		}
		eps = nil
		for _, s := range list.Items {
			for _, p := range s.Ports {
				if p.Name != "metrics" {
					continue
				}
				for _, e := range s.Endpoints {
					if e.Conditions.Ready == nil || !*e.Conditions.Ready {
						continue
					}
					for _, a := range e.Addresses {
						if ip, err := netip.ParseAddr(a); err == nil {
							eps = append(eps, netip.AddrPortFrom(ip, uint16(p.Port)))
						}
					}
				}
			}
		}
		slices.SortFunc(eps, func(a, b netip.AddrPort) int { return a.Compare(b) })
		return len(eps) == want, fmt.Sprintf("%d ready endpoints named metrics: %v", len(eps), eps)
	})
	return eps
}

// scrape GETs /metrics at addr from namespace ns.
func scrape(t *testing.T, ns string, addr netip.AddrPort) string {
	t.Helper()
	var c net.Conn
	err := netnsutil.Do(netnsutil.Path(ns), func() (err error) {
		c, err = net.DialTimeout("tcp4", addr.String(), 3*time.Second)
		return err
	})
	if err != nil {
		t.Fatalf("scrape %s from %s: %v", addr, ns, err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, "GET /metrics HTTP/1.0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("scrape %s: %v", addr, err)
	}
	head, body, _ := strings.Cut(string(resp), "\r\n\r\n")
	if !strings.HasPrefix(head, "HTTP/1.") || !strings.Contains(strings.SplitN(head, "\r\n", 2)[0], " 200") {
		t.Fatalf("scrape %s: answer %q", addr, head)
	}
	return body
}
