package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// TestGCAsRuntimesSendIt: GC through the built plugin the ways runtimes
// send it (internal/agent's gcKeys says who sends what). libcni v1.2.3
// and later (CRI-O since v1.32) send the list under both keys, and null
// under both when the runtime has no pod on the network; a runtime on
// libcni v1.2.0-v1.2.2 sends only "cni.dev/valid-attachments"; one that
// follows CNI 1.1.0's spec text as released sends only
// "cni.dev/attachments"; one that passes libcni no GCArgs sends neither.
// The single-key and no-key cases run the plugin binary as such a runtime
// would (CNI_COMMAND=GC, the config on stdin). Each step checks the
// agent's records and the node's kernel: a pod the runtime lists keeps
// its link, route and proxy entry; a pod it does not list loses them.
func TestGCAsRuntimesSendIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.cni("1.1.0")
	libcniGC, err := e.TB.NewCNI([]string{binDir}, filepath.Join(e.Dir, "gc-cache"),
		testbed.VpcniConfList("1.1.0", "vpcni-test", e.Cfg.SocketPath))
	if err != nil {
		t.Fatal(err)
	}
	attachment := func(id string) map[string]string { return map[string]string{"containerID": id, "ifname": "eth0"} }
	// execGC runs the plugin as a runtime that builds GC's config itself.
	execGC := func(keys map[string]any) {
		t.Helper()
		conf := map[string]any{"cniVersion": "1.1.0", "name": "vpcni-test", "type": "vpcni", "socket": e.Cfg.SocketPath}
		for k, v := range keys {
			conf[k] = v
		}
		stdin, _ := json.Marshal(conf)
		if cniErr, out := execPlugin(t, map[string]string{"CNI_COMMAND": "GC", "CNI_PATH": binDir}, stdin); cniErr != nil {
			t.Fatalf("GC %s: %v (%s)", stdin, cniErr, out)
		}
	}

	pod := 0
	live := map[string]bool{} // container ID -> still recorded
	add := func(ids ...string) {
		t.Helper()
		for _, id := range ids {
			e.AddIP(c, id, e.Pod(pod))
			pod++
			live[id] = true
		}
	}
	// expect checks that exactly want are recorded and wired on the node.
	expect := func(step string, want ...string) {
		t.Helper()
		got := []string{}
		for _, a := range e.state().Allocations {
			got = append(got, a.ContainerID)
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: the agent records %v, want %v", step, got, want)
		}
		bedtest.WaitFor(t, 10*time.Second, step+": the node's kernel to hold exactly the recorded pods", func() bool {
			ks := e.kernel()
			return len(ks.Links) == len(want) && len(ks.Routes) == len(want) && len(ks.Proxies) == len(want)
		})
		for id := range live {
			_, err := e.node().LinkByName(veth.HostIfName(id, "eth0"))
			if kept := slices.Contains(want, id); kept != (err == nil) {
				t.Errorf("%s: %s recorded=%v but its host link there=%v", step, id, kept, err == nil)
			}
		}
		for id := range live {
			live[id] = slices.Contains(want, id)
		}
	}

	add("k-0", "k-1")
	execGC(map[string]any{"cni.dev/other": []any{}})
	expect("GC with neither key", "k-0", "k-1")
	log, err := os.ReadFile(e.Agent.LogPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "GC names no valid attachments") {
		t.Errorf("the agent did not say it released nothing for a GC without a list:\n%s", log)
	}

	execGC(map[string]any{"cni.dev/attachments": []any{attachment("k-0")}})
	expect("GC with cni.dev/attachments only", "k-0")

	add("v-0", "v-1")
	execGC(map[string]any{"cni.dev/valid-attachments": []any{attachment("k-0"), attachment("v-0")}})
	expect("GC with cni.dev/valid-attachments only", "k-0", "v-0")

	add("b-0", "b-1")
	if err := libcniGC.GC(bedtest.Ctx(t), []types.GCAttachment{{ContainerID: "k-0", IfName: "eth0"}, {ContainerID: "b-0", IfName: "eth0"}}); err != nil {
		t.Fatalf("libcni GC (both keys): %v", err)
	}
	expect("libcni GC (both keys)", "k-0", "b-0")

	// Both keys null: no pod of the runtime's is on the network any more.
	if err := libcniGC.GC(bedtest.Ctx(t), nil); err != nil {
		t.Fatalf("libcni GC with no valid attachments: %v", err)
	}
	expect("libcni GC, both keys null")
	e.waitClean()
	if st := e.state(); st.Pool.Allocated != 0 {
		t.Fatalf("after the last GC the pool still allocates %d", st.Pool.Allocated)
	}
}
