package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"path/filepath"
	"sync"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/testbed"
)

// benchNeutron measures what vpcni asks of a real Neutron: calls per pod
// through the agent (steady churn, and a burst of 50 ADDs on a cold pool),
// and one batched update of K addresses against K single ones.
func benchNeutron(args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("bench neutron", flag.ContinueOnError)
	endpoint := fs.String("endpoint", "http://127.0.0.1:19696/", "noauth Neutron endpoint (scripts/neutron.sh up)")
	k := fs.Int("k", 8, "addresses in the batched update")
	rounds := fs.Int("rounds", 3, "alternating rounds of batched vs single updates")
	churn := fs.Int("churn", 40, "pods added and deleted one after another")
	if err := fs.Parse(args); err != nil {
		return err
	}
	bin, err := binDir()
	if err != nil {
		return err
	}
	pc := &gophercloud.ProviderClient{HTTPClient: http.Client{Timeout: 30 * time.Second}}
	nc := &gophercloud.ServiceClient{ProviderClient: pc, Endpoint: *endpoint, ResourceBase: *endpoint + "v2.0/", Type: "network"}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()

	n, err := networks.Create(ctx, nc, networks.CreateOpts{Name: "vpcni-bench"}).Extract()
	if err != nil {
		return fmt.Errorf("Neutron at %s: %w (start it with scripts/neutron.sh up)", *endpoint, err)
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if pages, err := ports.List(nc, ports.ListOpts{NetworkID: n.ID}).AllPages(c); err == nil {
			all, _ := ports.ExtractPorts(pages)
			for _, p := range all {
				_ = ports.Delete(c, nc, p.ID).ExtractErr()
			}
		}
		_ = networks.Delete(c, nc, n.ID).ExtractErr()
	}()
	sn, err := subnets.Create(ctx, nc, subnets.CreateOpts{NetworkID: n.ID, IPVersion: gophercloud.IPv4, CIDR: "10.81.0.0/22"}).Extract()
	if err != nil {
		return err
	}
	newPort := func(ip string) error {
		_, err := ports.Create(ctx, nc, ports.CreateOpts{NetworkID: n.ID, DeviceOwner: "compute:vpcni-bench", FixedIPs: []ports.IP{{SubnetID: sn.ID, IPAddress: ip}}}).Extract()
		return err
	}
	osCfg := config.OpenStack{Endpoint: *endpoint, SubnetID: sn.ID}
	osCfg.ApplyDefaults()

	// 1. One batched update of K addresses vs K single ones, alternating.
	if err := newPort("10.81.3.250"); err != nil {
		return err
	}
	prov, err := openstack.New(ctx, osCfg, netip.MustParseAddr("10.81.3.250"))
	if err != nil {
		return err
	}
	var batch, single []time.Duration
	for range *rounds {
		start := time.Now()
		got, err := prov.Assign(ctx, provider.AssignRequest{Count: *k})
		if err != nil {
			return err
		}
		batch = append(batch, time.Since(start))
		if err := prov.Release(ctx, got); err != nil {
			return err
		}
		start = time.Now()
		var all []netip.Addr
		for range *k {
			got, err := prov.Assign(ctx, provider.AssignRequest{Count: 1})
			if err != nil {
				return err
			}
			all = append(all, got...)
		}
		single = append(single, time.Since(start))
		if err := prov.Release(ctx, all); err != nil {
			return err
		}
	}

	// 2. Calls per pod through the agent, default pool policy.
	tb := testbed.New("vpcni-nbench", netip.MustParsePrefix("10.81.0.0/24"))
	if err := newPort(tb.NodeIP.String()); err != nil {
		return err
	}
	if err := tb.Up(); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, tb.Down()) }()
	fwd, err := testbed.Forward(tb.NodeNS(), "127.0.0.1:19696", hostPortOf(*endpoint))
	if err != nil {
		return err
	}
	defer fwd.Close()
	cfg := tb.AgentConfig(tb.RunDir, "10.81.0.0/24")
	agentOS := osCfg
	agentOS.Endpoint = "http://127.0.0.1:19696/"
	// Room for the churn's cooling addresses plus the burst.
	agentOS.MaxAddresses = 200
	cfg.Provider = config.Provider{Type: "openstack", OpenStack: &agentOS}
	agent, err := tb.StartAgent(bin, cfg)
	if err != nil {
		return err
	}
	cni, err := tb.NewCNI([]string{bin}, filepath.Join(tb.RunDir, "cache"), testbed.VpcniConfList("1.0.0", "vpcni-nbench", cfg.SocketPath))
	if err != nil {
		return err
	}
	calls := func() int64 {
		st, err := agent.State()
		if err != nil {
			return -1
		}
		var sum int64
		for _, v := range st.Pool.ProviderCalls {
			sum += v
		}
		return sum
	}
	if err := waitWarm(agent, cfg.Pool.WarmTarget); err != nil {
		return err
	}
	// Steady churn: ADD and DEL one pod after another.
	before := calls()
	for i := range *churn {
		name := fmt.Sprintf("%s-c%d", tb.Prefix, i)
		if err := netnsutil.Add(name); err != nil {
			return err
		}
		rt := testbed.Runtime(fmt.Sprintf("churn-%d", i), netnsutil.Path(name), "eth0", nil)
		if _, err := cni.Add(ctx, rt); err != nil {
			return fmt.Errorf("churn ADD: %w", err)
		}
		if err := cni.Del(ctx, rt); err != nil {
			return err
		}
		_ = netnsutil.Delete(name)
	}
	churnCalls := calls() - before
	perPod := float64(churnCalls) / float64(*churn)

	// A burst of 50 ADDs at once.
	const burstN = 50
	paths := make([]string, burstN)
	for i := range burstN {
		name := fmt.Sprintf("%s-b%d", tb.Prefix, i)
		if err := netnsutil.Add(name); err != nil {
			return err
		}
		paths[i] = netnsutil.Path(name)
	}
	before = calls()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, burstN)
	for i := range burstN {
		wg.Go(func() { _, errs[i] = cni.Add(ctx, testbed.Runtime(fmt.Sprintf("burst-%d", i), paths[i], "eth0", nil)) })
	}
	wg.Wait()
	burstTook := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("burst: %w", err)
	}
	burstCalls := calls() - before

	fmt.Fprintf(out, "neutron-bench: real neutron-server (Debian Zed, noauth, MariaDB) at %s; K=%d, %d rounds; churn of %d pods through vpcnid (pool warm %d, batch %d, maxFree %d, cooldown %s, maxAddresses %d); burst of %d ADDs took %s\n",
		*endpoint, *k, *rounds, *churn, cfg.Pool.WarmTarget, cfg.Pool.BatchSize, cfg.Pool.MaxFree, cfg.Cooldown, agentOS.MaxAddresses, burstN, burstTook.Round(time.Millisecond))
	fmt.Fprintf(out, "batched update of %d addresses: %v; %d single updates: %v (each = fresh GET + PUT + read-back GET)\n", *k, batch, *k, single)
	fmt.Fprintf(out, "neutron-bench: calls_per_pod=%.3f burst50_calls=%d batch_put_ms=%.0f single_puts_ms=%.0f\n",
		perPod, burstCalls, ms(medianDur(batch)), ms(medianDur(single)))
	return nil
}

func medianDur(d []time.Duration) time.Duration { return pct(d, 50) }

func hostPortOf(endpoint string) string {
	var host string
	if _, err := fmt.Sscanf(endpoint, "http://%s", &host); err != nil {
		return "127.0.0.1:19696"
	}
	for i, c := range host {
		if c == '/' {
			return host[:i]
		}
	}
	return host
}
