// Package ec2api is the lab's EC2-compatible endpoint: the EC2 Query API
// (version 2016-11-15, form bodies in, XML out) for the calls an ENI IPAM
// makes, held in memory and answered in the shapes the Go SDK decodes. It
// stands in for EC2 where moto_server cannot: instance-type limits, /28
// prefixes, subnet-wide address uniqueness, asynchronous attach, throttling,
// denied actions, and hooks through which the lab hot-plugs an attached
// ENI's link into a node and reprograms its fabric. It also serves as the
// lab IMDS's Source. Any SigV4 signature is accepted.
package ec2api

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/vpcni/vpcni/internal/lab/imds"
)

// Options configure a Server.
type Options struct {
	Region    string // default us-east-1
	AccountID string // default 123456789012
	// AttachDelay and DetachDelay, if set, make attach and detach
	// asynchronous as on EC2 (up to ~10 s per the EKS best-practices
	// guide): the call answers at once and the ENI shows attaching or
	// detaching until the delay has passed. Zero keeps them synchronous.
	AttachDelay time.Duration
	DetachDelay time.Duration
}

// ENI is a network interface. The server's state holds one per ENI; ENIs()
// and the hooks get copies.
type ENI struct {
	ID          string // eni-…
	MAC         string
	Description string
	SubnetID    string
	SubnetCIDR  netip.Prefix
	VPCID       string
	AZ          string
	Groups      []string // security group IDs
	// Status is available, attaching, in-use or detaching; the attachment
	// fields below are set in the last three.
	Status              string
	InstanceID          string
	AttachmentID        string
	DeviceIndex         int
	NetworkCard         int
	DeleteOnTermination bool
	AttachTime          time.Time
	SourceDestCheck     bool
	PrimaryIP           netip.Addr
	PrivateIPs          []netip.Addr // every private address, the primary first
	Prefixes            []netip.Prefix
	// IPv6s and IPv6Prefixes are the ENI's IPv6 addresses and /80
	// prefixes, from its subnet's IPv6 CIDR (SubnetCIDR6; invalid when
	// the subnet has none).
	SubnetCIDR6  netip.Prefix
	IPv6s        []netip.Addr
	IPv6Prefixes []netip.Prefix
	Tags         map[string]string
	CreatedAt    time.Time
}

func (e *ENI) clone() ENI {
	c := *e
	c.Groups, c.PrivateIPs, c.Prefixes, c.Tags = slices.Clone(e.Groups), slices.Clone(e.PrivateIPs), slices.Clone(e.Prefixes), maps.Clone(e.Tags)
	c.IPv6s, c.IPv6Prefixes = slices.Clone(e.IPv6s), slices.Clone(e.IPv6Prefixes)
	return c
}

// attached: the ENI holds an attachment (attaching, in-use or detaching).
func (e *ENI) attached() bool { return e.InstanceID != "" }

// InstanceType is what DescribeInstanceTypes tells about a type, and the
// limits the server enforces for it.
type InstanceType struct {
	Name       string // t3.medium
	Hypervisor string // nitro, xen, or empty for bare metal
	BareMetal  bool
	VCPUs      int
	MemoryMiB  int
	// MaxENIs is MaximumNetworkInterfaces, over all network cards.
	MaxENIs    int
	IPv4PerENI int // Ipv4AddressesPerInterface: the primary, secondaries and /28 prefixes
	IPv6PerENI int // Ipv6AddressesPerInterface: IPv6 addresses and /80 prefixes
	// Cards are each network card's MaximumNetworkInterfaces; empty is
	// one card holding MaxENIs.
	Cards       []int
	DefaultCard int
}

func (t InstanceType) cards() []int {
	if len(t.Cards) == 0 {
		return []int{t.MaxENIs}
	}
	return t.Cards
}

// RunOptions describe an instance to run.
type RunOptions struct {
	Type     string
	SubnetID string
	IP       netip.Addr // the primary address; zero: the server picks one
	// IP6 is an IPv6 address of the subnet's IPv6 block for the primary
	// ENI (zero: none), as RunInstances' Ipv6Addresses.
	IP6    netip.Addr
	Groups []string // security group IDs; empty: the VPC's default group
	Role   string   // the instance profile's role (IMDS serves its credentials)
}

// InstanceInfo is a running instance as RunInstance made it.
type InstanceInfo struct {
	ID       string
	Type     string
	AZ       string
	SubnetID string
	VPCID    string
	ENIID    string // the primary ENI, at device 0
	MAC      string
	IP       netip.Addr
	Role     string
}

type vpc struct {
	id    string
	cidr  netip.Prefix
	cidr6 netip.Prefix // the VPC's IPv6 block (a /56 on EC2); invalid: none
	// assoc6 is the IPv6 block's association ID.
	assoc6 string
	tags   map[string]string
}

type subnet struct {
	id, vpcID, az string
	cidr          netip.Prefix
	tags          map[string]string
	used          map[netip.Addr]string   // address → the ENI holding it
	prefixes      map[netip.Prefix]string // /28 → the ENI holding it
	// cidr6 is the subnet's IPv6 block (invalid: the subnet has none);
	// used6 and prefixes6 its addresses and /80s held by ENIs.
	cidr6     netip.Prefix
	assoc6    string
	used6     map[netip.Addr]string
	prefixes6 map[netip.Prefix]string
}

type securityGroup struct {
	id, vpcID, name string
	tags            map[string]string
}

type instance struct {
	id, typ, subnetID, vpcID, az string
	groups                       []string
	role                         string
	state                        string // running, terminated
	launched                     time.Time
	tags                         map[string]string
	creds                        imds.Credentials
}

// Server is the endpoint. A request runs its checks and changes under one
// lock, so each call is atomic; hooks run after, outside it.
type Server struct {
	// OnAttach hot-plugs an attaching ENI's link into the instance's node;
	// an error fails the attach and the ENI stays available.
	OnAttach func(instanceID string, eni ENI) error
	// OnDetach removes a detaching ENI's link from the node.
	OnDetach func(instanceID string, eni ENI)
	// OnChange gets every ENI after each change of addresses, attachments
	// or source/destination check, so the lab can reprogram its fabric.
	//
	// The hooks are set before serving. They are called without the
	// server's lock, one at a time, in the order of the changes; a request
	// is answered after the hooks of its own changes have run. A hook may
	// read the server (ENIs, Instance) but not change it through its API
	// or seeding methods: those wait for the running hooks to finish.
	OnChange func(enis []ENI)

	region, account          string
	attachDelay, detachDelay time.Duration

	mu        sync.Mutex
	vpcs      map[string]*vpc
	subnets   map[string]*subnet
	groups    map[string]*securityGroup
	types     map[string]InstanceType
	instances map[string]*instance
	enis      map[string]*ENI
	tokens    map[string]string // CreateNetworkInterface ClientToken → ENI ID
	macs      map[string]bool
	pending   []func() // hooks queued under mu, run by runHooks
	timers    []*time.Timer
	closed    bool

	hookMu sync.Mutex // one hook at a time, in order

	faults faults
}

// New returns an endpoint holding the built-in instance types and nothing
// else.
func New(o Options) *Server {
	if o.Region == "" {
		o.Region = "us-east-1"
	}
	if o.AccountID == "" {
		o.AccountID = "123456789012"
	}
	s := &Server{
		region: o.Region, account: o.AccountID, attachDelay: o.AttachDelay, detachDelay: o.DetachDelay,
		vpcs: map[string]*vpc{}, subnets: map[string]*subnet{}, groups: map[string]*securityGroup{},
		types: map[string]InstanceType{}, instances: map[string]*instance{}, enis: map[string]*ENI{},
		tokens: map[string]string{}, macs: map[string]bool{},
	}
	for _, t := range builtinTypes {
		s.types[t.Name] = t
	}
	s.faults.init()
	return s
}

// Close stops pending asynchronous attaches and detaches; no hook runs
// after it returns.
func (s *Server) Close() {
	s.mu.Lock()
	s.closed = true
	for _, t := range s.timers {
		t.Stop()
	}
	s.timers, s.pending = nil, nil
	s.mu.Unlock()
	s.hookMu.Lock() // wait for a hook that is running
	s.hookMu.Unlock()
}

// AddVPC makes a VPC with its default security group.
func (s *Server) AddVPC(cidr netip.Prefix) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := &vpc{id: newID("vpc-"), cidr: cidr.Masked(), tags: map[string]string{}}
	s.vpcs[v.id] = v
	g := &securityGroup{id: newID("sg-"), vpcID: v.id, name: "default", tags: map[string]string{}}
	s.groups[g.id] = g
	return v.id
}

// AddSubnet makes a subnet of vpcID in availability zone az. As on EC2 the
// CIDR is a /16 to /28 inside the VPC's and overlaps no other subnet.
func (s *Server) AddSubnet(vpcID string, cidr netip.Prefix, az string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.vpcs[vpcID]
	if !ok {
		return "", fmt.Errorf("vpc %s: %w", vpcID, errVPCNotFound(vpcID))
	}
	cidr = cidr.Masked()
	if !cidr.Addr().Is4() || cidr.Bits() < 16 || cidr.Bits() > 28 {
		return "", fmt.Errorf("subnet %s: an IPv4 /16 to /28 is needed", cidr)
	}
	if !v.cidr.Contains(cidr.Addr()) || v.cidr.Bits() > cidr.Bits() {
		return "", fmt.Errorf("subnet %s is not inside the VPC's %s", cidr, v.cidr)
	}
	for _, o := range s.subnets {
		if o.vpcID == vpcID && o.cidr.Overlaps(cidr) {
			return "", fmt.Errorf("subnet %s overlaps %s (%s)", cidr, o.id, o.cidr)
		}
	}
	if az == "" {
		az = s.region + "a"
	}
	sn := &subnet{id: newID("subnet-"), vpcID: vpcID, az: az, cidr: cidr, tags: map[string]string{},
		used: map[netip.Addr]string{}, prefixes: map[netip.Prefix]string{},
		used6: map[netip.Addr]string{}, prefixes6: map[netip.Prefix]string{}}
	s.subnets[sn.id] = sn
	return sn.id, nil
}

// AddSecurityGroup makes a security group in vpcID.
func (s *Server) AddSecurityGroup(vpcID, name string) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	g := &securityGroup{id: newID("sg-"), vpcID: vpcID, name: name, tags: map[string]string{}}
	s.groups[g.id] = g
	return g.id
}

// AddInstanceType adds (or replaces) an instance type.
func (s *Server) AddInstanceType(t InstanceType) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.types[t.Name] = t
}

// RunInstance starts an instance with its primary ENI attached at device 0
// of its default network card, deleted on termination. It fires OnChange,
// not OnAttach: the primary ENI's link is the node's own, made by whoever
// runs the instance.
func (s *Server) RunInstance(o RunOptions) (InstanceInfo, error) {
	defer s.runHooks()
	s.mu.Lock()
	defer s.mu.Unlock()
	t, ok := s.types[o.Type]
	if !ok {
		return InstanceInfo{}, fmt.Errorf("instance type %q: %w", o.Type, errInstanceType(o.Type))
	}
	sn, ok := s.subnets[o.SubnetID]
	if !ok {
		return InstanceInfo{}, errSubnetNotFound(o.SubnetID)
	}
	groups, aerr := s.resolveGroups(sn.vpcID, o.Groups)
	if aerr != nil {
		return InstanceInfo{}, aerr
	}
	var ips []netip.Addr
	if o.IP.IsValid() {
		if aerr := checkFree(sn, o.IP); aerr != nil {
			return InstanceInfo{}, aerr
		}
		ips = []netip.Addr{o.IP}
	} else if ips, aerr = sn.pick(1); aerr != nil {
		return InstanceInfo{}, aerr
	}
	if o.IP6.IsValid() && (!sn.cidr6.Contains(o.IP6) || sn.used6[o.IP6] != "") {
		return InstanceInfo{}, fmt.Errorf("IPv6 address %s: not free in subnet %s's IPv6 block %s", o.IP6, sn.id, sn.cidr6)
	}
	now := time.Now().UTC()
	in := &instance{id: newID("i-"), typ: t.Name, subnetID: sn.id, vpcID: sn.vpcID, az: sn.az, groups: groups,
		role: o.Role, state: "running", launched: now, tags: map[string]string{}}
	if o.Role != "" {
		in.creds = newCredentials(now)
	}
	s.instances[in.id] = in
	e := s.newENI(sn, groups, "Primary network interface")
	s.take(e, ips, nil)
	if o.IP6.IsValid() {
		s.take6(e, []netip.Addr{o.IP6}, nil)
	}
	e.Status, e.InstanceID, e.AttachmentID, e.DeviceIndex, e.NetworkCard = "in-use", in.id, newID("eni-attach-"), 0, t.DefaultCard
	e.DeleteOnTermination, e.AttachTime = true, now
	s.changed()
	return InstanceInfo{ID: in.id, Type: t.Name, AZ: sn.az, SubnetID: sn.id, VPCID: sn.vpcID, ENIID: e.ID, MAC: e.MAC,
		IP: e.PrimaryIP, Role: o.Role}, nil
}

// ENIs returns a copy of every ENI, ordered by ID.
func (s *Server) ENIs() []ENI {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.snapshot()
}

func (s *Server) snapshot() []ENI {
	out := make([]ENI, 0, len(s.enis))
	for _, id := range slices.Sorted(maps.Keys(s.enis)) {
		out = append(out, s.enis[id].clone())
	}
	return out
}

// Instance is the instance as its IMDS tells it: the ENIs attached (not
// those still attaching; those detaching until they are gone), ordered by
// network card and device index. It makes *Server an imds.Source.
func (s *Server) Instance(_ context.Context, id string) (imds.Instance, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	in, ok := s.instances[id]
	if !ok || in.state != "running" {
		return imds.Instance{}, errInstanceNotFound(id)
	}
	if in.role != "" && time.Until(in.creds.Expiration) < 15*time.Minute {
		in.creds = newCredentials(time.Now().UTC())
	}
	out := imds.Instance{ID: in.id, Type: in.typ, Region: s.region, AZ: in.az, Role: in.role, Credentials: in.creds}
	for _, e := range s.attachedTo(id) {
		if e.Status == "attaching" {
			continue
		}
		sn, v := s.subnets[e.SubnetID], s.vpcs[e.VPCID]
		out.Interfaces = append(out.Interfaces, imds.Interface{MAC: e.MAC, ID: e.ID, DeviceNumber: e.DeviceIndex,
			NetworkCard: e.NetworkCard, SubnetID: e.SubnetID, SubnetCIDR: sn.cidr, VPCID: e.VPCID,
			VPCCIDRs: []netip.Prefix{v.cidr}, SecurityGroups: slices.Clone(e.Groups),
			LocalIPv4s: slices.Clone(e.PrivateIPs), IPv4Prefixes: slices.Clone(e.Prefixes),
			IPv6s: slices.Clone(e.IPv6s), IPv6Prefixes: slices.Clone(e.IPv6Prefixes)})
		n := &out.Interfaces[len(out.Interfaces)-1]
		if sn.cidr6.IsValid() {
			n.SubnetIPv6CIDRs = []netip.Prefix{sn.cidr6}
		}
		if v.cidr6.IsValid() {
			n.VPCIPv6CIDRs = []netip.Prefix{v.cidr6}
		}
		if e.DeviceIndex == 0 && e.NetworkCard == s.types[in.typ].DefaultCard {
			out.LocalIPv4 = e.PrimaryIP
		}
	}
	return out, nil
}

// attachedTo lists the ENIs holding an attachment to the instance, by
// network card then device index.
func (s *Server) attachedTo(instanceID string) []*ENI {
	var out []*ENI
	for _, e := range s.enis {
		if e.InstanceID == instanceID {
			out = append(out, e)
		}
	}
	slices.SortFunc(out, func(a, b *ENI) int {
		if a.NetworkCard != b.NetworkCard {
			return a.NetworkCard - b.NetworkCard
		}
		return a.DeviceIndex - b.DeviceIndex
	})
	return out
}

// newENI makes an available ENI with no address yet.
func (s *Server) newENI(sn *subnet, groups []string, description string) *ENI {
	e := &ENI{ID: newID("eni-"), MAC: s.newMAC(), Description: description, SubnetID: sn.id, SubnetCIDR: sn.cidr, SubnetCIDR6: sn.cidr6,
		VPCID: sn.vpcID, AZ: sn.az, Groups: groups, Status: "available", SourceDestCheck: true,
		Tags: map[string]string{}, CreatedAt: time.Now().UTC()}
	s.enis[e.ID] = e
	return e
}

// resolveGroups checks that every group exists in the VPC; none is the
// VPC's default group.
func (s *Server) resolveGroups(vpcID string, ids []string) ([]string, *apiError) {
	if len(ids) == 0 {
		for _, g := range s.groups {
			if g.vpcID == vpcID && g.name == "default" {
				return []string{g.id}, nil
			}
		}
		return nil, nil
	}
	for _, id := range ids {
		if g, ok := s.groups[id]; !ok || g.vpcID != vpcID {
			return nil, errGroupNotFound(id)
		}
	}
	return slices.Clone(ids), nil
}

// queue runs f after the current request's changes (called with mu held).
func (s *Server) queue(f func()) {
	if !s.closed {
		s.pending = append(s.pending, f)
	}
}

// changed queues OnChange with the ENIs as they are now.
func (s *Server) changed() {
	if s.OnChange != nil {
		enis := s.snapshot()
		s.queue(func() { s.OnChange(enis) })
	}
}

// runHooks runs the queued hooks, in order, one at a time. A caller
// returns only once the hooks its own changes queued have run (by it or by
// the caller holding hookMu before it).
func (s *Server) runHooks() {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	s.drain()
}

// drain runs the queue with hookMu held.
func (s *Server) drain() {
	for {
		s.mu.Lock()
		p := s.pending
		s.pending = nil
		s.mu.Unlock()
		if len(p) == 0 {
			return
		}
		for _, f := range p {
			f()
		}
	}
}

func newID(prefix string) string {
	var b [9]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])[:17]
}

// newMAC is a locally administered unicast MAC (EC2's start 02:, 06:, 0a:,
// 0e:…), unique in the server.
func (s *Server) newMAC() string {
	for {
		var b [6]byte
		_, _ = rand.Read(b[:])
		b[0] = b[0]&0xfc | 0x02
		mac := fmt.Sprintf("%02x:%02x:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3], b[4], b[5])
		if !s.macs[mac] {
			s.macs[mac] = true
			return mac
		}
	}
}

// newCredentials are an instance role's keys, valid six hours. The server
// accepts any key; these look like EC2's (ASIA… temporary keys).
func newCredentials(now time.Time) imds.Credentials {
	return imds.Credentials{AccessKeyID: "ASIA" + upperHex(8), SecretAccessKey: upperHex(20), Token: upperHex(32),
		Expiration: now.Add(6 * time.Hour)}
}

func upperHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return fmt.Sprintf("%X", b)
}
