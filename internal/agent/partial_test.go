package agent

// The agent under partial failure: an address the datapath cannot wire,
// a requested address whose give-back fails across a restart.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/static"
)

// refusingRelease makes the "refusing" provider's Release fail: a cloud
// that will not let the node's addresses go (a floating IP points at
// them, the API is down for writes).
var refusingRelease atomic.Bool

// refusing is the static provider whose Release fails while
// refusingRelease is set.
type refusing struct{ provider.Provider }

func (r refusing) Release(ctx context.Context, addrs []netip.Addr) error {
	if refusingRelease.Load() {
		return errors.New("the cloud refuses the update")
	}
	return r.Provider.Release(ctx, addrs)
}

func init() {
	registerWrapped("refusing", func(p provider.Provider, _ provider.Node) provider.Provider { return refusing{p} })
}

// registerWrapped registers, for the agent's tests, the static provider
// wrapped by wrap under name.
func registerWrapped(name string, wrap func(provider.Provider, provider.Node) provider.Provider) {
	provider.Register(provider.Registration{
		Name:        name,
		NewSettings: func() provider.Settings { return &static.Config{} },
		New: func(ctx context.Context, node provider.Node, s provider.Settings) (provider.Provider, error) {
			r, err := provider.Lookup("static")
			if err != nil {
				return nil, err
			}
			p, err := r.New(ctx, node, s)
			if err != nil {
				return nil, err
			}
			return wrap(p, node), nil
		},
	})
}

// An address the datapath cannot wire does not block the node: the ADD
// after a failed one gets another address, and an address that keeps
// failing is set aside (held, handed to nobody) and reported.
func TestUnwirableAddressDoesNotBlockTheNode(t *testing.T) {
	n := newNode(t, "10.9.31.0/28")
	var told *warnings
	a := n.startWith(func(a *Agent) Cluster { told = &warnings{clusterLog: clusterLog{a: a}}; return told })
	ctx := context.Background()
	bad := netip.MustParseAddr("10.9.31.2") // the first address the pool hands out
	n.dp.FailAddress(bad, errors.New("the NIC for this address never appeared"))
	failures, lastFailed := 0, false
	for i := range 40 {
		id := fmt.Sprintf("c%d", i)
		res, aerr := a.Add(ctx, req(id, n.pod(id)))
		if aerr != nil {
			if lastFailed {
				t.Fatalf("ADD %s failed right after another failed ADD (%v): the unwirable address was tried first again", id, aerr)
			}
			failures++
			lastFailed = true
			continue
		}
		lastFailed = false
		if got := res.IPs[0].Address.IP.String(); got == bad.String() {
			t.Fatalf("ADD %s wired %s, which the datapath refuses", id, got)
		}
		// The pod leaves: its address goes back, last in line.
		if aerr := a.Del(ctx, req(id, "")); aerr != nil {
			t.Fatal(aerr)
		}
		if slices.Contains(a.addrs.Status(time.Now()).Addresses["aside"], bad) {
			break
		}
	}
	if failures == 0 {
		t.Fatalf("no ADD got %s: the test did not show anything", bad)
	}
	st := a.addrs.Status(time.Now())
	if !slices.Contains(st.Addresses["aside"], bad) {
		t.Fatalf("%s failed %d times and is not set aside: %v", bad, failures, st.Addresses)
	}
	if failures > 3 {
		t.Errorf("%s was tried %d times before it was set aside", bad, failures)
	}
	if heard := told.heard(); len(heard) != 1 || !strings.HasPrefix(heard[0], "VpcniAddressSetAside: address "+bad.String()) {
		t.Errorf("the cluster heard %q, want one VpcniAddressSetAside warning for %s", heard, bad)
	}
	a.checkInvariant(t, n)
}

// A requested address whose give-back to the cloud failed stays the
// pod's across an agent restart: the restarted agent gives it back and
// never hands it to another pod meanwhile (the pod that owns it would
// get "try again later" on every node for as long as it lives).
func TestLeavingAddressSurvivesARestart(t *testing.T) {
	t.Cleanup(func() { refusingRelease.Store(false) })
	n := newNode(t, "10.9.32.0/29", func(c *config.Config) { // .2-.6
		c.Provider = config.Provider{Type: "refusing", Settings: &static.Config{Ranges: []static.Range{{CIDR: "10.9.32.0/29"}}}}
		c.Pool.WarmTarget, c.Pool.BatchSize = 1, 1
		c.Resync.Duration = time.Second
	})
	a := n.start()
	ctx := context.Background()
	sticky := netip.MustParseAddr("10.9.32.6")
	if _, aerr := a.Add(ctx, reqIP("s1", n.pod("s1"), "IP="+sticky.String())); aerr != nil {
		t.Fatal(aerr)
	}
	refusingRelease.Store(true)
	if aerr := a.Del(ctx, req("s1", "")); aerr != nil {
		t.Fatal(aerr)
	}
	if !slices.Contains(a.held(t), sticky) {
		t.Fatalf("the provider let go of %s while it refused releases", sticky)
	}
	a.stop()
	a = n.start()
	a.waitSynced(t)
	// Every other address goes to a pod; the leaving one to none.
	for i := range 5 {
		id := fmt.Sprintf("p%d", i)
		res, aerr := a.Add(ctx, req(id, n.pod(id)))
		if aerr != nil {
			continue
		}
		if got := res.IPs[0].Address.IP.String(); got == sticky.String() {
			t.Fatalf("after a restart %s, still leaving, went to %s", sticky, id)
		}
	}
	if state := pooledAs(a, sticky); state != "" {
		t.Fatalf("after a restart the pool counts %s as %s", sticky, state)
	}
	refusingRelease.Store(false)
	for deadline := time.Now().Add(8 * time.Second); slices.Contains(a.held(t), sticky); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("%s not given back once the cloud lets it go", sticky)
		}
	}
	a.checkInvariant(t, n)
}

// An agent that dies after the provider gave a requested address to the
// node but before the ADD recorded its pod gives the address back at its
// next start: it is the pod's (retried maybe on another node), never a
// free address of this node's for another pod to take.
func TestRequestedAddressOfAnUnrecordedAddLeaves(t *testing.T) {
	n := newNode(t, "10.9.33.0/29", func(c *config.Config) { // .2-.6
		c.Pool.WarmTarget, c.Pool.BatchSize = 1, 1
		c.Resync.Duration = time.Second
	})
	a := n.start()
	sticky := netip.MustParseAddr("10.9.33.6")
	// The ADD's allocation, then the agent dies before the record.
	if _, err := a.addrs.TakeAddress(context.Background(), "s1/eth0", sticky); err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(a.held(t), sticky) {
		t.Fatalf("the provider does not hold %s after TakeAddress", sticky)
	}
	a.stop()
	a = n.start()
	a.waitSynced(t)
	for deadline := time.Now().Add(8 * time.Second); slices.Contains(a.held(t), sticky); time.Sleep(10 * time.Millisecond) {
		if state := pooledAs(a, sticky); state != "" {
			t.Fatalf("after a restart the pool counts the unrecorded pod's %s as %s", sticky, state)
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not given back after the restart", sticky)
		}
	}
	a.checkInvariant(t, n)
}

// pooledAs says in which state the pool has ip to hand out to a pod
// (free, cooling, allocated), "" if in none of them.
func pooledAs(a *running, ip netip.Addr) string {
	for _, state := range []string{"free", "cooling", "allocated"} {
		if slices.Contains(a.addrs.Status(time.Now()).Addresses[state], ip) {
			return state
		}
	}
	return ""
}
