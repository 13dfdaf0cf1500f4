package aws

import (
	"context"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// prefixSize is how many addresses one delegated IPv4 prefix (/28) holds.
const prefixSize = 16

// TypeLimits is what an instance type allows its ENIs, as EC2's
// DescribeInstanceTypes says (no table typed by hand: a new type works
// the day it launches).
type TypeLimits struct {
	Type string
	// ENIs the type takes on its default network card (the card the
	// primary ENI is on, and where vpcni attaches more; types with
	// several cards have more ENIs in all, on the other cards).
	ENIs int
	// IPv4PerENI counts the ENI's own primary address, and a /28 prefix
	// as one.
	IPv4PerENI int
	// IPv6PerENI is Ipv6AddressesPerInterface: IPv6 addresses and /80
	// prefixes (one slot each) an ENI takes; 0: the type has no IPv6.
	IPv6PerENI int
	VCPUs      int
	// Hypervisor is "nitro" or "xen" ("" for bare metal); prefixes need
	// Nitro.
	Hypervisor string
	BareMetal  bool
}

// ReadTypeLimits asks EC2 what instance type t allows.
func ReadTypeLimits(ctx context.Context, c *ec2.Client, t string) (TypeLimits, error) {
	out, err := c.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{types.InstanceType(t)}})
	if err != nil {
		return TypeLimits{}, explain(fmt.Errorf("describe instance type %s: %w", t, err))
	}
	for _, it := range out.InstanceTypes {
		if string(it.InstanceType) != t || it.NetworkInfo == nil {
			continue
		}
		n := it.NetworkInfo
		l := TypeLimits{Type: t, ENIs: int(aws.ToInt32(n.MaximumNetworkInterfaces)), IPv4PerENI: int(aws.ToInt32(n.Ipv4AddressesPerInterface)),
			IPv6PerENI: int(aws.ToInt32(n.Ipv6AddressesPerInterface)), Hypervisor: string(it.Hypervisor), BareMetal: aws.ToBool(it.BareMetal)}
		if n.Ipv6Supported != nil && !*n.Ipv6Supported {
			l.IPv6PerENI = 0
		}
		if it.VCpuInfo != nil {
			l.VCPUs = int(aws.ToInt32(it.VCpuInfo.DefaultVCpus))
		}
		// With several network cards the default card's own limit applies
		// (as the EKS max-pods table counts it: p5.48xlarge has 64 ENIs,
		// 2 of them on card 0).
		if len(n.NetworkCards) > 1 {
			def := aws.ToInt32(n.DefaultNetworkCardIndex)
			for _, card := range n.NetworkCards {
				if aws.ToInt32(card.NetworkCardIndex) == def {
					l.ENIs = int(aws.ToInt32(card.MaximumNetworkInterfaces))
				}
			}
		}
		if l.ENIs < 1 || l.IPv4PerENI < 1 {
			return TypeLimits{}, fmt.Errorf("instance type %s: EC2 gives %d ENIs of %d IPv4 addresses", t, l.ENIs, l.IPv4PerENI)
		}
		return l, nil
	}
	return TypeLimits{}, fmt.Errorf("instance type %s: EC2 does not describe it", t)
}

// Nitro says whether the type can hold prefixes.
func (l TypeLimits) Nitro() bool { return l.Hypervisor == "nitro" || l.BareMetal }

// slots is how many secondary addresses (or prefixes) one ENI takes: all
// its IPv4 slots but the ENI's own primary address.
func (l TypeLimits) slots() int { return l.IPv4PerENI - 1 }

// Capacity is how many pod addresses vpcni can hold on enis ENIs of the
// type: every slot but the ENI's own address, 16 addresses a slot in
// prefix mode.
func (l TypeLimits) Capacity(enis int, prefix bool) int {
	n := enis * l.slots()
	if prefix {
		n *= prefixSize
	}
	return n
}

// AWSMaxPods is the max-pods AWS documents for the type with the
// aws-vpc-cni (EKS's eni-max-pods.txt and max-pods-calculator.sh): its
// secondary addresses plus 2 host-network pods; with prefixes the same
// over 16 addresses a slot, capped at 110 pods for up to 30 vCPUs and 250
// above, as the calculator recommends.
func (l TypeLimits) AWSMaxPods(prefix bool) int {
	n := l.Capacity(l.ENIs, prefix) + 2
	if prefix {
		ceiling := 110
		if l.VCPUs > 30 {
			ceiling = 250
		}
		n = min(n, ceiling)
	}
	return n
}
