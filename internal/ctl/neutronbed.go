package ctl

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httputil"
	"net/netip"
	"net/url"
	"path/filepath"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// neutronBed is a benchmark bed on a real Neutron: a network and subnet of
// its own, and a testbed node whose VM port lives in that subnet, running
// vpcnid with the openstack provider through a forwarder.
type neutronBed struct {
	nc       *gophercloud.ServiceClient
	endpoint string
	netID    string
	subnetID string
	osCfg    openstack.Config
	tb       *testbed.Topology
	fwd      net.Listener
	bin      string
}

// newNeutronBed creates the network (cidr must hold the testbed's /24) and
// the testbed; close removes both.
func newNeutronBed(ctx context.Context, endpoint, prefix, cidr string) (b *neutronBed, err error) {
	bin, err := binDir()
	if err != nil {
		return nil, err
	}
	b = &neutronBed{endpoint: endpoint, bin: bin, nc: openstack.NoAuthClient(endpoint, http.Client{Timeout: 30 * time.Second})}
	n, err := networks.Create(ctx, b.nc, networks.CreateOpts{Name: prefix}).Extract()
	if err != nil {
		return nil, fmt.Errorf("Neutron at %s: %w (start it with scripts/neutron.sh up)", endpoint, err)
	}
	b.netID = n.ID
	bed := b // b is nil by the time a failed return's cleanup runs
	defer func() {
		if err != nil {
			err = errors.Join(err, bed.close())
		}
	}()
	sn, err := subnets.Create(ctx, b.nc, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv4, CIDR: cidr}).Extract()
	if err != nil {
		return nil, err
	}
	b.subnetID = sn.ID
	b.osCfg = openstack.Config{Endpoint: endpoint, SubnetID: sn.ID}
	b.osCfg.Defaults()
	p := netip.MustParsePrefix(cidr).Masked().Addr().As4()
	b.tb = testbed.New(prefix, netip.PrefixFrom(netip.AddrFrom4(p), 24))
	if err := b.newPort(ctx, b.tb.NodeIP); err != nil {
		return nil, err
	}
	if err := b.tb.Up(); err != nil {
		return nil, err
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, err
	}
	if b.fwd, err = testbed.Forward(b.tb.NodeNS(), "127.0.0.1:19696", u.Host); err != nil {
		return nil, err
	}
	return b, nil
}

// newPort makes a VM port with ip on the bed's subnet.
func (b *neutronBed) newPort(ctx context.Context, ip netip.Addr) error {
	_, err := ports.Create(ctx, b.nc, ports.CreateOpts{NetworkID: b.netID, DeviceOwner: "compute:vpcni-bench",
		FixedIPs: []ports.IP{{SubnetID: b.subnetID, IPAddress: ip.String()}}}).Extract()
	return err
}

// agent starts vpcnid on the node with the openstack provider and the
// given pool policy, state in a fresh directory.
func (b *neutronBed) agent(name string, pool config.Pool, maxAddresses int) (*testbed.Agent, *testbed.CNI, error) {
	dir := filepath.Join(b.tb.RunDir, name)
	cfg := b.tb.AgentConfig(dir, b.tb.Subnet.String())
	os := b.osCfg
	os.Endpoint = "http://127.0.0.1:19696/"
	os.MaxAddresses = maxAddresses
	cfg.Provider = config.Provider{Type: "openstack", Settings: &os}
	cfg.Pool = pool
	a, err := b.tb.StartAgent(b.bin, cfg)
	if err != nil {
		return nil, nil, err
	}
	cni, err := b.tb.NewCNI([]string{b.bin}, filepath.Join(dir, "cache"), testbed.VpcniConfList("1.0.0", "vpcni-"+name, cfg.SocketPath))
	return a, cni, err
}

// calls sums the agent's Neutron HTTP requests.
func calls(a *testbed.Agent) int64 {
	st, err := a.State()
	if err != nil {
		return -1
	}
	var sum int64
	for _, v := range st.Pool.ProviderCalls {
		sum += v
	}
	return sum
}

func (b *neutronBed) close() error {
	var errs []error
	if b.fwd != nil {
		b.fwd.Close()
	}
	if b.tb != nil {
		errs = append(errs, b.tb.Down())
	}
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if pages, err := ports.List(b.nc, ports.ListOpts{NetworkID: b.netID}).AllPages(c); err == nil {
		all, _ := ports.ExtractPorts(pages)
		for _, p := range all {
			_ = ports.Delete(c, b.nc, p.ID).ExtractErr()
		}
	}
	errs = append(errs, networks.Delete(c, b.nc, b.netID).ExtractErr())
	return errors.Join(errs...)
}

// vmProvider makes a VM port with ip and the openstack provider on it,
// with no agent: the benchmarks' yardstick for direct Neutron updates.
func (b *neutronBed) vmProvider(ctx context.Context, ip netip.Addr) (*openstack.Provider, error) {
	if err := b.newPort(ctx, ip); err != nil {
		return nil, err
	}
	return openstack.New(ctx, b.osCfg, ip)
}

// vmProviderVia is vmProvider with the provider's requests sent to
// endpoint (a recorder in front of the bed's Neutron).
func (b *neutronBed) vmProviderVia(ctx context.Context, ip netip.Addr, endpoint string) (*openstack.Provider, error) {
	if err := b.newPort(ctx, ip); err != nil {
		return nil, err
	}
	cfg := b.osCfg
	cfg.Endpoint = endpoint
	return openstack.New(ctx, cfg, ip)
}

// request is one HTTP request a recorder passed on: its method, its path
// with IDs as {id}, its status and how long Neutron took to answer it
// (as seen at the recorder, on loopback).
type request struct {
	method, path string
	status       int
	took         time.Duration
}

// recorder is a reverse proxy on loopback in front of a Neutron endpoint
// that records every request: the benchmark's view of where a provider
// call's time goes, without any hook in the provider (so the same
// measurement runs against any version of it).
type recorder struct {
	URL string
	srv *http.Server
	ln  net.Listener

	mu   sync.Mutex
	reqs []request
}

var uuidRE = regexp.MustCompile(`[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}`)

func newRecorder(endpoint string) (*recorder, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r := &recorder{URL: "http://" + ln.Addr().String() + "/", ln: ln}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = roundTripFunc(func(q *http.Request) (*http.Response, error) {
		start := time.Now()
		resp, err := http.DefaultTransport.RoundTrip(q)
		rq := request{method: q.Method, path: uuidRE.ReplaceAllString(q.URL.Path, "{id}"), took: time.Since(start)}
		if resp != nil {
			rq.status = resp.StatusCode
		}
		r.mu.Lock()
		r.reqs = append(r.reqs, rq)
		r.mu.Unlock()
		return resp, err
	})
	r.srv = &http.Server{Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = r.srv.Serve(ln) }()
	return r, nil
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// mark is where the requests made from now on start.
func (r *recorder) mark() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.reqs)
}

// since returns the requests made after mark.
func (r *recorder) since(mark int) []request {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reqs[mark:])
}

func (r *recorder) close() error { return r.srv.Close() }
