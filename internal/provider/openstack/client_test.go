package openstack_test

import (
	"context"
	"net/http"
	"net/http/httptest"
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
