package integration

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// TestPodHealth: the agent probes every pod's datapath each interval —
// the mode's check and an ICMP echo from the node — and vpcnictl status
// shows the result. A pod broken inside its namespace (its default route
// deleted, which no node-side reconcile can put back) turns unhealthy,
// with the problem named; one whose echo is dropped too; the others stay
// healthy.
func TestPodHealth(t *testing.T) {
	e := newEnv(t, func(c *config.Config) {
		c.Health = config.Health{Interval: config.Duration{Duration: time.Second}, Ping: true, PingTimeout: config.Duration{Duration: 300 * time.Millisecond}}
	})
	c := e.cni("1.0.0")
	var keys []string
	for i := range 3 {
		id := fmt.Sprintf("health-%d", i)
		e.AddIP(c, id, e.Pod(i))
		keys = append(keys, id+"/eth0")
	}
	health := func() map[string]api.PodHealth { return e.state().Health }
	bedtest.WaitFor(t, 5*time.Second, "every pod probed healthy with a ping", func() bool {
		h := health()
		for _, k := range keys {
			if !h[k].Healthy || h[k].PingMicros == 0 {
				return false
			}
		}
		return true
	})

	// Pod 0: its default route gone. Pod 1: drops ICMP echo requests.
	bedtest.Sh(t, e.TB.PodNS(0), "ip", "route", "del", "default")
	bedtest.Sh(t, e.TB.PodNS(1), "nft", "add table ip vpcni_t; add chain ip vpcni_t in { type filter hook input priority 0; }; add rule ip vpcni_t in icmp type echo-request drop")
	bedtest.WaitFor(t, 5*time.Second, "the two broken pods reported unhealthy", func() bool {
		h := health()
		return !h[keys[0]].Healthy && !h[keys[1]].Healthy
	})
	h := health()
	if p := h[keys[0]].Problem; !strings.Contains(p, "route") {
		t.Errorf("pod without its default route: problem %q does not name the route", p)
	}
	if p := h[keys[1]].Problem; !strings.Contains(p, "no ICMP echo reply") {
		t.Errorf("pod dropping echo requests: problem %q", p)
	}
	if !h[keys[2]].Healthy {
		t.Errorf("the intact pod is unhealthy: %+v", h[keys[2]])
	}
	o, err := exec.Command(filepath.Join(binDir, "vpcnictl"), "status", "--socket", e.Cfg.SocketPath).CombinedOutput()
	if err != nil {
		t.Fatalf("vpcnictl status: %v\n%s", err, o)
	}
	out := string(o)
	for _, want := range []string{"UNHEALTHY", "unhealthy datapaths:", "no ICMP echo reply", "ok (ping "} {
		if !strings.Contains(out, want) {
			t.Errorf("vpcnictl status lacks %q:\n%s", want, out)
		}
	}
}
