package openstack

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"net/netip"
	"slices"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"

	"github.com/vpcni/vpcni/internal/provider"
)

// Writes to the VM port. Each is a read-modify-write of one list (the
// fixed IPs with the description's marks, or the allowed address pairs)
// under If-Match, read back afterwards, and Neutron's If-Match is not an
// atomic compare-and-swap. Measured on Neutron Zed with two PUTs checked
// against one revision at once: both answer 200 (26 of 28 tries), the
// later lands at a revision past the other's, Neutron merges the two
// writes' fixed-IP changes (an address one removed stays removed, one
// the other added stays added), and each answer is its writer's own view
// of the port — the address the other writer removed still in it.
//
// So a read-back may lack an address for two reasons the addresses alone
// cannot tell apart: a racing write knocked it out, or its owner removed
// it after vpcni's write. vpcni puts back only its own addresses (marked,
// or reserved in address-pairs mode); someone else's address that went
// missing stays missing. What the revisions and the PUT's answer show of
// a race is reported (provider.ReasonWriteRace), never acted on.

// revisionMoves is how far one PUT of vpcni's moves the VM port's
// revision when no other write lands meanwhile (measured on Neutron Zed):
// once for its addresses (fixed IPs, or allowed address pairs) changing,
// once more for the port's own fields (the description). A PUT changing
// only fields, or nothing, is bumped once more after its answer (the
// read-back shows it; the answer does not); vpcni never sends one that
// changes nothing.
func revisionMoves(addresses, fields bool) int {
	n := 0
	if addresses {
		n++
	}
	if fields {
		n++
	}
	return n
}

// apply makes the VM port hold add (marked as vpcni's) and no longer hold
// remove, leaving everything else as it is (see untilHeld).
func (p *Provider) apply(ctx context.Context, add, remove map[netip.Addr]bool) error {
	// vpcni's own addresses a racing write took off the port (or
	// unmarked); the next attempt puts them back.
	restore := map[netip.Addr]bool{}
	return p.untilHeld(ctx, "the fixed IPs", func() (bool, error) {
		rest, marked, on, err := p.state()
		if err != nil {
			return false, err
		}
		// ours: what the port holds as vpcni's once written — its marked
		// addresses as read (a mark without its address is stale and
		// goes), those added and those put back.
		ours := map[netip.Addr]bool{}
		for a := range marked {
			if on[a] {
				ours[a] = true
			}
		}
		maps.Copy(ours, add)
		maps.Copy(ours, restore)
		want := maps.Clone(on)
		maps.Copy(want, ours)
		for a := range remove {
			delete(want, a)
			delete(ours, a)
		}
		desc, err := joinMarks(rest, ours, p.subnet)
		if err != nil {
			return false, fmt.Errorf("%w: %w", err, provider.ErrExhausted)
		}
		fixedChanged := !maps.Equal(want, on)
		if !fixedChanged && desc == p.port.Description {
			return true, nil
		}
		var fixed []ports.IP
		for _, f := range p.port.FixedIPs {
			if a, err := netip.ParseAddr(f.IPAddress); err == nil && f.SubnetID == p.cfg.SubnetID && !want[a] {
				continue
			}
			fixed = append(fixed, ports.IP{SubnetID: f.SubnetID, IPAddress: f.IPAddress})
		}
		for a := range want {
			if !on[a] {
				fixed = append(fixed, ports.IP{SubnetID: p.cfg.SubnetID, IPAddress: a.String()})
			}
		}
		before := p.port
		if err := p.put(ctx, fixed, desc); err != nil {
			return false, err
		}
		written := p.port
		if err := p.refresh(ctx); err != nil {
			return false, err
		}
		_, wroteMarked, wroteOn, err := p.stateOf(written)
		if err != nil {
			return false, err
		}
		_, nowMarked, nowOn, err := p.state()
		if err != nil {
			return false, err
		}
		// Someone else's address the answer holds and the read-back lacks
		// was removed after vpcni's write: left as it is.
		var dropped []string
		for a := range want {
			if !ours[a] && !wroteOn[a] {
				dropped = append(dropped, a.String())
			}
		}
		held := true
		var knocked []netip.Addr
		for a := range ours {
			if nowOn[a] && nowMarked[a] {
				continue
			}
			held = false
			restore[a] = true
			if wroteOn[a] && wroteMarked[a] {
				knocked = append(knocked, a)
			}
		}
		for a := range remove {
			held = held && !nowOn[a] && !nowMarked[a]
		}
		p.raced("fixed IPs", before, written, revisionMoves(fixedChanged, desc != before.Description), dropped, knocked)
		return held, nil
	})
}

// raced reports what one write attempt shows of another writer: before
// is the port the write was made on (If-Match), written the PUT's answer,
// moves how far the write alone moves the revision; dropped are someone
// else's entries written back as read that the answer lacks, knocked
// vpcni's own that the answer held and the read-back (p.port) lacks.
func (p *Provider) raced(what string, before, written *ports.Port, moves int, dropped []string, knocked []netip.Addr) {
	r0, r1, r2 := before.RevisionNumber, written.RevisionNumber, p.port.RevisionNumber
	if r1-r0 > moves {
		p.tell("overlapped", fmt.Sprintf("vpcni's write of the %s of VM port %s, checked against revision %d, landed at revision %d after another write it was not checked against (alone it moves the revision by %d): Neutron's If-Match let both through. Neutron merges two writes' fixed IPs, but the port's description and allowed address pairs are the last writer's: if someone changed those at that moment, check the port; vpcni put back nothing of anyone else's",
			what, p.portID, r0, r1, moves), "port", p.portID, "list", what, "revisionRead", r0, "revisionWritten", r1, "moves", moves)
	}
	if len(dropped) > 0 {
		slices.Sort(dropped)
		p.tell("dropped", fmt.Sprintf("the answer to vpcni's write of the %s of VM port %s (revision %d) lacks %v, which vpcni read on the port at revision %d and wrote back as they were: another write removed them at the same moment; vpcni leaves them off",
			what, p.portID, r1, dropped, r0), "port", p.portID, "list", what, "revisionRead", r0, "revisionWritten", r1, "dropped", dropped)
	}
	if len(knocked) > 0 {
		knocked = sorted(knocked)
		p.tell("knocked_out", fmt.Sprintf("another write took vpcni's %v (or their ownership marks) off the %s of VM port %s between vpcni's write (revision %d) and its read-back (revision %d), writing from an older copy of the port: vpcni puts them back. Whoever else writes the port should read it just before and send If-Match",
			knocked, what, p.portID, r1, r2), "port", p.portID, "list", what, "revisionWritten", r1, "revisionReadBack", r2, "addresses", knocked)
	}
}

// tell reports a race with another writer of the given kind.
func (p *Provider) tell(kind, msg string, attrs ...any) {
	if p.notify != nil {
		p.notify(provider.Notice{Reason: provider.ReasonWriteRace, Kind: kind, Message: msg, Attrs: attrs})
	}
}

// errStale: the first write of an untilHeld answered 412, so the copy of
// the port it was planned on was stale; untilHeld has read the port again
// and the caller plans again (what to add may have changed: an address
// that is now someone else's on the port must not be marked vpcni's).
var errStale = errors.New("the VM port changed since vpcni's copy of it")

// untilHeld runs one write attempt after another until the VM port, read
// back, holds what was written of vpcni's. The first attempt works on the
// provider's copy of the port (see refreshIfMissing): a 412 to it re-reads
// the port and returns errStale. Each later attempt works on the port as
// just read, writes under If-Match and reads the port back; a racing write
// may still land (see the top of this file), so an attempt remembers which
// of vpcni's own addresses it knocked out and the next puts them back.
// Retryable failures (412, 5xx, no answer) back off and try again, up to
// Retries attempts.
func (p *Provider) untilHeld(ctx context.Context, what string, attempt func() (held bool, err error)) error {
	for n := 0; ; n++ {
		if n > 0 {
			if n >= p.cfg.Retries {
				return fmt.Errorf("VM port %s: %s did not hold after %d attempts: %w", p.portID, what, n, provider.ErrUnavailable)
			}
			backoff(ctx, n)
			if err := p.refresh(ctx); err != nil {
				if retryable(err) {
					continue
				}
				return err
			}
		}
		held, err := attempt()
		if n == 0 && isStatus(err, http.StatusPreconditionFailed) {
			if err := p.refresh(ctx); err != nil {
				return err
			}
			return fmt.Errorf("%w: %w", errStale, err)
		}
		if err != nil && !retryable(err) {
			return err
		}
		if err == nil && held {
			return nil
		}
	}
}

// put writes fixed_ips and description under If-Match on the port as last
// read.
func (p *Provider) put(ctx context.Context, fixed []ports.IP, desc string) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timeout.Duration)
	defer cancel()
	rev := p.port.RevisionNumber
	updated, err := answered(ports.Update(ctx, p.nc, p.portID, ports.UpdateOpts{FixedIPs: fixed, Description: &desc, RevisionNumber: &rev}).Extract())
	if err != nil {
		return explain(fmt.Errorf("update VM port %s: %w", p.portID, err))
	}
	p.port = updated
	return nil
}
