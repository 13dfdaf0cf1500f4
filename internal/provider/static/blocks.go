package static

import (
	"context"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/provider"
)

// assignInBlocks is Assign in blocks mode: addresses from the node's
// blocks only; when they are full, it asks for one more block and waits
// for it (at most p.wait in all), as many times as the request needs.
// Only blocks of the request's family count: a dual-stack node has IPv4
// blocks and IPv6 ones (e.g. /80s of a /64, or /120s of a /112) from
// vpcni-controller's -block-ranges, and asks for each family's on its own.
func (p *Provider) assignInBlocks(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	fam := req.Fam()
	waitCtx, cancel := context.WithTimeout(ctx, p.wait)
	defer cancel()
	p.refreshNodes(ctx)
	blocks := p.blocksOf(fam)
	got, errs := p.takeRequested(ctx, fam, req.Addresses, blocks)
	want := req.Count
	for want > 0 {
		p.mu.Lock()
		picked, full := p.pick(fam, want, func(yield func(netip.Addr) bool) {
			// Range by range inside each block, so an exclusion is
			// stepped over, not walked (an IPv6 block may be a /80).
			for _, b := range blocks {
				for _, r := range p.ranges {
					stop := false
					r.AllIn(b, func(a netip.Addr) bool { stop = !yield(a); return !stop })
					if stop {
						return
					}
				}
			}
		})
		held := p.heldOf(fam)
		p.mu.Unlock()
		if full && len(picked) == 0 {
			// More blocks would not help.
			errs = append(errs, p.fullError(fam, held))
			break
		}
		if len(picked) > 0 {
			kept, _, err := p.vet(ctx, picked)
			if err != nil {
				errs = append(errs, err)
				break
			}
			got, want = append(got, kept...), want-len(kept)
			continue // the blocks may hold more, past what answered
		}
		if waitCtx.Err() != nil {
			break
		}
		if slices.ContainsFunc(blocks, p.outsideRanges) {
			// Misconfigured: another block would be outside too, and
			// asking on every request would take the whole range.
			break
		}
		// Full: one block more. Each round asks for one past what the
		// node has, so a lost or slow answer is asked for again, never
		// doubled.
		n := len(blocks) + 1
		if err := p.blocks.Want(ctx, fam, n, len(p.families()) == 1); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", err, provider.ErrUnavailable))
			break
		}
		if blocks = p.blocks.WaitFor(waitCtx, fam, n); len(blocks) < n {
			errs = append(errs, fmt.Errorf("this node's %d %s blocks are used up and vpcni-controller gave no %s block %d within %s "+
				"(is it running with -block-ranges that hold %s ranges, and are they full? kubectl get nodeblocks): %w",
				len(blocks), name(fam), name(fam), n, p.wait, name(fam), provider.ErrExhausted))
			break
		}
	}
	for _, b := range blocks {
		// Its addresses are not usable (p.usable): say why.
		if p.outsideRanges(b) {
			errs = append(errs, fmt.Errorf("block %s is outside provider.static.ranges: vpcni-controller's -block-ranges and the agents' ranges disagree", b))
		}
	}
	return p.finish(got, errs)
}

// blocksOf is the node's blocks of family f.
func (p *Provider) blocksOf(f family.Family) []netip.Prefix {
	return slices.DeleteFunc(p.blocks.Blocks(), func(b netip.Prefix) bool { return family.Of(b.Addr()) != f })
}

func inAny(blocks []netip.Prefix, a netip.Addr) bool {
	return slices.ContainsFunc(blocks, func(b netip.Prefix) bool { return b.Contains(a) })
}

// dropOutsideBlocks forgets held addresses in no block of the node any
// more: a block vpcni-controller took back (its Node was deleted, or a
// person deleted the NodeBlock) may be another node's now. The agent's
// pool then drops its free addresses there, and says loudly if a running
// pod has one (it asks for it back and is refused). Called with p.mu held.
func (p *Provider) dropOutsideBlocks() error {
	blocks := p.blocks.Blocks()
	var dropped []netip.Addr
	for a := range p.held {
		if !inAny(blocks, a) {
			delete(p.held, a)
			dropped = append(dropped, a)
		}
	}
	if len(dropped) == 0 {
		return nil
	}
	if err := p.save(); err != nil {
		for _, a := range dropped {
			p.held[a] = true
		}
		return err
	}
	return nil
}

// outsideRanges: b is in none of the configured ranges.
func (p *Provider) outsideRanges(b netip.Prefix) bool {
	return !slices.ContainsFunc(p.ranges, func(r ipam.Range) bool { return r.Prefix.Contains(b.Addr()) && r.Prefix.Bits() <= b.Bits() })
}
