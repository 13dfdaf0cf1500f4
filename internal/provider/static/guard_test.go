package static_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/static"
)

// segment is a stateful stand-in for the uplink: the node's own addresses
// and the hosts that answer (the real one is probed in test/staticguard).
type segment struct {
	mu      sync.Mutex
	own     []netip.Prefix
	holders map[netip.Addr]string
	probed  [][]netip.Addr
}

func (s *segment) Addresses() ([]netip.Prefix, error) { return s.own, nil }

func (s *segment) Probe(_ context.Context, addrs []netip.Addr) (map[netip.Addr]net.HardwareAddr, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.probed = append(s.probed, slices.Clone(addrs))
	out := map[netip.Addr]net.HardwareAddr{}
	for _, a := range addrs {
		if m, ok := s.holders[a]; ok {
			out[a], _ = net.ParseMAC(m)
		}
	}
	return out, nil
}

func ips(ss ...string) []netip.Addr {
	var out []netip.Addr
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

// In blocks mode the guard skips the node's and the Nodes' addresses and
// what answers inside the node's block, and takes the block's next
// addresses instead of asking for another block; every address handed out
// was probed first, and a held one is said with its MAC.
func TestGuardInBlocks(t *testing.T) {
	seg := &segment{own: []netip.Prefix{netip.MustParsePrefix("10.9.0.2/24")}, holders: map[netip.Addr]string{netip.MustParseAddr("10.9.0.3"): "02:00:00:00:00:03"}}
	src := &grantingSource{pending: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/29"), netip.MustParsePrefix("10.9.0.8/29")}}
	var notices []provider.Notice
	p, err := static.NewInBlocks(blocksConfig("1s"), t.TempDir(), src)
	if err != nil {
		t.Fatal(err)
	}
	p.SetGuard(static.Guard{Segment: seg, Probe: true, Recheck: time.Minute,
		Nodes:  func(context.Context) ([]netip.Addr, error) { return ips("10.9.0.4"), nil },
		Notify: func(n provider.Notice) { notices = append(notices, n) }})
	got, err := p.Assign(context.Background(), provider.AssignRequest{Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	var have []string
	for _, l := range got {
		have = append(have, l.Address.String())
	}
	// .0 network, .1 gateway, .2 the node, .3 answers, .4 a Node: .5 .6 .7.
	if want := []string{"10.9.0.5", "10.9.0.6", "10.9.0.7"}; !slices.Equal(have, want) {
		t.Fatalf("Assign(3) = %v, want %v", have, want)
	}
	if len(src.wants) != 1 {
		t.Fatalf("asked for blocks %v, want only the first", src.wants)
	}
	var probed []netip.Addr
	for _, b := range seg.probed {
		probed = append(probed, b...)
	}
	for _, a := range got {
		if !slices.Contains(probed, a.Address) {
			t.Errorf("%s handed out unprobed (probed %v)", a.Address, probed)
		}
	}
	if len(notices) != 1 || notices[0].Reason != provider.ReasonAddressInUse || notices[0].Attrs[3] != "02:00:00:00:00:03" {
		t.Fatalf("notices %+v, want one %s for 10.9.0.3 naming 02:00:00:00:00:03", notices, provider.ReasonAddressInUse)
	}
	_, err = p.Assign(context.Background(), provider.AssignRequest{Addresses: ips("10.9.0.3")})
	if !errors.Is(err, provider.ErrTaken) {
		t.Fatalf("Assign(10.9.0.3) = %v, want ErrTaken", err)
	}
}

// probe.enabled: false hands out without probing; node addresses are
// still skipped.
func TestGuardWithoutProbe(t *testing.T) {
	seg := &segment{own: []netip.Prefix{netip.MustParsePrefix("10.0.0.2/24")}, holders: map[netip.Addr]string{netip.MustParseAddr("10.0.0.3"): "02:00:00:00:00:03"}}
	cfg := &static.Config{Ranges: []static.Range{{CIDR: "10.0.0.0/29"}}}
	off := false
	cfg.Probe.Enabled = &off
	cfg.Defaults()
	p, err := static.New(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p.SetGuard(static.Guard{Segment: seg, Probe: cfg.Probe.On(), Recheck: time.Minute})
	got, err := p.Assign(context.Background(), provider.AssignRequest{Count: 1})
	if err != nil || got[0].Address.String() != "10.0.0.3" || len(seg.probed) != 0 {
		t.Fatalf("Assign(1) = %v, %v (probed %v); want 10.0.0.3, unprobed", got, err, seg.probed)
	}
}

// The probe settings are checked with the rest of the section.
func TestProbeSettingsValidate(t *testing.T) {
	cfg := &static.Config{Ranges: []static.Range{{CIDR: "10.0.0.0/24"}}}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil || !cfg.Probe.On() || cfg.Probe.TimeoutDuration() != 300*time.Millisecond || cfg.Probe.RecheckDuration() != 10*time.Minute {
		t.Fatalf("defaults: %+v, %v", cfg.Probe, err)
	}
	cfg.Probe.Timeout, cfg.Probe.Recheck = "1h", "x"
	err := cfg.Validate()
	for _, w := range []string{`probe.timeout: "1h" is not a duration between 10ms and 5s`, `probe.recheck: "x" is not a duration between 1s and 24h`} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("%v: want %q", err, w)
		}
	}
}

// An address off the uplink's subnets (a routed pod subnet) is not
// probed: ARP cannot reach a holder of it, and the wait would be for
// nothing.
func TestGuardProbesOnLinkOnly(t *testing.T) {
	seg := &segment{own: []netip.Prefix{netip.MustParsePrefix("10.90.0.5/24")}}
	p, err := static.New(&static.Config{Ranges: []static.Range{{CIDR: "10.77.0.0/26"}, {CIDR: "10.90.0.0/28"}}}, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	p.SetGuard(static.Guard{Segment: seg, Probe: true, Recheck: time.Minute})
	got, err := p.Assign(context.Background(), provider.AssignRequest{Count: 63}) // 61 routed, then 2 on the uplink's subnet
	if err != nil || len(got) != 63 {
		t.Fatalf("Assign(63) = %d addresses, %v", len(got), err)
	}
	var probed []netip.Addr
	for _, b := range seg.probed {
		probed = append(probed, b...)
	}
	if want := ips("10.90.0.2", "10.90.0.3"); !slices.Equal(probed, want) {
		t.Fatalf("probed %v, want only %v (the uplink's subnet, less its .5)", probed, want)
	}
}
