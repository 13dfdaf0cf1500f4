// Package aws takes pod addresses from EC2: secondary private IPv4
// addresses — or /28 prefixes of 16 addresses, in prefix mode — on the
// instance's ENIs, the primary ENI first and then ENIs vpcni creates and
// attaches when it is full.
//
// What the node is (its instance, type, primary ENI, subnet, VPC) comes
// from the instance metadata service, IMDSv2; what its ENIs hold comes
// from EC2's DescribeNetworkInterfaces, never from IMDS, which lags EC2
// after every assignment. vpcni owns every secondary address and prefix
// on the ENIs it created (tagged vpcni.io/owner=vpcni and the instance);
// on the primary ENI it owns what it recorded (records.go), and it never
// unassigns an address it did not assign. Writes are per ENI, one call
// per batch; the client paces itself per EC2 action (throttle.go).
package aws

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials/ec2rolecreds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go/middleware"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/provider"
)

// Provider is one node's view of EC2.
type Provider struct {
	cfg      Config
	ec2      *ec2.Client
	meter    *meter
	id       identity
	limits   TypeLimits
	maxENIs  int
	nodeName string
	log      *slog.Logger
	notify   func(provider.Notice)
	// network is the PodNetwork the provider serves ("": the node's own
	// pods, on the primary ENI and ENIs without a pod-network tag).
	network string
	// groups are the security groups of the ENIs vpcni creates.
	groups []string
	// eniSubnets are where new ENIs go (the configured ones, else the
	// primary ENI's).
	eniSubnets []string

	mu      sync.Mutex // one writer per instance
	enis    []*eni     // attached to the instance, by card and device
	readAt  time.Time
	subnets map[string]*subnet
	rec     *records
	// draining: vpcni's ENIs being detached and deleted (no new addresses).
	draining map[string]bool
	// dotTried: ENIs whose DeleteOnTermination was set (or tried) already.
	dotTried map[string]bool
	// cidrBackoff: subnets that had no free /28 for a prefix, until when,
	// and what EC2 said.
	cidrBackoff map[string]backoff
	answers     answerStyle
	// v6: the provider gives out IPv6 addresses too (ipFamilies has ipv6;
	// the node's own pods only); answers6 is answers for
	// AssignIpv6Addresses; dual: the node's pods take IPv4 too, so vpcni
	// attaches ENIs (for IPv4) that then carry IPv6 as well.
	v6, dual bool
	answers6 answerStyle
	kick     chan struct{}
	// freeENIs is how many more ENIs the instance's default card takes,
	// plus one (0: not read yet), and ownENIs the ENIs of the provider's
	// own network, both at the last read of the ENIs: Info reads them
	// without the lock.
	freeENIs, ownENIs atomic.Int64
}

type backoff struct {
	until time.Time
	err   error
}

var _ provider.Provider = (*Provider)(nil)

func init() {
	provider.Register(provider.Registration{
		Name:        "aws",
		NewSettings: func() provider.Settings { return &Config{} },
		New: func(ctx context.Context, node provider.Node, s provider.Settings) (provider.Provider, error) {
			return New(ctx, *s.(*Config), node)
		},
		// A VPC's internet gateway maps only an instance's primary address
		// to a public one: pod traffic leaving the VPC goes out as the node
		// unless snat.enabled is false (as aws-vpc-cni's
		// AWS_VPC_K8S_CNI_EXTERNALSNAT=false does by default).
		SNATByDefault: true,
		NetworkNICs:   true,
		Network: func(ctx context.Context, node provider.Node, s provider.Settings, name string, spec json.RawMessage) (provider.Provider, error) {
			return NewNetwork(ctx, *s.(*Config), node, name, spec)
		},
		NetworkRoom: networkRoom,
		Families:    []family.Family{family.V4, family.V6},
		Doctor:      &provider.Doctor{API: "ec2", Diagnose: diagnose},
	})
}

// New reads who the node is from IMDS, connects to EC2 with the SDK's
// default credential chain (the instance role, served by IMDS, on EC2),
// reads the instance type's limits and the instance's ENIs, settles
// interrupted writes, deletes leaked ENIs, and starts the cleanup of
// emptied and leaked ENIs, which runs as long as ctx. cfg has had its
// Defaults.
func New(ctx context.Context, cfg Config, node provider.Node) (*Provider, error) {
	return open(ctx, cfg, node, nil)
}

// open is New for the node's own pods (net nil) or for a PodNetwork's.
func open(ctx context.Context, cfg Config, node provider.Node, net *podNetwork) (*Provider, error) {
	if node.StateDir == "" {
		return nil, errors.New("provider aws needs the agent's stateDir: it records there which addresses on the primary ENI are vpcni's")
	}
	log := node.Log
	if log == nil {
		log = slog.Default()
	}
	p := &Provider{cfg: cfg, meter: newMeter(cfg.APIRate, cfg.APIBurst), nodeName: node.Name, log: log, notify: node.Notify,
		subnets: map[string]*subnet{}, draining: map[string]bool{}, dotTried: map[string]bool{}, cidrBackoff: map[string]backoff{},
		kick: make(chan struct{}, 1)}
	start, cancel := context.WithTimeout(ctx, 4*cfg.Timeout.Duration)
	defer cancel()
	md := newIMDS(cfg)
	var err error
	if p.id, err = readIdentity(start, md); err != nil {
		return nil, err
	}
	p.meter.shareWith(p.id.instanceID)
	if p.ec2, err = p.connect(start, md); err != nil {
		return nil, err
	}
	if p.limits, err = ReadTypeLimits(start, p.ec2, p.id.instanceType); err != nil {
		return nil, err
	}
	if cfg.PrefixMode && !p.limits.Nitro() {
		return nil, fmt.Errorf("prefixMode: instance type %s runs on %q, and EC2 delegates prefixes only to Nitro instances", p.id.instanceType, p.limits.Hypervisor)
	}
	p.maxENIs = p.limits.ENIs
	if cfg.MaxENIs > 0 && cfg.MaxENIs < p.maxENIs {
		p.maxENIs = cfg.MaxENIs
	}
	path := filepath.Join(node.StateDir, recordsFile)
	if net != nil {
		p.network, path = net.name, net.recordsPath(node.StateDir)
		if err := p.checkNetwork(start, net); err != nil {
			return nil, err
		}
	}
	if p.rec, err = loadRecords(path, p.id.instanceID); err != nil {
		return nil, err
	}
	p.v6 = net == nil && wantsV6(node.Families)
	p.dual = p.v6 && family.Has(node.Families, family.V4)
	p.mu.Lock()
	err = p.start(start)
	if err == nil && p.v6 {
		err = p.checkIPv6()
	}
	p.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if n, err := p.deleteLeaked(start); err != nil {
		log.Warn("looking for leaked ENIs failed; the next cleanup tries again", "err", err)
	} else if n > 0 {
		log.Info("deleted leaked ENIs of vpcni's at start", "count", n)
	}
	go p.cleanupLoop(ctx)
	return p, nil
}

// connect builds the EC2 client: the default credential chain (IMDS's
// role last, through the same IMDS endpoint), the standard retryer with
// cfg's attempts and backoff, and the meter after it.
func (p *Provider) connect(ctx context.Context, md ec2rolecreds.GetMetadataAPIClient) (*ec2.Client, error) {
	region := p.cfg.Region
	if region == "" {
		region = p.id.region
	}
	cfg := p.cfg
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx,
		awsconfig.WithRegion(region),
		awsconfig.WithHTTPClient(awshttp.NewBuildableClient().WithTimeout(cfg.Timeout.Duration)),
		awsconfig.WithEC2RoleCredentialOptions(func(o *ec2rolecreds.Options) { o.Client = md }),
		awsconfig.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts, o.MaxBackoff = cfg.Retries, cfg.RetryMaxBackoff.Duration
			})
		}),
		awsconfig.WithAPIOptions([]func(*middleware.Stack) error{p.meter.middleware}),
	)
	if err != nil {
		return nil, fmt.Errorf("AWS SDK configuration: %w", err)
	}
	return ec2.NewFromConfig(awsCfg, func(o *ec2.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	}), nil
}

// start reads the instance's ENIs, settles the records against them,
// and picks the security groups and subnets of new ENIs. The caller holds
// p.mu.
func (p *Provider) start(ctx context.Context) error {
	if err := p.readENIs(ctx); err != nil {
		return err
	}
	if err := p.reconcileRecords(); err != nil {
		return err
	}
	if p.network != "" {
		return nil // its groups and subnets are the PodNetwork's (checkNetwork)
	}
	p.groups = p.cfg.SecurityGroups
	if len(p.groups) == 0 {
		p.groups = p.id.groups
	}
	return p.findENISubnets(ctx)
}

// Info implements provider.Provider: the primary ENI, the capacity the
// instance type gives, and the EC2 requests made so far by action.
func (p *Provider) Info() provider.Info {
	if p.network != "" {
		return p.networkInfo()
	}
	i := provider.Info{Name: "aws", Port: p.id.eniID, Calls: p.meter.snapshot(), VPCCIDRs: slices.Clone(p.id.vpcCIDRs)}
	i.Capacity = p.limits.Capacity(p.maxENIs, p.cfg.PrefixMode)
	per := fmt.Sprintf("%d secondary addresses (%d IPv4 addresses per ENI less the ENI's own)", p.limits.slots(), p.limits.IPv4PerENI)
	if p.cfg.PrefixMode {
		per = fmt.Sprintf("%d /28 prefixes of 16 addresses (%d IPv4 slots per ENI less the ENI's own address)", p.limits.slots(), p.limits.IPv4PerENI)
	}
	enis := fmt.Sprintf("%d ENIs (instance type %s)", p.maxENIs, p.id.instanceType)
	if p.maxENIs < p.limits.ENIs {
		enis = fmt.Sprintf("%d ENIs (maxENIs; instance type %s allows %d)", p.maxENIs, p.id.instanceType, p.limits.ENIs)
	}
	i.CapacityReason = enis + " × " + per
	i.FreeNICs, i.NICAddresses = -1, p.limits.Capacity(1, p.cfg.PrefixMode)
	if free, ok := p.freeSlots(); ok {
		i.FreeNICs = free
	}
	if p.v6 {
		i.Capacities = map[family.Family]provider.Capacity{
			family.V4: {Max: i.Capacity, Reason: i.CapacityReason},
			family.V6: p.capacity6(),
		}
	}
	return i
}

// freeSlots is how many more ENIs the instance's default card takes, as
// last read (ok false: never).
func (p *Provider) freeSlots() (int, bool) {
	n := p.freeENIs.Load()
	return int(n - 1), n > 0
}

// InstanceID is the node's instance, as IMDS named it.
func (p *Provider) InstanceID() string { return p.id.instanceID }

// lease says where an address of the node lives: its ENI's subnet and
// router, and — on an ENI of vpcni's — that ENI as a NIC of its own, whose
// route table the pod's traffic must take (EC2 drops what leaves by an ENI
// that does not hold the source address).
func (p *Provider) lease(e *eni, a netip.Addr) alloc.Lease {
	l := alloc.Lease{Address: a, Interface: e.id}
	if sn := p.subnets[e.subnetID]; sn != nil {
		l.Prefix, l.Gateway = sn.cidr.Masked(), sn.gateway()
	}
	if e.id != p.id.eniID {
		l.NIC = &alloc.NIC{MAC: e.mac, Address: e.primaryIP}
	}
	return l
}

// Held implements provider.Provider: read from EC2 now, the secondary
// addresses and prefix addresses vpcni put on the instance's ENIs, less
// prefix addresses the agent gave back.
func (p *Provider) Held(ctx context.Context) ([]alloc.Lease, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if err := p.readENIs(ctx); err != nil {
		return nil, err
	}
	if err := p.reconcileRecords(); err != nil {
		return nil, err
	}
	var out []alloc.Lease
	for _, e := range p.enis {
		for _, a := range p.mine(e) {
			out = append(out, p.lease(e, a))
		}
		for _, a := range p.mine6(e) {
			out = append(out, p.lease6(e, a))
		}
	}
	slices.SortFunc(out, func(a, b alloc.Lease) int { return a.Address.Compare(b.Address) })
	return out, nil
}

// mine lists the pod addresses of vpcni's on e, as last read: every
// secondary address and prefix address on an ENI of vpcni's, the recorded
// ones on another; prefix addresses given back are not listed.
func (p *Provider) mine(e *eni) []netip.Addr {
	if !e.attached {
		return nil // attaching or detaching: no link to carry pods
	}
	var out []netip.Addr
	for _, a := range e.secondaries {
		if e.ours || p.rec.owns(e.id, a.String()) {
			out = append(out, a)
		}
	}
	for _, pf := range e.prefixes {
		if !e.ours && !p.rec.owns(e.id, pf.String()) {
			continue
		}
		for _, a := range expand(pf) {
			if !p.rec.isIdle(a) {
				out = append(out, a)
			}
		}
	}
	return out
}

// reconcileRecords settles interrupted writes against the ENIs as read,
// forgets what left them, and saves if anything changed. The caller
// holds p.mu.
func (p *Provider) reconcileRecords() error {
	changed := len(p.rec.Pending) > 0
	attached := map[string]*eni{}
	for _, e := range p.enis {
		attached[e.id] = e
		if e.ours {
			continue
		}
		claimed, unclaimed := p.rec.settle(e.id, e.holds())
		if len(claimed) > 0 {
			p.log.Info("an assign interrupted earlier had landed; its addresses are vpcni's", "eni", e.id, "addresses", claimed)
		}
		if len(unclaimed) > 0 {
			p.notice("interrupted_assign", fmt.Sprintf("ENI %s gained %v during an assign of vpcni's that was interrupted, more than it asked for: someone else wrote at the same moment, so vpcni claims none of them (they stay on the ENI; unassign those that are not a person's)", e.id, unclaimed),
				"eni", e.id, "addresses", unclaimed)
		}
		holds := map[string]bool{}
		for _, w := range e.holds() {
			holds[w] = true
		}
		changed = p.rec.prune(e.id, holds, time.Now().Add(-time.Minute)) || changed
	}
	// An intent on an ENI that left the instance settles nothing.
	pending := slices.DeleteFunc(slices.Clone(p.rec.Pending), func(in intent) bool { return attached[in.ENI] == nil })
	if len(pending) != len(p.rec.Pending) {
		p.rec.Pending = pending
	}
	for id := range p.rec.Owned {
		if attached[id] == nil {
			changed = p.rec.prune(id, nil, time.Now().Add(-time.Minute)) || changed
		}
	}
	// Idle addresses whose prefix left vpcni's ENIs are forgotten.
	idle := slices.DeleteFunc(slices.Clone(p.rec.Idle), func(a netip.Addr) bool {
		for _, e := range p.enis {
			for _, pf := range e.prefixes {
				if pf.Contains(a) {
					return false
				}
			}
		}
		return true
	})
	if len(idle) != len(p.rec.Idle) {
		p.rec.Idle, changed = idle, true
	}
	changed = p.forgetPrefixes6() || changed
	if !changed {
		return nil
	}
	if err := p.rec.save(); err != nil {
		return fmt.Errorf("save vpcni's record of its addresses on the primary ENI: %w", err)
	}
	return nil
}

// notice tells a person something through the agent.
func (p *Provider) notice(kind, msg string, attrs ...any) {
	p.log.Warn(msg, attrs...)
	if p.notify != nil {
		p.notify(provider.Notice{Reason: provider.ReasonWriteRace, Kind: kind, Message: msg, Attrs: attrs})
	}
}
