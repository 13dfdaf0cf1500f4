package ctl

import (
	"bytes"
	"encoding/json"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/api"
)

// fakeAgent serves st at the agent's state path on a unix socket in a temp
// dir and counts the requests it gets.
func fakeAgent(t *testing.T, st api.State) (socket string, requests *atomic.Int64) {
	t.Helper()
	socket = filepath.Join(t.TempDir(), "vpcnid.sock")
	l, err := net.Listen("unix", socket)
	if err != nil {
		t.Fatal(err)
	}
	requests = &atomic.Int64{}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+api.PathState, func(w http.ResponseWriter, _ *http.Request) {
		requests.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(st)
	})
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return socket, requests
}

func TestStatusExitCode(t *testing.T) {
	ready := api.State{Node: "node-a", Ready: true, Provider: "static", Datapath: "veth", Uplink: "eth0", MTU: 1500,
		Allocations: []alloc.Allocation{{Lease: alloc.Lease{Address: netip.MustParseAddr("10.77.0.64")}, PodNamespace: "default", PodName: "p0", ContainerID: "c0", IfName: "eth0"}}}
	notReady := api.State{Node: "node-a", Reason: "restoring allocations", Provider: "static"}
	for name, c := range map[string]struct {
		st       api.State
		format   []string
		wantCode int
	}{
		"table ready":     {ready, nil, 0},
		"table not ready": {notReady, nil, 1},
		"json ready":      {ready, []string{"-o", "json"}, 0},
		"json not ready":  {notReady, []string{"-o", "json"}, 1},
	} {
		t.Run(name, func(t *testing.T) {
			socket, _ := fakeAgent(t, c.st)
			var stdout, stderr bytes.Buffer
			code := Main(append([]string{"status", "--socket", socket}, c.format...), &stdout, &stderr)
			if code != c.wantCode {
				t.Fatalf("exit %d, want %d; stderr: %s", code, c.wantCode, stderr.String())
			}
			if c.wantCode != 0 && !strings.Contains(stderr.String(), "agent not ready: restoring allocations") {
				t.Errorf("stderr does not say why: %q", stderr.String())
			}
			// Whatever the exit code, the state is printed in the form asked for.
			if len(c.format) > 0 {
				var got api.State
				if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
					t.Fatalf("stdout is not the state as JSON: %v\n%s", err, stdout.String())
				}
				if got.Node != c.st.Node || got.Ready != c.st.Ready || len(got.Allocations) != len(c.st.Allocations) {
					t.Errorf("JSON state %+v, want %+v", got, c.st)
				}
			} else if !strings.HasPrefix(stdout.String(), "node      node-a\n") {
				t.Errorf("table output: %q", stdout.String())
			}
		})
	}
}

func TestStatusUnknownFormat(t *testing.T) {
	socket, requests := fakeAgent(t, api.State{Node: "node-a", Ready: true})
	var stdout, stderr bytes.Buffer
	code := Main([]string{"status", "--socket", socket, "-o", "yaml"}, &stdout, &stderr)
	if code != 2 {
		t.Fatalf("exit %d, want 2; stderr: %s", code, stderr.String())
	}
	if stdout.Len() != 0 {
		t.Errorf("printed something for an unknown format: %q", stdout.String())
	}
	if !strings.Contains(stderr.String(), `unknown output format "yaml"`) || !strings.Contains(stderr.String(), "vpcnictl status") {
		t.Errorf("stderr lacks the error or the usage: %q", stderr.String())
	}
	if n := requests.Load(); n != 0 {
		t.Errorf("asked the agent %d times for a command line that is wrong", n)
	}
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, args := range [][]string{{}, {"nope"}, {"bench"}, {"bench", "nope"}, {"lab"}, {"lab", "nope"}, {"lab", "exec", "n1"},
		{"status", "-bogus"}, {"bench", "cni", "-rounds", "many"}, {"install-cni", "-nope"}} {
		var stdout, stderr bytes.Buffer
		if code := Main(args, &stdout, &stderr); code != 2 {
			t.Errorf("vpcnictl %v: exit %d, want 2; stderr: %s", args, code, stderr.String())
		}
		if stdout.Len() != 0 || !strings.Contains(stderr.String(), "vpcnictl bench datapath") {
			t.Errorf("vpcnictl %v: want the usage on stderr only; stdout %q, stderr %q", args, stdout.String(), stderr.String())
		}
	}
}

func TestHelpListsEveryBenchmark(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"help"}, &stdout, &stderr); code != 0 || stderr.Len() != 0 {
		t.Fatalf("help: exit %d, stderr %q", code, stderr.String())
	}
	// bench dispatches on the same table; this catches a lost loop.
	for _, b := range benches {
		if !strings.Contains(stdout.String(), "vpcnictl bench "+b.name+" ") {
			t.Errorf("help does not list bench %s:\n%s", b.name, stdout.String())
		}
	}
}

// A subcommand's -h prints its flags and is no failure.
func TestSubcommandHelpExits0(t *testing.T) {
	for _, args := range [][]string{{"status", "-h"}, {"bench", "restart", "-h"}, {"install-cni", "-h"}} {
		var stdout, stderr bytes.Buffer
		if code := Main(args, &stdout, &stderr); code != 0 {
			t.Errorf("vpcnictl %v: exit %d, want 0", args, code)
		}
	}
}

// The table shows each pod's last datapath probe, and the problems of the
// unhealthy ones below it.
func TestStatusShowsHealth(t *testing.T) {
	al := func(ip, id string) alloc.Allocation {
		return alloc.Allocation{Lease: alloc.Lease{Address: netip.MustParseAddr(ip)}, PodNamespace: "default", PodName: id, ContainerID: id, IfName: "eth0"}
	}
	st := api.State{Node: "node-a", Ready: true, Provider: "static", Datapath: "veth",
		Pool:        api.PoolState{Free: 2, Allocated: 3, Capacity: 64, WarmTarget: 12, Waiting: 4},
		Allocations: []alloc.Allocation{al("10.77.0.64", "p0"), al("10.77.0.65", "p1"), al("10.77.0.66", "p2")},
		Health: map[string]api.PodHealth{
			"p0/eth0": {Healthy: true, PingMicros: 85, CheckedAt: "2026-11-24T00:00:00Z"},
			"p1/eth0": {Problem: "node has no route 10.77.0.65/32 dev vpc123", CheckedAt: "2026-11-24T00:00:00Z"},
		}}
	socket, _ := fakeAgent(t, st)
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"status", "--socket", socket}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{"capacity 64; warm target 12\n", "4 ADDs waiting for addresses from the cloud", "DATAPATH", "ok (ping 85us)", "UNHEALTHY", "unhealthy datapaths:\n  10.77.0.65 (default/p1), checked 2026-11-24T00:00:00Z: node has no route 10.77.0.65/32 dev vpc123"} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	// p2 was not probed: a dash, not "ok".
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "10.77.0.66") && !strings.HasSuffix(strings.TrimSpace(l), "-") {
			t.Errorf("an unprobed pod shows %q", l)
		}
	}
}

// The table names the pods' subnet and how the provider settled it.
func TestStatusShowsSubnet(t *testing.T) {
	const subnet = "subnet 5f1c (10.0.3.0/24), discovered: the subnet of VM port 9a2e's fixed IP 10.0.3.14"
	socket, _ := fakeAgent(t, api.State{Node: "node-a", Ready: true, Provider: "openstack", ProviderSubnet: subnet})
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"status", "--socket", socket}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if !strings.Contains(stdout.String(), "provider  openstack, "+subnet+"\n") {
		t.Errorf("status does not name the subnet under the provider:\n%s", stdout.String())
	}
}

// A node that serves PodNetworks shows each network's pool and source,
// and each pod's network and NIC; a node that serves none keeps the
// table as it was.
func TestStatusShowsPodNetworks(t *testing.T) {
	web := alloc.Allocation{ContainerID: "c1", IfName: "eth0", PodNamespace: "shop", PodName: "web-0",
		Lease: alloc.Lease{Address: netip.MustParseAddr("10.9.0.5"), Interface: "port-w", PodNetwork: "web", NIC: &alloc.NIC{MAC: "fa:16:3e:00:00:09"}}}
	plain := alloc.Allocation{ContainerID: "c2", IfName: "eth0", PodNamespace: "default", PodName: "app",
		Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.3.7")}}
	st := api.State{Node: "node-a", Ready: true, Provider: "openstack", Allocations: []alloc.Allocation{web, plain},
		PodNetworks: []api.PodNetworkState{{Name: "web", Ready: true, Source: "pod network web: network n1, subnets s1 (10.9.0.0/24); security groups sg-web",
			Pool: api.PoolState{Free: 2, Allocated: 1, Capacity: 448}}}}
	socket, _ := fakeAgent(t, st)
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"status", "--socket", socket}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	out := stdout.String()
	for _, want := range []string{
		"network   web (ready): free 2, cooling 0, allocated 1, capacity 448; pod network web: network n1, subnets s1 (10.9.0.0/24); security groups sg-web\n",
		"NETWORK", "web      fa:16:3e:00:00:09 (port port-w)", "default  -",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}
	socket, _ = fakeAgent(t, api.State{Node: "node-a", Ready: true, Provider: "openstack", Allocations: []alloc.Allocation{plain}})
	stdout.Reset()
	if code := Main([]string{"status", "--socket", socket}, &stdout, &stderr); code != 0 {
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	if strings.Contains(stdout.String(), "NETWORK") {
		t.Errorf("a node without PodNetworks shows the network column:\n%s", stdout.String())
	}
}

// A single-family node's pool line stays as scripts read it; a dual-stack
// node shows one line per family and every address of a pod.
func TestStatusShowsFamilies(t *testing.T) {
	single := api.State{Node: "n", Ready: true, Pool: api.PoolState{Free: 3, Capacity: 9, WarmTarget: 2}}
	dual := single
	dual.Pool.Family = "ipv4"
	dual.Families = []api.PoolState{dual.Pool, {Family: "ipv6", Free: 4, Allocated: 1, Capacity: 65536, WarmTarget: 2}}
	dual.Allocations = []alloc.Allocation{{ContainerID: "c1", IfName: "eth0", Lease: alloc.Lease{Address: netip.MustParseAddr("10.0.0.5")},
		Others: []alloc.Lease{{Address: netip.MustParseAddr("fd00::5")}}}}
	for _, tc := range []struct {
		st   api.State
		want []string
	}{
		{single, []string{"pool      free 3, cooling 0, allocated 0, capacity 9; warm target 2\n"}},
		{dual, []string{"pool ipv4 free 3, cooling 0, allocated 0, capacity 9; warm target 2\n",
			"pool ipv6 free 4, cooling 0, allocated 1, capacity 65536; warm target 2\n", "10.0.0.5,fd00::5 "}},
	} {
		socket, _ := fakeAgent(t, tc.st)
		var stdout, stderr bytes.Buffer
		if code := Main([]string{"status", "--socket", socket}, &stdout, &stderr); code != 0 {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		for _, w := range tc.want {
			if !strings.Contains(stdout.String(), w) {
				t.Errorf("status lacks %q:\n%s", w, stdout.String())
			}
		}
	}
}
