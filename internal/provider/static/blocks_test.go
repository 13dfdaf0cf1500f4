package static_test

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/static"
)

// grantingSource is a stateful stand-in for the node's NodeBlocks and
// vpcni-controller together: Want grants blocks from a list, in order,
// while it has some (the real pair runs against the API server in
// test/blocks).
type grantingSource struct {
	mu      sync.Mutex
	pending []netip.Prefix
	blocks  []netip.Prefix
	taken   []netip.Prefix // other nodes'
	wants   []int
}

func (s *grantingSource) Taken() []netip.Prefix {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.taken)
}

func (s *grantingSource) Blocks() []netip.Prefix {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.blocks)
}

func (s *grantingSource) Want(_ context.Context, f family.Family, n int, _ bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.wants = append(s.wants, n)
	for len(ofFamily(s.blocks, f)) < n {
		i := slices.IndexFunc(s.pending, func(b netip.Prefix) bool { return family.Of(b.Addr()) == f })
		if i < 0 {
			break
		}
		s.blocks, s.pending = append(s.blocks, s.pending[i]), slices.Delete(s.pending, i, i+1)
	}
	return nil
}

func (s *grantingSource) WaitFor(_ context.Context, f family.Family, n int) []netip.Prefix {
	return ofFamily(s.Blocks(), f)
}

func ofFamily(blocks []netip.Prefix, f family.Family) []netip.Prefix {
	return slices.DeleteFunc(slices.Clone(blocks), func(b netip.Prefix) bool { return family.Of(b.Addr()) != f })
}

func blocksConfig(wait string) *static.Config {
	cfg := &static.Config{Ranges: []static.Range{{CIDR: "10.9.0.0/24", Exclude: []string{"10.9.0.20"}}}, Blocks: &static.Blocks{Wait: wait}}
	cfg.Defaults()
	return cfg
}

// Addresses come only from the node's blocks, skipping the range's
// network address, gateway and exclusions; a full set of blocks asks for
// one more, and a request the controller cannot meet says so, with what
// it got.
func TestBlocksModeTakesOnlyFromTheNodesBlocks(t *testing.T) {
	src := &grantingSource{pending: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/28"), netip.MustParsePrefix("10.9.0.16/28")}}
	p, err := static.NewInBlocks(blocksConfig("50ms"), t.TempDir(), src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Assign(context.Background(), provider.AssignRequest{Count: 20})
	if err != nil {
		t.Fatal(err)
	}
	// 14 from the first block (.0 and the gateway .1 never), 6 from the
	// second (.20 excluded): .16-.19, .21, .22.
	want := []netip.Addr{}
	for i := 2; i <= 15; i++ {
		want = append(want, netip.AddrFrom4([4]byte{10, 9, 0, byte(i)}))
	}
	want = append(want, addrs("10.9.0.16", "10.9.0.17", "10.9.0.18", "10.9.0.19", "10.9.0.21", "10.9.0.22")...)
	if g := provider.Addresses(got); !slices.Equal(g, want) {
		t.Fatalf("got %v, want %v", g, want)
	}
	if !slices.Equal(src.wants, []int{1, 2}) {
		t.Errorf("asked for %v blocks, want 1 then 2", src.wants)
	}
	// The second block has 9 left; 12 more: 9, then nothing more comes.
	got, err = p.Assign(context.Background(), provider.AssignRequest{Count: 12})
	if len(got) != 9 || !errors.Is(err, provider.ErrExhausted) || !strings.Contains(err.Error(), "gave no IPv4 block 3") {
		t.Fatalf("past the last block: %d addresses, %v", len(got), err)
	}
	// A requested address must be in the node's blocks.
	_, err = p.Assign(context.Background(), provider.AssignRequest{Addresses: addrs("10.9.0.40")})
	if !errors.Is(err, provider.ErrTaken) || !strings.Contains(err.Error(), "not in one of this node's blocks") {
		t.Errorf("an address outside the node's blocks: %v", err)
	}
}

// A block outside the configured ranges gives nothing and says the two
// configurations disagree.
func TestBlocksModeNamesABlockOutsideTheRanges(t *testing.T) {
	src := &grantingSource{blocks: []netip.Prefix{netip.MustParsePrefix("10.8.0.0/28")}, pending: []netip.Prefix{netip.MustParsePrefix("10.8.0.16/28")}}
	p, err := static.NewInBlocks(blocksConfig("10ms"), t.TempDir(), src)
	if err != nil {
		t.Fatal(err)
	}
	got, err := p.Assign(context.Background(), provider.AssignRequest{Count: 1})
	if len(got) != 0 || err == nil || !strings.Contains(err.Error(), "block 10.8.0.0/28 is outside provider.static.ranges") {
		t.Fatalf("got %v, %v", got, err)
	}
	// Asking for more would only hoard blocks that are outside too.
	if len(src.wants) != 0 {
		t.Errorf("asked for %v blocks with its blocks outside its ranges", src.wants)
	}
}

func TestBlocksConfigChecked(t *testing.T) {
	for _, w := range []string{"soon", "0s", "1h"} {
		cfg := &static.Config{Ranges: []static.Range{{CIDR: "10.9.0.0/24"}}, Blocks: &static.Blocks{Wait: w}}
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "blocks.wait") {
			t.Errorf("blocks.wait %q: %v", w, err)
		}
	}
	cfg := &static.Config{Ranges: []static.Range{{CIDR: "10.9.0.0/24"}}, Blocks: &static.Blocks{}}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil || cfg.Blocks.Wait != "10s" {
		t.Errorf("defaults: %v, wait %q", err, cfg.Blocks.Wait)
	}
}

// A block taken back (its NodeBlock deleted) no longer counts as held: the
// agent's pool drops its free addresses there, so two nodes never hand
// out one address.
func TestBlocksModeForgetsATakenBackBlock(t *testing.T) {
	src := &grantingSource{pending: []netip.Prefix{netip.MustParsePrefix("10.9.0.32/28"), netip.MustParsePrefix("10.9.0.48/28")}}
	dir := t.TempDir()
	p, err := static.NewInBlocks(blocksConfig("10ms"), dir, src)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Assign(context.Background(), provider.AssignRequest{Count: 20}); err != nil {
		t.Fatal(err)
	}
	src.mu.Lock()
	src.blocks = src.blocks[1:]
	src.mu.Unlock()
	h, err := p.Held(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range provider.Addresses(h) {
		if !netip.MustParsePrefix("10.9.0.48/28").Contains(a) {
			t.Errorf("still holds %s of the block taken back", a)
		}
	}
	if len(h) != 4 {
		t.Errorf("holds %d, want the 4 of the remaining block", len(h))
	}
	// And after a restart (the state file).
	p2, err := static.NewInBlocks(blocksConfig("10ms"), dir, src)
	if err != nil {
		t.Fatal(err)
	}
	if h2, _ := p2.Held(context.Background()); len(h2) != 4 {
		t.Errorf("after a restart holds %d, want 4", len(h2))
	}
}

// The capacity a node advertises: the ranges' usable addresses less those
// in other nodes' blocks.
func TestBlocksModeCapacityLeavesOutOtherNodesBlocks(t *testing.T) {
	src := &grantingSource{blocks: []netip.Prefix{netip.MustParsePrefix("10.9.0.0/28")},
		taken: []netip.Prefix{netip.MustParsePrefix("10.9.0.16/28"), netip.MustParsePrefix("10.9.0.32/28")}}
	p, err := static.NewInBlocks(blocksConfig("10ms"), t.TempDir(), src)
	if err != nil {
		t.Fatal(err)
	}
	// 10.9.0.0/24: 256 less network, broadcast, gateway .1 and .20 = 252;
	// the others' blocks hold 15 (.20 excluded) and 16.
	if got := p.Info().Capacity; got != 252-31 {
		t.Errorf("capacity %d, want %d (%s)", got, 252-31, p.Info().CapacityReason)
	}
}
