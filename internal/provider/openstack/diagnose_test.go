package openstack

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/doctor"
	"github.com/vpcni/vpcni/internal/provider"
)

// check runs the provider's Doctor as vpcnictl doctor does, with the
// agent config "f".
func check(cfg Config, nodeIP string, rt http.RoundTripper) []doctor.Result {
	r, err := provider.Lookup("openstack")
	if err != nil || r.Doctor == nil || r.Doctor.API != "neutron" {
		panic(fmt.Sprintf("provider openstack registered without its Doctor: %+v %v", r, err))
	}
	return doctor.Cloud(r.Doctor.Diagnose(context.Background(), &cfg, provider.DoctorNode{IP: netip.MustParseAddr(nodeIP), ConfigFile: "f", Transport: rt}))
}

func find(t *testing.T, rs []doctor.Result, name string) doctor.Result {
	t.Helper()
	for _, r := range rs {
		if r.Name == name {
			return r
		}
	}
	t.Fatalf("no check %q in %+v", name, rs)
	return doctor.Result{}
}

func expect(t *testing.T, r doctor.Result, status doctor.Status, detail ...string) {
	t.Helper()
	if r.Status != status {
		t.Errorf("%s: %s (%s), want %s", r.Name, r.Status, r.Detail, status)
	}
	for _, d := range detail {
		if !strings.Contains(r.Detail+" | "+r.Fix, d) {
			t.Errorf("%s: %q / fix %q does not say %q", r.Name, r.Detail, r.Fix, d)
		}
	}
	if status != doctor.OK && r.Fix == "" {
		t.Errorf("%s: %s without a fix", r.Name, status)
	}
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
	cfg := Config{Endpoint: srv.URL, SubnetID: "s1"}
	cfg.Defaults()
	clock := &doctor.DateClock{Next: http.DefaultTransport}
	rs := check(cfg, "10.0.0.5", clock)
	expect(t, find(t, rs, "cloud port"), doctor.OK, "p1")
	expect(t, find(t, rs, "cloud policy"), doctor.Fail, "mode fixed-ips cannot work here", "network n1 is a shared network of project owner", "provider.openstack.mode: passthrough")
	if len(rs) != 4 {
		t.Errorf("steps after the refused policy ran: %+v", rs)
	}
	expect(t, clock.Skew("neutron"), doctor.OK)

	// An owner's or admin's credentials: the no-op update goes through.
	allow = true
	rs = check(cfg, "10.0.0.5", clock)
	expect(t, find(t, rs, "cloud policy"), doctor.OK, "project owner's", "update_port:fixed_ips", "VM port p1")
	expect(t, find(t, rs, "cloud limits"), doctor.OK, "0 of ")
	allow = false

	// The port not found.
	rs = check(cfg, "10.0.0.6", clock)
	expect(t, find(t, rs, "cloud port"), doctor.Fail, "no Neutron port", "set provider.openstack.nodeIP in f")

	// Neutron unreachable.
	srv.Close()
	rs = check(cfg, "10.0.0.5", clock)
	expect(t, find(t, rs, "cloud subnet"), doctor.Fail, "reaches the cloud's endpoints")
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
	cfg := Config{Endpoint: srv.URL, SubnetID: "s1", Mode: "address-pairs"}
	cfg.Defaults()
	diagnose := func() []doctor.Result {
		return check(cfg, "10.0.0.5", http.DefaultTransport)
	}
	rs := diagnose()
	expect(t, find(t, rs, "cloud policy"), doctor.OK, "belongs to the VM port's project")
	expect(t, find(t, rs, "cloud limits"), doctor.OK, "1 of 10 allowed address pairs")
	expect(t, find(t, rs, "cloud quota"), doctor.OK, "8 of 10 ports")
	quota = `{"quota":{"port":{"used":10,"reserved":0,"limit":10}}}`
	expect(t, find(t, diagnose(), "cloud quota"), doctor.Warn, "can create no more", "quota set --ports")
	quota = ""
	expect(t, find(t, diagnose(), "cloud quota"), doctor.Warn, "cannot read the port quota of project member")

	// fixed-ips creates no ports: no quota step.
	cfg.Mode = "fixed-ips"
	for _, r := range diagnose() {
		if r.Name == "cloud quota" {
			t.Errorf("fixed-ips read the port quota: %+v", r)
		}
	}
}
