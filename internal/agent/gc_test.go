package agent

import (
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/vpcni/vpcni/internal/api"
)

// GC as each runtime sends it (gcKeys): the list under either key, under
// both (their union is kept), null (CRI-O for a network without pods:
// nothing is valid), or no list at all (nothing is released).
func TestGCKeys(t *testing.T) {
	const b, c = `{"containerID":"b","ifname":"eth0"}`, `{"containerID":"c","ifname":"eth0"}`
	cases := []struct {
		name string
		list string // the config's GC keys, after "name"
		keep []string
	}{
		{"valid-attachments only (libcni v1.2.0-v1.2.2)", `"cni.dev/valid-attachments":[` + b + `]`, []string{"b"}},
		{"attachments only (the spec text of CNI 1.1.0 as released)", `"cni.dev/attachments":[` + b + `]`, []string{"b"}},
		{"both, the same list (libcni v1.2.3 and later)", `"cni.dev/valid-attachments":[` + b + `],"cni.dev/attachments":[` + b + `]`, []string{"b"}},
		{"both, different lists: their union", `"cni.dev/valid-attachments":[` + b + `],"cni.dev/attachments":[` + c + `]`, []string{"b", "c"}},
		{"both null (CRI-O, no pod on the network)", `"cni.dev/valid-attachments":null,"cni.dev/attachments":null`, nil},
		{"neither key", `"other":1`, []string{"a", "b", "c"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			n := newNode(t, "10.9.7.0/24")
			a := n.start()
			for _, id := range []string{"a", "b", "c"} {
				a.add(t, id, n.pod(id))
			}
			gc := &api.CNIRequest{Config: json.RawMessage(`{"cniVersion":"1.1.0","name":"vpcni",` + tc.list + `}`)}
			if aerr := a.GC(context.Background(), gc); aerr != nil {
				t.Fatalf("GC: %v", aerr)
			}
			recs, err := a.store.List()
			if err != nil {
				t.Fatal(err)
			}
			var kept []string
			for _, r := range recs {
				kept = append(kept, r.ContainerID)
			}
			slices.Sort(kept)
			if !slices.Equal(kept, tc.keep) {
				t.Fatalf("after GC the records are %v, want %v", kept, tc.keep)
			}
			a.checkInvariant(t, n)
		})
	}
}

// A list that is not a list is refused, and nothing is released.
func TestGCBadList(t *testing.T) {
	n := newNode(t, "10.9.8.0/24")
	a := n.start()
	a.add(t, "a", n.pod("a"))
	gc := &api.CNIRequest{Config: json.RawMessage(`{"cniVersion":"1.1.0","name":"vpcni","cni.dev/attachments":{"containerID":"a"}}`)}
	aerr := a.GC(context.Background(), gc)
	if aerr == nil || aerr.Code != api.CodeDecodingFailure {
		t.Fatalf("GC with a malformed list: %v, want code %d", aerr, api.CodeDecodingFailure)
	}
	if recs, _ := a.store.List(); len(recs) != 1 {
		t.Fatalf("a refused GC released something: %+v", recs)
	}
	a.checkInvariant(t, n)
}
