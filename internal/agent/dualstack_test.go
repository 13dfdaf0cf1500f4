package agent

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider/static"
)

// dualNode is a node whose pods get fams, from a static IPv4 range and an
// IPv6 one.
func dualNode(t *testing.T, v4, v6 string, fams ...family.Family) *node {
	return newNode(t, v4, func(c *config.Config) {
		c.IPFamilies = fams
		var ranges []static.Range
		if v4 != "" {
			ranges = append(ranges, static.Range{CIDR: v4})
		}
		ranges = append(ranges, static.Range{CIDR: v6})
		c.Provider = config.Provider{Type: "static", Settings: &static.Config{Ranges: ranges}}
	})
}

// addAll is an ADD that must succeed; it returns the result's addresses in
// order.
func (r *running) addAll(t *testing.T, id, netns string) []netip.Addr {
	t.Helper()
	res, aerr := r.Add(context.Background(), req(id, netns))
	if aerr != nil {
		t.Fatalf("ADD %s: %v", id, aerr)
	}
	var out []netip.Addr
	for _, ip := range res.IPs {
		a, _ := netip.AddrFromSlice(ip.Address.IP)
		out = append(out, a.Unmap())
	}
	return out
}

// checkFamilies: every record holds one address of each family in order,
// each family's pool gives it to the record, no address twice, and each
// pool allocates as many as the store records.
func (r *running) checkFamilies(t *testing.T, n *node) {
	t.Helper()
	recs, err := r.store.List()
	if err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Addr]string{}
	fams := r.cfg.Families()
	for _, rec := range recs {
		addrs := rec.Addresses()
		if len(addrs) != len(fams) {
			t.Fatalf("%s holds %v, want one address of each of %v", rec.Key(), addrs, fams)
		}
		for i, a := range addrs {
			if family.Of(a) != fams[i] {
				t.Errorf("%s: address %d is %s, want %s", rec.Key(), i, a, fams[i])
			}
			if other, dup := seen[a]; dup {
				t.Fatalf("%s recorded for %s and %s", a, other, rec.Key())
			}
			seen[a] = rec.Key()
			if !r.fams[fams[i]].Owns(rec.Key(), a) {
				t.Errorf("the %s pool does not give %s to %s", fams[i], a, rec.Key())
			}
			if !n.dp.Wired(rec.Key(), a) {
				t.Errorf("%s (%s) is recorded but not wired", rec.Key(), a)
			}
		}
	}
	for _, f := range fams {
		if got := r.fams[f].Status(time.Now()).Allocated; got != len(recs) {
			t.Errorf("the %s pool allocates %d, the store records %d", f, got, len(recs))
		}
	}
}

// A dual-stack ADD takes an address of each family, in ipFamilies' order;
// DEL gives both back; the node shows a pool per family.
func TestDualStackAddDel(t *testing.T) {
	for _, fams := range [][]family.Family{{family.V4, family.V6}, {family.V6, family.V4}} {
		t.Run(family.Join(fams), func(t *testing.T) {
			n := dualNode(t, "10.9.6.0/24", "fd00:9:6::/120", fams...)
			a := n.start()
			ns := n.pod("p1")
			got := a.addAll(t, "c1", ns)
			if len(got) != 2 || family.Of(got[0]) != fams[0] || family.Of(got[1]) != fams[1] {
				t.Fatalf("ADD result addresses %v, want %v then %v", got, fams[0], fams[1])
			}
			rec, _ := a.store.Get("c1", "eth0")
			if rec == nil || rec.Address != got[0] || len(rec.Others) != 1 || rec.Others[0].Address != got[1] {
				t.Fatalf("record %+v, want first %s and other %s", rec, got[0], got[1])
			}
			a.checkFamilies(t, n)
			// A repeated ADD gives the same addresses.
			if again := a.addAll(t, "c1", ns); !slices.Equal(again, got) {
				t.Fatalf("repeated ADD %v, first %v", again, got)
			}
			st, err := a.State()
			if err != nil {
				t.Fatal(err)
			}
			if len(st.Families) != 2 || st.Families[0].Family != fams[0].String() || st.Families[1].Allocated != 1 || st.Pool.Family != fams[0].String() {
				t.Fatalf("state's pools %+v (first %+v)", st.Families, st.Pool)
			}
			if aerr := a.Del(context.Background(), req("c1", ns)); aerr != nil {
				t.Fatal(aerr)
			}
			for _, f := range fams {
				s := a.fams[f].Status(time.Now())
				if s.Allocated != 0 || s.Cooling+s.Free < 1 {
					t.Errorf("%s pool after DEL: %+v", f, s)
				}
			}
			a.checkFamilies(t, n)
		})
	}
}

// All or none: with no IPv6 address left, an ADD fails saying so, and the
// IPv4 address it took goes back, first in line.
func TestDualStackAllOrNone(t *testing.T) {
	// A /126 of IPv6: few addresses; IPv4 has plenty.
	n := dualNode(t, "10.9.7.0/24", "fd00:9:7::/126", family.V4, family.V6)
	a := n.start()
	var pods int
	var lastErr *api.Error
	for i := range 8 {
		ns := n.pod("p" + string(rune('a'+i)))
		_, aerr := a.Add(context.Background(), req("c"+string(rune('a'+i)), ns))
		if aerr != nil {
			lastErr = aerr
			break
		}
		pods++
	}
	if lastErr == nil {
		t.Fatal("8 dual-stack pods on a /126 of IPv6: no ADD failed")
	}
	if pods == 0 || lastErr.Code != api.CodeTryAgainLater || !strings.Contains(lastErr.Msg, "no ipv6 address") {
		t.Fatalf("after %d pods, ADD failed with %v, want try-again-later saying no ipv6 address", pods, lastErr)
	}
	s4 := a.fams[family.V4].Status(time.Now())
	if s4.Allocated != pods {
		t.Fatalf("the IPv4 pool allocates %d for %d pods: the failed ADD kept its IPv4 address", s4.Allocated, pods)
	}
	a.checkFamilies(t, n)
	if fig := a.Pool(); fig.Capacity == 0 || fig.Capacity > 4 {
		t.Errorf("node capacity %d, want the IPv6 range's (at most 4)", fig.Capacity)
	}
}

// A restart puts both families' addresses back in their pools: nothing is
// handed out twice.
func TestDualStackRestart(t *testing.T) {
	n := dualNode(t, "10.9.8.0/24", "fd00:9:8::/120", family.V4, family.V6)
	a := n.start()
	first := a.addAll(t, "c1", n.pod("p1"))
	a.stop()
	b := n.start()
	b.waitRestored(t)
	second := b.addAll(t, "c2", n.pod("p2"))
	for _, x := range second {
		if slices.Contains(first, x) {
			t.Fatalf("after a restart %s went to a second pod (first had %v)", x, first)
		}
	}
	b.checkFamilies(t, n)
}

// IPv6 only: the pod's one address is IPv6.
func TestIPv6Only(t *testing.T) {
	n := dualNode(t, "", "fd00:9:9::/120", family.V6)
	a := n.start()
	got := a.addAll(t, "c1", n.pod("p1"))
	if len(got) != 1 || family.Of(got[0]) != family.V6 {
		t.Fatalf("IPv6-only ADD got %v", got)
	}
	a.checkFamilies(t, n)
}

// Requested addresses: one per family, each from its own pool; two of one
// family, or one of a family the node does not serve, are refused.
func TestDualStackRequested(t *testing.T) {
	n := dualNode(t, "10.9.10.0/24", "fd00:9:a::/120", family.V4, family.V6)
	a := n.start()
	r := req("c1", n.pod("p1"))
	r.Args += ";IP=fd00:9:a::20,10.9.10.20"
	res, aerr := a.Add(context.Background(), r)
	if aerr != nil {
		t.Fatal(aerr)
	}
	rec, _ := a.store.Get("c1", "eth0")
	if rec.Address != netip.MustParseAddr("10.9.10.20") || rec.Others[0].Address != netip.MustParseAddr("fd00:9:a::20") || !rec.Requested || len(res.IPs) != 2 {
		t.Fatalf("requested record %+v", rec)
	}
	for _, bad := range []struct{ ip, says string }{
		{"10.9.10.21,10.9.10.22", "two ipv4 addresses"},
		{"10.9.10.21,fd00:9:a::21,10.9.10.22", "3 addresses requested"},
		{"fe80::1", "not a unicast"},
	} {
		r := req("c2", n.pod("p2"))
		r.Args += ";IP=" + bad.ip
		if _, aerr := a.Add(context.Background(), r); aerr == nil || aerr.Code != api.CodeInvalidEnv || !strings.Contains(aerr.Msg, bad.says) {
			t.Errorf("IP=%s: %v, want code 4 saying %q", bad.ip, aerr, bad.says)
		}
	}
	if aerr := a.Del(context.Background(), req("c1", n.pod("p1"))); aerr != nil {
		t.Fatal(aerr)
	}
	// Requested addresses leave the node: neither is free or cooling here.
	for _, f := range []family.Family{family.V4, family.V6} {
		s := a.fams[f].Status(time.Now())
		if s.Allocated != 0 {
			t.Errorf("%s pool after DEL of a requested pod: %+v", f, s)
		}
	}
	a.checkFamilies(t, n)
}

// A node refuses an IPv4-only single family address request for IPv6.
func TestIPv4NodeRefusesIPv6Request(t *testing.T) {
	n := newNode(t, "10.9.11.0/24")
	a := n.start()
	r := req("c1", n.pod("p1"))
	r.Args += ";IP=fd00::5"
	if _, aerr := a.Add(context.Background(), r); aerr == nil || !strings.Contains(aerr.Msg, "ipv4 only") {
		t.Fatalf("IPv6 address requested on an IPv4 node: %v", aerr)
	}
}
