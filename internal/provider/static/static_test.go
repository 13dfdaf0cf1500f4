package static_test

import (
	"context"
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/static"
)

// testRanges: 10.0.0.0/28 with gateway .1 and .2 and .8-.11 excluded leaves
// .3-.7 and .12-.14; 10.0.1.0/30 adds .2 (.1 is its gateway).
func testRanges() *static.Config {
	return &static.Config{Ranges: []static.Range{
		{CIDR: "10.0.0.0/28", Exclude: []string{"10.0.0.2", "10.0.0.8/30"}},
		{CIDR: "10.0.1.0/30"},
	}}
}

var usable = addrs("10.0.0.3", "10.0.0.4", "10.0.0.5", "10.0.0.6", "10.0.0.7", "10.0.0.12", "10.0.0.13", "10.0.0.14", "10.0.1.2")

func addrs(ss ...string) []netip.Addr {
	out := make([]netip.Addr, 0, len(ss))
	for _, s := range ss {
		out = append(out, netip.MustParseAddr(s))
	}
	return out
}

func newProvider(t *testing.T, dir string) *static.Provider {
	t.Helper()
	p, err := static.New(testRanges(), dir)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func held(t *testing.T, p *static.Provider) []netip.Addr {
	t.Helper()
	h, err := p.Held(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return leased(t, h)
}

// assign asks p for addresses; every lease must name its range's subnet
// and gateway.
func assign(t *testing.T, p *static.Provider, req provider.AssignRequest) ([]netip.Addr, error) {
	t.Helper()
	got, err := p.Assign(context.Background(), req)
	return leased(t, got), err
}

func leased(t *testing.T, leases []alloc.Lease) []netip.Addr {
	t.Helper()
	out := make([]netip.Addr, len(leases))
	for i, l := range leases {
		if !l.Prefix.IsValid() || !l.Prefix.Contains(l.Address) || !l.Prefix.Contains(l.Gateway) || l.Gateway == l.Address {
			t.Errorf("lease %+v does not say where its address lives", l)
		}
		out[i] = l.Address
	}
	return out
}

func TestAssignCountGivesLowestUsableInOrder(t *testing.T) {
	p := newProvider(t, t.TempDir())
	if n := p.Info().Capacity; n != len(usable) {
		t.Fatalf("Capacity = %d, want %d", n, len(usable))
	}
	got, err := assign(t, p, provider.AssignRequest{Count: 3})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, usable[:3]) {
		t.Fatalf("first Assign = %v, want %v", got, usable[:3])
	}
	got, err = assign(t, p, provider.AssignRequest{Count: 5})
	if err != nil {
		t.Fatal(err)
	}
	// Skips the excluded .8-.11 and carries on in the next range.
	if !slices.Equal(got, usable[3:8]) {
		t.Fatalf("second Assign = %v, want %v", got, usable[3:8])
	}
	if h := held(t, p); !slices.Equal(h, usable[:8]) {
		t.Fatalf("Held = %v, want %v", h, usable[:8])
	}
	for _, n := range []int{0, -1} {
		if got, err := assign(t, p, provider.AssignRequest{Count: n}); len(got) != 0 {
			t.Fatalf("Assign of Count %d = %v, %v; want nothing", n, got, err)
		}
	}
	if h := held(t, p); len(h) != 8 {
		t.Fatalf("Held = %v after asking for nothing", h)
	}
}

func TestAssignSpecificAddresses(t *testing.T) {
	p := newProvider(t, t.TempDir())
	want := addrs("10.0.0.13", "10.0.1.2")
	got, err := assign(t, p, provider.AssignRequest{Addresses: want})
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("Assign of %v = %v, %v", want, got, err)
	}
	// Taken now: ErrTaken, and nothing else is given.
	got, err = assign(t, p, provider.AssignRequest{Addresses: addrs("10.0.0.13")})
	if !errors.Is(err, provider.ErrTaken) || len(got) != 0 {
		t.Fatalf("second Assign of 10.0.0.13 = %v, %v; want ErrTaken", got, err)
	}
	// Never the gateway, the network, an exclusion or a foreign address.
	for _, a := range addrs("10.0.0.1", "10.0.0.0", "10.0.0.15", "10.0.0.2", "10.0.0.9", "10.0.1.1", "192.168.0.3") {
		got, err := assign(t, p, provider.AssignRequest{Addresses: []netip.Addr{a}})
		if err == nil || len(got) != 0 {
			t.Errorf("Assign of %s = %v, %v; want an error", a, got, err)
		} else if !strings.Contains(err.Error(), a.String()) {
			t.Errorf("error %q does not name %s", err, a)
		}
	}
	// Mixed: the good one is given even though the bad one is refused, and
	// a Count skips what is already held.
	got, err = assign(t, p, provider.AssignRequest{Addresses: addrs("10.0.0.1", "10.0.0.14"), Count: 1})
	if err == nil || !slices.Equal(got, addrs("10.0.0.14", "10.0.0.3")) {
		t.Fatalf("mixed Assign = %v, %v; want [10.0.0.14 10.0.0.3] and an error", got, err)
	}
	if h := held(t, p); !slices.Equal(h, addrs("10.0.0.3", "10.0.0.13", "10.0.0.14", "10.0.1.2")) {
		t.Fatalf("Held = %v", h)
	}
}

func TestAssignExhausted(t *testing.T) {
	p := newProvider(t, t.TempDir())
	if _, err := assign(t, p, provider.AssignRequest{Count: 2}); err != nil {
		t.Fatal(err)
	}
	got, err := assign(t, p, provider.AssignRequest{Count: 100})
	if !errors.Is(err, provider.ErrExhausted) {
		t.Fatalf("Assign beyond capacity: err = %v, want ErrExhausted", err)
	}
	if !slices.Equal(got, usable[2:]) {
		t.Fatalf("partial result = %v, want the %d that were left: %v", got, len(usable)-2, usable[2:])
	}
	if h := held(t, p); !slices.Equal(h, usable) {
		t.Fatalf("Held = %v, want everything", h)
	}
	got, err = assign(t, p, provider.AssignRequest{Count: 1})
	if !errors.Is(err, provider.ErrExhausted) || len(got) != 0 {
		t.Fatalf("Assign when full = %v, %v; want nothing and ErrExhausted", got, err)
	}
}

func TestReleaseThenHeld(t *testing.T) {
	ctx := context.Background()
	p := newProvider(t, t.TempDir())
	if _, err := assign(t, p, provider.AssignRequest{Count: 4}); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx, addrs("10.0.0.4", "10.0.0.6", "10.0.0.14" /* not held */, "8.8.8.8")); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if h := held(t, p); !slices.Equal(h, addrs("10.0.0.3", "10.0.0.5")) {
		t.Fatalf("Held after release = %v", h)
	}
	// Released addresses are the lowest free again.
	got, err := assign(t, p, provider.AssignRequest{Count: 2})
	if err != nil || !slices.Equal(got, addrs("10.0.0.4", "10.0.0.6")) {
		t.Fatalf("Assign after release = %v, %v", got, err)
	}
	if err := p.Release(ctx, nil); err != nil {
		t.Fatalf("Release of nothing: %v", err)
	}
}

func TestStateSurvivesRestart(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	p := newProvider(t, dir)
	if _, err := assign(t, p, provider.AssignRequest{Count: 3}); err != nil {
		t.Fatal(err)
	}
	if _, err := assign(t, p, provider.AssignRequest{Addresses: addrs("10.0.1.2")}); err != nil {
		t.Fatal(err)
	}
	if err := p.Release(ctx, addrs("10.0.0.4")); err != nil {
		t.Fatal(err)
	}
	want := addrs("10.0.0.3", "10.0.0.5", "10.0.1.2")

	st, err := os.Stat(filepath.Join(dir, "static-provider.json"))
	if err != nil {
		t.Fatalf("no state file: %v", err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("state file mode %v, want 0600", st.Mode().Perm())
	}

	p2 := newProvider(t, dir)
	if h := held(t, p2); !slices.Equal(h, want) {
		t.Fatalf("Held after restart = %v, want %v", h, want)
	}
	got, err := assign(t, p2, provider.AssignRequest{Count: 2})
	if err != nil || !slices.Equal(got, addrs("10.0.0.4", "10.0.0.6")) {
		t.Fatalf("Assign after restart = %v, %v; want the lowest not held", got, err)
	}
	if _, err := assign(t, p2, provider.AssignRequest{Addresses: addrs("10.0.1.2")}); !errors.Is(err, provider.ErrTaken) {
		t.Fatalf("re-assigning an address held before the restart: %v, want ErrTaken", err)
	}

	// An address the ranges no longer cover stays held.
	narrower := &static.Config{Ranges: []static.Range{{CIDR: "10.0.0.0/28", Exclude: []string{"10.0.0.2", "10.0.0.8/30"}}}}
	p3, err := static.New(narrower, dir)
	if err != nil {
		t.Fatal(err)
	}
	h, err := p3.Held(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(h, func(l alloc.Lease) bool { return l.Address == netip.MustParseAddr("10.0.1.2") }); i < 0 {
		t.Fatalf("Held after dropping a range = %v; 10.0.1.2 was dropped silently", h)
	} else if h[i].Prefix.IsValid() {
		t.Fatalf("10.0.1.2 is in no range now, but its lease names %s", h[i].Prefix)
	}
	// No temp files left behind by the atomic writes.
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("state dir holds %v, want just static-provider.json", names)
	}
}

func TestCorruptStateFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "static-provider.json")
	for _, content := range []string{`{"held":["10.0.0.3",`, `{"held":["not an address"]}`, "\x00\x01"} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := static.New(testRanges(), dir)
		if err == nil {
			t.Errorf("state %q loaded", content)
			continue
		}
		if msg := err.Error(); !strings.Contains(msg, "corrupt") || !strings.Contains(msg, path) {
			t.Errorf("state %q: error %q should say the file is corrupt and name it", content, msg)
		}
	}
}

func TestFailedSaveAssignsNothing(t *testing.T) {
	// A state dir that does not exist: the state cannot be written, so the
	// assignment must not count either.
	p := newProvider(t, filepath.Join(t.TempDir(), "missing"))
	got, err := assign(t, p, provider.AssignRequest{Count: 2})
	if err == nil || len(got) != 0 {
		t.Fatalf("Assign without a writable state = %v, %v; want nothing and an error", got, err)
	}
	if h := held(t, p); len(h) != 0 {
		t.Fatalf("Held = %v after a failed save", h)
	}
}

func TestNewRejectsBadRanges(t *testing.T) {
	for _, r := range []static.Range{
		{CIDR: "bogus"},
		{CIDR: "10.0.0.0/24", Gateway: "10.0.1.1"},
		{CIDR: "10.0.0.0/24", Gateway: "x"},
		{CIDR: "10.0.0.0/24", Exclude: []string{"nope"}},
	} {
		if _, err := static.New(&static.Config{Ranges: []static.Range{r}}, t.TempDir()); err == nil {
			t.Errorf("New accepted %+v", r)
		}
	}
}

func TestConcurrentAssignNeverDuplicates(t *testing.T) {
	dir := t.TempDir()
	cfg := &static.Config{Ranges: []static.Range{{CIDR: "10.1.0.0/24"}}} // 253 usable
	p, err := static.New(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	const workers, calls = 16, 10 // up to 16*10*3 = 480 asked: more than there is
	var (
		mu        sync.Mutex
		all       []netip.Addr
		exhausted int
		wg        sync.WaitGroup
	)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range calls {
				got, err := assign(t, p, provider.AssignRequest{Count: 1 + (w+i)%3})
				if err != nil && !errors.Is(err, provider.ErrExhausted) {
					t.Errorf("Assign: %v", err)
				}
				mu.Lock()
				all = append(all, got...)
				if err != nil {
					exhausted++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	seen := map[netip.Addr]bool{}
	for _, a := range all {
		if seen[a] {
			t.Fatalf("%s was assigned twice", a)
		}
		seen[a] = true
	}
	capacity := p.Info().Capacity
	if len(all) != capacity || exhausted == 0 {
		t.Fatalf("assigned %d of %d with %d exhausted answers; want all of them and some ErrExhausted", len(all), capacity, exhausted)
	}
	slices.SortFunc(all, netip.Addr.Compare)
	if h := held(t, p); !slices.Equal(h, all) {
		t.Fatalf("Held (%d) differs from what was assigned (%d)", len(h), len(all))
	}
	// And what was saved matches too.
	p2, err := static.New(cfg, dir)
	if err != nil {
		t.Fatal(err)
	}
	if h := held(t, p2); !slices.Equal(h, all) {
		t.Fatalf("saved state (%d) differs from what was assigned (%d)", len(h), len(all))
	}
}

// A range on a NIC of its own: its leases name the NIC (MAC, own address),
// the NIC's address is never handed out, and a bad NIC is named.
func TestRangeOnNIC(t *testing.T) {
	cfg := &static.Config{Ranges: []static.Range{
		{CIDR: "10.0.0.0/29"},
		// Shares its subnet with the range before it, split by excludes.
		{CIDR: "10.0.2.0/29", Gateway: "10.0.2.1", Exclude: []string{"10.0.2.4/30"}},
		{CIDR: "10.0.2.0/29", Gateway: "10.0.2.1", Exclude: []string{"10.0.2.0/30"}, NIC: &static.NIC{MAC: "02:AA:00:00:00:02", Address: "10.0.2.2"}},
	}}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := static.New(cfg, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Assign(context.Background(), provider.AssignRequest{Count: 20})
	if !errors.Is(err, provider.ErrExhausted) {
		t.Fatalf("Assign(20) of 9 usable: %v", err)
	}
	if len(got) != 9 || slices.Contains(provider.Addresses(got), netip.MustParseAddr("10.0.2.2")) {
		t.Errorf("got %v: want 9 addresses, never the NIC's own 10.0.2.2", provider.Addresses(got))
	}
	var onNIC []netip.Addr
	for _, l := range got {
		if l.NIC == nil {
			continue
		}
		onNIC = append(onNIC, l.Address)
		if l.NIC.MAC != "02:aa:00:00:00:02" || l.NIC.Address != netip.MustParseAddr("10.0.2.2") || l.Gateway != netip.MustParseAddr("10.0.2.1") {
			t.Errorf("lease %s: NIC %+v gateway %s", l.Address, *l.NIC, l.Gateway)
		}
	}
	if want := addrs("10.0.2.4", "10.0.2.5", "10.0.2.6"); !slices.Equal(onNIC, want) {
		t.Errorf("addresses on the NIC: %v, want %v", onNIC, want)
	}
	bad := &static.Config{Ranges: []static.Range{{CIDR: "10.0.2.0/29", NIC: &static.NIC{MAC: "nope", Address: "10.9.9.9"}}}}
	err = bad.Validate()
	for _, want := range []string{"ranges[0].nic.mac", "ranges[0].nic.address", "ranges[0].gateway"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("bad NIC: %v; want it to name %s", err, want)
		}
	}
}
