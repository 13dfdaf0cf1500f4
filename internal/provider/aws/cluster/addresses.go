package cluster

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/cloudconfig"
)

// held is where one ENI holds an address: as a secondary address, as its
// own (primary) one, or in a delegated /28 prefix; an IPv6 address as one
// of the ENI's IPv6 addresses or in a /80 prefix.
type held struct {
	eni     types.NetworkInterface
	primary bool
	prefix  netip.Prefix
}

func (h held) id() string { return aws.ToString(h.eni.NetworkInterfaceId) }

// find says where ENI n holds a, if it does.
func find(n types.NetworkInterface, a netip.Addr) (held, bool) {
	for _, p := range n.PrivateIpAddresses {
		if ip, err := netip.ParseAddr(aws.ToString(p.PrivateIpAddress)); err == nil && ip == a {
			return held{eni: n, primary: aws.ToBool(p.Primary) || aws.ToString(n.PrivateIpAddress) == a.String()}, true
		}
	}
	for _, p := range n.Ipv4Prefixes {
		if pf, err := netip.ParsePrefix(aws.ToString(p.Ipv4Prefix)); err == nil && pf.Contains(a) {
			return held{eni: n, prefix: pf.Masked()}, true
		}
	}
	for _, p := range n.Ipv6Addresses {
		if ip, err := netip.ParseAddr(aws.ToString(p.Ipv6Address)); err == nil && ip == a {
			return held{eni: n}, true
		}
	}
	for _, p := range n.Ipv6Prefixes {
		if pf, err := netip.ParsePrefix(aws.ToString(p.Ipv6Prefix)); err == nil && pf.Contains(a) {
			return held{eni: n, prefix: pf.Masked()}, true
		}
	}
	return held{}, false
}

// addressFilter is the DescribeNetworkInterfaces filter that finds the
// ENIs holding a as an address of their own (not in a prefix).
func addressFilter(a netip.Addr) string {
	if a.Is6() && !a.Is4In6() {
		return "ipv6-addresses.ipv6-address"
	}
	return "addresses.private-ip-address"
}

// how says it in a person's words.
func (h held) how() string {
	where := "ENI " + h.id()
	if a := h.eni.Attachment; a != nil && aws.ToString(a.InstanceId) != "" {
		where += fmt.Sprintf(" (device %d)", aws.ToInt32(a.DeviceIndex))
	} else {
		where += " (" + string(h.eni.Status) + ")"
	}
	switch {
	case h.primary:
		return "the own address of " + where
	case h.prefix.IsValid():
		return "in prefix " + h.prefix.String() + " of " + where
	}
	return "a secondary address of " + where
}

// TakeOff takes pod addresses off a dead node's ENIs, as that node's own
// release would: port is its primary ENI (the node's provider port, as
// the AddressReservation recorded it), and each address leaves the ENI of
// the instance that holds it — one UnassignPrivateIpAddresses per ENI (and per ENI's prefixes),
// UnassignIpv6Addresses for IPv6 addresses and /80s —
// so that another node can assign it (EC2 gives an address to one ENI at
// a time). An ENI's own address is never taken. An address in a /28 prefix
// leaves with its whole prefix, which EC2 assigns and unassigns only
// whole, and only when the instance no longer runs: the prefix's other
// addresses may be pods' still running there. An address the instance no
// longer holds is done. When the port itself is gone (its instance
// terminated), only vpcni's detached ENIs are looked at: the instance's
// others went with it.
//
// There is no conditional write on EC2: the address's being the sticky
// pod's, held by a dead node, is what the AddressReservation says (the
// agent recorded it from its own allocation); the controller does not
// second-guess it.
func TakeOff(ctx context.Context, c *ec2.Client, clusterName, port string, addrs []netip.Addr) error {
	out, err := c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{port}})
	var enis []types.NetworkInterface
	instance := ""
	switch {
	case code(err) == codeENINotFound:
		for _, a := range addrs {
			filters := []types.Filter{{Name: aws.String(addressFilter(a)), Values: []string{a.String()}},
				{Name: aws.String("tag:" + tagOwner), Values: []string{ownerValue}}, {Name: aws.String("status"), Values: []string{"available"}}}
			if clusterName != "" {
				filters = append(filters, types.Filter{Name: aws.String("tag:" + tagCluster), Values: []string{clusterName}})
			}
			left, err := describe(ctx, c, filters)
			if err != nil {
				return fmt.Errorf("find %s on a detached ENI of vpcni's: %w", a, err)
			}
			enis = append(enis, left...)
		}
	case err != nil:
		return explain(fmt.Errorf("read the dead node's ENI %s: %w", port, err))
	case len(out.NetworkInterfaces) == 1 && out.NetworkInterfaces[0].Attachment != nil:
		instance = aws.ToString(out.NetworkInterfaces[0].Attachment.InstanceId)
		if enis, err = describe(ctx, c, []types.Filter{{Name: aws.String("attachment.instance-id"), Values: []string{instance}}}); err != nil {
			return fmt.Errorf("read the ENIs of the dead node's instance %s: %w", instance, err)
		}
	default:
		enis = out.NetworkInterfaces
	}
	addrsOn, prefixesOn := map[string][]string{}, map[string][]string{}
	addrs6On, prefixes6On := map[string][]string{}, map[string][]string{}
	var errs []error
	for _, a := range addrs {
		i := slices.IndexFunc(enis, func(n types.NetworkInterface) bool { _, ok := find(n, a); return ok })
		if i < 0 {
			continue // not held there any more
		}
		h, _ := find(enis[i], a)
		addrsOn, prefixesOn := addrsOn, prefixesOn
		if h.prefix.IsValid() && h.prefix.Addr().Is6() || !h.prefix.IsValid() && a.Is6() {
			addrsOn, prefixesOn = addrs6On, prefixes6On
		}
		switch {
		case h.primary:
			errs = append(errs, fmt.Errorf("%s is ENI %s's own address: never taken off", a, h.id()))
		case h.prefix.IsValid():
			if !slices.Contains(prefixesOn[h.id()], h.prefix.String()) {
				prefixesOn[h.id()] = append(prefixesOn[h.id()], h.prefix.String())
			}
		default:
			addrsOn[h.id()] = append(addrsOn[h.id()], a.String())
		}
	}
	if len(prefixesOn)+len(prefixes6On) > 0 && instance != "" {
		state, err := instanceState(ctx, c, instance)
		if err != nil {
			return err
		}
		if state == types.InstanceStateNameRunning || state == types.InstanceStateNamePending {
			var ps []string
			for _, p := range slices.Concat(slices.Collect(maps.Values(prefixesOn)), slices.Collect(maps.Values(prefixes6On))) {
				ps = append(ps, p...)
			}
			slices.Sort(ps)
			errs = append(errs, fmt.Errorf("%s of instance %s, which still runs: EC2 takes a prefix off only whole, with its other addresses, which may be pods' still running there; the address is free once the instance is stopped or terminated (or the node gives it back)", strings.Join(ps, ", "), instance))
			clear(prefixesOn)
			clear(prefixes6On)
		}
	}
	// Addresses and prefixes go in calls of their own, as the agent's
	// release makes them.
	unassign := func(in *ec2.UnassignPrivateIpAddressesInput, what []string) {
		if _, err := c.UnassignPrivateIpAddresses(ctx, in); err != nil && code(err) != codeENINotFound {
			errs = append(errs, explain(fmt.Errorf("unassign %v from ENI %s: %w", what, aws.ToString(in.NetworkInterfaceId), err)))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(addrsOn)) {
		unassign(&ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(id), PrivateIpAddresses: addrsOn[id]}, addrsOn[id])
	}
	for _, id := range slices.Sorted(maps.Keys(prefixesOn)) {
		unassign(&ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: aws.String(id), Ipv4Prefixes: prefixesOn[id]}, prefixesOn[id])
	}
	unassign6 := func(in *ec2.UnassignIpv6AddressesInput, what []string) {
		if _, err := c.UnassignIpv6Addresses(ctx, in); err != nil && code(err) != codeENINotFound {
			errs = append(errs, explain(fmt.Errorf("unassign %v from ENI %s: %w", what, aws.ToString(in.NetworkInterfaceId), err)))
		}
	}
	for _, id := range slices.Sorted(maps.Keys(addrs6On)) {
		unassign6(&ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: aws.String(id), Ipv6Addresses: addrs6On[id]}, addrs6On[id])
	}
	for _, id := range slices.Sorted(maps.Keys(prefixes6On)) {
		unassign6(&ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: aws.String(id), Ipv6Prefixes: prefixes6On[id]}, prefixes6On[id])
	}
	return errors.Join(errs...)
}

// instanceState reads an instance's state; one EC2 no longer describes is
// terminated.
func instanceState(ctx context.Context, c *ec2.Client, id string) (types.InstanceStateName, error) {
	out, err := c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{id}})
	if code(err) == "InvalidInstanceID.NotFound" {
		return types.InstanceStateNameTerminated, nil
	}
	if err != nil {
		return "", explain(fmt.Errorf("read instance %s: %w", id, err))
	}
	for _, r := range out.Reservations {
		for _, in := range r.Instances {
			if aws.ToString(in.InstanceId) == id && in.State != nil {
				return in.State.Name, nil
			}
		}
	}
	return types.InstanceStateNameTerminated, nil
}

// Holders says which ENIs hold addr and the instances they are attached
// to: those with it as a private address (EC2 finds them by filter), else
// those with a /28 prefix holding it, found among the ENIs of the subnets
// whose CIDR holds it (EC2 documents no filter for a prefix's addresses).
func Holders(ctx context.Context, c *ec2.Client, addr netip.Addr) ([]cloudconfig.Holder, error) {
	enis, err := describe(ctx, c, []types.Filter{{Name: aws.String(addressFilter(addr)), Values: []string{addr.String()}}})
	if err != nil {
		return nil, fmt.Errorf("find the ENIs holding %s: %w", addr, err)
	}
	if len(enis) == 0 {
		if enis, err = subnetENIs(ctx, c, addr); err != nil {
			return nil, err
		}
	}
	var out []cloudconfig.Holder
	for _, n := range enis {
		h, ok := find(n, addr)
		if !ok {
			continue
		}
		hd := cloudconfig.Holder{Resource: h.id(), How: h.how()}
		if a := n.Attachment; a != nil {
			hd.Instance = aws.ToString(a.InstanceId)
		}
		out = append(out, hd)
	}
	return out, nil
}

// subnetENIs reads the ENIs of every subnet whose CIDR holds addr.
func subnetENIs(ctx context.Context, c *ec2.Client, addr netip.Addr) ([]types.NetworkInterface, error) {
	var ids []string
	pages := ec2.NewDescribeSubnetsPaginator(c, &ec2.DescribeSubnetsInput{})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, explain(fmt.Errorf("find the subnet of %s: %w", addr, err))
		}
		for _, s := range page.Subnets {
			blocks := []string{aws.ToString(s.CidrBlock)}
			for _, a := range s.Ipv6CidrBlockAssociationSet {
				blocks = append(blocks, aws.ToString(a.Ipv6CidrBlock))
			}
			if slices.ContainsFunc(blocks, func(b string) bool { p, err := netip.ParsePrefix(b); return err == nil && p.Contains(addr) }) {
				ids = append(ids, aws.ToString(s.SubnetId))
			}
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	enis, err := describe(ctx, c, []types.Filter{{Name: aws.String("subnet-id"), Values: ids}})
	if err != nil {
		return nil, fmt.Errorf("read the ENIs of subnets %v: %w", ids, err)
	}
	return enis, nil
}
