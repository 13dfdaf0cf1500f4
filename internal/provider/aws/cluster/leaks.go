package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/leaks"
)

// Leaks is the leak collector's cloud (leaks.Cloud) on EC2. What vpcni
// holds there beyond a node's own ENIs is the ENIs the agents created
// (tagged vpcni.io/owner=vpcni and the instance they were made for): one
// whose instance is no Node and carries no live pod's or reserved address
// is an orphan — detached and left by a crash, or attached to an instance
// that left the cluster. Addresses on a node's ENIs are its agent's to
// give back: the agent reads EC2 as its truth at every start.
type Leaks struct {
	EC2 *ec2.Client
	// ClusterName, if set, is the agents' clusterName: only ENIs tagged
	// vpcni.io/cluster with it are read, each this cluster's.
	ClusterName string
	// ClusterID names this cluster in claims (vpcni.io/cluster-id).
	ClusterID string
	// Log hears what a pass skips.
	Log *slog.Logger
}

// Instance implements leaks.Cloud: a Node's spec.providerID is
// aws:///<zone>/<instance-id>.
func (l *Leaks) Instance(providerID string) (string, bool) { return instanceOf(providerID) }

// eni is one ENI of vpcni's as the audit reads it.
type eni struct {
	id       string
	instance string // the attachment's, else the tag's
	attached string // the attachment ID ("" detached)
	status   types.NetworkInterfaceStatus
	primary  netip.Addr
	carries  []netip.Addr // every address, those of its prefixes too
	tags     map[string]string
}

func parseENI(n types.NetworkInterface) eni {
	e := eni{id: aws.ToString(n.NetworkInterfaceId), status: n.Status, tags: map[string]string{}}
	for _, t := range n.TagSet {
		e.tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	e.instance = e.tags[tagInstance]
	if a := n.Attachment; a != nil && aws.ToString(a.InstanceId) != "" {
		e.instance, e.attached = aws.ToString(a.InstanceId), aws.ToString(a.AttachmentId)
	}
	e.primary, _ = netip.ParseAddr(aws.ToString(n.PrivateIpAddress))
	for _, a := range n.PrivateIpAddresses {
		if ip, err := netip.ParseAddr(aws.ToString(a.PrivateIpAddress)); err == nil {
			e.carries = append(e.carries, ip)
		}
	}
	for _, p := range n.Ipv4Prefixes {
		if pf, err := netip.ParsePrefix(aws.ToString(p.Ipv4Prefix)); err == nil {
			for a := pf.Masked().Addr(); pf.Contains(a); a = a.Next() {
				e.carries = append(e.carries, a)
			}
		}
	}
	slices.SortFunc(e.carries, netip.Addr.Compare)
	e.carries = slices.Compact(e.carries)
	return e
}

// filters find vpcni's ENIs, this cluster's only when its name is known.
func (l *Leaks) filters() []types.Filter {
	f := []types.Filter{{Name: aws.String("tag:" + tagOwner), Values: []string{ownerValue}}}
	if l.ClusterName != "" {
		f = append(f, types.Filter{Name: aws.String("tag:" + tagCluster), Values: []string{l.ClusterName}})
	}
	return f
}

func (l *Leaks) claimed(e eni) bool {
	return e.tags[tagClusterID] == l.ClusterID || l.ClusterName != "" && e.tags[tagCluster] == l.ClusterName
}

// describe reads every ENI the filters match, page by page.
func describe(ctx context.Context, c *ec2.Client, filters []types.Filter) ([]types.NetworkInterface, error) {
	var out []types.NetworkInterface
	pages := ec2.NewDescribeNetworkInterfacesPaginator(c, &ec2.DescribeNetworkInterfacesInput{Filters: filters, MaxResults: aws.Int32(1000)})
	for pages.HasMorePages() {
		page, err := pages.NextPage(ctx)
		if err != nil {
			return nil, explain(err)
		}
		out = append(out, page.NetworkInterfaces...)
	}
	return out, nil
}

// Holdings implements leaks.Cloud: vpcni's ENIs, each tied to its
// instance and that instance's own address (its primary ENI's), which a
// Node has as its InternalIP when its providerID is not set.
func (l *Leaks) Holdings(ctx context.Context) ([]leaks.Holding, error) {
	if l.ClusterID == "" {
		return nil, errors.New("the audit needs the cluster's ID")
	}
	all, err := describe(ctx, l.EC2, l.filters())
	if err != nil {
		return nil, fmt.Errorf("list vpcni's ENIs: %w", err)
	}
	enis := make([]eni, 0, len(all))
	var instances []string
	for _, n := range all {
		e := parseENI(n)
		enis = append(enis, e)
		if e.instance != "" && !slices.Contains(instances, e.instance) {
			instances = append(instances, e.instance)
		}
	}
	own, err := l.instanceIPs(ctx, instances)
	if err != nil {
		return nil, err
	}
	out := make([]leaks.Holding, 0, len(enis))
	for _, e := range enis {
		out = append(out, leaks.Holding{Kind: leaks.ENI, Address: e.primary.String(), Resource: e.id, Instance: e.instance,
			NodeIPs: own[e.instance], Carries: e.carries, Claimed: l.claimed(e)})
	}
	return out, nil
}

// instanceIPs reads the primary ENI's own address of each instance that
// still has one (a terminated instance's is gone with it).
func (l *Leaks) instanceIPs(ctx context.Context, instances []string) (map[string][]netip.Addr, error) {
	own := map[string][]netip.Addr{}
	for chunk := range slices.Chunk(instances, 200) { // EC2 takes up to 200 values a filter
		primaries, err := describe(ctx, l.EC2, []types.Filter{
			{Name: aws.String("attachment.instance-id"), Values: chunk},
			{Name: aws.String("attachment.device-index"), Values: []string{"0"}},
		})
		if err != nil {
			return nil, fmt.Errorf("read the primary ENIs of %d instances: %w", len(chunk), err)
		}
		for _, n := range primaries {
			e := parseENI(n)
			if e.primary.IsValid() && e.attached != "" {
				own[e.instance] = append(own[e.instance], e.primary)
			}
		}
	}
	return own, nil
}

// Claim implements leaks.Cloud: the tag vpcni.io/cluster-id=<cluster's ID>
// on the ENI (CreateTags touches nothing else of it).
func (l *Leaks) Claim(ctx context.Context, h leaks.Holding) error {
	_, err := l.EC2.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{h.Resource},
		Tags: []types.Tag{{Key: aws.String(tagClusterID), Value: aws.String(l.ClusterID)}}})
	if code(err) == codeENINotFound {
		return nil // gone meanwhile: nothing to claim
	}
	return explain(err)
}

// codeENINotFound: the ENI does not exist (any more).
const codeENINotFound = "InvalidNetworkInterfaceID.NotFound"

// Release implements leaks.Cloud: an ENI still as listed (vpcni's, for the
// same instance, holding the same addresses) is detached if it is
// attached, and deleted once EC2 has it detached; gone already is done.
func (l *Leaks) Release(ctx context.Context, h leaks.Holding) error {
	if h.Kind != leaks.ENI {
		return fmt.Errorf("%s: not a holding of the aws cloud", h.Kind)
	}
	for try := 0; ; try++ {
		out, err := l.EC2.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{h.Resource}})
		if code(err) == codeENINotFound {
			return nil
		}
		if err != nil {
			return explain(fmt.Errorf("read ENI %s: %w", h.Resource, err))
		}
		if len(out.NetworkInterfaces) != 1 {
			return fmt.Errorf("ENI %s: EC2 described %d", h.Resource, len(out.NetworkInterfaces))
		}
		e := parseENI(out.NetworkInterfaces[0])
		if e.tags[tagOwner] != ownerValue || e.instance != h.Instance || !slices.Equal(e.carries, h.Carries) {
			return fmt.Errorf("ENI %s changed since the audit (instance %q, %d addresses): left alone", e.id, e.instance, len(e.carries))
		}
		switch {
		case e.status == types.NetworkInterfaceStatusAvailable:
			_, err := l.EC2.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: &e.id})
			if err != nil && code(err) != codeENINotFound {
				return explain(fmt.Errorf("delete ENI %s: %w", e.id, err))
			}
			return nil
		case try >= 6:
			return fmt.Errorf("ENI %s is still %s after it was detached: deleted at the next pass", e.id, e.status)
		case e.attached != "" && e.status != types.NetworkInterfaceStatusDetaching:
			// Its instance is no Node and none of its addresses is a live
			// pod's: as the agent removes an emptied ENI of its own.
			_, err := l.EC2.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: &e.attached})
			if err != nil && code(err) != "InvalidAttachmentID.NotFound" {
				return explain(fmt.Errorf("detach ENI %s from instance %s: %w", e.id, e.instance, err))
			}
			l.Log.Info("detached an orphaned ENI of vpcni's from its instance, to delete it", "eni", e.id, "instance", e.instance)
		}
		// A detach takes seconds on EC2.
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Duration(250<<try) * time.Millisecond):
		}
	}
}
