package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/static"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// TestForeignHostAddressNeverHandedOut: vpcnid itself, on the testbed's
// segment, with the neighbour host holding 10.78.0.65 and .66 of the
// node's range before the agent starts, and the node's own .10 inside the
// range too: no pod ever gets one of them, and the agent's log names the
// neighbour's MAC with the VpcniAddressInUse reason.
func TestForeignHostAddressNeverHandedOut(t *testing.T) {
	held := []string{"10.78.0.65", "10.78.0.66"} // and its own .20
	e := &env{bedtest.New(t, binDir, "vpcnit", "10.78.0.0/24", "")}
	// The range from .2 on, but for the node's .10 and the neighbour's .20
	// kept in, as in a careless config.
	e.Cfg.Provider.Settings = &static.Config{Ranges: []static.Range{{CIDR: "10.78.0.0/24", Exclude: []string{"10.78.0.0/31", "10.78.0.2/31", "10.78.0.4/30",
		"10.78.0.8/31", "10.78.0.11/32", "10.78.0.12/30", "10.78.0.16/30", "10.78.0.21/32", "10.78.0.22/31", "10.78.0.24/29", "10.78.0.32/27",
		"10.78.0.68/30", "10.78.0.72/29", "10.78.0.80/28", "10.78.0.96/27", "10.78.0.128/25"}}}}
	withPool(4, 4)(&e.Cfg)
	nbr := e.TB.NbrNS()
	for _, a := range held {
		if err := netnsutil.Exec(nbr, "ip", "addr", "add", a+"/24", "dev", "eth0"); err != nil {
			t.Fatal(err)
		}
	}
	e.StartAgent()
	// Usable as configured: .10 (the node), .20 (the neighbour), .64 to
	// .67; the pods' to have: .64 and .67.
	out, err := netnsutil.Output(nbr, "cat", "/sys/class/net/eth0/address")
	if err != nil {
		t.Fatal(err)
	}
	mac := strings.TrimSpace(out)
	c := e.cni("1.0.0")
	var got []string
	for i := range 2 {
		ip := e.AddIP(c, fmt.Sprintf("seg-%d", i), e.Pod(i))
		got = append(got, ip.String())
	}
	for _, a := range got {
		if a != "10.78.0.64" && a != "10.78.0.67" {
			t.Fatalf("pods got %v: %s is the node's or a host's on the segment", got, a)
		}
	}
	if st := e.state(); st.Pool.Free != 0 {
		t.Errorf("free addresses %d, want 0 (only .64 and .67 were the pods' to have, and both went)", st.Pool.Free)
	}
	t.Logf("pods got %v", got)
	log, err := os.ReadFile(e.Agent.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range append(held, "10.78.0.20") {
		if !strings.Contains(string(log), a+" is in the static ranges but host "+mac+" answered ARP for it") {
			t.Errorf("the agent's log does not name %s and %s:\n%s", a, mac, log)
		}
	}
	if !strings.Contains(string(log), provider.ReasonAddressInUse) {
		t.Errorf("the agent's log lacks %s", provider.ReasonAddressInUse)
	}
	for _, l := range strings.Split(string(log), "\n") {
		if strings.Contains(l, provider.ReasonAddressInUse) {
			t.Logf("vpcnid: %s", l)
		}
	}
}
