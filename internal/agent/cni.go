package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/store"
)

// netConf is the part of the runtime's network config the agent reads.
type netConf struct {
	CNIVersion string    `json:"cniVersion"`
	Name       string    `json:"name"`
	DNS        types.DNS `json:"dns"`
	PrevResult any       `json:"prevResult,omitempty"`
	// ValidAttachments is GC's list of attachments still in use.
	ValidAttachments []types.GCAttachment `json:"cni.dev/valid-attachments,omitempty"`
}

var containerIDRe = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9_.\-]*$`)

// parseRequest checks what every verb needs; withNetns for ADD and CHECK.
func parseRequest(req *api.CNIRequest, withAttachment, withNetns bool) (*netConf, *api.Error) {
	conf := &netConf{}
	if err := json.Unmarshal(req.Config, conf); err != nil {
		return nil, api.Errorf(api.CodeDecodingFailure, "network configuration is not valid JSON", err.Error())
	}
	if conf.Name == "" {
		return nil, api.Errorf(api.CodeInvalidConfig, `network configuration lacks "name"`, "")
	}
	if !withAttachment {
		return conf, nil
	}
	var bad []string
	if !containerIDRe.MatchString(req.ContainerID) {
		bad = append(bad, fmt.Sprintf("CNI_CONTAINERID %q is empty or has characters other than letters, digits, '_', '.', '-'", req.ContainerID))
	}
	if req.IfName == "" || len(req.IfName) > 15 || strings.ContainsAny(req.IfName, "/: \t\n") || req.IfName == "." || req.IfName == ".." {
		bad = append(bad, fmt.Sprintf("CNI_IFNAME %q is not a valid interface name (1-15 bytes, no '/', ':' or spaces)", req.IfName))
	}
	if withNetns {
		if req.Netns == "" {
			bad = append(bad, "CNI_NETNS is required")
		} else if _, err := os.Stat(req.Netns); err != nil {
			bad = append(bad, fmt.Sprintf("CNI_NETNS: network namespace %s does not exist", req.Netns))
		}
	}
	if len(bad) > 0 {
		return nil, api.Errorf(api.CodeInvalidEnv, strings.Join(bad, "; "), "")
	}
	return conf, nil
}

// k8sPod picks the pod's identity out of CNI_ARGS: namespace, name, and
// the UID runtimes may send.
func k8sPod(args string) (namespace, name, uid string) {
	for _, kv := range strings.Split(args, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			namespace = v
		case "K8S_POD_NAME":
			name = v
		case "K8S_POD_UID":
			uid = v
		}
	}
	return namespace, name, uid
}

// Add gives the attachment an address and wires it, and records it before
// answering. A repeated ADD returns the same result. The cluster hears of
// the outcome afterwards: the pod's annotations, or an event saying why.
func (a *Agent) Add(ctx context.Context, req *api.CNIRequest) (*types100.Result, *api.Error) {
	res, aerr := a.add(ctx, req)
	if aerr != nil {
		a.failed(req, aerr)
	} else if a.cluster != nil {
		a.cluster.Changed(req.ContainerID, req.IfName) // a queue add; pods only are worked on
	}
	return res, aerr
}

func (a *Agent) add(ctx context.Context, req *api.CNIRequest) (*types100.Result, *api.Error) {
	conf, aerr := parseRequest(req, true, true)
	if aerr != nil {
		return nil, aerr
	}
	rec, unlock, aerr := a.lockRecord(req)
	if aerr != nil {
		return nil, aerr
	}
	defer unlock()
	if rec != nil {
		return a.readd(rec, req, conf)
	}

	start := time.Now()
	ip, aerr := a.allocate(ctx, store.Key(req.ContainerID, req.IfName))
	if aerr != nil {
		return nil, aerr
	}
	allocated := time.Now()
	podNS, podName, podUID := k8sPod(req.Args)
	rec = &store.Record{
		ContainerID: req.ContainerID, IfName: req.IfName, Network: conf.Name, Netns: req.Netns,
		Address: ip, HostIf: datapath.HostIfName(req.ContainerID, req.IfName),
		PodNamespace: podNS, PodName: podName, PodUID: podUID, Created: time.Now().UTC(),
	}
	// The record and the wiring go in parallel; both are done before the
	// answer. A crash in between leaves a record without wiring (re-wired
	// at start) or wiring without a record (an orphan link, removed at
	// start, its address still free in the pool): nothing leaks either way.
	putErr := make(chan error, 1)
	var recorded time.Time
	go func() { err := a.store.Put(rec); recorded = time.Now(); putErr <- err }()
	wired, err := a.dp.Setup(attachmentOf(rec))
	wiredAt := time.Now()
	perr := <-putErr
	a.log.Debug("add timing", "container", rec.ContainerID, "allocate_ms", msBetween(start, allocated),
		"wire_ms", msBetween(allocated, wiredAt), "record_ms", msBetween(allocated, recorded))
	if perr != nil {
		if err == nil {
			_ = a.dp.Teardown(attachmentOf(rec))
		}
		a.unallocate(ip)
		return nil, api.Errorf(api.CodeIOFailure, "could not record the allocation; the pod was not wired", perr.Error())
	}
	if err != nil {
		if derr := a.store.Delete(rec.ContainerID, rec.IfName); derr != nil {
			// The record stays: the next start or DEL cleans up.
			a.log.Error("could not drop the record of a failed ADD", "container", rec.ContainerID, "err", derr)
			return nil, setupError(err)
		}
		a.unallocate(ip)
		return nil, setupError(err)
	}
	a.log.Info("pod added", "container", rec.ContainerID, "ifName", rec.IfName, "address", ip, "pod", podNS+"/"+podName)
	return result(rec, wired, conf), nil
}

// lockRecord serialises work on the request's attachment and reads its
// record (nil if none). The caller must call unlock.
func (a *Agent) lockRecord(req *api.CNIRequest) (rec *store.Record, unlock func(), aerr *api.Error) {
	unlock = a.locks.Lock(store.Key(req.ContainerID, req.IfName))
	rec, err := a.store.Get(req.ContainerID, req.IfName)
	if err != nil {
		unlock()
		return nil, nil, api.Errorf(api.CodeIOFailure, "read allocation store", err.Error())
	}
	return rec, unlock, nil
}

// readd answers an ADD for an attachment already recorded: the same address,
// re-wired if the kernel lost any of it.
func (a *Agent) readd(rec *store.Record, req *api.CNIRequest, conf *netConf) (*types100.Result, *api.Error) {
	att := attachmentOf(rec)
	if rec.Netns != req.Netns {
		// Same container and interface, new namespace (a restarted sandbox
		// that kept its ID): move the address there.
		if err := a.dp.Teardown(att); err != nil {
			return nil, api.Errorf(api.CodeInternal, "could not take down the previous wiring", err.Error())
		}
		rec.Netns = req.Netns
		if err := a.store.Put(rec); err != nil {
			return nil, api.Errorf(api.CodeIOFailure, "could not update the allocation record", err.Error())
		}
		att = attachmentOf(rec)
	}
	if a.dp.Check(att) != nil {
		if err := a.dp.Teardown(att); err != nil {
			return nil, api.Errorf(api.CodeInternal, "could not take down broken wiring", err.Error())
		}
		if _, err := a.dp.Setup(att); err != nil {
			return nil, setupError(err)
		}
	}
	return result(rec, datapath.Wired{HostIf: rec.HostIf, HostMAC: datapath.HostMAC(att), PodMAC: datapath.PodMAC(att)}, conf), nil
}

func setupError(err error) *api.Error {
	var se *datapath.SetupError
	if errors.As(err, &se) && se.BadRequest {
		return api.Errorf(api.CodeInvalidEnv, "cannot wire the pod: "+se.Error(), "")
	}
	return api.Errorf(api.CodeInternal, "wiring the pod failed, nothing was left behind", err.Error())
}

func result(rec *store.Record, w datapath.Wired, conf *netConf) *types100.Result {
	podIf := 1
	return &types100.Result{
		CNIVersion: types100.ImplementedSpecVersion,
		Interfaces: []*types100.Interface{
			{Name: w.HostIf, Mac: w.HostMAC.String()},
			{Name: rec.IfName, Mac: w.PodMAC.String(), Sandbox: rec.Netns},
		},
		IPs: []*types100.IPConfig{{
			Interface: &podIf,
			Address:   net.IPNet{IP: rec.Address.AsSlice(), Mask: net.CIDRMask(32, 32)},
			Gateway:   datapath.Gateway.AsSlice(),
		}},
		Routes: []*types.Route{{Dst: net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}, GW: datapath.Gateway.AsSlice()}},
		DNS:    conf.DNS,
	}
}

// allocate takes a free address. With the pool empty it asks the provider
// for more, and waits — for a refill that failed to succeed on a retry, or
// for a cooldown to end — up to pool.addWait before "try again later".
// Every round either obtains addresses, waits, or ends.
func (a *Agent) allocate(ctx context.Context, owner string) (netip.Addr, *api.Error) {
	deadline := time.Now().Add(a.cfg.Pool.AddWait.Duration)
	pause := 100 * time.Millisecond
	for {
		if ip, ok := a.take(owner); ok {
			a.kickRefill()
			return ip, nil
		}
		a.refillMu.Lock()
		// Another ADD may have refilled while this one waited.
		if ip, ok := a.take(owner); ok {
			a.refillMu.Unlock()
			return ip, nil
		}
		// An empty pool asks for a whole batch: one cloud call for the
		// pods that follow this one.
		n := a.want(max(a.cfg.Pool.WarmTarget, a.cfg.Pool.BatchSize))
		got, err := 0, error(nil)
		if n > 0 {
			got, err = a.obtain(ctx, n)
		}
		a.refillMu.Unlock()
		if got > 0 {
			continue
		}
		// Nothing obtained: wait if something may change in time.
		wait := pause
		if errors.Is(err, provider.ErrExhausted) || n == 0 {
			a.mu.Lock()
			next, cooling := a.pool.NextCooled()
			a.mu.Unlock()
			if !cooling {
				return netip.Addr{}, a.exhausted()
			}
			wait = time.Until(next)
		}
		if time.Now().Add(wait).After(deadline) || ctx.Err() != nil {
			if err != nil && !errors.Is(err, provider.ErrExhausted) {
				return netip.Addr{}, api.Errorf(api.CodeTryAgainLater,
					fmt.Sprintf("no free address and the provider could not be reached for more within %s; try again later", a.cfg.Pool.AddWait), err.Error())
			}
			return netip.Addr{}, a.exhausted()
		}
		select {
		case <-ctx.Done():
		case <-time.After(max(wait, time.Millisecond)):
		}
		pause = min(pause*2, 2*time.Second)
	}
}

func (a *Agent) take(owner string) (netip.Addr, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.pool.Take(owner, time.Now())
}

func (a *Agent) exhausted() *api.Error {
	a.mu.Lock()
	c, capacity := a.pool.Counts(), a.capacity
	a.mu.Unlock()
	msg := fmt.Sprintf("no free address on node %s: %d allocated, %d cooling down (%s), capacity %d",
		a.cfg.NodeName, c.Allocated, c.Cooling, a.pool.Cooldown(), capacity)
	return api.Errorf(api.CodeTryAgainLater, msg+"; try again later",
		"free addresses by deleting pods, wait for the cooldown, or give the node more addresses")
}

func (a *Agent) unallocate(ip netip.Addr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if err := a.pool.Unallocate(ip); err != nil {
		a.log.Error("return unused address", "address", ip, "err", err)
	}
}

// Del takes the attachment's datapath down, then frees its address. It
// succeeds for attachments the agent never saw.
func (a *Agent) Del(_ context.Context, req *api.CNIRequest) *api.Error {
	if _, aerr := parseRequest(req, true, false); aerr != nil {
		return aerr
	}
	rec, unlock, aerr := a.lockRecord(req)
	if aerr != nil {
		return aerr
	}
	defer unlock()
	if rec == nil {
		return nil
	}
	if err := a.release(rec); err != nil {
		return api.Errorf(api.CodeInternal, "could not remove the pod's wiring; the address stays allocated until a retry succeeds", err.Error())
	}
	a.log.Info("pod deleted", "container", rec.ContainerID, "ifName", rec.IfName, "address", rec.Address)
	a.changed(rec)
	a.kickRefill() // surplus may go back to the provider
	return nil
}

// release undoes one allocation: datapath, then record, then pool.
func (a *Agent) release(rec *store.Record) error {
	if err := a.dp.Release(attachmentOf(rec)); err != nil {
		return err
	}
	now := time.Now()
	var until time.Time
	if cd := a.pool.Cooldown(); cd > 0 {
		until = now.Add(cd)
	}
	if err := a.store.Release(rec, until); err != nil {
		return fmt.Errorf("update allocation store: %w", err)
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if owner := a.pool.Owner(rec.Address); owner != rec.Key() {
		a.log.Error("pool gives this address to another attachment; leaving it", "address", rec.Address, "record", rec.Key(), "owner", owner)
		return nil
	}
	if _, err := a.pool.Release(rec.Address, now); err != nil {
		a.log.Error("pool disagrees with store", "address", rec.Address, "err", err)
	}
	return nil
}

// Check verifies the attachment's record and wiring.
func (a *Agent) Check(_ context.Context, req *api.CNIRequest) *api.Error {
	conf, aerr := parseRequest(req, true, true)
	if aerr != nil {
		return aerr
	}
	rec, unlock, aerr := a.lockRecord(req)
	if aerr != nil {
		return aerr
	}
	defer unlock()
	if rec == nil {
		return api.Errorf(api.CodeUnknownContainer, fmt.Sprintf("vpcni has no allocation for container %s interface %s", req.ContainerID, req.IfName), "")
	}
	if conf.PrevResult != nil {
		if err := checkPrevResult(conf.PrevResult, rec); err != nil {
			return api.Errorf(api.CodeInternal, "prevResult disagrees with vpcni's record", err.Error())
		}
	}
	if rec.Netns != req.Netns {
		return api.Errorf(api.CodeInternal, "check failed", fmt.Sprintf("recorded netns %s, runtime says %s", rec.Netns, req.Netns))
	}
	if err := a.dp.Check(attachmentOf(rec)); err != nil {
		return api.Errorf(api.CodeInternal, "check failed: the pod's wiring is not as vpcni left it", err.Error())
	}
	return nil
}

func checkPrevResult(prev any, rec *store.Record) error {
	data, err := json.Marshal(prev)
	if err != nil {
		return err
	}
	var ver struct {
		CNIVersion string `json:"cniVersion"`
	}
	if err := json.Unmarshal(data, &ver); err != nil {
		return fmt.Errorf("read prevResult: %w", err)
	}
	res, err := version.NewResult(ver.CNIVersion, data)
	if err != nil {
		return fmt.Errorf("read prevResult: %w", err)
	}
	r, err := types100.GetResult(res)
	if err != nil {
		return fmt.Errorf("read prevResult: %w", err)
	}
	for _, ip := range r.IPs {
		if addr, ok := netip.AddrFromSlice(ip.Address.IP.To4()); ok && addr == rec.Address {
			return nil
		}
	}
	return fmt.Errorf("prevResult does not hold %s", rec.Address)
}

// GC releases every allocation of this network that is not among the
// runtime's valid attachments.
func (a *Agent) GC(_ context.Context, req *api.CNIRequest) *api.Error {
	conf, aerr := parseRequest(req, false, false)
	if aerr != nil {
		return aerr
	}
	valid := map[string]bool{}
	for _, v := range conf.ValidAttachments {
		valid[store.Key(v.ContainerID, v.IfName)] = true
	}
	records, err := a.store.List()
	if err != nil {
		return api.Errorf(api.CodeIOFailure, "read allocation store", err.Error())
	}
	var errs []error
	for _, r := range records {
		if r.Network != conf.Name || valid[r.Key()] {
			continue
		}
		unlock := a.locks.Lock(r.Key())
		cur, err := a.store.Get(r.ContainerID, r.IfName)
		if err == nil && cur != nil {
			err = a.release(cur)
		}
		unlock()
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", r.Key(), err))
			continue
		}
		a.log.Info("garbage-collected allocation", "container", r.ContainerID, "ifName", r.IfName, "address", r.Address)
		a.changed(r)
	}
	if err := errors.Join(errs...); err != nil {
		return api.Errorf(api.CodeInternal, "GC could not release every stale allocation", err.Error())
	}
	return nil
}

// Status says whether an ADD could be served now.
func (a *Agent) Status(_ context.Context, _ *api.CNIRequest) *api.Error {
	ready, reason := a.readiness()
	if ready && a.cluster != nil {
		if err := a.cluster.Ready(); err != nil {
			ready, reason = false, err.Error()
		}
	}
	if !ready {
		return api.Errorf(api.CodeNotAvailable, "vpcni cannot add pods on node "+a.cfg.NodeName+": "+reason, "")
	}
	return nil
}

func (a *Agent) readiness() (bool, string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.pool.Promote(time.Now())
	c := a.pool.Counts()
	if c.Free > 0 {
		if a.degradedLocked() {
			return true, fmt.Sprintf("degraded: serving %d free addresses from the pool while the provider fails: %v", c.Free, a.providerErr)
		}
		return true, ""
	}
	if a.capacity > 0 && c.Held() >= a.capacity {
		return false, fmt.Sprintf("no free address and none obtainable: all %d addresses are allocated (%d) or cooling down (%d)", a.capacity, c.Allocated, c.Cooling)
	}
	if a.providerErr != nil {
		return false, "no free address and the provider fails: " + a.providerErr.Error()
	}
	return true, ""
}

func msBetween(a, b time.Time) float64 { return float64(b.Sub(a).Microseconds()) / 1000 }
