package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vpcni/vpcni/internal/addresses"
	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/snat"
	"github.com/vpcni/vpcni/internal/store"
)

// Listen opens the agent's unix socket, root-only (0600, in a 0700 dir). A
// socket left by a dead agent is replaced; a live agent's is not.
func Listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("socket dir: %w", err)
	}
	if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
		c.Close()
		return nil, fmt.Errorf("another vpcnid is already listening on %s", path)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("remove stale socket: %w", err)
	}
	old := syscall.Umask(0o177)
	l, err := net.Listen("unix", path)
	syscall.Umask(old)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		l.Close()
		return nil, err
	}
	return l, nil
}

// Handler serves the agent API.
func (a *Agent) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST "+api.PathAdd, a.serveCNI("ADD", func(ctx context.Context, r *api.CNIRequest) (any, *api.Error) {
		res, err := a.Add(ctx, r)
		return res, err
	}))
	mux.HandleFunc("POST "+api.PathDel, a.serveCNI("DEL", noResult(a.Del)))
	mux.HandleFunc("POST "+api.PathCheck, a.serveCNI("CHECK", noResult(a.Check)))
	mux.HandleFunc("POST "+api.PathGC, a.serveCNI("GC", noResult(a.GC)))
	mux.HandleFunc("POST "+api.PathStatus, a.serveCNI("STATUS", noResult(a.Status)))
	mux.HandleFunc("GET "+api.PathState, func(w http.ResponseWriter, r *http.Request) {
		st, err := a.State()
		if err != nil {
			writeError(w, api.Errorf(api.CodeIOFailure, "read agent state", err.Error()))
			return
		}
		writeJSON(w, http.StatusOK, st)
	})
	mux.HandleFunc("GET "+api.PathTrace, func(w http.ResponseWriter, r *http.Request) {
		tr, aerr := a.Trace(r.Context(), r.URL.Query().Get("pod"))
		if aerr != nil {
			writeError(w, aerr)
			return
		}
		writeJSON(w, http.StatusOK, tr)
	})
	return mux
}

func noResult(f func(context.Context, *api.CNIRequest) *api.Error) func(context.Context, *api.CNIRequest) (any, *api.Error) {
	return func(ctx context.Context, r *api.CNIRequest) (any, *api.Error) {
		if err := f(ctx, r); err != nil {
			return nil, err
		}
		return struct{}{}, nil
	}
}

func (a *Agent) serveCNI(verb string, f func(context.Context, *api.CNIRequest) (any, *api.Error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		req, aerr := DecodeRequest(http.MaxBytesReader(w, r.Body, api.MaxRequestBytes))
		var out any
		if aerr == nil {
			out, aerr = f(r.Context(), req)
		}
		result := "ok"
		if aerr != nil {
			result = fmt.Sprint(aerr.Code)
		}
		if a.metrics != nil {
			a.metrics.CNIDuration.WithLabelValues(verb, result).Observe(time.Since(start).Seconds())
		}
		if aerr != nil {
			a.log.Warn("CNI request failed", "verb", verb, "container", containerOf(req), "code", aerr.Code, "err", aerr.Error(), "ms", msSince(start))
			writeError(w, aerr)
			return
		}
		a.log.Debug("CNI request", "verb", verb, "container", containerOf(req), "ms", msSince(start))
		writeJSON(w, http.StatusOK, out)
	}
}

// DecodeRequest reads one API request strictly: unknown fields, trailing
// data and a missing config are errors. A body cut off by
// http.MaxBytesReader is refused as too large, naming the limit.
func DecodeRequest(body io.Reader) (*api.CNIRequest, *api.Error) {
	// Invalid config (7), not a decoding failure: nearly all of a request
	// is the network configuration, and no retry makes it fit.
	tooLarge := func(err error) *api.Error {
		var mbe *http.MaxBytesError
		if !errors.As(err, &mbe) {
			return nil
		}
		return api.Errorf(api.CodeInvalidConfig,
			fmt.Sprintf("vpcnid request too large: over the limit of %d bytes", mbe.Limit),
			"the network configuration is too big; shorten it")
	}
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	req := &api.CNIRequest{}
	if err := dec.Decode(req); err != nil {
		if aerr := tooLarge(err); aerr != nil {
			return nil, aerr
		}
		return nil, api.Errorf(api.CodeDecodingFailure, "malformed vpcnid request", err.Error())
	}
	// More() misses a stray '}' or ']': only the end of the input will do.
	if _, err := dec.Token(); err != io.EOF {
		if aerr := tooLarge(err); aerr != nil {
			return nil, aerr
		}
		return nil, api.Errorf(api.CodeDecodingFailure, "malformed vpcnid request", "data after the request object")
	}
	if len(req.Config) == 0 || string(req.Config) == "null" {
		return nil, api.Errorf(api.CodeDecodingFailure, "malformed vpcnid request", "no network configuration")
	}
	return req, nil
}

func containerOf(r *api.CNIRequest) string {
	if r == nil {
		return ""
	}
	return r.ContainerID
}

func msSince(t time.Time) float64 { return float64(time.Since(t).Microseconds()) / 1000 }

func writeError(w http.ResponseWriter, e *api.Error) {
	status := http.StatusInternalServerError
	switch e.Code {
	case api.CodeInvalidEnv, api.CodeInvalidConfig, api.CodeDecodingFailure, api.CodeUnsupportedField, api.CodeIncompatibleVersion:
		status = http.StatusBadRequest
	case api.CodeUnknownContainer:
		status = http.StatusNotFound
	case api.CodeTryAgainLater, api.CodeNotAvailable, api.CodeLimitedConnectivity:
		status = http.StatusServiceUnavailable
	}
	writeJSON(w, status, e)
}

// writeJSON answers with a Content-Length, never chunked: the plugin's
// minimal client relies on it.
func writeJSON(w http.ResponseWriter, status int, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		status, data = http.StatusInternalServerError, []byte(`{"code":999,"msg":"encode answer"}`)
	}
	data = append(data, '\n')
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(data)))
	w.WriteHeader(status)
	_, _ = w.Write(data)
}

// State describes the agent for vpcnictl status. It changes nothing.
func (a *Agent) State() (*api.State, error) {
	records, err := a.store.List()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	s := a.addrs.Status(now)
	dp := a.dp.Info()
	st := &api.State{
		Node: a.cfg.NodeName, Ready: s.Ready, Reason: s.Reason, Degraded: s.Degraded,
		Provider: a.cfg.Provider.Type, ProviderPort: s.Provider.Port, ProviderSubnet: s.Provider.Subnet, Datapath: dp.Mode, Uplink: dp.Uplink, MTU: dp.MTU,
		Pool:        poolState(s),
		Allocations: make([]alloc.Allocation, 0, len(records)),
		Health:      a.Health(),
		StartedAt:   a.started.UTC().Format(time.RFC3339),
		StoreSchema: store.Schema,
	}
	if f, ok := a.dp.(fastPather); ok {
		st.FastPath = "on"
		switch fp := f.FastPath(); {
		case !fp.Active:
			st.FastPath = "off: " + fp.Reason
		case fp.Note != "":
			st.FastPath = "on " + fp.Note
		}
	}
	for _, r := range records {
		st.Allocations = append(st.Allocations, *r)
	}
	if fams := a.cfg.Families(); len(fams) > 1 {
		st.Ready, st.Reason = a.poolsReady(now)
		for _, f := range fams {
			fs := a.fams[f].Status(now)
			ps := poolState(fs)
			ps.Family = f.String()
			st.Families = append(st.Families, ps)
			st.Degraded = st.Degraded || fs.Degraded
		}
		st.Pool.Family = fams[0].String()
	}
	pools := a.netPools()
	for _, name := range slices.Sorted(maps.Keys(pools)) {
		ns := pools[name].Status(now)
		st.PodNetworks = append(st.PodNetworks, api.PodNetworkState{Name: name, Ready: ns.Ready, Reason: ns.Reason,
			Source: ns.Provider.Subnet, Pool: poolState(ns)})
	}
	return st, nil
}

// poolState is a pool's status as /v1/state tells it.
func poolState(s addresses.Status) api.PoolState {
	byState := map[string][]string{}
	for st, ips := range s.Addresses {
		for _, ip := range ips {
			byState[st] = append(byState[st], ip.String())
		}
	}
	return api.PoolState{Free: s.Free, Cooling: s.Cooling, Allocated: s.Allocated, Aside: s.Aside, Leaving: s.Leaving, Capacity: s.Provider.Capacity,
		CapacityReason: s.Provider.CapacityReason, WarmTarget: s.WarmTarget, Waiting: s.Waiting, Addresses: byState, ProviderCalls: s.Provider.Calls}
}

// Trace is the path of pod ("namespace/name") through this node: for each
// of its attachments the datapath's pieces (node and pod side) and the
// cloud's (the address on the provider's port, read now).
func (a *Agent) Trace(ctx context.Context, pod string) (*api.Trace, *api.Error) {
	ns, name, ok := strings.Cut(pod, "/")
	if !ok || ns == "" || name == "" {
		return nil, api.Errorf(api.CodeInvalidEnv, "trace: pod must be namespace/name", fmt.Sprintf("got %q", pod))
	}
	records, err := a.store.List()
	if err != nil {
		return nil, api.Errorf(api.CodeIOFailure, "read agent state", err.Error())
	}
	info := a.dp.Info()
	tr := &api.Trace{Pod: pod, Node: a.cfg.NodeName, Datapath: info.Mode, Provider: a.cfg.Provider.Type}
	if info.NodeIP.IsValid() {
		tr.NodeIP = info.NodeIP.String()
	}
	for _, r := range records {
		if r.PodNamespace != ns || r.PodName != name {
			continue
		}
		a.wiring.RLock() // not while a reconcile rewrites the node side
		hops := a.dp.Trace(ctx, r)
		a.wiring.RUnlock()
		if a.snat != nil {
			hops = append(hops, a.snatHop(ctx, r.Address))
		}
		hops = append(hops, a.cloudHop(ctx, r))
		tr.Attachments = append(tr.Attachments, api.TraceAttachment{ContainerID: r.ContainerID, IfName: r.IfName, Address: r.Address.String(),
			PodNetwork: r.PodNetwork, Hops: hops})
	}
	if len(tr.Attachments) == 0 {
		return nil, api.Errorf(api.CodeUnknownContainer, "trace: this node's agent has no address for pod "+pod,
			"is the pod on this node (kubectl get pod -o wide) and on vpcni's network?")
	}
	return tr, nil
}

// cloudHop is the address as the cloud holds it for this node.
func (a *Agent) cloudHop(ctx context.Context, r *alloc.Allocation) api.Hop {
	addr := r.Address
	held, where, err := a.pool(r).CloudHolds(ctx, addr)
	what := fmt.Sprintf("%s held by provider %s", addr, a.cfg.Provider.Type)
	if r.PodNetwork != "" {
		what += " for PodNetwork " + r.PodNetwork
	}
	if where != "" {
		what += " on port " + where
	}
	switch {
	case err != nil:
		return api.Hop{Where: api.HopCloud, What: what, State: api.HopWrong, Detail: "cannot read the cloud: " + err.Error(),
			Fix: "check the provider's endpoint and credentials (vpcnictl status; the agent's log)"}
	case !held:
		return api.Hop{Where: api.HopCloud, What: what, State: api.HopMissing, Detail: fmt.Sprintf("the provider does not hold %s for this node", addr),
			Fix: "the agent asks the cloud for it again at its next resync (vpcnid.yaml resync, default 1m); if someone else took it, its log says so and the pod must be re-created"}
	}
	return api.Hop{Where: api.HopCloud, What: what, State: api.HopOK}
}

// snatHop is the pod's address in the node's SNAT table (snat.enabled):
// traffic leaving the VPC from it is masqueraded to the node's address.
func (a *Agent) snatHop(ctx context.Context, addr netip.Addr) api.Hop {
	what := fmt.Sprintf("SNAT: %s in nftables set ip %s pods", addr, snat.Table)
	in, err := a.snat.HasPod(ctx, addr)
	switch {
	case err != nil:
		return api.Hop{Where: api.HopNode, What: what, State: api.HopWrong, Detail: err.Error(), Fix: datapath.FixNode}
	case !in:
		return api.Hop{Where: api.HopNode, What: what, State: api.HopMissing,
			Detail: fmt.Sprintf("%s is not in the SNAT table's pods set: its traffic beyond the VPC leaves with the pod's own address", addr), Fix: datapath.FixNode}
	}
	return api.Hop{Where: api.HopNode, What: what, State: api.HopOK}
}
