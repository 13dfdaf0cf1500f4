package aws

import (
	"context"
	"time"
)

// cleanupLoop removes, every cleanupInterval and when a release empties an
// ENI, vpcni's ENIs that hold no address any more and are older than
// eniMinLifetime, and deletes leaked ones. It runs until ctx ends.
func (p *Provider) cleanupLoop(ctx context.Context) {
	t := time.NewTicker(p.cfg.CleanupInterval.Duration)
	defer t.Stop()
	lastLeak := time.Now()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.kick:
		}
		if err := p.removeEmpty(ctx); err != nil {
			p.log.Warn("removing emptied ENIs failed; the next cleanup tries again", "err", err)
		}
		// Leaks are rare (a crash between create and attach): looking for
		// them once per grace is enough.
		if time.Since(lastLeak) >= min(p.cfg.LeakedENIGrace.Duration, 10*time.Minute) {
			lastLeak = time.Now()
			if _, err := p.deleteLeaked(ctx); err != nil {
				p.log.Warn("looking for leaked ENIs failed; the next cleanup tries again", "err", err)
			}
		}
	}
}

// removeEmpty detaches and deletes vpcni's ENIs that hold no secondary
// address and no prefix of either family and have lived eniMinLifetime. They are marked
// draining first, so no Assign puts an address on them meanwhile; the
// slow part (a detach takes seconds on EC2) runs without the lock.
func (p *Provider) removeEmpty(ctx context.Context) error {
	p.mu.Lock()
	if err := p.readIfStale(ctx); err != nil {
		p.mu.Unlock()
		return err
	}
	var gone []*eni
	for _, e := range p.enis {
		if e.ours && e.used()+e.used6() == 0 && !p.draining[e.id] && time.Since(e.created) >= p.cfg.ENIMinLifetime.Duration {
			p.draining[e.id] = true
			gone = append(gone, e)
		}
	}
	p.mu.Unlock()
	var firstErr error
	for _, e := range gone {
		detached, err := p.removeENI(ctx, e)
		p.mu.Lock()
		delete(p.draining, e.id)
		if err == nil || detached {
			// Detached but not deleted (a refused delete, say): it leaves
			// the instance's ENIs all the same, and the leak sweep deletes
			// it later; kept, it could be given pod addresses.
			for i, x := range p.enis {
				if x.id == e.id {
					p.enis = append(p.enis[:i:i], p.enis[i+1:]...)
					p.countENIs()
					break
				}
			}
			if err == nil {
				p.log.Info("detached and deleted an emptied ENI of vpcni's", "eni", e.id, "device", e.device)
			}
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
		p.mu.Unlock()
	}
	return firstErr
}
