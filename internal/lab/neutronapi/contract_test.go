package neutronapi

import (
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/neutrontest"
	"github.com/vpcni/vpcni/internal/provider/providertest"
)

// TestProviderContract holds the lab's endpoint to the standard the real
// neutron-server meets (test/neutron runs the same contract against it).
func TestProviderContract(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := New()
	go srv.Serve(l)
	t.Cleanup(func() { l.Close() })
	url := "http://" + l.Addr().String() + "/"
	for _, mode := range []string{"fixed-ips", "address-pairs"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			providertest.Run(t, neutrontest.Endpoint{NC: openstack.NoAuthClient(url, http.Client{Timeout: 30 * time.Second}), URL: url, Mode: mode})
		})
	}
}

// TestProviderContractIPv6: the contract's IPv6 part against the lab's
// endpoint, as test/neutron runs it against the real neutron-server.
func TestProviderContractIPv6(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go New().Serve(l)
	t.Cleanup(func() { l.Close() })
	url := "http://" + l.Addr().String() + "/"
	providertest.RunIPv6(t, neutrontest.Endpoint{NC: openstack.NoAuthClient(url, http.Client{Timeout: 30 * time.Second}), URL: url, Mode: "fixed-ips"})
}

// TestPodMACs: the lab's endpoint keeps each allowed address pair's MAC as
// the real neutron-server does (test/neutron runs the same test).
func TestPodMACs(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := New()
	go srv.Serve(l)
	t.Cleanup(func() { l.Close() })
	url := "http://" + l.Addr().String() + "/"
	neutrontest.RunPodMACs(t, neutrontest.Endpoint{NC: openstack.NoAuthClient(url, http.Client{Timeout: 30 * time.Second}), URL: url}, "10.77.0.0/24")
}

// TestFloatingIPContract: association, Neutron's leaving a floating IP on
// a fixed IP taken off a port, the provider's refusal, release and retain
// (test/neutron runs the same against the real neutron-server).
func TestFloatingIPContract(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go New().Serve(l)
	t.Cleanup(func() { l.Close() })
	url := "http://" + l.Addr().String() + "/"
	nc := openstack.NoAuthClient(url, http.Client{Timeout: 30 * time.Second})
	t.Run("fixed-ips", func(t *testing.T) {
		neutrontest.RunFloatingIPs(t, neutrontest.Endpoint{NC: nc, URL: url}, "10.78.0.0/24", "203.0.113.0/24")
	})
	t.Run("address-pairs", func(t *testing.T) {
		neutrontest.RunFloatingIPsPairs(t, neutrontest.Endpoint{NC: nc, URL: url, Mode: "address-pairs"}, "10.79.0.0/24", "198.51.100.0/24")
	})
}
