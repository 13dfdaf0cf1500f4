package static

import (
	"fmt"
	"math"
	"strconv"

	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/provider"
)

// The static provider serves IPv4 and IPv6 from one configuration: each
// range is of one family, a request names the family it wants (the agent
// runs a pool per family), and the node's capacity is counted per family.
// An IPv6 range may be a whole /64: it is counted in closed form
// (ipam.Range.Size), and a node holds at most maxAddresses of a family,
// which is then its capacity.

// checkFamilies refuses ipFamilies naming a family the ranges have none
// of: the agent would run a pool that can never fill.
func checkFamilies(cfg *Config, fams []family.Family) error {
	have := cfg.families()
	for _, f := range fams {
		if !family.Has(have, f) {
			return fmt.Errorf("ipFamilies names %s but provider.static.ranges has no %s range", f, name(f))
		}
	}
	return nil
}

// name is how a message names a family to a person: IPv4 or IPv6.
func name(f family.Family) string {
	if f == family.V6 {
		return "IPv6"
	}
	return "IPv4"
}

// sizes counts the usable addresses of each family's ranges, saturated at
// math.MaxInt.
func sizes(ranges []ipam.Range) map[family.Family]int {
	out := map[family.Family]int{}
	for _, r := range ranges {
		f := family.Of(r.Prefix.Addr())
		out[f] = satAdd(out[f], r.Size())
	}
	return out
}

func satAdd(a, b int) int {
	if a > math.MaxInt-b {
		return math.MaxInt
	}
	return a + b
}

// families are those of the ranges, IPv4 first.
func (p *Provider) families() []family.Family {
	var out []family.Family
	for _, f := range family.All {
		if p.serves(f) {
			out = append(out, f)
		}
	}
	return out
}

// serves says whether a range is of family f.
func (p *Provider) serves(f family.Family) bool {
	for _, r := range p.ranges {
		if family.Of(r.Prefix.Addr()) == f {
			return true
		}
	}
	return false
}

// heldOf counts the held addresses of family f; called with p.mu held.
func (p *Provider) heldOf(f family.Family) int {
	n := 0
	for a := range p.held {
		if family.Of(a) == f {
			n++
		}
	}
	return n
}

// rangesField names the ranges in the configuration, for a message.
func (p *Provider) rangesField() string {
	if p.network != "" {
		return fmt.Sprintf("PodNetwork %s's static.ranges", p.network)
	}
	return "provider.static.ranges"
}

// fullError says the node holds maxAddresses of family f already.
func (p *Provider) fullError(f family.Family, held int) error {
	return fmt.Errorf("the node holds %d %s addresses, provider.static.maxAddresses (%d) of one family: %w", held, name(f), p.maxAddrs, provider.ErrExhausted)
}

// capacityOf is family f's capacity: its usable addresses (in blocks mode
// outside other nodes' blocks), at most maxAddresses.
func (p *Provider) capacityOf(f family.Family) provider.Capacity {
	n := p.sizes[f]
	where := "the configured " + name(f) + " ranges"
	if f == family.V4 {
		where = "the configured ranges"
	}
	if p.network != "" {
		where = fmt.Sprintf("PodNetwork %s's %s ranges", p.network, name(f))
	}
	reason := fmt.Sprintf("%s usable addresses in %s", count(n), where)
	if p.blocks != nil && p.network == "" {
		// The node may grow by blocks into whatever no other node holds
		// (shared with every node still growing): as the ranges fill,
		// the bound shrinks to its own blocks, and the scheduler stops
		// sending pods no address can come for. Blocks of the other
		// family count none.
		taken, others := 0, 0
		for _, b := range p.blocks.Taken() {
			if family.Of(b.Addr()) != f {
				continue
			}
			others++
			for _, r := range p.ranges {
				if family.Of(r.Prefix.Addr()) == f {
					taken = satAdd(taken, r.SizeIn(b))
				}
			}
		}
		if n < math.MaxInt { // a saturated count stays saturated
			n -= taken
		}
		reason = fmt.Sprintf("%s usable addresses in %s outside other nodes' blocks (%d); this node holds %d %s blocks",
			count(n), where, others, len(p.blocksOf(f)), name(f))
	}
	if n > p.maxAddrs {
		reason = fmt.Sprintf("%d, provider.static.maxAddresses, of %s", p.maxAddrs, reason)
		n = p.maxAddrs
	}
	return provider.Capacity{Max: n, Reason: reason}
}

// count writes a number of addresses; a saturated one as what it means.
func count(n int) string {
	if n == math.MaxInt {
		return "2^63 or more"
	}
	return strconv.Itoa(n)
}
