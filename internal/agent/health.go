package agent

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/icmp"
	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/family"
)

// health keeps the last probe of every pod's datapath.
type health struct {
	mu     sync.Mutex
	byKey  map[string]api.PodHealth
	failed map[string]bool // unhealthy at the last probe: logged once
}

// Health returns the last probe of each allocation, by key.
func (a *Agent) Health() map[string]api.PodHealth {
	a.health.mu.Lock()
	defer a.health.mu.Unlock()
	out := make(map[string]api.PodHealth, len(a.health.byKey))
	for k, v := range a.health.byKey {
		out[k] = v
	}
	return out
}

// healthLoop probes every pod's datapath each health.interval: the mode's
// Check (node route, neighbour entry, links, the pod's own addresses and
// routes) and, if configured, an ICMP echo from the node. It repairs
// nothing — the self-healing reconcile does, and a pod broken inside its
// namespace is re-wired by its next ADD or an agent restart — it tells.
func (a *Agent) healthLoop(ctx context.Context) {
	every := a.cfg.Health.Interval.Duration
	if every == 0 {
		return
	}
	// The first probe once the pods recorded at start are checked.
	select {
	case <-ctx.Done():
		return
	case <-a.restored:
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		a.probeAll(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// probeAll probes every recorded, ready allocation this node owns once.
func (a *Agent) probeAll(ctx context.Context) {
	records, err := a.store.List()
	if err != nil {
		a.log.Warn("health probe: cannot read the records", "err", err)
		return
	}
	results := map[string]api.PodHealth{}
	var ping []*alloc.Allocation
	for _, r := range records {
		if ctx.Err() != nil {
			return
		}
		if !r.Ready || !a.owns(r) {
			continue // an ADD under way, or a record in conflict
		}
		h := api.PodHealth{Healthy: true}
		if err := a.checkOne(ctx, r); err != nil {
			if errors.Is(err, errGone) {
				continue
			}
			h = api.PodHealth{Problem: err.Error()}
		} else if a.cfg.Health.Ping {
			ping = append(ping, r)
		}
		h.CheckedAt = time.Now().UTC().Format(time.RFC3339)
		results[r.Key()] = h
	}
	if len(ping) > 0 {
		var addrs []netip.Addr
		for _, r := range ping {
			addrs = append(addrs, r.Addresses()...)
		}
		rtts, err := pingAll(addrs, a.cfg.Health.PingTimeout.Duration)
		for _, r := range ping {
			h := results[r.Key()]
			// Every address of the pod answers, or it is not healthy: a
			// dual-stack pod reachable by one family alone is broken.
			for _, addr := range r.Addresses() {
				switch rtt, ok := rtts[addr]; {
				case err != nil:
					h.Healthy, h.Problem = false, "ping: "+err.Error()
				case !ok:
					h.Healthy, h.Problem = false, fmt.Sprintf("no ICMP echo reply from %s within %s", addr, a.cfg.Health.PingTimeout.Duration)
				case h.Healthy:
					h.PingMicros = max(h.PingMicros, rtt.Microseconds(), 1)
				}
				if !h.Healthy {
					h.PingMicros = 0
					break
				}
			}
			results[r.Key()] = h
		}
	}
	a.recordHealth(results)
}

var errGone = errors.New("gone")

// checkOne runs the mode's check of one allocation, under its lock so that
// no ADD or DEL of it runs meanwhile.
func (a *Agent) checkOne(ctx context.Context, r *alloc.Allocation) error {
	unlock := a.locks.Lock(r.Key())
	defer unlock()
	cur, err := a.store.Get(r.ContainerID, r.IfName)
	if err != nil || cur == nil || !cur.Created.Equal(r.Created) {
		return errGone // deleted or replaced since the list
	}
	a.wiring.RLock()
	defer a.wiring.RUnlock()
	_, err = a.dp.Check(ctx, cur)
	return err
}

// recordHealth keeps the results, sets the gauges and logs each pod that
// turned unhealthy (once) and each that recovered.
func (a *Agent) recordHealth(results map[string]api.PodHealth) {
	// The cluster hears of pods that turned unhealthy after the lock is
	// let go: /v1/state and the readiness probe read the results under it.
	turned := map[string]string{}
	defer func() {
		for key, problem := range turned {
			a.unhealthy(key, problem)
		}
	}()
	a.health.mu.Lock()
	defer a.health.mu.Unlock()
	if a.health.failed == nil {
		a.health.failed = map[string]bool{}
	}
	healthy, unhealthy := 0, 0
	for key, h := range results {
		if h.Healthy {
			healthy++
			if a.health.failed[key] {
				a.log.Info("pod datapath healthy again", "attachment", key)
				delete(a.health.failed, key)
			}
			continue
		}
		unhealthy++
		if !a.health.failed[key] {
			a.log.Warn("pod datapath unhealthy", "attachment", key, "problem", h.Problem)
			a.health.failed[key] = true
			turned[key] = h.Problem
		}
	}
	for key := range a.health.failed {
		if _, ok := results[key]; !ok {
			delete(a.health.failed, key) // the pod is gone
		}
	}
	a.health.byKey = results
	a.metrics.PodHealth.WithLabelValues("healthy").Set(float64(healthy))
	a.metrics.PodHealth.WithLabelValues("unhealthy").Set(float64(unhealthy))
}

// unhealthy tells the cluster of a pod whose datapath turned unhealthy.
func (a *Agent) unhealthy(key, problem string) {
	if a.cluster == nil {
		return
	}
	cid, ifName, _ := strings.Cut(key, "/")
	if r, err := a.store.Get(cid, ifName); err == nil && r != nil && r.PodName != "" {
		a.cluster.Unhealthy(r.PodNamespace, r.PodName, problem)
	}
}

// pingAll sends one ICMP echo from the node to every address, on one raw
// socket per family, and waits up to timeout for the replies: round trips
// by address (missing: no reply). Echo IDs are this process's, sequence
// numbers the index, so replies to another prober are ignored.
func pingAll(addrs []netip.Addr, timeout time.Duration) (map[netip.Addr]time.Duration, error) {
	var v4, v6 []netip.Addr
	for _, a := range addrs {
		if family.Of(a) == family.V6 {
			v6 = append(v6, a)
		} else {
			v4 = append(v4, a)
		}
	}
	out := map[netip.Addr]time.Duration{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, set := range [][]netip.Addr{v4, v6} {
		if len(set) == 0 {
			continue
		}
		wg.Go(func() {
			got, err := pingFamily(family.Of(set[0]), set, timeout)
			mu.Lock()
			defer mu.Unlock()
			maps.Copy(out, got)
			errs[i] = err
		})
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// pingFamily is pingAll for addresses of one family.
func pingFamily(f family.Family, addrs []netip.Addr, timeout time.Duration) (map[netip.Addr]time.Duration, error) {
	network, listen, proto := "ip4:icmp", "0.0.0.0", 1
	var echoType, replyType icmp.Type = ipv4.ICMPTypeEcho, ipv4.ICMPTypeEchoReply
	if f == family.V6 {
		network, listen, proto = "ip6:ipv6-icmp", "::", 58
		echoType, replyType = ipv6.ICMPTypeEchoRequest, ipv6.ICMPTypeEchoReply
	}
	c, err := icmp.ListenPacket(network, listen)
	if err != nil {
		return nil, fmt.Errorf("%s ICMP socket (needs CAP_NET_RAW): %w", f, err)
	}
	defer c.Close()
	id := os.Getpid() & 0xffff
	sent := make([]time.Time, len(addrs))
	for i, addr := range addrs {
		// The kernel computes an ICMPv6 checksum on a raw socket itself.
		msg := icmp.Message{Type: echoType, Body: &icmp.Echo{ID: id, Seq: i, Data: []byte("vpcni-health")}}
		b, err := msg.Marshal(nil)
		if err != nil {
			return nil, err
		}
		sent[i] = time.Now()
		if _, err := c.WriteTo(b, &net.IPAddr{IP: addr.AsSlice()}); err != nil {
			continue // no route, say: no reply, reported as such
		}
	}
	out := map[netip.Addr]time.Duration{}
	_ = c.SetReadDeadline(time.Now().Add(timeout))
	buf := make([]byte, 1500)
	for len(out) < len(addrs) {
		n, from, err := c.ReadFrom(buf)
		if err != nil {
			break // the deadline: whatever did not answer has no entry
		}
		msg, err := icmp.ParseMessage(proto, buf[:n])
		if err != nil || msg.Type != replyType {
			continue
		}
		echo, ok := msg.Body.(*icmp.Echo)
		if !ok || echo.ID != id || echo.Seq < 0 || echo.Seq >= len(addrs) {
			continue
		}
		src, _ := netip.AddrFromSlice(from.(*net.IPAddr).IP)
		if src = src.Unmap(); src != addrs[echo.Seq] {
			continue
		}
		out[src] = time.Since(sent[echo.Seq])
	}
	return out, nil
}
