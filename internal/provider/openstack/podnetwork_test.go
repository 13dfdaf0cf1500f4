package openstack

import (
	"encoding/json"
	"testing"

	"github.com/vpcni/vpcni/internal/provider"
)

// What a node advertises for a PodNetwork it does not serve yet: a NIC in
// each free slot of the VM, maxAddresses on each (one with portPerPod);
// unknown until the slots were counted; none in passthrough.
func TestNetworkRoom(t *testing.T) {
	cfg := Config{MaxAddresses: 16, Mode: "fixed-ips"}
	shared := json.RawMessage(`{"networkID":"n","subnetIDs":["s"]}`)
	perPod := json.RawMessage(`{"networkID":"n","subnetIDs":["s"],"portPerPod":true}`)
	for _, c := range []struct {
		what    string
		cfg     Config
		spec    json.RawMessage
		free    int
		room    int
		counted bool
	}{
		{"three free slots", cfg, shared, 3, 48, true},
		{"no free slot", cfg, shared, 0, 0, true},
		{"a port per pod", cfg, perPod, 3, 3, true},
		{"slots not counted yet", cfg, shared, -1, 0, false},
		{"passthrough", Config{MaxAddresses: 16, Mode: "passthrough"}, shared, 3, 0, true},
		{"a spec that is no JSON object", cfg, json.RawMessage(`[`), 3, 0, false},
	} {
		room, ok := networkRoom(c.cfg, c.spec, provider.Info{FreeNICs: c.free})
		if room != c.room || ok != c.counted {
			t.Errorf("%s: room %d (known %v), want %d (known %v)", c.what, room, ok, c.room, c.counted)
		}
	}
}
