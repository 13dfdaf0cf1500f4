package doctor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/rest"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
)

func find(t *testing.T, rs []Result, name string) Result {
	t.Helper()
	for _, r := range rs {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no check %q in %+v", name, rs)
	return Result{}
}

func expect(t *testing.T, r Result, status Status, detail ...string) {
	t.Helper()
	if r.Status != status {
		t.Errorf("%s: %s (%s), want %s", r.Name, r.Status, r.Detail, status)
	}
	for _, d := range detail {
		if !strings.Contains(r.Detail+" | "+r.Fix, d) {
			t.Errorf("%s: %q / fix %q does not say %q", r.Name, r.Detail, r.Fix, d)
		}
	}
	if status != OK && r.Fix == "" && r.Name != "kernel veth" {
		t.Errorf("%s: %s without a fix", r.Name, status)
	}
}

var modeNeeds = map[string]datapath.Needs{
	"veth":    {Links: []string{"veth"}},
	"macvlan": {Links: []string{"macvlan", "veth"}},
	"ipvlan":  {Links: []string{"ipvlan", "veth"}},
	"bridge":  {Links: []string{"bridge", "veth"}},
}

// A link type the kernel lacks fails only when the configured mode needs
// it; otherwise it warns, and either way names the modes it rules out and
// those that work.
func TestKernel(t *testing.T) {
	probed := map[string]error{"veth": nil, "macvlan": nil, "bridge": nil, "ipvlan": errors.New("operation not supported")}
	rs := Kernel("veth", modeNeeds, probed)
	if len(rs) != 4 {
		t.Fatalf("%d checks, want one per link type: %+v", len(rs), rs)
	}
	expect(t, find(t, rs, "kernel ipvlan"), Warn, "operation not supported", "rules out datapath ipvlan", "modprobe ipvlan", "bridge, macvlan, veth")
	expect(t, find(t, rs, "kernel veth"), OK, "datapath bridge, ipvlan, macvlan, veth", "configured mode veth needs them")
	expect(t, find(t, rs, "kernel ipvlan"), Warn)

	rs = Kernel("ipvlan", modeNeeds, probed)
	expect(t, find(t, rs, "kernel ipvlan"), Fail, "rules out datapath ipvlan")

	// Without a veth every mode is out.
	probed["veth"] = errors.New("operation not supported")
	rs = Kernel("", modeNeeds, probed)
	r := find(t, rs, "kernel veth")
	expect(t, r, Warn, "rules out datapath bridge, ipvlan, macvlan, veth")
	if strings.Contains(r.Fix, "supports:") {
		t.Errorf("fix %q names a mode that works, and none does", r.Fix)
	}
}

func TestSysctls(t *testing.T) {
	list := []datapath.Sysctl{datapath.Forwarding,
		{Key: "net/ipv4/neigh/eth0/proxy_delay", Value: "0", Why: "ARP at once"},
		{Key: "net/bridge", Why: "br_netfilter"}}
	values := map[string]string{"net/ipv4/ip_forward": "1", "net/ipv4/neigh/eth0/proxy_delay": "80"}
	read := func(k string) (string, error) {
		v, ok := values[k]
		if !ok {
			return "", fs.ErrNotExist
		}
		return v, nil
	}
	rs := Sysctls("veth", list, read, "/etc/vpcni/vpcnid.yaml")
	expect(t, find(t, rs, "sysctl net.ipv4.ip_forward"), OK)
	expect(t, find(t, rs, "sysctl net.ipv4.neigh.eth0.proxy_delay"), Fail, "is 80", "needs 0", "install-cni --agent-config /etc/vpcni/vpcnid.yaml", "sysctl -w net.ipv4.neigh.eth0.proxy_delay=0")
	expect(t, find(t, rs, "sysctl net.bridge"), Fail, "/proc/sys/net/bridge is missing", "br_netfilter")
	values["net/bridge"] = ""
	expect(t, find(t, Sysctls("bridge", list, read, "f"), "sysctl net.bridge"), OK)
}

func TestUplink(t *testing.T) {
	l := Link{Name: "eth0", Up: true, MTU: 1450, IPv4: "10.0.0.5"}
	expect(t, Uplink(l, nil, 0, "f"), OK, "eth0 up, mtu 1450, pods' mtu 1450", "node IP 10.0.0.5")
	expect(t, Uplink(l, nil, 1500, "f"), Fail, "pods' mtu 1500 is above eth0's 1450", "set mtu in f to 1450")
	expect(t, Uplink(l, errors.New(`uplink "eth9": Link not found`), 0, "f"), Fail, "eth9", "set uplink in f")
	down := l
	down.Up = false
	expect(t, Uplink(down, nil, 0, "f"), Fail, "eth0 is down")
	bare := l
	bare.IPv4 = ""
	expect(t, Uplink(bare, nil, 0, "f"), Warn, "no IPv4 address", "nodeIP")
	port := l
	port.Master = "vpcbr0"
	expect(t, Uplink(port, nil, 0, "f"), OK, "port of vpcbr0")
}

func TestAgent(t *testing.T) {
	expect(t, Agent("/s", nil, errors.New("vpcnid is not reachable at /s")), Fail, "not reachable at /s", "start vpcnid")
	expect(t, Agent("/s", &api.State{Reason: "provider: login"}, nil), Fail, "not ready: provider: login")
	expect(t, Agent("/s", &api.State{Ready: true, Degraded: true, Reason: "cloud unreachable"}, nil), Warn, "degraded: cloud unreachable")
	expect(t, Agent("/s", &api.State{Ready: true, Node: "n1", Datapath: "veth"}, nil), OK, "node n1, datapath veth")
}

func TestSkew(t *testing.T) {
	now := time.Date(2026, 1, 1, 12, 0, 0, 400e6, time.UTC)
	sent, received := now.Add(-50*time.Millisecond), now.Add(50*time.Millisecond)
	// The header's whole second holds the local time: no skew.
	expect(t, Skew("neutron", now.Truncate(time.Second), sent, received), OK, "within 1s")
	// The remote clock 8 s behind: this node is ahead.
	expect(t, Skew("neutron", now.Add(-8*time.Second).Truncate(time.Second), sent, received), Warn, "ahead of neutron", "time synchronisation")
	expect(t, Skew("apiserver", now.Add(9*time.Second).Truncate(time.Second), sent, received), Warn, "9s behind apiserver")
	// Within the threshold.
	expect(t, Skew("neutron", now.Add(-4*time.Second).Truncate(time.Second), sent, received), OK)
	expect(t, Skew("neutron", time.Time{}, sent, received), Warn, "no Date header")
}

func writeFile(t *testing.T, path, data string, mode os.FileMode) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), mode); err != nil {
		t.Fatal(err)
	}
}

const vpcniList = `{"cniVersion":"1.0.0","name":"vpcni","plugins":[{"type":"vpcni"},{"type":"portmap"},{"type":"bandwidth"}]}`

func TestCNI(t *testing.T) {
	conf, bin := t.TempDir(), t.TempDir()
	for _, p := range []string{"vpcni", "portmap", "bandwidth"} {
		writeFile(t, filepath.Join(bin, p), "#!/bin/sh\n", 0o755)
	}
	expect(t, CNI(filepath.Join(conf, "none"), bin)[0], Fail, "not a directory", "--cni-conf-dir")
	expect(t, CNI(conf, bin)[0], Fail, "no network configuration", "install-cni")

	writeFile(t, filepath.Join(conf, "10-vpcni.conflist"), vpcniList, 0o644)
	// Not a file the runtime reads, so no shadow.
	writeFile(t, filepath.Join(conf, "00-notes.txt"), "x", 0o644)
	rs := CNI(conf, bin)
	expect(t, rs[0], OK, "10-vpcni.conflist")
	expect(t, rs[1], OK, "vpcni, portmap, bandwidth")

	// A single .conf of another CNI sorts first: it shadows vpcni's.
	writeFile(t, filepath.Join(conf, "05-flannel.conf"), `{"cniVersion":"0.4.0","name":"cbr0","type":"flannel"}`, 0o644)
	expect(t, CNI(conf, bin)[0], Fail, "shadowed by 05-flannel.conf", "remove "+filepath.Join(conf, "05-flannel.conf"))
	os.Remove(filepath.Join(conf, "05-flannel.conf"))

	os.Chmod(filepath.Join(bin, "bandwidth"), 0o644)
	expect(t, CNI(conf, bin)[1], Fail, "chains bandwidth, which is not an executable in "+bin)

	writeFile(t, filepath.Join(conf, "10-vpcni.conflist"), `{"cniVersion":"1.0.0","name":"vpcni","plugins":[{"type":"vpcni"}]}`, 0o644)
	expect(t, CNI(conf, bin)[1], Fail, "chains no portmap (pods' hostPorts are not served) and no bandwidth")
}

// The API server's answers to the agent's credentials, judged.
func TestAPIServer(t *testing.T) {
	status := http.StatusOK
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if status != http.StatusOK {
			w.WriteHeader(status)
			fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","code":%d}`, status)
			return
		}
		if r.URL.Path != "/api/v1/nodes/n1" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"kind":"Node","apiVersion":"v1","metadata":{"name":"n1"}}`))
	}))
	t.Cleanup(srv.Close)
	rc := &rest.Config{Host: srv.URL}
	clock := &DateClock{}
	expect(t, APIServer(context.Background(), rc, nil, "n1", clock), OK, "Node n1 found")
	expect(t, clock.Skew("apiserver"), OK)
	for code, want := range map[int]string{http.StatusUnauthorized: "refused the credentials", http.StatusForbidden: "may not read Nodes", http.StatusNotFound: "has no Node n1"} {
		status = code
		expect(t, APIServer(context.Background(), rc, nil, "n1", &DateClock{}), Fail, want)
	}
	expect(t, APIServer(context.Background(), nil, errors.New("not in a pod"), "n1", &DateClock{}), Fail, "not in a pod", "kubernetes.mode: off")
}

func TestBTF(t *testing.T) {
	expect(t, BTF(func(p string) bool { return p == "/sys/kernel/btf/vmlinux" }), OK, "bpf() syscall: no, BTF (/sys/kernel/btf/vmlinux): yes")
}

// A provider's steps become "cloud <step>" checks: a failed step fails
// with its error and fix, a warning warns with its fix, a passed step is
// ok and carries no fix.
func TestCloudSteps(t *testing.T) {
	rs := Cloud([]provider.Step{
		{Name: "login", Detail: "accepted"},
		{Name: "limits", Detail: "9 of 10", Warn: true, Fix: "raise it"},
		{Name: "port", Detail: "looked", Err: errors.New("no port has 10.0.0.5"), Fix: "set nodeIP"},
		{Name: "unused", Detail: "fine", Fix: "never shown"},
	})
	expect(t, find(t, rs, "cloud login"), OK, "accepted")
	expect(t, find(t, rs, "cloud limits"), Warn, "9 of 10", "raise it")
	expect(t, find(t, rs, "cloud port"), Fail, "no port has 10.0.0.5", "set nodeIP")
	if r := find(t, rs, "cloud unused"); r.Status != OK || r.Fix != "" {
		t.Errorf("a passed step: %+v", r)
	}
}

// check runs provider openstack's Doctor as Run does, with the agent
// config "f".
func check(cfg openstack.Config, nodeIP string, rt http.RoundTripper) []Result {
	r, err := provider.Lookup("openstack")
	if err != nil || r.Doctor == nil || r.Doctor.API != "neutron" {
		panic(fmt.Sprintf("provider openstack registered without its Doctor: %+v %v", r, err))
	}
	return Cloud(r.Doctor.Diagnose(context.Background(), &cfg, provider.DoctorNode{IP: netip.MustParseAddr(nodeIP), ConfigFile: "f", Transport: rt}))
}

// The check names each failed step's fix; a policy refusal names the mode
// that works. The endpoint is a Neutron whose network belongs to another
// project and whose policy refuses this one's port updates (Neutron's
// default for a shared network's member).
func TestCloudPolicyNamesPassthrough(t *testing.T) {
	allow := false
	const port = `{"id":"p1","network_id":"n1","project_id":"member","revision_number":3,"fixed_ips":[{"subnet_id":"s1","ip_address":"10.0.0.5"}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch {
		case r.URL.Path == "/v2.0/ports/p1" && (r.Method == http.MethodGet || allow):
			_, _ = w.Write([]byte(`{"port":` + port + `}`))
		case r.URL.Path == "/v2.0/subnets/s1":
			_, _ = w.Write([]byte(`{"subnet":{"id":"s1","network_id":"n1","cidr":"10.0.0.0/24","gateway_ip":"10.0.0.1","ip_version":4}}`))
		case r.URL.Path == "/v2.0/ports" && r.Method == http.MethodGet && !slices.Contains(r.URL.Query()["fixed_ips"], "ip_address=10.0.0.5"):
			_, _ = w.Write([]byte(`{"ports":[]}`))
		case r.URL.Path == "/v2.0/ports" && r.Method == http.MethodGet:
			_, _ = w.Write([]byte(`{"ports":[` + port + `]}`))
		case r.URL.Path == "/v2.0/networks/n1":
			_, _ = w.Write([]byte(`{"network":{"id":"n1","project_id":"owner","shared":true}}`))
		case r.URL.Path == "/v2.0/ports/p1" && r.Method == http.MethodPut:
			w.WriteHeader(http.StatusForbidden)
			_, _ = w.Write([]byte(`{"NeutronError":{"type":"PolicyNotAuthorized","message":"rule update_port:fixed_ips"}}`))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	cfg := openstack.Config{Endpoint: srv.URL, SubnetID: "s1"}
	cfg.Defaults()
	clock := &DateClock{Next: http.DefaultTransport}
	rs := check(cfg, "10.0.0.5", clock)
	expect(t, find(t, rs, "cloud port"), OK, "p1")
	expect(t, find(t, rs, "cloud policy"), Fail, "mode fixed-ips cannot work here", "network n1 is a shared network of project owner", "provider.openstack.mode: passthrough")
	if len(rs) != 4 {
		t.Errorf("steps after the refused policy ran: %+v", rs)
	}
	expect(t, clock.Skew("neutron"), OK)

	// An owner's or admin's credentials: the no-op update goes through.
	allow = true
	rs = check(cfg, "10.0.0.5", clock)
	expect(t, find(t, rs, "cloud policy"), OK, "project owner's", "update_port:fixed_ips", "VM port p1")
	expect(t, find(t, rs, "cloud limits"), OK, "0 of ")
	allow = false

	// The port not found.
	rs = check(cfg, "10.0.0.6", clock)
	expect(t, find(t, rs, "cloud port"), Fail, "no Neutron port", "set provider.openstack.nodeIP in f")

	// Neutron unreachable.
	srv.Close()
	rs = check(cfg, "10.0.0.5", clock)
	expect(t, find(t, rs, "cloud subnet"), Fail, "reaches the cloud's endpoints")
}

// A mode that creates ports reads the project's port quota: room left,
// none left, or a quota it may not read (said, not failed).
func TestCloudPortQuota(t *testing.T) {
	quota := `{"quota":{"port":{"used":7,"reserved":1,"limit":10}}}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		switch r.URL.Path {
		case "/v2.0/subnets/s1":
			_, _ = w.Write([]byte(`{"subnet":{"id":"s1","network_id":"n1","cidr":"10.0.0.0/24","gateway_ip":"10.0.0.1","ip_version":4}}`))
		case "/v2.0/ports":
			_, _ = w.Write([]byte(`{"ports":[{"id":"p1","network_id":"n1","project_id":"member","fixed_ips":[{"subnet_id":"s1","ip_address":"10.0.0.5"}],
				"allowed_address_pairs":[{"ip_address":"10.0.0.9"}]}]}`))
		case "/v2.0/networks/n1":
			_, _ = w.Write([]byte(`{"network":{"id":"n1","project_id":"member"}}`))
		case "/v2.0/quotas/member/details.json":
			if quota == "" {
				http.NotFound(w, r)
				return
			}
			_, _ = w.Write([]byte(quota))
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	cfg := openstack.Config{Endpoint: srv.URL, SubnetID: "s1", Mode: "address-pairs"}
	cfg.Defaults()
	diagnose := func() []Result {
		return check(cfg, "10.0.0.5", http.DefaultTransport)
	}
	rs := diagnose()
	expect(t, find(t, rs, "cloud policy"), OK, "belongs to the VM port's project")
	expect(t, find(t, rs, "cloud limits"), OK, "1 of 10 allowed address pairs")
	expect(t, find(t, rs, "cloud quota"), OK, "8 of 10 ports")
	quota = `{"quota":{"port":{"used":10,"reserved":0,"limit":10}}}`
	expect(t, find(t, diagnose(), "cloud quota"), Warn, "can create no more", "quota set --ports")
	quota = ""
	expect(t, find(t, diagnose(), "cloud quota"), Warn, "cannot read the port quota of project member")

	// fixed-ips creates no ports: no quota step.
	cfg.Mode = "fixed-ips"
	for _, r := range diagnose() {
		if r.Name == "cloud quota" {
			t.Errorf("fixed-ips read the port quota: %+v", r)
		}
	}
}
