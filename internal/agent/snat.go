package agent

import (
	"context"
	"net/netip"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/snat"
)

// openSNAT opens the node's SNAT table when the config (or the provider's
// default) enables it, and removes one a previous configuration left when
// it does not: switching SNAT off leaves no rule behind.
func openSNAT(ctx context.Context, cfg config.Config) (*snat.NAT, error) {
	if !cfg.SNATOn() {
		return nil, snat.Remove(ctx)
	}
	return snat.Open(cfg.SNAT)
}

// syncSNAT writes the SNAT table for the recorded pods (a no-op with SNAT
// off) and says what of it was missing or wrong ("" if nothing). A
// failure is logged and retried by the next reconcile.
func (a *Agent) syncSNAT(ctx context.Context, records []*alloc.Allocation) (fixed string) {
	if a.snat == nil {
		return ""
	}
	if a.snat.WaitingForVPC() {
		// The file lists no VPC CIDRs: the provider reports them once it
		// is connected (until then the table is not written).
		a.snat.SetVPC(a.addrs.Provider().VPCCIDRs)
	}
	pods := make([]netip.Addr, 0, len(records))
	for _, r := range records {
		pods = append(pods, r.Address)
	}
	fixed, err := a.snat.Sync(ctx, pods)
	if err != nil {
		a.log.Warn("SNAT table not in line; the next reconcile tries again", "err", err)
	}
	return fixed
}

// snatPod puts a new pod's address into the SNAT set before its ADD
// answers, so its first packet out of the VPC already leaves as the node.
func (a *Agent) snatPod(ctx context.Context, ip netip.Addr) {
	if a.snat == nil {
		return
	}
	if err := a.snat.AddPod(ctx, ip); err != nil {
		a.log.Warn("pod address not added to the SNAT set; reconciling", "address", ip, "err", err)
		a.kick("snat")
	}
}

// records lists the store's allocations (none if it cannot be read: the
// next reconcile lists them again).
func (a *Agent) records() []*alloc.Allocation {
	recs, err := a.store.List()
	if err != nil {
		a.log.Warn("read allocation store", "err", err)
	}
	return recs
}
