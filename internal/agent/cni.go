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

	"github.com/vpcni/vpcni/internal/addresses"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/store"
)

// netConf is the part of the runtime's network config the agent reads.
type netConf struct {
	CNIVersion string    `json:"cniVersion"`
	Name       string    `json:"name"`
	DNS        types.DNS `json:"dns"`
	PrevResult any       `json:"prevResult,omitempty"`
	// RuntimeConfig holds what the runtime passes for the capabilities the
	// conflist gives vpcni: "ips" (specific addresses asked for) and
	// "bandwidth" (the pod's kubernetes.io/ingress-bandwidth and
	// egress-bandwidth annotations).
	RuntimeConfig struct {
		// IPs asks for specific addresses (the "ips" capability).
		IPs       []string `json:"ips,omitempty"`
		Bandwidth *struct {
			IngressRate uint64 `json:"ingressRate"`
			EgressRate  uint64 `json:"egressRate"`
		} `json:"bandwidth"`
	} `json:"runtimeConfig"`
}

// checkBandwidth refuses a pod that asks for a bandwidth limit in a mode
// where the bandwidth plugin chained after vpcni has no node-side veth to
// shape. It would fail after vpcni with "container interface eth0 has no
// veth peer", the address already taken; this says why and what to do,
// before anything is allocated.
// (info is asked only then: some modes read the node's links for it.)
func checkBandwidth(conf *netConf, info func() datapath.Info) *api.Error {
	if !shaped(conf) {
		return nil
	}
	bw := conf.RuntimeConfig.Bandwidth
	dp := info()
	if dp.PodVeth {
		return nil
	}
	return api.Errorf(api.CodeInvalidConfig,
		fmt.Sprintf("datapath %s cannot limit a pod's bandwidth: the pod's interface is not a veth, so the bandwidth plugin has no node-side end to shape", dp.Mode),
		fmt.Sprintf("the pod asks for ingress %d bit/s, egress %d bit/s (kubernetes.io/ingress-bandwidth, kubernetes.io/egress-bandwidth): remove those annotations, or run the node in datapath veth or bridge", bw.IngressRate, bw.EgressRate))
}

// shaped says the runtime asks the bandwidth plugin to limit the pod.
func shaped(conf *netConf) bool {
	bw := conf.RuntimeConfig.Bandwidth
	return bw != nil && (bw.IngressRate > 0 || bw.EgressRate > 0)
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
	switch {
	case len(req.ContainerID) > alloc.MaxContainerID:
		bad = append(bad, fmt.Sprintf("CNI_CONTAINERID is %d bytes; vpcni takes at most %d (it marks the pod's node-side links with it)", len(req.ContainerID), alloc.MaxContainerID))
	case !containerIDRe.MatchString(req.ContainerID):
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
// the outcome afterwards: the pod's annotations (once the record holds its
// wiring), or an event saying why.
func (a *Agent) Add(ctx context.Context, req *api.CNIRequest) (*types100.Result, *api.Error) {
	res, aerr := a.add(ctx, req)
	if aerr != nil {
		a.failed("ADD", req, aerr)
	}
	return res, aerr
}

func (a *Agent) add(ctx context.Context, req *api.CNIRequest) (*types100.Result, *api.Error) {
	conf, aerr := parseRequest(req, true, true)
	if aerr != nil {
		return nil, aerr
	}
	if aerr := checkBandwidth(conf, a.dp.Info); aerr != nil {
		return nil, aerr
	}
	fams := a.cfg.Families()
	wants, aerr := requestedAddresses(req.Args, conf, fams)
	if aerr != nil {
		return nil, aerr
	}
	podNS, podName, podUID := k8sPod(req.Args)
	sticky, aerr := a.reserved(podNS, podName, wants)
	if aerr != nil {
		return nil, aerr
	}
	netName, pool, aerr := a.podNetwork(ctx, podNS, podName, podUID)
	if aerr != nil {
		return nil, aerr
	}
	if netName != "" && len(fams) > 1 {
		return nil, api.Errorf(api.CodeInvalidEnv, fmt.Sprintf("pod %s/%s is on PodNetwork %s, and PodNetworks give pods one address family while this node's pods get %s (ipFamilies)", podNS, podName, netName, family.Join(fams)),
			"run the PodNetwork's pods on single-family nodes")
	}
	rec, unlock, aerr := a.lockRecord(req)
	if aerr != nil {
		return nil, aerr
	}
	defer unlock()
	if rec != nil {
		for f, w := range wants {
			if l, ok := rec.LeaseOf(f); !ok || l.Address != w {
				return nil, api.Errorf(api.CodeInvalidEnv, fmt.Sprintf("container %s interface %s already has %s, not the requested %s: DEL it first", rec.ContainerID, rec.IfName, addrList(rec.Addresses()), w), "")
			}
		}
		return a.readd(ctx, rec, req, conf)
	}

	start := time.Now()
	pools := append([]*addresses.Manager{pool}, a.otherPools()...)
	if netName != "" {
		pools = pools[:1]
	}
	leases, err := takeAll(ctx, alloc.Key(req.ContainerID, req.IfName), pools, fams, wants)
	if err != nil {
		var s *addresses.Shortage
		var bad *addresses.BadRequest
		if netName != "" && errors.As(err, &s) && s.Exhausted && a.cluster != nil {
			// The pod's own Event says why it cannot start; the Node's
			// says that this node cannot serve the network now — a full
			// subnet, or no NIC slot left for another network.
			a.cluster.NodeWarning(ReasonPodNetworkExhausted, fmt.Sprintf("node %s could not give pod %s/%s an address of PodNetwork %s: %s (%s)", a.cfg.NodeName, podNS, podName, netName, s.Msg, s.Details))
		}
		switch {
		case errors.As(err, &s) && sticky && len(wants) > 0:
			return nil, api.Errorf(api.CodeTryAgainLater, fmt.Sprintf("pod %s/%s keeps its address (AddressReservation): %s", podNS, podName, s.Msg), s.Details)
		case errors.As(err, &s):
			return nil, api.Errorf(api.CodeTryAgainLater, s.Msg, s.Details)
		case errors.As(err, &bad):
			return nil, api.Errorf(api.CodeInvalidEnv, bad.Msg, "")
		}
		return nil, api.Errorf(api.CodeInternal, "could not allocate an address", err.Error())
	}
	allocated := time.Now()
	leases[0].PodNetwork = netName
	rec = &alloc.Allocation{
		ContainerID: req.ContainerID, IfName: req.IfName, Network: conf.Name, Netns: req.Netns, Lease: leases[0], Others: leases[1:],
		PodNamespace: podNS, PodName: podName, PodUID: podUID, Requested: len(wants) > 0 || sticky, Created: time.Now().UTC(),
		Shaped: shaped(conf),
	}
	a.wiring.RLock()
	defer a.wiring.RUnlock()
	// The record and the wiring go in parallel; both are done before the
	// answer. The record is written unready: a crash in between leaves a
	// record without wiring (checked and re-wired at start) or wiring
	// without a record (an orphan link, removed at start, its address
	// still free in the pool): nothing leaks either way.
	putErr := make(chan error, 1)
	var recorded time.Time
	go func() { err := a.store.Put(rec); recorded = time.Now(); putErr <- err }()
	wired, err := a.dp.Setup(ctx, rec)
	wiredAt := time.Now()
	perr := <-putErr
	a.log.Debug("add timing", "container", rec.ContainerID, "allocate_ms", msBetween(start, allocated),
		"wire_ms", msBetween(allocated, wiredAt), "record_ms", msBetween(allocated, recorded))
	a.metrics.AddPhase.WithLabelValues("address").Observe(allocated.Sub(start).Seconds())
	a.metrics.AddPhase.WithLabelValues("wire").Observe(wiredAt.Sub(allocated).Seconds())
	a.metrics.AddPhase.WithLabelValues("record").Observe(recorded.Sub(allocated).Seconds())
	if perr != nil {
		if err == nil {
			_ = a.dp.Teardown(ctx, rec)
		}
		a.untake(rec, nil)
		return nil, api.Errorf(api.CodeIOFailure, "could not record the allocation; the pod was not wired", perr.Error())
	}
	if err != nil {
		if derr := a.dropRecord(rec); derr != nil {
			// The record stays: the next start or DEL cleans up.
			a.log.Error("could not drop the record of a failed ADD", "container", rec.ContainerID, "err", derr)
			return nil, setupError(err)
		}
		// Unless the request was bad or the runtime gave up, the address
		// itself may be why the wiring failed.
		var se *datapath.SetupError
		var wiringErr error
		if ctx.Err() == nil && !(errors.As(err, &se) && se.BadRequest) {
			wiringErr = err
		}
		a.untake(rec, wiringErr)
		return nil, setupError(err)
	}
	for _, l := range rec.Leases() {
		a.familyPool(rec, l).Wired(l.Address)
	}
	a.snatPod(ctx, rec.Address)
	rec.Wiring, rec.Ready = &wired, true
	// Marking the record ready is not waited for: it only changes the
	// record if it is still this one (a DEL may follow at once), and a
	// crash before it lands leaves an unready record, checked at start.
	// The cluster hears of the pod once the record holds its wiring (its
	// MAC and gateway go into the pod's annotations).
	go func(r alloc.Allocation) {
		if err := a.store.MarkReady(&r); err != nil && !errors.Is(err, store.ErrClosed) {
			a.log.Warn("could not mark the record ready; the next start checks it again", "container", r.ContainerID, "err", err)
		}
		a.changed(&r)
	}(*rec)
	a.log.Info("pod added", "container", rec.ContainerID, "ifName", rec.IfName, "address", addrList(rec.Addresses()), "pod", podNS+"/"+podName)
	return result(rec, wired, conf), nil
}

// lockRecord serialises work on the request's attachment and reads its
// record (nil if none). The caller must call unlock.
func (a *Agent) lockRecord(req *api.CNIRequest) (rec *alloc.Allocation, unlock func(), aerr *api.Error) {
	unlock = a.locks.Lock(alloc.Key(req.ContainerID, req.IfName))
	rec, err := a.store.Get(req.ContainerID, req.IfName)
	if err != nil {
		unlock()
		return nil, nil, api.Errorf(api.CodeIOFailure, "read allocation store", err.Error())
	}
	return rec, unlock, nil
}

// readd answers an ADD for an attachment already recorded: the same address,
// re-wired if the kernel lost any of it.
func (a *Agent) readd(ctx context.Context, rec *alloc.Allocation, req *api.CNIRequest, conf *netConf) (*types100.Result, *api.Error) {
	// A record in conflict is never wired: that would take its address
	// from the pod that holds it.
	if holder, err := a.heldByAnother(rec); err != nil {
		return nil, api.Errorf(api.CodeIOFailure, "read allocation store", err.Error())
	} else if holder != "" {
		return nil, api.Errorf(api.CodeInternal, fmt.Sprintf("container %s interface %s is recorded with %s, which the node gives to %s: vpcni does not wire it twice; DEL this attachment", rec.ContainerID, rec.IfName, rec.Address, holder), "")
	}
	if rec.Netns != req.Netns {
		// Same container and interface, new namespace (a restarted sandbox
		// that kept its ID): move the address there.
		a.wiring.RLock()
		err := a.dp.Teardown(ctx, rec)
		a.wiring.RUnlock()
		if err != nil {
			return nil, api.Errorf(api.CodeInternal, "could not take down the previous wiring", err.Error())
		}
		rec.Netns, rec.Wiring, rec.Ready = req.Netns, nil, false
		if err := a.store.Put(rec); err != nil {
			return nil, api.Errorf(api.CodeIOFailure, "could not update the allocation record", err.Error())
		}
	}
	w, err := a.ensureWired(ctx, rec)
	if err != nil {
		return nil, setupError(err)
	}
	a.changed(rec)
	return result(rec, w, conf), nil
}

func setupError(err error) *api.Error {
	var se *datapath.SetupError
	if errors.As(err, &se) && se.BadRequest {
		return api.Errorf(api.CodeInvalidEnv, "cannot wire the pod: "+se.Error(), "")
	}
	return api.Errorf(api.CodeInternal, "wiring the pod failed, nothing was left behind", err.Error())
}

// result is the CNI result of a wired allocation.
func result(rec *alloc.Allocation, w alloc.Wiring, conf *netConf) *types100.Result {
	res := &types100.Result{CNIVersion: types100.ImplementedSpecVersion, DNS: conf.DNS}
	for _, i := range w.Interfaces {
		res.Interfaces = append(res.Interfaces, &types100.Interface{Name: i.Name, Mac: i.MAC, Sandbox: i.Sandbox})
	}
	for _, ip := range w.IPs {
		c := &types100.IPConfig{Interface: types100.Int(ip.Interface), Address: ipNet(ip.Address)}
		if ip.Gateway.IsValid() {
			c.Gateway = ip.Gateway.AsSlice()
		}
		res.IPs = append(res.IPs, c)
	}
	for _, r := range w.Routes {
		rt := &types.Route{Dst: ipNet(r.Dst)}
		if r.GW.IsValid() {
			rt.GW = r.GW.AsSlice()
		}
		res.Routes = append(res.Routes, rt)
	}
	return res
}

func ipNet(p netip.Prefix) net.IPNet {
	return net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

// Del takes the attachment's datapath down, then frees its address
// (release: a record whose address another record holds only goes from
// the store). It succeeds for attachments the agent never saw.
func (a *Agent) Del(ctx context.Context, req *api.CNIRequest) *api.Error {
	aerr := a.del(ctx, req)
	if aerr != nil {
		a.failed("DEL", req, aerr)
	}
	return aerr
}

func (a *Agent) del(ctx context.Context, req *api.CNIRequest) *api.Error {
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
	if err := a.release(ctx, rec); err != nil {
		return api.Errorf(api.CodeInternal, "could not remove the pod's wiring; the address stays allocated until a retry succeeds", err.Error())
	}
	a.log.Info("pod deleted", "container", rec.ContainerID, "ifName", rec.IfName, "address", addrList(rec.Addresses()))
	a.changed(rec)
	return nil
}

// release undoes one allocation: datapath, then record, then pool. A
// record whose address another record holds only goes from the store
// (dropConflict). The caller holds the attachment's lock.
func (a *Agent) release(ctx context.Context, rec *alloc.Allocation) error {
	if holder, err := a.heldByAnother(rec); err != nil || holder != "" {
		if err != nil {
			return err
		}
		return a.dropConflict(rec, holder)
	}
	if !rec.Requested && a.reservedFor(rec) {
		// Reserved after its ADD (the controller lagged): it is the
		// pod's all the same, and must leave with it.
		rec.Requested = true
	}
	if err := a.unwire(ctx, rec); err != nil {
		return err
	}
	if rec.Requested {
		// Outside the wiring lock: this waits on the cloud, and a
		// reconcile waiting for the lock would hold up every ADD behind it.
		for _, l := range rec.Leases() {
			if err := a.familyPool(rec, l).GiveBack(ctx, rec.Key(), l.Address); err != nil {
				a.log.Error("requested address not given back to the provider", "address", l.Address, "record", rec.Key(), "err", err)
			}
		}
	}
	return nil
}

// heldByAnother names the record the pool gives rec's address to when that
// is another record in the store, "" otherwise: rec is then the loser of
// two records for one address (restore gave the address to the other).
// The store is read only when the pool does not give the address to rec,
// which it otherwise always does.
func (a *Agent) heldByAnother(rec *alloc.Allocation) (string, error) {
	if a.owns(rec) {
		return "", nil
	}
	records, err := a.store.List()
	if err != nil {
		return "", fmt.Errorf("read allocation store: %w", err)
	}
	for _, r := range records {
		if r.Address == rec.Address && r.Key() != rec.Key() && a.owns(r) {
			return r.Key(), nil
		}
	}
	return "", nil
}

// dropConflict forgets a record whose address another record holds: its
// record goes, and nothing else. A teardown would take the address's
// node-side pieces — the proxy ARP entry, the eBPF map entry, the route,
// all keyed by the address alone — from the pod that holds it, and the
// address is that pod's, so it goes neither to the pool nor to the
// provider. The record's own links, if it has any, carry its key: with
// the record gone they are no one's, and the node reconcile this kicks
// removes them while it keeps (or puts back) the holder's pieces.
func (a *Agent) dropConflict(rec *alloc.Allocation, holder string) error {
	if err := a.store.Delete(rec.ContainerID, rec.IfName); err != nil {
		return fmt.Errorf("update allocation store: %w", err)
	}
	// Its addresses of other families, if their pools gave them to it,
	// are its own and go back (cooling: a pod may have used them).
	for _, l := range rec.Others {
		if pool := a.familyPool(rec, l); pool.Owns(rec.Key(), l.Address) {
			if err := pool.Release(rec.Key(), l.Address, time.Now()); err != nil {
				a.log.Error("address not returned to the pool", "address", l.Address, "record", rec.Key(), "err", err)
			}
		}
	}
	a.log.Warn("dropped a record whose address another record holds; the address stays with that one",
		"container", rec.ContainerID, "ifName", rec.IfName, "address", rec.Address, "holder", holder)
	a.kick("conflict")
	return nil
}

// unwire takes the allocation's datapath down and releases its record
// and, unless it was requested by name, its address to the pool, under
// the wiring lock.
func (a *Agent) unwire(ctx context.Context, rec *alloc.Allocation) error {
	a.wiring.RLock()
	defer a.wiring.RUnlock()
	if err := a.dp.Teardown(ctx, rec); err != nil {
		return err
	}
	now := time.Now()
	if rec.Requested {
		// It leaves the node (nothing cools here), recorded as leaving
		// with the record's release; given back by release, after the lock.
		if err := a.store.Leave(rec); err != nil {
			return fmt.Errorf("update allocation store: %w", err)
		}
		return nil
	}
	if err := a.store.Release(rec, a.pool(rec).CoolUntil(now)); err != nil {
		return fmt.Errorf("update allocation store: %w", err)
	}
	for _, l := range rec.Leases() {
		if err := a.familyPool(rec, l).Release(rec.Key(), l.Address, now); err != nil {
			a.log.Error("address not returned to the pool", "address", l.Address, "record", rec.Key(), "err", err)
		}
	}
	return nil
}

// Check verifies the attachment's record and wiring.
func (a *Agent) Check(ctx context.Context, req *api.CNIRequest) *api.Error {
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
	if _, err := a.dp.Check(ctx, rec); err != nil {
		return api.Errorf(api.CodeInternal, "check failed: the pod's wiring is not as vpcni left it", err.Error())
	}
	return nil
}

func checkPrevResult(prev any, rec *alloc.Allocation) error {
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
	var missing []netip.Addr
	for _, want := range rec.Addresses() {
		found := false
		for _, ip := range r.IPs {
			if addr, ok := netip.AddrFromSlice(ip.Address.IP); ok && addr.Unmap() == want {
				found = true
			}
		}
		if !found {
			missing = append(missing, want)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("prevResult does not hold %s", addrList(missing))
	}
	return nil
}

// GC releases every allocation of this network that is not among the
// runtime's valid attachments (gcValid). A GC that lists none at all
// releases nothing.
func (a *Agent) GC(ctx context.Context, req *api.CNIRequest) *api.Error {
	conf, aerr := parseRequest(req, false, false)
	if aerr != nil {
		return aerr
	}
	valid, listed, err := gcValid(req.Config)
	if err != nil {
		return api.Errorf(api.CodeDecodingFailure, "GC's list of valid attachments cannot be read", err.Error())
	}
	if !listed {
		// Read as an empty list, a GC that names no attachment would
		// unwire every pod of the network on this node. It succeeds
		// doing nothing instead, and says so once per call: an error
		// would fail the runtime's GC of the whole chain (libcni joins
		// the plugins' errors) over something the runtime cannot change
		// by retrying, while nothing leaks for good without this GC — a
		// DEL still releases each pod, and under Kubernetes
		// vpcni-controller releases the records of pods that are gone.
		a.log.Warn("GC names no valid attachments (neither "+strings.Join(gcKeys, " nor ")+"): releasing nothing", "network", conf.Name)
		return nil
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
			err = a.release(ctx, cur)
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

// gcKeys are the keys a runtime lists GC's still-valid attachments under.
// CNI spec 1.1.0 as first released named the list "cni.dev/attachments"
// (SPEC.md of containernetworking/cni v1.2.0-v1.2.2) while libcni of the
// same releases sent only "cni.dev/valid-attachments" (libcni/api.go,
// GCNetworkList); the spec text was corrected to the latter in v1.2.3
// (containernetworking/cni #1101, #1103), whose libcni sends both. So a
// runtime on libcni v1.2.0-v1.2.2 sends only the second key, and one
// that follows the released spec text only the first.
//
// What the runtimes send today (read from their source, August 2026):
//   - containerd (main, v2.4.0-beta.0-70-g301026e58) sends no CNI GC at
//     all: its CRI plugin talks CNI through go-cni v1.1.13 (vendor/
//     modules.txt:211), which calls libcni's Add, Del, Check and Status
//     (vendor/github.com/containerd/go-cni/namespace.go:41, cni.go:148)
//     and never GCNetworkList.
//   - CRI-O (main, v1.36.0-191-gf954a17e50; since v1.32.0) runs one GC
//     per network at start (server/server.go:283 networkGC ->
//     pkg/config/config.go:2405 -> ocicni v0.5.0 pkg/ocicni/ocicni.go:857
//     GC) through libcni v1.3.0, whose GCNetworkList sends both keys
//     (vendor/github.com/containernetworking/cni/libcni/api.go:823-826).
//     ocicni passes the network's list as GCArgs.ValidAttachments
//     (ocicni.go:884), nil when no pod is on that network: both keys
//     then say null.
//
// libcni sends neither key when its caller passes no GCArgs at all.
var gcKeys = []string{"cni.dev/valid-attachments", "cni.dev/attachments"}

// gcValid reads GC's valid attachments from the network config: the
// union of the lists under either key (an attachment either names is
// kept). listed is false when neither key is there; a key present with
// null is an empty list (every attachment stale), as CRI-O sends it for a
// network without pods.
func gcValid(config []byte) (valid map[string]bool, listed bool, err error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(config, &raw); err != nil {
		return nil, false, err
	}
	valid = map[string]bool{}
	for _, k := range gcKeys {
		v, ok := raw[k]
		if !ok {
			continue
		}
		listed = true
		var list []types.GCAttachment
		if err := json.Unmarshal(v, &list); err != nil {
			return nil, false, fmt.Errorf("%s: %w", k, err)
		}
		for _, at := range list {
			valid[alloc.Key(at.ContainerID, at.IfName)] = true
		}
	}
	return valid, listed, nil
}

// Status says whether an ADD could be served now.
func (a *Agent) Status(_ context.Context, _ *api.CNIRequest) *api.Error {
	ready, reason := a.poolsReady(time.Now())
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
