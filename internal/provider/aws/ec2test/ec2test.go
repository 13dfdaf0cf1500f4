// Package ec2test runs the provider contract against any EC2 API —
// moto_server, the lab's endpoint — through the same calls: each test
// subnet in a VPC of its own, each node an instance in it with an IMDSv2
// of its own (internal/lab/imds, reading the instance through the same
// EC2 API), and a provider built as the agent builds it.
package ec2test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/lab/imds"
	"github.com/vpcni/vpcni/internal/provider"
	vpcaws "github.com/vpcni/vpcni/internal/provider/aws"
	"github.com/vpcni/vpcni/internal/provider/providertest"
)

// Endpoint is an EC2 API under test as the provider contract sees it.
type Endpoint struct {
	// URL is the EC2 endpoint the providers use; Client reads and seeds
	// it (any region, test keys).
	URL    string
	Client *ec2.Client
	// InstanceType of the nodes (default m5.large: 3 ENIs of 10
	// addresses, so the contract's nodes fit on their primary ENI).
	InstanceType string
	// AZ of the test subnets (default: the client's region + "a").
	AZ string
	// Seed, if set, makes the test subnets and instances (the lab's
	// endpoint is seeded in Go); nil: through the EC2 API (CreateVpc,
	// CreateSubnet, RunInstances).
	Seed Seeder
	// Source serves each node's IMDS (default: imds.FromEC2 over Client,
	// with a role whose keys are the test keys).
	Source imds.Source
	// IMDSLag delays each node's IMDS behind the EC2 API.
	IMDSLag time.Duration
	// Lacks is what the endpoint does not do as EC2 does.
	Lacks providertest.Lacks
	// Configure, if set, adjusts each provider's config.
	Configure func(*vpcaws.Config)
	// Families are the providers' address families (the agent's
	// ipFamilies; nil: IPv4 only).
	Families []family.Family
}

// IPv6Seeder is a Seeder that can give a subnet an IPv6 block.
type IPv6Seeder interface {
	SubnetIPv6(t *testing.T, subnetID string, block netip.Prefix)
}

var block6N atomic.Int32

// AddIPv6 gives a subnet an IPv6 /64 and returns it: through the seeder,
// or through the EC2 API as a person does (the VPC gets an
// Amazon-provided /56, the subnet its first /64).
func (e *Endpoint) AddIPv6(t *testing.T, subnetID string) netip.Prefix {
	t.Helper()
	if s, ok := e.Seed.(IPv6Seeder); ok {
		n := block6N.Add(1)
		block := netip.MustParsePrefix(fmt.Sprintf("2600:1f18:%x:%x::/64", 0x100+n/0x100, n%0x100))
		s.SubnetIPv6(t, subnetID, block)
		return block
	}
	sn, err := e.Client.DescribeSubnets(Ctx(t), &ec2.DescribeSubnetsInput{SubnetIds: []string{subnetID}})
	if err != nil || len(sn.Subnets) != 1 {
		t.Fatalf("read subnet %s: %v", subnetID, err)
	}
	vpc, err := e.Client.AssociateVpcCidrBlock(Ctx(t), &ec2.AssociateVpcCidrBlockInput{VpcId: sn.Subnets[0].VpcId, AmazonProvidedIpv6CidrBlock: aws.Bool(true)})
	if err != nil || vpc.Ipv6CidrBlockAssociation == nil {
		t.Fatalf("give the VPC of %s an IPv6 block: %v", subnetID, err)
	}
	v6, err := netip.ParsePrefix(aws.ToString(vpc.Ipv6CidrBlockAssociation.Ipv6CidrBlock))
	if err != nil {
		t.Fatalf("the VPC's IPv6 block: %v", err)
	}
	block := netip.PrefixFrom(v6.Masked().Addr(), 64)
	if _, err := e.Client.AssociateSubnetCidrBlock(Ctx(t), &ec2.AssociateSubnetCidrBlockInput{SubnetId: &subnetID, Ipv6CidrBlock: aws.String(block.String())}); err != nil {
		t.Fatalf("give subnet %s the IPv6 block %s: %v", subnetID, block, err)
	}
	return block
}

// Seeder makes what a test needs on an endpoint that is seeded in Go.
type Seeder interface {
	// Subnets makes a VPC with cidr and the subnets of it in az.
	Subnets(t *testing.T, vpc netip.Prefix, az string, subnets ...netip.Prefix) []string
	// Instance runs an instance of typ in subnetID with ip, its instance
	// role's keys served by its IMDS; it returns the instance and its
	// primary ENI.
	Instance(t *testing.T, subnetID, typ string, ip netip.Addr) (id, eni string)
}

// Ctx is a test's context, bounded.
func Ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

func (e *Endpoint) az() string {
	if e.AZ != "" {
		return e.AZ
	}
	return e.Client.Options().Region + "a"
}

// Run runs the provider contract (what the endpoint lacks not run).
func (e *Endpoint) Run(t *testing.T) { providertest.RunLacking(t, e, e.Lacks) }

// NewSubnet implements providertest.Endpoint: a VPC with the subnet's
// CIDR, and the subnet. Unless the endpoint lacks exhaustion, addresses
// beyond pool (from the top down) are taken by a filler ENI, so that
// exactly pool addresses are free from .4 up.
func (e *Endpoint) NewSubnet(t *testing.T, cidr string, pool int) providertest.Subnet {
	t.Helper()
	prefix := netip.MustParsePrefix(cidr)
	id := e.subnet(t, prefix)
	if e.Lacks.Exhaustion == "" {
		e.fill(t, id, prefix, pool)
	}
	return providertest.Subnet{ID: id, CIDR: prefix, Gateway: prefix.Addr().Next()}
}

// subnet makes a VPC with the CIDR and a subnet of all of it.
func (e *Endpoint) subnet(t *testing.T, prefix netip.Prefix) string {
	return e.NewVPC(t, prefix, prefix)[0]
}

// NewVPC makes a VPC with the CIDR and subnets of it in the endpoint's
// AZ, and returns the subnets' IDs.
func (e *Endpoint) NewVPC(t *testing.T, cidr netip.Prefix, subnets ...netip.Prefix) []string {
	t.Helper()
	if e.Seed != nil {
		return e.Seed.Subnets(t, cidr, e.az(), subnets...)
	}
	vpc, err := e.Client.CreateVpc(Ctx(t), &ec2.CreateVpcInput{CidrBlock: aws.String(cidr.String())})
	if err != nil {
		t.Fatalf("create VPC %s: %v", cidr, err)
	}
	var ids []string
	for _, p := range subnets {
		sn, err := e.Client.CreateSubnet(Ctx(t), &ec2.CreateSubnetInput{VpcId: vpc.Vpc.VpcId, CidrBlock: aws.String(p.String()), AvailabilityZone: aws.String(e.az())})
		if err != nil {
			t.Fatalf("create subnet %s: %v", p, err)
		}
		ids = append(ids, aws.ToString(sn.Subnet.SubnetId))
	}
	return ids
}

// fill takes the subnet's usable addresses beyond the first pool.
func (e *Endpoint) fill(t *testing.T, subnetID string, p netip.Prefix, pool int) {
	var usable []netip.Addr
	last := p.Addr()
	for a := p.Addr(); p.Contains(a); a = a.Next() {
		last = a
	}
	for a := p.Addr().Next().Next().Next().Next(); a != last; a = a.Next() {
		usable = append(usable, a)
	}
	if len(usable) <= pool {
		return
	}
	var spec []types.PrivateIpAddressSpecification
	for i, a := range usable[pool:] {
		spec = append(spec, types.PrivateIpAddressSpecification{PrivateIpAddress: aws.String(a.String()), Primary: aws.Bool(i == 0)})
	}
	if _, err := e.Client.CreateNetworkInterface(Ctx(t), &ec2.CreateNetworkInterfaceInput{SubnetId: &subnetID, PrivateIpAddresses: spec,
		Description: aws.String("vpcni-test filler")}); err != nil {
		t.Fatalf("fill subnet %s beyond %d free addresses: %v", p, pool, err)
	}
}

// NewNode implements providertest.Endpoint: an instance with nodeIP, its
// IMDS, and a provider for it.
func (e *Endpoint) NewNode(t *testing.T, sn providertest.Subnet, nodeIP netip.Addr) providertest.Node {
	n, _ := e.NewInstance(t, sn.ID, nodeIP)
	return n
}

// Instance is a test node's instance.
type Instance struct {
	ID, ENI  string
	IMDS     *imds.Server
	IMDSURL  string
	StateDir string
}

// NewInstance runs an instance with nodeIP in subnetID, serves its IMDS
// and opens a provider for it.
func (e *Endpoint) NewInstance(t *testing.T, subnetID string, nodeIP netip.Addr) (providertest.Node, Instance) {
	t.Helper()
	typ := e.InstanceType
	if typ == "" {
		typ = "m5.large"
	}
	inst := Instance{StateDir: t.TempDir()}
	if e.Seed != nil {
		inst.ID, inst.ENI = e.Seed.Instance(t, subnetID, typ, nodeIP)
	} else {
		inst.ID, inst.ENI = e.runInstance(t, subnetID, typ, nodeIP)
	}
	src := e.Source
	if src == nil {
		s := imds.FromEC2(e.Client)
		s.Role, s.Credentials = "vpcni-test-node", imds.Credentials{AccessKeyID: "testing", SecretAccessKey: "testing", Token: "testing"}
		src = s
	}
	inst.IMDS = imds.New(src, inst.ID, imds.Options{Lag: e.IMDSLag, Refresh: 200 * time.Millisecond})
	srv := httptest.NewServer(inst.IMDS)
	t.Cleanup(srv.Close)
	inst.IMDSURL = srv.URL
	open := func(t *testing.T) provider.Provider { return e.Open(t, inst, nil) }
	n := e.node(inst.ENI)
	n.Provider, n.Reopen = open(t), open
	return n, inst
}

// runInstance runs an instance through the EC2 API.
func (e *Endpoint) runInstance(t *testing.T, subnetID, typ string, ip netip.Addr) (id, eni string) {
	run, err := e.Client.RunInstances(Ctx(t), &ec2.RunInstancesInput{
		ImageId: aws.String("ami-0123456789abcdef0"), MinCount: aws.Int32(1), MaxCount: aws.Int32(1),
		InstanceType: types.InstanceType(typ), SubnetId: &subnetID, PrivateIpAddress: aws.String(ip.String()),
	})
	if err != nil {
		t.Fatalf("run an instance with %s: %v", ip, err)
	}
	in := run.Instances[0]
	for _, ni := range in.NetworkInterfaces {
		if ni.Attachment != nil && aws.ToInt32(ni.Attachment.DeviceIndex) == 0 {
			eni = aws.ToString(ni.NetworkInterfaceId)
		}
	}
	if eni == "" {
		t.Fatalf("instance %s has no ENI at device 0: %+v", aws.ToString(in.InstanceId), in.NetworkInterfaces)
	}
	return aws.ToString(in.InstanceId), eni
}

// Open builds a provider for inst as the agent does, its config adjusted
// by Configure and then by adjust.
func (e *Endpoint) Open(t *testing.T, inst Instance, adjust func(*vpcaws.Config)) *vpcaws.Provider {
	t.Helper()
	cfg := vpcaws.Config{Endpoint: e.URL, IMDSEndpoint: inst.IMDSURL, ClusterName: "vpcni-test"}
	if e.Configure != nil {
		e.Configure(&cfg)
	}
	if adjust != nil {
		adjust(&cfg)
	}
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("provider config: %v", err)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	p, err := vpcaws.New(Ctx(t), cfg, provider.Node{Name: "node-" + inst.ID, StateDir: inst.StateDir, Log: log, Families: e.Families})
	if err != nil {
		t.Fatalf("aws provider: %v", err)
	}
	if got := p.Info().Port; got != inst.ENI {
		t.Fatalf("provider found primary ENI %s, want %s", got, inst.ENI)
	}
	return p
}

// node is an instance's primary ENI as the contract reads it.
func (e *Endpoint) node(eniID string) providertest.Node {
	return providertest.Node{
		PortID:    eniID,
		BatchCall: "AssignPrivateIpAddresses",
		PortIPs:   func(t *testing.T) []netip.Addr { return e.ENIAddrs(t, eniID) },
		AddByHand: func(t *testing.T, ip netip.Addr) {
			if _, err := e.Client.AssignPrivateIpAddresses(Ctx(t), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &eniID, PrivateIpAddresses: []string{ip.String()}}); err != nil {
				t.Errorf("add %s to ENI %s by hand: %v", ip, eniID, err)
			}
		},
	}
}

// ENIAddrs reads from the endpoint every address an ENI holds: its
// private addresses and those of its prefixes.
func (e *Endpoint) ENIAddrs(t *testing.T, eniID string) []netip.Addr {
	t.Helper()
	out, err := e.Client.DescribeNetworkInterfaces(Ctx(t), &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{eniID}})
	if err != nil || len(out.NetworkInterfaces) != 1 {
		t.Fatalf("read ENI %s: %v", eniID, err)
	}
	var addrs []netip.Addr
	ni := out.NetworkInterfaces[0]
	for _, a := range ni.PrivateIpAddresses {
		if ip, err := netip.ParseAddr(aws.ToString(a.PrivateIpAddress)); err == nil && !slices.Contains(addrs, ip) {
			addrs = append(addrs, ip)
		}
	}
	for _, pf := range ni.Ipv4Prefixes {
		p := netip.MustParsePrefix(aws.ToString(pf.Ipv4Prefix))
		for a := p.Addr(); p.Contains(a); a = a.Next() {
			addrs = append(addrs, a)
		}
	}
	slices.SortFunc(addrs, netip.Addr.Compare)
	return addrs
}

// ENIs reads the ENIs attached to an instance, by device index.
func (e *Endpoint) ENIs(t *testing.T, instanceID string) []types.NetworkInterface {
	t.Helper()
	out, err := e.Client.DescribeNetworkInterfaces(Ctx(t), &ec2.DescribeNetworkInterfacesInput{
		Filters: []types.Filter{{Name: aws.String("attachment.instance-id"), Values: []string{instanceID}}},
	})
	if err != nil {
		t.Fatalf("read the ENIs of %s: %v", instanceID, err)
	}
	enis := out.NetworkInterfaces
	slices.SortFunc(enis, func(a, b types.NetworkInterface) int {
		return int(aws.ToInt32(a.Attachment.DeviceIndex) - aws.ToInt32(b.Attachment.DeviceIndex))
	})
	return enis
}

// Tag reads one tag of an ENI.
func Tag(ni types.NetworkInterface, key string) string {
	for _, t := range ni.TagSet {
		if aws.ToString(t.Key) == key {
			return aws.ToString(t.Value)
		}
	}
	return ""
}

// Describe says what an ENI holds, for failure messages.
func Describe(ni types.NetworkInterface) string {
	var ips []string
	for _, a := range ni.PrivateIpAddresses {
		ips = append(ips, aws.ToString(a.PrivateIpAddress))
	}
	return fmt.Sprintf("%s (%s) %s", aws.ToString(ni.NetworkInterfaceId), ni.Status, strings.Join(ips, ","))
}
