package aws

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// findENISubnets settles where new ENIs go: the configured subnets and
// those carrying every subnetTags tag, in the instance's VPC and
// availability zone (an ENI attaches only to an instance in its own AZ);
// neither configured, the primary ENI's subnet. The caller holds p.mu.
func (p *Provider) findENISubnets(ctx context.Context) error {
	if len(p.cfg.Subnets) == 0 && len(p.cfg.SubnetTags) == 0 {
		p.eniSubnets = []string{p.id.subnetID}
		return nil
	}
	var ids []string
	if len(p.cfg.Subnets) > 0 {
		if err := p.readSubnets(ctx, p.cfg.Subnets); err != nil {
			return fmt.Errorf("subnets: %w", err)
		}
		ids = append(ids, p.cfg.Subnets...)
	}
	if len(p.cfg.SubnetTags) > 0 {
		filters := []types.Filter{{Name: aws.String("vpc-id"), Values: []string{p.id.vpcID}}}
		for _, k := range sortedKeys(p.cfg.SubnetTags) {
			filters = append(filters, types.Filter{Name: aws.String("tag:" + k), Values: []string{p.cfg.SubnetTags[k]}})
		}
		out, err := p.ec2.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{Filters: filters})
		if err != nil {
			return explain(fmt.Errorf("subnetTags: find the tagged subnets: %w", err))
		}
		for _, s := range out.Subnets {
			sn := p.parseSubnet(s)
			p.subnets[sn.id] = sn
			if !slices.Contains(ids, sn.id) {
				ids = append(ids, sn.id)
			}
		}
	}
	var wrongAZ []string
	for _, id := range ids {
		if sn := p.subnets[id]; sn.az != "" && p.id.az != "" && sn.az != p.id.az {
			wrongAZ = append(wrongAZ, fmt.Sprintf("%s (%s)", id, sn.az))
			continue
		}
		p.eniSubnets = append(p.eniSubnets, id)
	}
	if len(wrongAZ) > 0 {
		p.log.Warn("subnets outside the instance's availability zone are not used for its ENIs", "az", p.id.az, "subnets", wrongAZ)
	}
	if len(p.eniSubnets) == 0 {
		return fmt.Errorf("subnets/subnetTags: no subnet in the instance's availability zone %s and VPC %s matches (skipped: %v)", p.id.az, p.id.vpcID, wrongAZ)
	}
	return nil
}

// subnetForENI picks the subnet of a new ENI: of the ENI subnets not
// ruled out (full in this call, or backing off for prefixes), the one
// with the most free addresses, by a fresh read when there are several.
// nil if none is left. The caller holds p.mu.
func (p *Provider) subnetForENI(ctx context.Context, ruledOut map[string]bool) (*subnet, error) {
	var ids []string
	for _, id := range p.eniSubnets {
		if !ruledOut[id] && !p.backingOff(id) {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	if len(ids) > 1 {
		if err := p.readSubnets(ctx, ids); err != nil {
			return nil, err
		}
	}
	best := p.subnets[ids[0]]
	for _, id := range ids[1:] {
		if sn := p.subnets[id]; sn.free > best.free {
			best = sn
		}
	}
	return best, nil
}

// backingOff says whether prefixes are not asked for in subnet id now (it
// had no free /28 lately). The caller holds p.mu.
func (p *Provider) backingOff(id string) bool {
	b, ok := p.cidrBackoff[id]
	return ok && p.cfg.PrefixMode && time.Now().Before(b.until)
}
