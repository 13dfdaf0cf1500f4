package agent

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/config"
)

// reservationMap is the cluster's AddressReservations as the agent sees
// them (the real one is an informer cache: internal/k8s/nodeside.Reservations).
type reservationMap struct {
	mu sync.Mutex
	m  map[string]netip.Addr // "namespace/name" → address (invalid: none yet)
}

func (r *reservationMap) set(key string, a netip.Addr) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[key] = a
}

func (r *reservationMap) ReservedAddresses(namespace, name string) ([]netip.Addr, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.m[namespace+"/"+name]
	if !a.IsValid() {
		return nil, ok
	}
	return []netip.Addr{a}, ok
}

// A pod with a reservation: with no address recorded yet it takes any,
// which is then its own (DEL gives it to the provider, not the pool);
// with one recorded it asks for exactly that; a runtime request that
// disagrees is refused; another pod holding the address is a 11 naming
// the reservation; a reservation made after the ADD still sends the
// address back to the provider at DEL. Pods without one are untouched.
func TestReservedAddressFollowsThePod(t *testing.T) {
	n := newNode(t, "10.9.6.0/24", func(c *config.Config) { c.Cooldown.Duration = time.Hour })
	a := n.start()
	res := &reservationMap{m: map[string]netip.Addr{"default/web-0": {}}}
	a.SetReservations(res)
	ctx := context.Background()

	first := a.add(t, "web-0", n.pod("web-0"))
	if r, _ := a.store.Get("web-0", "eth0"); r == nil || !r.Requested {
		t.Fatalf("record %+v: a reserved pod's first address must be the pod's", r)
	}
	if aerr := a.Del(ctx, req("web-0", "")); aerr != nil {
		t.Fatal(aerr)
	}
	if slices.Contains(a.held(t), first) {
		t.Fatalf("provider still holds %s after DEL: a reserved address leaves the node with its pod", first)
	}
	a.checkInvariant(t, n)

	// Recorded (the controller saw its PodAddress): the next ADD, here
	// under a new container ID as a re-created pod has, asks for it.
	res.set("default/web-0", first)
	r := req("web-0b", n.pod("web-0b"))
	r.Args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"
	got, aerr := a.Add(ctx, r)
	if aerr != nil || got.IPs[0].Address.IP.String() != first.String() {
		t.Fatalf("re-created web-0 = %v, %v; want its reserved %s", got, aerr, first)
	}

	// A second live pod of that name (the old one not gone yet, seen
	// from another attachment) never gets the address: 11, nothing taken.
	r2 := req("web-0c", n.pod("web-0c"))
	r2.Args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0"
	if _, aerr := a.Add(ctx, r2); aerr == nil || aerr.Code != api.CodeTryAgainLater || !strings.Contains(aerr.Msg, "AddressReservation") {
		t.Errorf("second web-0 while the first holds %s = %v, want code 11 naming the reservation", first, aerr)
	}
	if rec, _ := a.store.Get("web-0c", "eth0"); rec != nil {
		t.Errorf("refused ADD left a record %+v", rec)
	}
	// A runtime request that disagrees with the reservation.
	r3 := reqIP("web-0d", n.pod("web-0d"), "IP=10.9.6.200")
	r3.Args = "K8S_POD_NAMESPACE=default;K8S_POD_NAME=web-0;IP=10.9.6.200"
	if _, aerr := a.Add(ctx, r3); aerr == nil || aerr.Code != api.CodeInvalidEnv {
		t.Errorf("IP=10.9.6.200 against the reservation of %s = %v, want code 4", first, aerr)
	}
	if aerr := a.Del(ctx, req("web-0b", "")); aerr != nil {
		t.Fatal(aerr)
	}

	// A pod without a reservation keeps the node's rules: its address
	// goes back to the pool and cools there.
	plain := a.add(t, "db-0", n.pod("db-0"))
	if r, _ := a.store.Get("db-0", "eth0"); r.Requested {
		t.Errorf("db-0 has no reservation, yet its record says requested")
	}
	// Reserved after its ADD (the controller lagged): DEL still hands it
	// to the provider, else the next node could never have it.
	late := a.add(t, "web-1", n.pod("web-1"))
	res.set("default/web-1", late)
	for _, id := range []string{"db-0", "web-1"} {
		if aerr := a.Del(ctx, req(id, "")); aerr != nil {
			t.Fatal(aerr)
		}
	}
	held := a.held(t)
	if !slices.Contains(held, plain) {
		t.Errorf("db-0's %s left the node: only reserved addresses do", plain)
	}
	if slices.Contains(held, late) {
		t.Errorf("web-1's %s, reserved after its ADD, still held after DEL", late)
	}
	a.checkInvariant(t, n)
}
