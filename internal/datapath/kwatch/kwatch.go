// Package kwatch tells the agent, within milliseconds, that something may
// have taken a piece of vpcni's datapath off the node: it subscribes to the
// kernel's change notifications in the node namespace (links, routes,
// neighbours, policy rules, nftables) and calls back for the changes that
// can break what vpcni made. It repairs nothing itself: the callback asks
// for a reconcile, which compares the whole node with what should be there
// — so a notification missed (a full socket buffer) costs only time, until
// the agent's periodic reconcile.
//
// What counts, by vpcni's own marks (every mode uses them):
//   - a link whose alias starts with "vpcni:", or the uplink: deleted, or
//     seen up and now down, or moved to another master; a port of such a
//     link (the uplink in vpcni's bridge) taken off it or deleted;
//   - a route deleted with vpcni's protocol (0xa7), or from a table other
//     than main and local (a secondary NIC's table);
//   - a proxy neighbour entry gone (vpcni answers ARP and NDP for its
//     pods). The kernel sends no notification for proxy entries of either
//     family (none on 6.18, measured with `ip monitor neigh`), so the
//     watch polls them: one dump of proxy entries every ProxyPoll,
//     microseconds of work;
//   - any IPv4 policy rule deleted (rules are few and rarely change);
//   - a tc filter or qdisc deleted on such a link (mode ebpf's programs
//     hang off the uplink's and the host veths' ingress);
//   - a table, chain, set or rule deleted in an nftables table whose name
//     starts with "vpcni". (Set elements carry no table in their
//     notification; their loss waits for the timer.)
//
// vpcni's own deletions (a pod's DEL) are reported too; the reconcile they
// cause finds nothing to do. The caller bounds how often it reconciles.
package kwatch

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/google/nftables"
	mnl "github.com/mdlayher/netlink"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/datapath"
)

// routeProtocol marks the routes vpcni installs (veth and svcpath use it).
const routeProtocol = 0xa7

// tablePrefix starts the name of every nftables table vpcni makes.
const tablePrefix = "vpcni"

// Watch subscribes in the calling thread's network namespace (the node's)
// and calls kick with a short description of every relevant change until
// ctx ends. It returns once the subscriptions are open; an error names
// those that failed to open (the others run: the watch is partial, not
// off); a subscription that breaks later (its socket
// overflowed, ENOBUFS) is opened again, after a kick — what it missed may
// have mattered. kick runs on the watch's own goroutines and must not
// block. uplink is the node interface pods reach the network through.
func Watch(ctx context.Context, uplink string, kick func(what string)) error {
	w := &watcher{uplink: uplink, kick: kick, links: map[int]linkState{}}
	// A burst (a node's pods deleted at once) must not overflow the
	// sockets: that costs a resubscription.
	const rcvbuf = 4 << 20
	// The nftables connection is told which namespace to watch rather
	// than left to whichever thread it dials from.
	here, err := netns.Get()
	if err != nil {
		return fmt.Errorf("this thread's network namespace: %w", err)
	}
	go func() {
		<-ctx.Done()
		here.Close()
	}()
	err = errors.Join(
		keep(ctx, w, "links", func(ch chan netlink.LinkUpdate, done <-chan struct{}, cb func(error)) error {
			// ListExisting: the links' current state, so that "was up,
			// now down" is known from the start.
			return netlink.LinkSubscribeWithOptions(ch, done, netlink.LinkSubscribeOptions{ListExisting: true, ErrorCallback: cb, ReceiveBufferSize: rcvbuf, ReceiveBufferForceSize: true})
		}, w.link),
		keep(ctx, w, "routes", func(ch chan netlink.RouteUpdate, done <-chan struct{}, cb func(error)) error {
			return netlink.RouteSubscribeWithOptions(ch, done, netlink.RouteSubscribeOptions{ErrorCallback: cb, ReceiveBufferSize: rcvbuf, ReceiveBufferForceSize: true})
		}, w.route),
		keep(ctx, w, "policy rules", subscribeRules, w.rule),
		keep(ctx, w, "tc", subscribeTC, w.tc),
		keep(ctx, w, "nftables", subscribeNFT(here), w.nft),
	)
	// A socket of its own: opened here, in the namespace watched; the
	// goroutine polling it may run on any thread. Started whatever else
	// failed: each part watches on its own.
	d, derr := newProxyDumper()
	if derr != nil {
		return errors.Join(err, fmt.Errorf("netlink socket for proxy entries: %w", derr))
	}
	go w.pollProxies(ctx, d)
	return err
}

// ProxyPoll is how often the proxy neighbour entries are read.
const ProxyPoll = 50 * time.Millisecond

// pollProxies reports proxy entries that were there at a read and are
// gone at a later one. An entry found gone is asked about again for a few
// reads while it stays gone: put back by the reconcile and taken again
// between two reads, it is never seen present, and would otherwise be
// missed. (A pod deleted for good costs those few extra reconciles, which
// find nothing to do.)
func (w *watcher) pollProxies(ctx context.Context, d *proxyDumper) {
	defer d.close()
	const again = 3
	// Two sets, swapped each read: a poll allocates nothing once they
	// have grown to the node's entries.
	before, now := map[proxyKey]bool{}, map[proxyKey]bool{}
	missing := map[proxyKey]int{} // entry -> reads left to ask about it
	t := time.NewTicker(ProxyPoll)
	defer t.Stop()
	for {
		if err := d.dump(now); err == nil {
			for e := range before {
				if !now[e] {
					missing[e] = again
				}
			}
			var gone *proxyKey
			for e, left := range missing {
				switch {
				case now[e]:
					delete(missing, e)
				default:
					gone = &e
					if missing[e] = left - 1; left <= 1 {
						delete(missing, e)
					}
				}
			}
			if gone != nil {
				w.kick("proxy neighbour " + gone.String() + " gone") // one reconcile looks at all of them
			}
			before, now = now, before
		} // a failed dump (interrupted by a change) is read again next tick
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// keep opens a subscription and reads it until ctx ends, opening it again
// whenever it breaks. open must close ch when the subscription ends.
func keep[T any](ctx context.Context, w *watcher, what string, open func(ch chan T, done <-chan struct{}, onErr func(error)) error, handle func(T)) error {
	// start opens the subscription; release ends it early (it broke).
	start := func() (chan T, func(), error) {
		ch, done := make(chan T, 256), make(chan struct{})
		stop := context.AfterFunc(ctx, func() { close(done) })
		release := func() {
			if stop() {
				close(done)
			}
		}
		if err := open(ch, done, func(error) {}); err != nil {
			release()
			return nil, nil, fmt.Errorf("subscribe to %s changes: %w", what, err)
		}
		return ch, release, nil
	}
	ch, release, err := start()
	if err != nil {
		return err
	}
	go func() {
		for {
			for u := range ch {
				handle(u)
			}
			release()
			if ctx.Err() != nil {
				return
			}
			w.kick(what + " watch broke (notifications may be lost); subscribing again")
			for {
				select {
				case <-ctx.Done():
					return
				case <-time.After(100 * time.Millisecond):
				}
				if ch, release, err = start(); err == nil {
					break
				}
			}
		}
	}()
	return nil
}

// subscribeRules: the netlink library has no rule subscription; rules
// are only watched for deletion, which needs nothing but the header.
func subscribeRules(ch chan uint16, done <-chan struct{}, onErr func(error)) error {
	return subscribeGroup(unix.RTNLGRP_IPV4_RULE, func(m syscall.NetlinkMessage) (uint16, bool) { return m.Header.Type, true })(ch, done, onErr)
}

// subscribeGroup reports the messages of one rtnetlink group that pick
// keeps, as pick turns them, until done.
func subscribeGroup[T any](group uint, pick func(syscall.NetlinkMessage) (T, bool)) func(ch chan T, done <-chan struct{}, _ func(error)) error {
	return func(ch chan T, done <-chan struct{}, _ func(error)) error {
		s, err := nl.Subscribe(unix.NETLINK_ROUTE, group)
		if err != nil {
			return err
		}
		go func() {
			<-done
			s.Close() // ends the Receive below
		}()
		go func() {
			defer close(ch)
			for {
				msgs, _, err := s.Receive()
				if err != nil {
					return
				}
				for _, m := range msgs {
					if v, ok := pick(m); ok {
						ch <- v
					}
				}
			}
		}()
		return nil
	}
}

// tcChange is a tc notification: its type and the link it is about.
type tcChange struct {
	typ     uint16
	ifindex int32
}

// subscribeTC reports tc filter and qdisc deletions by link.
var subscribeTC = subscribeGroup(unix.RTNLGRP_TC, func(m syscall.NetlinkMessage) (tcChange, bool) {
	t := m.Header.Type
	// struct tcmsg: family, 3 bytes of padding, ifindex.
	if (t != unix.RTM_DELTFILTER && t != unix.RTM_DELQDISC) || len(m.Data) < 8 {
		return tcChange{}, false
	}
	return tcChange{typ: t, ifindex: int32(nl.NativeEndian().Uint32(m.Data[4:8]))}, true
})

// subscribeNFT watches deletions only, in the namespace ns: additions
// are vpcni's own or another program's, and neither takes anything from
// vpcni.
func subscribeNFT(ns netns.NsHandle) func(ch chan *nftables.MonitorEvent, done <-chan struct{}, _ func(error)) error {
	return func(ch chan *nftables.MonitorEvent, done <-chan struct{}, _ func(error)) error {
		return monitorNFT(ns, ch, done)
	}
}

func monitorNFT(ns netns.NsHandle, ch chan *nftables.MonitorEvent, done <-chan struct{}) error {
	// A lasting connection, closed here when the subscription ends: the
	// library's monitor does not close its socket when it breaks (a full
	// buffer), so each resubscription would leak one. The buffer is large
	// because every nftables change on the node (kube-proxy's, iptables-
	// nft's) comes through, not only vpcni's.
	conn, err := nftables.New(nftables.WithNetNSFd(int(ns)), nftables.AsLasting(),
		nftables.WithSockOptions(func(c *mnl.Conn) error { return c.SetReadBuffer(4 << 20) }))
	if err != nil {
		return err
	}
	// Every action: the library's filter drops all events for a
	// deletions-only monitor (v0.3.0 tests flags&1<<type, which Go reads
	// as (flags&1)<<type); deletions are picked below.
	mon := nftables.NewMonitor()
	events, err := conn.AddMonitor(mon)
	if err != nil {
		_ = conn.CloseLasting()
		return err
	}
	go func() {
		<-done
		mon.Close() // closes events, if the monitor has not ended already
		_ = conn.CloseLasting()
	}()
	go func() {
		defer close(ch)
		for ev := range events {
			switch ev.Type {
			case nftables.MonitorEventTypeDelTable, nftables.MonitorEventTypeDelChain,
				nftables.MonitorEventTypeDelRule, nftables.MonitorEventTypeDelSet:
			default:
				continue // an addition, or an error the monitor did not handle
			}
			ch <- ev
		}
	}()
	return nil
}

type linkState struct {
	name    string
	watched bool // vpcni's or the uplink
	up      bool
	master  int
}

type watcher struct {
	uplink string
	kick   func(string)
	mu     sync.Mutex
	links  map[int]linkState // every link, last seen
}

func (w *watcher) watched(l netlink.Link) bool {
	a := l.Attrs()
	return strings.HasPrefix(a.Alias, datapath.AliasPrefix) || (w.uplink != "" && a.Name == w.uplink)
}

// link tracks every link's last state, to tell what changed: vpcni's
// links and the uplink matter themselves, any other link as a port of one
// of vpcni's (the uplink taken off vpcni's bridge).
func (w *watcher) link(u netlink.LinkUpdate) {
	// AF_BRIDGE messages are about bridge ports (a "deletion" is a port
	// leaving its bridge); the link's own message says the same.
	if u.Link == nil || u.Family == unix.AF_BRIDGE {
		return
	}
	a := u.Link.Attrs()
	w.mu.Lock()
	defer w.mu.Unlock()
	before, known := w.links[a.Index]
	if u.Header.Type == unix.RTM_DELLINK {
		delete(w.links, a.Index)
		if w.watched(u.Link) || w.links[before.master].watched {
			w.kick(fmt.Sprintf("link %s deleted", a.Name))
		}
		return
	}
	now := linkState{name: a.Name, watched: w.watched(u.Link), up: a.Flags&net.FlagUp != 0, master: a.MasterIndex}
	w.links[a.Index] = now
	switch {
	case !known:
	case now.watched && before.up && !now.up:
		w.kick(fmt.Sprintf("link %s down", a.Name))
	case before.master != now.master && (now.watched || w.links[before.master].watched):
		w.kick(fmt.Sprintf("link %s master %d -> %d", a.Name, before.master, now.master))
	}
}

func (w *watcher) route(u netlink.RouteUpdate) {
	if u.Type != unix.RTM_DELROUTE {
		return
	}
	r := u.Route
	if r.Protocol != routeProtocol && (r.Table == unix.RT_TABLE_MAIN || r.Table == unix.RT_TABLE_LOCAL) {
		return
	}
	w.kick(fmt.Sprintf("route %v table %d deleted", r.Dst, r.Table))
}

func (w *watcher) rule(msgType uint16) {
	if msgType == unix.RTM_DELRULE {
		w.kick("policy rule deleted")
	}
}

func (w *watcher) tc(c tcChange) {
	w.mu.Lock()
	l, known := w.links[int(c.ifindex)]
	w.mu.Unlock()
	if !known || !l.watched {
		return
	}
	what := "filter"
	if c.typ == unix.RTM_DELQDISC {
		what = "qdisc"
	}
	w.kick(fmt.Sprintf("tc %s deleted on %s", what, l.name))
}

func (w *watcher) nft(ev *nftables.MonitorEvent) {
	var table *nftables.Table
	switch d := ev.Data.(type) {
	case *nftables.Table:
		table = d
	case *nftables.Chain:
		table = d.Table
	case *nftables.Rule:
		table = d.Table
	case *nftables.Set:
		table = d.Table
	}
	if table == nil || !strings.HasPrefix(table.Name, tablePrefix) {
		return
	}
	if ev.Type == nftables.MonitorEventTypeDelTable {
		w.kick("nftables table " + table.Name + " deleted")
		return
	}
	w.kick(fmt.Sprintf("nftables %s in table %s deleted", nftKind(ev.Type), table.Name))
}

func nftKind(t nftables.MonitorEventType) string {
	switch t {
	case nftables.MonitorEventTypeDelChain:
		return "chain"
	case nftables.MonitorEventTypeDelRule:
		return "rule"
	case nftables.MonitorEventTypeDelSet:
		return "set"
	}
	return "object"
}
