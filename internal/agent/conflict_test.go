package agent

import (
	"context"
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/store"
)

// conflictNode starts an agent on a store with two records for one
// address, each with a link of its own (the node's kernel as a copied
// store or a bug would leave it), and returns the agent, the address, the
// record the pool gave it to and the other one.
func conflictNode(t *testing.T, cidr string) (n *node, a *running, ip netip.Addr, holder, loser string) {
	t.Helper()
	n = newNode(t, cidr)
	st, err := store.Open(n.cfg.StateDir)
	if err != nil {
		t.Fatal(err)
	}
	ip = netip.MustParsePrefix(cidr).Addr().Next().Next().Next()
	created := time.Now().UTC()
	for _, id := range []string{"first", "second"} {
		netns := n.pod(id)
		if err := st.Put(&alloc.Allocation{ContainerID: id, IfName: "eth0", Network: "vpcni", Netns: netns,
			PodNamespace: "default", PodName: id, Lease: alloc.Lease{Address: ip}, Created: created}); err != nil {
			t.Fatal(err)
		}
		n.dp.Orphan(id+"/eth0", netns, ip)
	}
	st.Close()
	a = n.start()
	a.waitRestored(t)
	for _, k := range []string{"first/eth0", "second/eth0"} {
		if a.addrs.Owns(k, ip) {
			holder = k
		} else {
			loser = k
		}
	}
	if holder == "" || loser == "" || !n.dp.Wired(holder, ip) {
		t.Fatalf("holder %q, loser %q, links %v: want the pool's holder wired", holder, loser, n.dp.Links())
	}
	return n, a, ip, holder, loser
}

// Releasing the loser of two records for one address — by DEL, by GC, by
// the controller — drops its record and its own link, and nothing of the
// holder's: its wiring (the address's proxy entry, which a teardown of
// the loser would take), its record, its address (neither pooled nor
// cooling).
func TestConflictingRecordReleasedAlone(t *testing.T) {
	cases := []struct {
		name    string
		release func(t *testing.T, a *running, loser, holder string)
	}{
		{"DEL", func(t *testing.T, a *running, loser, _ string) {
			cid, _, _ := strings.Cut(loser, "/")
			if aerr := a.Del(context.Background(), req(cid, "")); aerr != nil {
				t.Fatalf("DEL %s: %v", loser, aerr)
			}
		}},
		{"GC", func(t *testing.T, a *running, _, holder string) {
			cid, _, _ := strings.Cut(holder, "/")
			conf, _ := json.Marshal(map[string]any{"cniVersion": "1.1.0", "name": "vpcni",
				"cni.dev/valid-attachments": []map[string]string{{"containerID": cid, "ifname": "eth0"}}})
			if aerr := a.GC(context.Background(), &api.CNIRequest{Config: conf}); aerr != nil {
				t.Fatalf("GC: %v", aerr)
			}
		}},
		{"controller release", func(t *testing.T, a *running, loser, _ string) {
			cid, ifName, _ := strings.Cut(loser, "/")
			rec, err := a.store.Get(cid, ifName)
			if err != nil || rec == nil {
				t.Fatalf("record of %s: %v %v", loser, rec, err)
			}
			if err := a.Release(cid, ifName, rec.Created, "test"); err != nil {
				t.Fatalf("release %s: %v", loser, err)
			}
		}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n, a, ip, holder, loser := conflictNode(t, []string{"10.9.9.0/24", "10.9.10.0/24", "10.9.11.0/24"}[i])
			tc.release(t, a, loser, holder)
			if !n.dp.Wired(holder, ip) {
				t.Errorf("releasing %s unwired %s, which holds %s", loser, holder, ip)
			}
			cid, ifName, _ := strings.Cut(loser, "/")
			if r, _ := a.store.Get(cid, ifName); r != nil {
				t.Errorf("the record of %s is still there", loser)
			}
			hid, hif, _ := strings.Cut(holder, "/")
			if r, _ := a.store.Get(hid, hif); r == nil || r.Address != ip {
				t.Errorf("the record of %s is gone or changed: %+v", holder, r)
			}
			if !a.addrs.Owns(holder, ip) {
				t.Errorf("the pool no longer gives %s to %s", ip, holder)
			}
			cooling, err := a.store.Cooling()
			if err != nil {
				t.Fatal(err)
			}
			if _, ok := cooling[ip]; ok {
				t.Errorf("%s, which %s holds, is recorded as cooling", ip, holder)
			}
			// The loser's own link goes with the next reconcile; the
			// holder's pieces stay.
			waitUntil(t, "the loser's link removed", func() bool { return slices.Equal(n.dp.Links(), []string{holder}) })
			if !n.dp.Wired(holder, ip) {
				t.Errorf("after the reconcile %s is not wired", holder)
			}
			if got := a.add(t, "next", n.pod("next")); got == ip {
				t.Errorf("%s handed to a new pod while %s holds it", ip, holder)
			}
			a.checkInvariant(t, n)
		})
	}
}

// A repeated ADD of the loser is refused and wires nothing: wiring it
// would take the address from the holder's pod.
func TestConflictingRecordNotRewired(t *testing.T) {
	n, a, ip, holder, loser := conflictNode(t, "10.9.12.0/24")
	n.dp.DropLink(loser) // its check then fails, and a re-wire would follow
	cid, _, _ := strings.Cut(loser, "/")
	_, aerr := a.Add(context.Background(), req(cid, n.pod(cid)))
	if aerr == nil || !strings.Contains(aerr.Msg, "DEL this attachment") {
		t.Fatalf("repeated ADD of %s: %v, want a refusal", loser, aerr)
	}
	if !n.dp.Wired(holder, ip) || slices.Contains(n.dp.Links(), loser) {
		t.Fatalf("after the refused ADD: links %v, %s wired %v", n.dp.Links(), holder, n.dp.Wired(holder, ip))
	}
}
