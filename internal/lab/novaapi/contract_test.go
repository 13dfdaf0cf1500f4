package novaapi

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/lab/neutronapi"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/openstack/neutrontest"
	"github.com/vpcni/vpcni/internal/provider/providertest"
)

// labEndpoint serves the lab's Neutron and os-interface on one listener,
// as the lab does (without namespaces: nothing is plugged).
func labEndpoint(t *testing.T) labNova {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	nsrv := neutronapi.New()
	nova := New(nsrv)
	mux := http.NewServeMux()
	mux.Handle(Prefix+"/", nova.Handler())
	mux.Handle("/", nsrv.Handler())
	go http.Serve(l, mux)
	t.Cleanup(func() { l.Close() })
	url := "http://" + l.Addr().String() + "/"
	httpc := http.Client{Timeout: 30 * time.Second}
	var n atomic.Int64
	ep := neutrontest.Endpoint{NC: openstack.NoAuthClient(url, httpc), URL: url, Nova: &neutrontest.Nova{
		CC:  openstack.NoAuthComputeClient(url+"compute/v2.1", httpc),
		URL: url + "compute/v2.1/",
		NewServer: func(t *testing.T, primary string) string {
			id := fmt.Sprintf("00000000-0000-4000-8000-%06d%06d", os.Getpid()%1000000, n.Add(1))
			nova.AddServer(id)
			if _, err := nsrv.Bind(primary, id); err != nil {
				t.Fatalf("boot %s with port %s: %v", id, primary, err)
			}
			return id
		},
	}}
	return labNova{ep, nova}
}

type labNova struct {
	neutrontest.Endpoint
	StandIn *Server
}

// TestOSInterfaceContract holds the stand-in to what a real Nova does
// (test/nova runs the same against Nova).
func TestOSInterfaceContract(t *testing.T) {
	labEndpoint(t).RunOSInterface(t, "10.230.0.0/24")
}

// TestProviderNICContract: passthrough and secondary NICs against the lab's
// endpoint.
func TestProviderNICContract(t *testing.T) {
	providertest.RunNICs(t, labEndpoint(t))
}

// TestFailedAttachLeavesNoPort: when the hypervisor cannot plug the NIC
// (Nova answers 500), the provider deletes the port it created for it.
func TestFailedAttachLeavesNoPort(t *testing.T) {
	ep := labEndpoint(t)
	fails := 0
	ep.StandIn.Plug = func(string, neutronapi.Port) error {
		fails++
		return fmt.Errorf("no PCI slot left")
	}
	sn := ep.NewSubnet(t, "10.230.1.0/24", 50)
	for _, opts := range []providertest.NICOptions{{Mode: "passthrough"}, {Mode: "fixed-ips", MaxAddresses: 1, SecondaryNICs: 1}} {
		n := ep.NewNICNode(t, sn, netip.MustParseAddr(fmt.Sprintf("10.230.1.%d", 10+fails)), opts)
		got, err := n.Provider.Assign(context.Background(), provider.AssignRequest{Count: 2})
		if err == nil || !strings.Contains(err.Error(), "no PCI slot left") {
			t.Fatalf("%s: Assign with a failing attach = %v, %v; want the attach's error", opts.Mode, got, err)
		}
		if left := n.Unattached(t); len(left) != 0 {
			t.Fatalf("%s: a failed attach left ports %v", opts.Mode, left)
		}
		if att := n.Attached(t); len(att) != 1 {
			t.Fatalf("%s: the VM has NICs %v after failed attaches", opts.Mode, att)
		}
	}
	if fails < 2 {
		t.Fatalf("the attach was tried %d times", fails)
	}
}
