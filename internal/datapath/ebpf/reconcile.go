package ebpf

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/family"
)

// Reconcile implements datapath.Datapath: mode veth's reconcile, then the
// fast path's pieces: the uplink's program, each accelerated pod's map
// entry and host veth program, no map entry for an address that is not a
// pod here (a stale entry would redirect into a veth that is gone), no
// program on a shaped pod's veth. A node that fell back tries the fast
// path again every retryEvery.
func (d *Datapath) Reconcile(ctx context.Context, want datapath.Desired) (datapath.Report, error) {
	rep, err := d.Veth.Reconcile(ctx, want)
	if err != nil {
		return rep, err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fp == nil && d.why != "closed" && time.Since(d.tried) >= retryEvery {
		_ = d.tryStart() // logs either way
	}
	if d.fp == nil {
		return rep, nil
	}
	if err := d.sync(want, &rep); err != nil {
		return rep, err
	}
	return rep, nil
}

// ourVeths are the host veths mode veth made, by name.
func ourVeths() (map[string]netlink.Link, error) {
	links, err := nlutil.RetryDump(netlink.LinkList)
	if err != nil {
		return nil, fmt.Errorf("list links: %w", err)
	}
	out := map[string]netlink.Link{}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Alias, datapath.AliasPrefix) && l.Type() == "veth" && strings.HasPrefix(l.Attrs().Name, "vpc") {
			out[l.Attrs().Name] = l
		}
	}
	return out, nil
}

func (d *Datapath) sync(want datapath.Desired, rep *datapath.Report) error {
	fp := d.fp
	veths, err := ourVeths()
	if err != nil {
		return err
	}
	entries, err := fp.podEntries()
	if err != nil {
		return fmt.Errorf("read the pods map: %w", err)
	}
	if id, err := attached(fp.uplinkIdx, progUplink); err != nil {
		rep.Failed = append(rep.Failed, fmt.Sprintf("program on %s: %v", d.Uplink, err))
	} else if id != fp.uplinkID {
		if err := attach(fp.uplinkIdx, fp.uplink, progUplink); err != nil {
			rep.Failed = append(rep.Failed, fmt.Sprintf("program on %s: %v", d.Uplink, err))
		} else if id != 0 {
			rep.AddRepair(datapath.RepairProgram, "%s on %s ran an older program (id %d): replaced", progUplink, d.Uplink, id)
		} else if fp.attachedOnce {
			rep.AddRepair(datapath.RepairProgram, "%s on %s", progUplink, d.Uplink)
		}
		fp.attachedOnce = true
	}

	keep := map[netip.Addr]bool{}
	for _, a := range want.Leave {
		keep[fastAddr(a)] = true
	}
	for _, a := range want.Allocations {
		ip := fastAddr(a)
		if onNIC(a) || !ip.IsValid() {
			continue
		}
		w := veth.Wiring(a)
		link, ok := veths[w.Interfaces[0].Name]
		if !ok || link.Attrs().Alias != datapath.AliasPrefix+a.Key() {
			continue // no veth: mode veth reported it Broken, the entry goes below
		}
		if a.Shaped || errors.Is(unshaped(link), errShaped) {
			// Routed, so its bandwidth limits hold: no entry (below), no
			// program of ours ahead of the plugin's.
			if err := detachOurs(link.Attrs().Index, progPod); err != nil {
				rep.Failed = append(rep.Failed, fmt.Sprintf("program on shaped %s: %v", link.Attrs().Name, err))
			}
			continue
		}
		keep[ip] = true
		v, err := podEntry(link.Attrs().Index, w.Interfaces[1].MAC, w.Interfaces[0].MAC)
		if err != nil {
			rep.Failed = append(rep.Failed, fmt.Sprintf("pods map entry %s: %v", ip, err))
			continue
		}
		if have, ok := entries[ip]; !ok || have != v {
			if err := fp.putPod(ip, v); err != nil {
				rep.Failed = append(rep.Failed, fmt.Sprintf("pods map entry %s: %v", ip, err))
			} else {
				rep.AddRepair(datapath.RepairProgram, "pods map entry %s -> %s", ip, link.Attrs().Name)
			}
		}
		id, err := attached(link.Attrs().Index, progPod)
		switch {
		case err != nil:
			rep.Failed = append(rep.Failed, fmt.Sprintf("program on %s: %v", link.Attrs().Name, err))
		case id == fp.podID:
		default:
			if err := attach(link.Attrs().Index, fp.pod, progPod); err != nil {
				rep.Failed = append(rep.Failed, fmt.Sprintf("program on %s: %v", link.Attrs().Name, err))
			} else if id == 0 {
				rep.AddRepair(datapath.RepairProgram, "%s on %s", progPod, link.Attrs().Name)
			} else {
				rep.AddRepair(datapath.RepairProgram, "%s on %s ran an older program (id %d): replaced", progPod, link.Attrs().Name, id)
			}
		}
	}
	for ip := range entries {
		if keep[ip] {
			continue
		}
		if err := fp.deletePod(ip); err != nil {
			rep.Failed = append(rep.Failed, fmt.Sprintf("pods map entry %s: %v", ip, err))
		} else {
			rep.Removed = append(rep.Removed, fmt.Sprintf("pods map entry %s", ip))
		}
	}
	return nil
}

// Check implements datapath.Datapath: mode veth's pieces only. A fast
// path piece missing makes the pod slower, not broken — the reconcile
// puts it back — so it must not make the agent re-wire the pod or call it
// unhealthy; Trace shows it.
func (d *Datapath) Check(ctx context.Context, a *alloc.Allocation) (alloc.Wiring, error) {
	return d.Veth.Check(ctx, a)
}

// Trace implements datapath.Datapath: mode veth's hops, then the uplink's
// program, the pod's map entry and its host veth's program — or one hop
// saying the node runs without the fast path, and why.
func (d *Datapath) Trace(ctx context.Context, a *alloc.Allocation) []datapath.Hop {
	hops := d.Veth.Trace(ctx, a)
	if onNIC(a) {
		return append(hops, datapath.Hop{Where: datapath.HopNode, What: "ebpf fast path: not for a pod on a secondary NIC (routed by the stack)", State: datapath.HopOK})
	}
	if a.Shaped {
		return append(hops, datapath.Hop{Where: datapath.HopNode, What: "ebpf fast path: not for a pod with bandwidth limits (routed by the stack, through the bandwidth plugin's qdiscs)", State: datapath.HopOK})
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.fp == nil {
		return append(hops, datapath.Hop{Where: datapath.HopNode, What: "ebpf fast path off, plain routed path: " + d.why, State: datapath.HopOK})
	}
	fp := d.fp
	add := func(what string, ok bool, state, detail string) {
		h := datapath.Hop{Where: datapath.HopNode, What: what, State: datapath.HopOK}
		if !ok {
			h.State, h.Detail, h.Fix = state, detail, datapath.FixNode
		}
		hops = append(hops, h)
	}
	id, err := attached(fp.uplinkIdx, progUplink)
	add(fmt.Sprintf("tc program %s on %s ingress", progUplink, d.Uplink), err == nil && id == fp.uplinkID, datapath.HopMissing,
		fmt.Sprintf("%s ingress does not run %s (id %d): attached %d, err %v", d.Uplink, progUplink, fp.uplinkID, id, err))
	w := veth.Wiring(a)
	hostIf := w.Interfaces[0].Name
	link, err := netlink.LinkByName(hostIf)
	if err != nil {
		return hops // mode veth's hops say the veth is gone
	}
	if errors.Is(unshaped(link), errShaped) {
		return append(hops, datapath.Hop{Where: datapath.HopNode, What: "ebpf fast path: not for " + hostIf + ", which carries bandwidth limits (routed by the stack)", State: datapath.HopOK})
	}
	for _, l := range a.Leases() {
		if family.Of(l.Address) == family.V6 {
			hops = append(hops, datapath.Hop{Where: datapath.HopNode, What: "ebpf fast path: not for " + l.Address.String() + " (IPv6 takes the routed path through the node's stack)", State: datapath.HopOK})
		}
	}
	ip := fastAddr(a)
	if !ip.IsValid() {
		return hops
	}
	want, err := podEntry(link.Attrs().Index, w.Interfaces[1].MAC, w.Interfaces[0].MAC)
	var have pod
	if err == nil {
		err = fp.pods.Lookup(podKey(ip), &have)
	}
	add(fmt.Sprintf("pods map %s -> %s (ifindex %d)", ip, hostIf, link.Attrs().Index), err == nil && have == want, datapath.HopWrong,
		fmt.Sprintf("pods map entry for %s: have %+v, want %+v (%v)", ip, have, want, err))
	id, err = attached(link.Attrs().Index, progPod)
	add(fmt.Sprintf("tc program %s on %s ingress", progPod, hostIf), err == nil && id == fp.podID, datapath.HopMissing,
		fmt.Sprintf("%s ingress does not run %s (id %d): attached %d, err %v", hostIf, progPod, fp.podID, id, err))
	return hops
}

// clear detaches vpcni's programs from the uplink and every host veth of
// vpcni's and removes the pins: the node as mode veth leaves it.
func clear(uplink, pinPath string) error {
	var errs []error
	if link, err := nlutil.Uplink(uplink); err == nil {
		errs = append(errs, detachOurs(link.Attrs().Index, progUplink))
	} else {
		errs = append(errs, err)
	}
	veths, err := ourVeths()
	if err != nil {
		return errors.Join(append(errs, err)...)
	}
	for _, l := range veths {
		errs = append(errs, detachOurs(l.Attrs().Index, progPod))
	}
	if pinPath != "" {
		for _, name := range []string{progUplink, progPod, "pods", "fast", "services", "config", "stats"} {
			if err := os.Remove(filepath.Join(pinPath, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
		}
		_ = os.Remove(pinPath) // only if empty
	}
	return errors.Join(errs...)
}

// detachOurs removes vpcni's filter from a link if the one there is ours,
// and the clsact qdisc with it when no filter is left on it (an empty
// clsact would keep the bandwidth plugin's ingress qdisc off the link).
func detachOurs(linkIdx int, name string) error {
	id, err := attached(linkIdx, name)
	if err != nil || id == 0 {
		return err
	}
	if err := detach(linkIdx); err != nil {
		return err
	}
	return dropEmptyClsact(linkIdx)
}

// uninstall is clear with the node's settings (vpcnictl uninstall-cni).
func uninstall(node datapath.Node, s *Settings) error { return clear(node.Uplink, s.PinPath) }
