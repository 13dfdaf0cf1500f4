package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
)

// podNets is the cluster's PodNetworks as the agent reads them: which
// network each pod is on (by namespace/name) and each network's static
// section.
type podNets struct {
	pods  map[string]string
	specs map[string]string
}

func (p podNets) NetworkOf(_ context.Context, namespace, name, _ string) (string, error) {
	return p.pods[namespace+"/"+name], nil
}

func (p podNets) Spec(_ context.Context, name, typ string) (json.RawMessage, error) {
	s, ok := p.specs[name]
	if !ok {
		return nil, fmt.Errorf("no PodNetwork %s exists (kubectl get podnetworks)", name)
	}
	if typ != "static" {
		return nil, fmt.Errorf("PodNetwork %s has no %s section", name, typ)
	}
	return json.RawMessage(s), nil
}

func (p podNets) Names(typ string) []string {
	var out []string
	for name := range p.specs {
		if typ == "static" {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

func podReq(id, namespace, name, netns string) *api.CNIRequest {
	return &api.CNIRequest{ContainerID: id, IfName: "eth0", Netns: netns,
		Args:   "K8S_POD_NAMESPACE=" + namespace + ";K8S_POD_NAME=" + name,
		Config: json.RawMessage(`{"cniVersion":"1.1.0","name":"vpcni"}`)}
}

// addPod ADDs pod namespace/name in container id and returns its address
// and the gateway the result names.
func (r *running) addPod(t *testing.T, n *node, id, namespace, name string) (addr, gw netip.Addr) {
	t.Helper()
	res, aerr := r.Add(context.Background(), podReq(id, namespace, name, n.pod(id)))
	if aerr != nil {
		t.Fatalf("ADD %s/%s: %v", namespace, name, aerr)
	}
	if len(res.IPs) != 1 {
		t.Fatalf("ADD %s/%s: %d IPs", namespace, name, len(res.IPs))
	}
	addr, _ = netip.AddrFromSlice(res.IPs[0].Address.IP.To4())
	gw, _ = netip.AddrFromSlice(res.IPs[0].Gateway.To4())
	return addr, gw
}

// webState is PodNetwork web's pool as /v1/state tells it.
func (r *running) webState(t *testing.T) api.PodNetworkState {
	t.Helper()
	st, err := r.State()
	if err != nil {
		t.Fatal(err)
	}
	i := slices.IndexFunc(st.PodNetworks, func(p api.PodNetworkState) bool { return p.Name == "web" })
	if i < 0 {
		t.Fatalf("/v1/state lists no PodNetwork web: %+v", st.PodNetworks)
	}
	return st.PodNetworks[i]
}

// A pod on PodNetwork web takes its address from web's ranges (with web's
// gateway), a pod on none from the node's; the DEL gives it back to web's
// pool; a restart puts web's record back in web's pool; a pod naming a
// PodNetwork that does not exist, or one the provider refuses, is told to
// try again later, and takes nothing from any pool.
func TestPodNetworkServedFromItsOwnPool(t *testing.T) {
	n := newNode(t, "10.9.0.0/24")
	web := netip.MustParsePrefix("10.30.0.0/28")
	n.podNets = podNets{
		pods: map[string]string{"shop/web-0": "web", "shop/web-1": "web", "shop/ghost-0": "ghost", "shop/bad-0": "bad"},
		specs: map[string]string{"web": `{"ranges":["10.30.0.0/28"],"gateway":"10.30.0.14"}`,
			"bad": `{"ranges":["10.9.0.128/25"]}`}, // the node's own range
	}
	a := n.start()

	// Before any pod of it, the node advertises what web's ranges hold
	// (13 of the /28: not its network, broadcast or gateway address); a
	// spec the provider cannot serve is unknown (-1, the pod limit: the
	// ADD says why).
	if got := a.Pool().Networks; got["web"] != 13 || got["bad"] != -1 || len(got) != 2 {
		t.Errorf("room per PodNetwork before any pod: %v, want web 13, bad -1", got)
	}
	ip, gw := a.addPod(t, n, "c-web0", "shop", "web-0")
	if got := a.Pool().Networks["web"]; got != 13 {
		t.Errorf("web's room once served: %d, want its pool's capacity 13", got)
	}
	if !web.Contains(ip) || gw != netip.MustParseAddr("10.30.0.14") {
		t.Fatalf("web-0 got %s via %s, want an address of %s via web's gateway 10.30.0.14", ip, gw, web)
	}
	rec, _ := a.store.Get("c-web0", "eth0")
	if rec == nil || rec.PodNetwork != "web" {
		t.Fatalf("web-0's record %+v does not name PodNetwork web", rec)
	}
	plain, _ := a.addPod(t, n, "c-plain", "shop", "cart-0")
	if !netip.MustParsePrefix("10.9.0.0/24").Contains(plain) {
		t.Fatalf("a pod on no PodNetwork got %s, not the node's range", plain)
	}
	if rec, _ := a.store.Get("c-plain", "eth0"); rec == nil || rec.PodNetwork != "" {
		t.Fatalf("the default network's record %+v names a PodNetwork", rec)
	}
	ws := a.webState(t)
	if ws.Pool.Allocated != 1 || !strings.Contains(ws.Source, "10.30.0.0/28") {
		t.Errorf("web's state %+v: want 1 allocated, its ranges as its source", ws)
	}
	a.checkInvariant(t, n)

	// A PodNetwork that does not exist: try again later, naming it.
	// Taken is allocated: the pools refill their warm addresses on their
	// own meanwhile, so the free ones are no measure.
	allocated := func() (n int) {
		n = a.addrs.Status(time.Now()).Allocated
		for _, m := range a.netPools() {
			n += m.Status(time.Now()).Allocated
		}
		return n
	}
	before := allocated()
	_, aerr := a.Add(context.Background(), podReq("c-ghost", "shop", "ghost-0", n.pod("c-ghost")))
	if aerr == nil || aerr.Code != api.CodeTryAgainLater || !strings.Contains(aerr.Msg, "ghost") {
		t.Fatalf("ADD of a pod on a missing PodNetwork: %v, want code %d naming ghost", aerr, api.CodeTryAgainLater)
	}
	if rec, _ := a.store.Get("c-ghost", "eth0"); rec != nil {
		t.Errorf("refused, but recorded %+v", rec)
	}
	if _, ok := a.netPools()["ghost"]; ok {
		t.Error("a pool was made for a PodNetwork that does not exist")
	}
	if after := allocated(); after != before {
		t.Errorf("%d addresses allocated before, %d after: the refused ADD took one", before, after)
	}
	// One the provider refuses (its range is the node's): the same, with
	// the provider's reason.
	_, aerr = a.Add(context.Background(), podReq("c-bad", "shop", "bad-0", n.pod("c-bad")))
	if aerr == nil || aerr.Code != api.CodeTryAgainLater || !strings.Contains(aerr.Error(), "overlaps this node's provider.static.ranges[0]") {
		t.Fatalf("ADD of a pod on a PodNetwork overlapping the node's range: %v", aerr)
	}
	if rec, _ := a.store.Get("c-bad", "eth0"); rec != nil {
		t.Errorf("refused, but recorded %+v", rec)
	}
	if after := allocated(); after != before {
		t.Errorf("%d addresses allocated before, %d after: the refused ADD took one", before, after)
	}
	a.checkInvariant(t, n)

	// DEL: the address goes back to web's pool, never the default's.
	if aerr := a.Del(context.Background(), podReq("c-web0", "shop", "web-0", n.pod("c-web0"))); aerr != nil {
		t.Fatal(aerr)
	}
	if ws := a.webState(t); ws.Pool.Allocated != 0 || !slices.Contains(ws.Pool.Addresses["free"], ip.String()) {
		t.Errorf("after the DEL web's pool is %+v: want %s free in it", ws.Pool, ip)
	}
	if slices.Contains(a.addrs.Idle(), ip) {
		t.Errorf("%s went to the default network's pool", ip)
	}
	again, _ := a.addPod(t, n, "c-web1", "shop", "web-1")
	if !web.Contains(again) {
		t.Fatalf("web-1 got %s", again)
	}
	waitUntil(t, "every record ready", func() bool {
		recs, _ := a.store.List()
		return len(recs) == 2 && !slices.ContainsFunc(recs, func(r *alloc.Allocation) bool { return !r.Ready })
	})
	a.stop()

	// A restart on the same state: web's record is back in web's pool.
	b := n.start()
	b.waitRestored(t)
	if ws := b.webState(t); ws.Pool.Allocated != 1 || !slices.Contains(ws.Pool.Addresses["allocated"], again.String()) {
		t.Errorf("after a restart web's pool is %+v: want %s allocated in it", ws.Pool, again)
	}
	waitUntil(t, "web's pool ready", func() bool { return b.webState(t).Ready })
	b.checkInvariant(t, n)
	if aerr := b.Del(context.Background(), podReq("c-web1", "shop", "web-1", n.pod("c-web1"))); aerr != nil {
		t.Fatal(aerr)
	}
	if ws := b.webState(t); ws.Pool.Allocated != 0 || !slices.Contains(ws.Pool.Addresses["free"], again.String()) {
		t.Errorf("DEL after the restart: web's pool is %+v, want %s free", ws.Pool, again)
	}
	if !n.dp.Wired("c-plain/eth0", plain) {
		t.Error("the default network's pod lost its wiring over the restart")
	}
	b.checkInvariant(t, n)

	// With no pod of web left, its pool still holds addresses: a restart
	// makes it again from the state directory's list, and finds them.
	waitUntil(t, "the list of networks written", func() bool { return slices.Contains(b.savedNetworks(), "web") })
	if slices.Contains(b.savedNetworks(), "bad") {
		t.Errorf("the list of networks %v names bad, whose pool never connected", b.savedNetworks())
	}
	held := b.webState(t).Pool.Free
	b.stop()
	c := n.start()
	c.waitRestored(t)
	waitUntil(t, "web's pool made again and synced", func() bool {
		ws := c.webState(t)
		return ws.Ready && ws.Pool.Free >= held && held > 0
	})
	c.checkInvariant(t, n)
}
