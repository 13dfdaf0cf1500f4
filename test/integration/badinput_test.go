package integration

import (
	"errors"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// TestBadInput: every malformed invocation gets the CNI error code the spec
// asks for and a message that says what is wrong, and leaves nothing behind:
// no record, no link, no route, no proxy entry, no pod interface.
func TestBadInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	podNS := e.Pod(1)
	good := `{"cniVersion":"1.0.0","name":"vpcni-test","type":"vpcni","socket":"` + e.Cfg.SocketPath + `"}`
	env := func(over map[string]string) map[string]string {
		m := map[string]string{
			"CNI_COMMAND": "ADD", "CNI_CONTAINERID": "bad-input", "CNI_NETNS": podNS,
			"CNI_IFNAME": "eth0", "CNI_PATH": binDir,
		}
		for k, v := range over {
			if v == "" {
				delete(m, k)
			} else {
				m[k] = v
			}
		}
		return m
	}
	cases := []struct {
		name  string
		env   map[string]string
		stdin string
		code  uint
		says  string
	}{
		{"malformed JSON", env(nil), `{"cniVersion":"1.0.0","name":`, 6, "unmarshal"},
		{"missing name", env(nil), `{"cniVersion":"1.0.0","type":"vpcni"}`, 7, "network name"},
		{"unsupported cniVersion", env(nil), `{"cniVersion":"9.9.9","name":"n","type":"vpcni"}`, 1, "incompatible CNI versions"},
		{"field of the wrong type", env(nil), `{"cniVersion":"1.0.0","name":"n","type":"vpcni","timeoutSeconds":"soon"}`, 6, "not valid JSON"},
		{"ipam section", env(nil), `{"cniVersion":"1.0.0","name":"n","type":"vpcni","ipam":{"type":"host-local"}}`, 7, "remove the ipam section"},
		{"relative socket", env(nil), `{"cniVersion":"1.0.0","name":"n","type":"vpcni","socket":"vpcnid.sock"}`, 7, "absolute path"},
		{"missing CNI_NETNS", env(map[string]string{"CNI_NETNS": ""}), good, 4, "CNI_NETNS"},
		{"netns that does not exist", env(map[string]string{"CNI_NETNS": "/run/netns/vpcni-no-such-ns"}), good, 4, "does not exist"},
		{"missing CNI_CONTAINERID", env(map[string]string{"CNI_CONTAINERID": ""}), good, 4, "CNI_CONTAINERID"},
		{"interface name over 15 bytes", env(map[string]string{"CNI_IFNAME": "eth0123456789012"}), good, 4, "interface name is too long"},
		{"interface name with a slash", env(map[string]string{"CNI_IFNAME": "eth/0"}), good, 4, "interface name"},
		{"container ID over 233 bytes", env(map[string]string{"CNI_CONTAINERID": strings.Repeat("c", 250)}), good, 4, "at most 233"},
		{"config over the agent's 1 MiB limit", env(nil), `{"cniVersion":"1.0.0","name":"n","type":"vpcni","socket":"` + e.Cfg.SocketPath + `","pad":"` + strings.Repeat("x", api.MaxRequestBytes) + `"}`, 7, "too large"},
		{"agent socket missing", env(nil), `{"cniVersion":"1.0.0","name":"n","type":"vpcni","socket":"/run/vpcni-no-such/vpcnid.sock"}`, 11, "try again later"},
		{"CHECK of an unknown container", env(map[string]string{"CNI_COMMAND": "CHECK"}), good, 3, "no allocation"},
		{"requested address not an address", env(map[string]string{"CNI_ARGS": "IgnoreUnknown=1;IP=10.0.0.300"}), good, 4, "not a unicast IPv4 or IPv6 address"},
		{"requested address outside the ranges", env(map[string]string{"CNI_ARGS": "IgnoreUnknown=1;IP=192.0.2.9"}), good, 4, "outside the provider's subnet or ranges"},
		{"two requested addresses", env(map[string]string{"CNI_ARGS": "IP=192.0.2.9;IP=192.0.2.10"}), good, 4, "vpcni wires one"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cniErr, out := execPlugin(t, c.env, []byte(c.stdin))
			if cniErr == nil {
				t.Fatalf("plugin succeeded: %s", out)
			}
			if cniErr.Code != c.code || !strings.Contains(cniErr.Error(), c.says) {
				t.Errorf("got code %d %q; want code %d saying %q", cniErr.Code, cniErr.Error(), c.code, c.says)
			}
			if st := e.state(); len(st.Allocations) != 0 || st.Pool.Allocated != 0 {
				t.Errorf("left an allocation: %+v, pool %+v", st.Allocations, st.Pool)
			}
			if ks := e.kernel(); !ks.empty() {
				t.Errorf("left kernel state on the node: %+v", ks)
			}
			if err := bedtest.NoLink(bedtest.HandleIn(t, podNS), "eth0"); err != nil {
				t.Errorf("eth0 in the pod: %v", err)
			}
		})
	}
	// The agent still serves after all that.
	if err, out := execPlugin(t, env(nil), []byte(good)); err != nil {
		t.Fatalf("a good ADD after the bad ones failed: %v", err)
	} else if !strings.Contains(string(out), `"ips"`) {
		t.Fatalf("ADD printed no result: %s", out)
	}
	if err, _ := execPlugin(t, env(map[string]string{"CNI_COMMAND": "DEL", "CNI_NETNS": ""}), []byte(good)); err != nil {
		t.Fatalf("DEL without CNI_NETNS: %v", err)
	}
	e.waitClean()

	// The agent checks for itself what a client other than the plugin sends.
	for _, req := range []api.CNIRequest{
		{ContainerID: "raw", IfName: "a/b", Netns: podNS, Config: []byte(good)},
		{ContainerID: "raw id", IfName: "eth0", Netns: podNS, Config: []byte(good)},
		{ContainerID: "raw", IfName: "eth0", Netns: "/proc/self/no-such", Config: []byte(good)},
		{ContainerID: "raw", IfName: "eth0", Netns: podNS, Config: []byte(`{"cniVersion":"1.0.0"}`)},
	} {
		err := e.Agent.Client.Do(bedtest.Ctx(t), api.PathAdd, &req, nil)
		var apiErr *api.Error
		if !errors.As(err, &apiErr) || (apiErr.Code != 4 && apiErr.Code != 7) {
			t.Errorf("agent accepted or mis-coded %+v: %v", req, err)
		}
	}
	if ks := e.kernel(); !ks.empty() {
		t.Errorf("raw requests left kernel state: %+v", ks)
	}
}
