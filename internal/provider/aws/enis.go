package aws

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/provider"
)

// Tags vpcni puts on the ENIs it creates. An ENI with tagOwner = ownerValue
// and tagInstance = the node's instance is vpcni's: every secondary
// address and prefix on it is a pod address of that node.
const (
	tagPrefix   = "vpcni.io/"
	tagOwner    = tagPrefix + "owner"
	ownerValue  = "vpcni"
	tagInstance = tagPrefix + "instance-id"
	tagNode     = tagPrefix + "node"
	tagCluster  = tagPrefix + "cluster"
	tagCreated  = tagPrefix + "created-at"
	// tagNetwork names the PodNetwork whose pods an ENI carries
	// (podnetwork.go); the node's own ENIs have none.
	tagNetwork = tagPrefix + "pod-network"
)

// eni is one ENI attached to the instance, as EC2 describes it.
type eni struct {
	id, mac, subnetID string
	device, card      int
	attachmentID      string
	deleteOnTerm      bool
	// attached: the attachment is complete (not attaching or detaching):
	// the node has the ENI's link, and its addresses can carry pods.
	attached    bool
	primaryIP   netip.Addr
	secondaries []netip.Addr
	prefixes    []netip.Prefix
	// ipv6s and prefixes6 are the ENI's IPv6 addresses and /80 prefixes
	// (ipv6.go); they take the type's IPv6 slots, not its IPv4 ones.
	ipv6s     []netip.Addr
	prefixes6 []netip.Prefix
	// vpcni: vpcni created the ENI for this instance (its tags); network
	// is the PodNetwork it serves ("" the node's own pods). ours: vpcni's
	// and of the provider's own network, the only ENIs it writes.
	vpcni, ours bool
	network     string
	created     time.Time
}

// used is how many of the ENI's address slots hold a secondary address
// or a prefix (its own primary address takes one more).
func (e *eni) used() int { return len(e.secondaries) + len(e.prefixes) }

// holds lists the ENI's secondary addresses and prefixes, of both
// families, as strings: what the records settle and prune against.
func (e *eni) holds() []string {
	out := make([]string, 0, e.used()+e.used6())
	for _, a := range e.secondaries {
		out = append(out, a.String())
	}
	for _, p := range e.prefixes {
		out = append(out, p.String())
	}
	for _, a := range e.ipv6s {
		out = append(out, a.String())
	}
	for _, p := range e.prefixes6 {
		out = append(out, p.String())
	}
	return out
}

// subnet is a subnet vpcni takes addresses in.
type subnet struct {
	id   string
	cidr netip.Prefix
	az   string
	vpc  string
	free int // AvailableIpAddressCount as last read
	// cidr6 is the subnet's IPv6 block (invalid: it has none).
	cidr6 netip.Prefix
}

// gateway is the subnet's router: EC2 keeps its first host address.
func (s *subnet) gateway() netip.Addr { return s.cidr.Masked().Addr().Next() }

// usable says whether a is an address EC2 may give an ENI in the subnet:
// not the network address, not the three EC2 reserves after it (router,
// DNS, future use), not the broadcast address. (EC2 never hands these
// out; an emulator that does must not give them to pods.)
func (s *subnet) usable(a netip.Addr) bool {
	if !s.cidr.Contains(a) {
		return false
	}
	base := s.cidr.Masked().Addr()
	for range 4 {
		if a == base {
			return false
		}
		base = base.Next()
	}
	last := s.cidr.Masked().Addr().As4()
	host := uint32(1)<<(32-s.cidr.Bits()) - 1
	v := uint32(last[0])<<24 | uint32(last[1])<<16 | uint32(last[2])<<8 | uint32(last[3]) | host
	return a != netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// parseENI reads one ENI of EC2's answer.
func (p *Provider) parseENI(n types.NetworkInterface) *eni {
	e := &eni{id: aws.ToString(n.NetworkInterfaceId), mac: strings.ToLower(aws.ToString(n.MacAddress)), subnetID: aws.ToString(n.SubnetId)}
	if a := n.Attachment; a != nil {
		e.device, e.card = int(aws.ToInt32(a.DeviceIndex)), int(aws.ToInt32(a.NetworkCardIndex))
		e.attachmentID, e.deleteOnTerm = aws.ToString(a.AttachmentId), aws.ToBool(a.DeleteOnTermination)
		e.attached = a.Status == types.AttachmentStatusAttached
	}
	e.primaryIP, _ = netip.ParseAddr(aws.ToString(n.PrivateIpAddress))
	for _, a := range n.PrivateIpAddresses {
		ip, err := netip.ParseAddr(aws.ToString(a.PrivateIpAddress))
		if err != nil || aws.ToBool(a.Primary) || ip == e.primaryIP || slices.Contains(e.secondaries, ip) {
			continue
		}
		e.secondaries = append(e.secondaries, ip)
	}
	for _, pf := range n.Ipv4Prefixes {
		if pfx, err := netip.ParsePrefix(aws.ToString(pf.Ipv4Prefix)); err == nil && !slices.Contains(e.prefixes, pfx) {
			e.prefixes = append(e.prefixes, pfx)
		}
	}
	for _, a := range n.Ipv6Addresses {
		if ip, err := netip.ParseAddr(aws.ToString(a.Ipv6Address)); err == nil && ip.Is6() && !slices.Contains(e.ipv6s, ip) {
			e.ipv6s = append(e.ipv6s, ip)
		}
	}
	for _, pf := range n.Ipv6Prefixes {
		if pfx, err := netip.ParsePrefix(aws.ToString(pf.Ipv6Prefix)); err == nil && pfx.Addr().Is6() && !slices.Contains(e.prefixes6, pfx) {
			e.prefixes6 = append(e.prefixes6, pfx)
		}
	}
	tags := map[string]string{}
	for _, t := range n.TagSet {
		tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	e.vpcni = tags[tagOwner] == ownerValue && tags[tagInstance] == p.id.instanceID
	e.network = tags[tagNetwork]
	e.ours = e.vpcni && e.network == p.network
	e.created, _ = time.Parse(time.RFC3339, tags[tagCreated])
	return e
}

// readENIs reads from EC2 the ENIs attached to the instance (the truth;
// IMDS lags it) and the subnets they are in. The caller holds p.mu.
func (p *Provider) readENIs(ctx context.Context) error {
	var all []*eni
	pages := ec2.NewDescribeNetworkInterfacesPaginator(p.ec2, &ec2.DescribeNetworkInterfacesInput{
		Filters:    []types.Filter{{Name: aws.String("attachment.instance-id"), Values: []string{p.id.instanceID}}},
		MaxResults: aws.Int32(1000),
	})
	for pages.HasMorePages() {
		out, err := pages.NextPage(ctx)
		if err != nil {
			return explain(fmt.Errorf("read the ENIs of instance %s: %w", p.id.instanceID, err))
		}
		for _, n := range out.NetworkInterfaces {
			if n.Attachment != nil && aws.ToString(n.Attachment.InstanceId) == p.id.instanceID {
				all = append(all, p.parseENI(n))
			}
		}
	}
	slices.SortFunc(all, func(a, b *eni) int {
		if a.card != b.card {
			return a.card - b.card
		}
		return a.device - b.device
	})
	if !slices.ContainsFunc(all, func(e *eni) bool { return e.id == p.id.eniID }) {
		return fmt.Errorf("EC2 lists no ENI %s (the primary ENI IMDS names) on instance %s: %w", p.id.eniID, p.id.instanceID, errGone)
	}
	var missing []string
	for _, e := range all {
		if _, ok := p.subnets[e.subnetID]; !ok && !slices.Contains(missing, e.subnetID) {
			missing = append(missing, e.subnetID)
		}
	}
	if err := p.readSubnets(ctx, missing); err != nil {
		return err
	}
	p.enis, p.readAt = all, time.Now()
	p.countENIs()
	p.fixDeleteOnTermination(ctx)
	return nil
}

// readIfStale reads the ENIs again unless they were read (or written by
// the provider itself) within the last few seconds: after its own writes
// the provider's copy is current, and a write on a stale copy fails in a
// way that makes it read again (PrivateIpAddressLimitExceeded).
func (p *Provider) readIfStale(ctx context.Context) error {
	if p.enis != nil && time.Since(p.readAt) < freshFor {
		return nil
	}
	return p.readENIs(ctx)
}

// freshFor is how long the provider trusts its copy of the ENIs.
const freshFor = 10 * time.Second

// readSubnets reads subnets by ID into p.subnets.
func (p *Provider) readSubnets(ctx context.Context, ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	out, err := p.ec2.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: ids})
	if err != nil {
		return explain(fmt.Errorf("read subnets %v: %w", ids, err))
	}
	for _, s := range out.Subnets {
		p.subnets[aws.ToString(s.SubnetId)] = p.parseSubnet(s)
	}
	for _, id := range ids {
		if p.subnets[id] == nil {
			return fmt.Errorf("subnet %s: EC2 does not describe it", id)
		}
	}
	return nil
}

func (p *Provider) parseSubnet(s types.Subnet) *subnet {
	cidr, _ := netip.ParsePrefix(aws.ToString(s.CidrBlock))
	sn := &subnet{id: aws.ToString(s.SubnetId), cidr: cidr, az: aws.ToString(s.AvailabilityZone), vpc: aws.ToString(s.VpcId), free: int(aws.ToInt32(s.AvailableIpAddressCount))}
	for _, a := range s.Ipv6CidrBlockAssociationSet {
		if st := a.Ipv6CidrBlockState; st != nil && leaving(string(st.State)) {
			continue
		}
		if p, err := netip.ParsePrefix(aws.ToString(a.Ipv6CidrBlock)); err == nil && p.Addr().Is6() && !sn.cidr6.IsValid() {
			sn.cidr6 = p.Masked()
		}
	}
	return sn
}

// leaving says whether a CIDR block association's state is one of a
// block going or gone. Anything else is taken as associated: moto 5.2.1
// writes a subnet's state as "{'State': 'associated'}".
func leaving(state string) bool {
	for _, s := range []types.SubnetCidrBlockStateCode{types.SubnetCidrBlockStateCodeDisassociating, types.SubnetCidrBlockStateCodeDisassociated,
		types.SubnetCidrBlockStateCodeFailing, types.SubnetCidrBlockStateCodeFailed} {
		if strings.Contains(state, string(s)) {
			return true
		}
	}
	return false
}

// fixDeleteOnTermination sets DeleteOnTermination on vpcni's ENIs that
// lack it (a crash between attach and the flag), once per ENI and process:
// without it the ENI outlives its instance. The caller holds p.mu.
func (p *Provider) fixDeleteOnTermination(ctx context.Context) {
	for _, e := range p.enis {
		if !e.ours || e.deleteOnTerm || p.dotTried[e.id] {
			continue
		}
		p.dotTried[e.id] = true
		if err := p.setDeleteOnTermination(ctx, e); err != nil {
			p.log.Warn("could not set DeleteOnTermination on vpcni's ENI; it would outlive the instance", "eni", e.id, "err", err)
		}
	}
}

func (p *Provider) setDeleteOnTermination(ctx context.Context, e *eni) error {
	_, err := p.ec2.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{
		NetworkInterfaceId: &e.id,
		Attachment:         &types.NetworkInterfaceAttachmentChanges{AttachmentId: &e.attachmentID, DeleteOnTermination: aws.Bool(true)},
	})
	if err != nil {
		return explain(fmt.Errorf("set DeleteOnTermination on ENI %s: %w", e.id, err))
	}
	e.deleteOnTerm = true
	return nil
}

// primary is the primary ENI as last read.
func (p *Provider) primary() *eni {
	for _, e := range p.enis {
		if e.id == p.id.eniID {
			return e
		}
	}
	return nil
}

// countENIs keeps, for Info, the instance's free ENI slots and the ENIs
// of this provider's network as just read.
func (p *Provider) countENIs() {
	own := 0
	for _, e := range p.enis {
		if e.ours && e.id != p.id.eniID {
			own++
		}
	}
	p.ownENIs.Store(int64(own))
	p.freeENIs.Store(int64(max(p.maxENIs-p.attachedOnCard(), 0)) + 1) // +1: zero means not read
}

// attachedOnCard counts the ENIs on the default network card.
func (p *Provider) attachedOnCard() int {
	n := 0
	for _, e := range p.enis {
		if e.card == p.primary().card {
			n++
		}
	}
	return n
}

// createENI makes an ENI of vpcni's in sn with count secondary addresses
// (or count prefixes), attaches it at the next free device index and has
// it deleted with the instance. An ENI that does not attach is deleted.
// The caller holds p.mu.
func (p *Provider) createENI(ctx context.Context, sn *subnet, count int) (_ *eni, err error) {
	now := time.Now().UTC()
	tags := []types.Tag{
		{Key: aws.String(tagOwner), Value: aws.String(ownerValue)},
		{Key: aws.String(tagInstance), Value: aws.String(p.id.instanceID)},
		{Key: aws.String(tagCreated), Value: aws.String(now.Format(time.RFC3339))},
	}
	if p.nodeName != "" {
		tags = append(tags, types.Tag{Key: aws.String(tagNode), Value: aws.String(p.nodeName)})
	}
	if p.cfg.ClusterName != "" {
		tags = append(tags, types.Tag{Key: aws.String(tagCluster), Value: aws.String(p.cfg.ClusterName)})
	}
	desc := fmt.Sprintf("vpcni pod addresses of instance %s (node %s)", p.id.instanceID, p.nodeName)
	if p.network != "" {
		tags = append(tags, types.Tag{Key: aws.String(tagNetwork), Value: aws.String(p.network)})
		desc = fmt.Sprintf("vpcni pod network %s on instance %s (node %s)", p.network, p.id.instanceID, p.nodeName)
	}
	for _, k := range sortedKeys(p.cfg.Tags) {
		tags = append(tags, types.Tag{Key: aws.String(k), Value: aws.String(p.cfg.Tags[k])})
	}
	// A client token makes the create idempotent: the SDK's retry after a
	// lost reply or a 5xx gets the ENI the first attempt made, not a
	// second one left available until the leak sweep.
	token := make([]byte, 16)
	_, _ = rand.Read(token)
	in := &ec2.CreateNetworkInterfaceInput{
		ClientToken:       aws.String(hex.EncodeToString(token)),
		SubnetId:          &sn.id,
		Groups:            p.groups,
		Description:       aws.String(desc),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface, Tags: tags}},
	}
	if count > 0 && p.cfg.PrefixMode {
		in.Ipv4PrefixCount = aws.Int32(int32(count))
	} else if count > 0 {
		in.SecondaryPrivateIpAddressCount = aws.Int32(int32(count))
	}
	// The node's provider and each PodNetwork's add ENIs to the same
	// instance: one at a time counts its ENIs, picks a device index and
	// attaches, or two would take the last slot, or the same index.
	unlock := lockAttach(p.id.instanceID)
	locked := true
	defer func() {
		if locked {
			unlock()
		}
	}()
	dev, inUse, err := p.freeDevice(ctx)
	if err != nil {
		return nil, err
	}
	if inUse >= p.maxENIs {
		// Someone took the last slot since the provider last read the
		// instance: another of vpcni's providers on the node (the node's
		// own pods', or a PodNetwork's), or a person.
		return nil, fmt.Errorf("the instance has its %d ENIs on its network card (the node's own pods and its PodNetworks share them): %w", p.maxENIs, provider.ErrExhausted)
	}
	out, err := p.ec2.CreateNetworkInterface(ctx, in)
	if err != nil {
		return nil, explain(fmt.Errorf("create an ENI in subnet %s (%s): %w", sn.id, sn.cidr, err))
	}
	e := p.parseENI(*out.NetworkInterface)
	e.vpcni, e.ours, e.network, e.created = true, true, p.network, now
	defer func() {
		if err != nil {
			if derr := p.deleteENI(ctx, e.id); derr != nil {
				err = errors.Join(err, fmt.Errorf("delete the ENI %s that did not attach (it is tagged and will be collected as leaked): %w", e.id, derr))
			}
		}
	}()
	att, dev, err := p.attach(ctx, e, dev)
	unlock()
	locked = false
	if err != nil {
		return nil, explain(fmt.Errorf("attach ENI %s to instance %s at device index %d: %w", e.id, p.id.instanceID, dev, err))
	}
	e.attachmentID, e.device, e.card = aws.ToString(att.AttachmentId), dev, p.primary().card
	p.dotTried[e.id] = true
	if err := p.setDeleteOnTermination(ctx, e); err != nil {
		// Detached before it is deleted: an ENI that would outlive its
		// instance is not kept (as aws-vpc-cni does).
		if _, derr := p.ec2.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: &e.attachmentID, Force: aws.Bool(true)}); derr != nil {
			err = errors.Join(err, explain(derr))
		}
		return nil, err
	}
	// It is the instance's now, deleted with it: kept whatever comes next
	// (an ENI still attaching is used once a read finds it attached).
	p.enis = append(p.enis, e)
	p.countENIs()
	if err := p.waitAttached(ctx, e); err != nil {
		return nil, err
	}
	return e, nil
}

// attach attaches e at device index dev of the default card (the caller
// holds the instance's attach lock).
func (p *Provider) attach(ctx context.Context, e *eni, dev int) (att *ec2.AttachNetworkInterfaceOutput, _ int, err error) {
	for try := 0; ; try++ {
		att, err = p.ec2.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{
			InstanceId: &p.id.instanceID, NetworkInterfaceId: &e.id, DeviceIndex: aws.Int32(int32(dev)), NetworkCardIndex: aws.Int32(int32(p.primary().card)),
		})
		// A new ENI may not be visible to the attach call at once (EC2's
		// API is eventually consistent).
		if err == nil || !isCode(err, codeENINotFound) || try >= 3 {
			break
		}
		if serr := sleep(ctx, time.Duration(200<<try)*time.Millisecond); serr != nil {
			return nil, dev, serr
		}
	}
	if err != nil {
		// A retried attach whose first reply was lost finds the ENI
		// attached already (InvalidNetworkInterface.InUse): it is.
		if a, rerr := p.attachmentOf(ctx, e.id); rerr == nil && a != nil && aws.ToString(a.InstanceId) == p.id.instanceID {
			att, err = &ec2.AttachNetworkInterfaceOutput{AttachmentId: a.AttachmentId}, nil
			dev = int(aws.ToInt32(a.DeviceIndex))
		}
	}
	return att, dev, err
}

// attachLocks: instance ID → its *sync.Mutex (see createENI).
var attachLocks sync.Map

func lockAttach(instance string) (unlock func()) {
	m, _ := attachLocks.LoadOrStore(instance, &sync.Mutex{})
	mu := m.(*sync.Mutex)
	mu.Lock()
	return mu.Unlock
}

// waitAttached waits until EC2 has finished attaching e (asynchronous on
// EC2, up to ~10 s): only then has the node its link, and the addresses
// can carry pods.
func (p *Provider) waitAttached(ctx context.Context, e *eni) error {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.AttachTimeout.Duration)
	defer cancel()
	for try := 0; ; try++ {
		a, err := p.attachmentOf(ctx, e.id)
		switch {
		case err != nil:
			return explain(fmt.Errorf("read ENI %s while it attaches: %w", e.id, err))
		case a != nil && a.Status == types.AttachmentStatusAttached:
			e.attached = true
			return nil
		}
		if err := sleep(ctx, time.Duration(min(50<<try, 2000))*time.Millisecond); err != nil {
			return fmt.Errorf("ENI %s is still attaching after %s (attachTimeout); its addresses are used once it is attached: %w", e.id, p.cfg.AttachTimeout, provider.ErrUnavailable)
		}
	}
}

// attachmentOf reads an ENI's attachment (nil: none).
func (p *Provider) attachmentOf(ctx context.Context, id string) (*types.NetworkInterfaceAttachment, error) {
	out, err := p.ec2.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{id}})
	if err != nil || len(out.NetworkInterfaces) != 1 {
		return nil, err
	}
	return out.NetworkInterfaces[0].Attachment, nil
}

// freeDevice is the lowest device index above 0 the instance does not use
// on its default card, by EC2's DescribeInstances and the ENIs as read,
// and how many ENIs EC2 says are attached there.
func (p *Provider) freeDevice(ctx context.Context) (dev, inUse int, _ error) {
	out, err := p.ec2.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{p.id.instanceID}})
	if err != nil {
		return 0, 0, explain(fmt.Errorf("read instance %s for a free device index: %w", p.id.instanceID, err))
	}
	card := p.primary().card
	used := map[int]bool{0: true}
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			for _, n := range in.NetworkInterfaces {
				if a := n.Attachment; a != nil && int(aws.ToInt32(a.NetworkCardIndex)) == card {
					used[int(aws.ToInt32(a.DeviceIndex))] = true
					inUse++
				}
			}
		}
	}
	for _, e := range p.enis {
		if e.card == card {
			used[e.device] = true
		}
	}
	d := 1
	for used[d] {
		d++
	}
	return d, inUse, nil
}

// deleteENI deletes a detached ENI; one already gone is no error.
func (p *Provider) deleteENI(ctx context.Context, id string) error {
	_, err := p.ec2.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: &id})
	if err == nil || isCode(err, codeENINotFound) {
		return nil
	}
	return explain(fmt.Errorf("delete ENI %s: %w", id, err))
}

// removeENI detaches one of vpcni's ENIs, waits until EC2 has it detached
// ("available": detaching takes seconds on EC2) and deletes it.
// It says whether the ENI was detached, even when deleting it failed: the
// node no longer has its link, so it must carry no addresses.
func (p *Provider) removeENI(ctx context.Context, e *eni) (detached bool, _ error) {
	_, err := p.ec2.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: &e.attachmentID})
	if err != nil && !isCode(err, codeAttachNotFound, codeENINotFound) {
		return false, explain(fmt.Errorf("detach ENI %s: %w", e.id, err))
	}
	return true, p.awaitDetachedAndDelete(ctx, e)
}

// awaitDetachedAndDelete deletes a detached ENI once EC2 says it is
// available.
func (p *Provider) awaitDetachedAndDelete(ctx context.Context, e *eni) error {
	for try := 0; ; try++ {
		out, err := p.ec2.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{e.id}})
		switch {
		case isCode(err, codeENINotFound):
			return nil
		case err != nil:
			return explain(fmt.Errorf("read ENI %s while it detaches: %w", e.id, err))
		case len(out.NetworkInterfaces) == 1 && out.NetworkInterfaces[0].Status == types.NetworkInterfaceStatusAvailable:
			return p.deleteENI(ctx, e.id)
		case try >= 8:
			return fmt.Errorf("ENI %s is still not detached after %d reads; the next cleanup tries again", e.id, try+1)
		}
		if err := sleep(ctx, time.Duration(min(250<<try, 4000))*time.Millisecond); err != nil {
			return err
		}
	}
}

// leakedFilters find the ENIs vpcni created for this instance (and
// cluster) that are attached to nothing.
func (p *Provider) leakedFilters() []types.Filter {
	f := []types.Filter{
		{Name: aws.String("tag:" + tagOwner), Values: []string{ownerValue}},
		{Name: aws.String("tag:" + tagInstance), Values: []string{p.id.instanceID}},
		{Name: aws.String("status"), Values: []string{string(types.NetworkInterfaceStatusAvailable)}},
	}
	if p.cfg.ClusterName != "" {
		f = append(f, types.Filter{Name: aws.String("tag:" + tagCluster), Values: []string{p.cfg.ClusterName}})
	}
	return f
}

// deleteLeaked deletes vpcni's ENIs of this instance that are detached
// and older than leakedENIGrace: left by a crash between create and
// attach, or by a detach whose delete failed. It returns how many it
// deleted.
func (p *Provider) deleteLeaked(ctx context.Context) (int, error) {
	out, err := p.ec2.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: p.leakedFilters()})
	if err != nil {
		return 0, explain(fmt.Errorf("look for leaked ENIs: %w", err))
	}
	n := 0
	var errs []error
	for _, ni := range out.NetworkInterfaces {
		e := p.parseENI(ni)
		// Any of vpcni's ENIs of this instance left detached is a leak,
		// whichever network it served: a PodNetwork gone from the cluster
		// has no provider left to collect its own.
		if !e.vpcni || ni.Status != types.NetworkInterfaceStatusAvailable || time.Since(e.created) < p.cfg.LeakedENIGrace.Duration {
			continue
		}
		if err := p.deleteENI(ctx, e.id); err != nil {
			errs = append(errs, err)
			continue
		}
		p.log.Info("deleted a leaked ENI of vpcni's", "eni", e.id, "created", e.created)
		n++
	}
	return n, errors.Join(errs...)
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
