package static

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/provider"
)

// assignInBlocks is Assign in blocks mode: addresses from the node's
// blocks only; when they are full, it asks for one more block and waits
// for it (at most p.wait in all), as many times as the request needs.
func (p *Provider) assignInBlocks(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	waitCtx, cancel := context.WithTimeout(ctx, p.wait)
	defer cancel()
	var got []netip.Addr
	var errs []error
	blocks := p.blocks.Blocks()
	p.mu.Lock()
	for _, a := range req.Addresses {
		switch {
		case p.held[a]:
			errs = append(errs, fmt.Errorf("%s: %w", a, provider.ErrTaken))
		case !p.usable(a):
			errs = append(errs, fmt.Errorf("%s is not in the configured ranges: %w", a, provider.ErrOutside))
		case !inAny(blocks, a):
			errs = append(errs, fmt.Errorf("%s is not in one of this node's blocks %v (another node's, or none's yet): %w", a, blocks, provider.ErrTaken))
		default:
			p.held[a] = true
			got = append(got, a)
		}
	}
	p.mu.Unlock()
	want := req.Count
	for want > 0 {
		p.mu.Lock()
		for _, b := range blocks {
			for a := b.Addr(); b.Contains(a) && want > 0; a = a.Next() {
				if !p.held[a] && p.usable(a) {
					p.held[a] = true
					got = append(got, a)
					want--
				}
			}
		}
		p.mu.Unlock()
		if want == 0 || waitCtx.Err() != nil {
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
		if err := p.blocks.Want(ctx, n); err != nil {
			errs = append(errs, fmt.Errorf("%w: %w", err, provider.ErrUnavailable))
			break
		}
		if blocks = p.blocks.WaitFor(waitCtx, n); len(blocks) < n {
			errs = append(errs, fmt.Errorf("this node's %d blocks are used up and vpcni-controller gave no block %d within %s "+
				"(is it running with -block-ranges, and are they full? kubectl get nodeblocks): %w", len(blocks), n, p.wait, provider.ErrExhausted))
			break
		}
	}
	for _, b := range blocks {
		// Its addresses are not usable (p.usable): say why.
		if p.outsideRanges(b) {
			errs = append(errs, fmt.Errorf("block %s is outside provider.static.ranges: vpcni-controller's -block-ranges and the agents' ranges disagree", b))
		}
	}
	if len(got) > 0 {
		p.mu.Lock()
		err := p.save()
		if err != nil {
			for _, a := range got {
				delete(p.held, a)
			}
		}
		p.mu.Unlock()
		if err != nil {
			return nil, err
		}
	}
	return p.leases(got), errors.Join(errs...)
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
