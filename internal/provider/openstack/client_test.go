package openstack_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"

	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// A noauth client reaches <endpoint>/v2.0/ with or without the endpoint's
// trailing slash, and sends no token.
func TestNoAuthClientPaths(t *testing.T) {
	var gotPath, gotToken string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotPath, gotToken = r.URL.Path, r.Header.Get("X-Auth-Token")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"networks":[{"id":"n1","name":"one"}]}`))
	}))
	t.Cleanup(srv.Close)
	for _, ep := range []string{srv.URL + "/neutron", srv.URL + "/neutron/"} {
		nc := openstack.NoAuthClient(ep, http.Client{Timeout: 5 * time.Second})
		if nc.Endpoint != srv.URL+"/neutron/" {
			t.Errorf("%s: Endpoint %q, want a trailing slash", ep, nc.Endpoint)
		}
		pages, err := networks.List(nc, nil).AllPages(context.Background())
		if err != nil {
			t.Fatalf("%s: list networks: %v", ep, err)
		}
		all, err := networks.ExtractNetworks(pages)
		if err != nil || len(all) != 1 || all[0].ID != "n1" {
			t.Fatalf("%s: networks %+v, %v", ep, all, err)
		}
		if gotPath != "/neutron/v2.0/networks" || gotToken != "" {
			t.Errorf("%s: request to %q with token %q, want /neutron/v2.0/networks and none", ep, gotPath, gotToken)
		}
	}
}

// A nodeIP that is no address, in a Config built in code (where Validate
// may not have run), is an error from New, not a panic.
func TestNewWithABadNodeIP(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path != "/v2.0/subnets/s1" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(`{"subnet":{"id":"s1","network_id":"n1","cidr":"10.0.0.0/24","gateway_ip":"10.0.0.1","ip_version":4,
			"allocation_pools":[{"start":"10.0.0.2","end":"10.0.0.254"}]}}`))
	}))
	t.Cleanup(srv.Close)
	cfg := openstack.Config{Endpoint: srv.URL, SubnetID: "s1", NodeIP: "not-an-ip"}
	cfg.Defaults()
	_, err := openstack.New(context.Background(), cfg, netip.Addr{})
	if err == nil || !strings.Contains(err.Error(), `nodeIP "not-an-ip" is not an IP address`) {
		t.Fatalf("New with nodeIP not-an-ip = %v, want an error naming it", err)
	}
}
