// Package imds is the lab's EC2 instance metadata service (IMDSv2): what an
// agent on an EC2 instance reads to learn who it is and which MAC is which
// ENI. It serves one instance per handler from a Source — the lab's own EC2
// endpoint, or any EC2 API (moto_server) read through the SDK — and can lag
// behind that source on purpose, as the real IMDS lags EC2 after an
// assignment.
package imds

import (
	"context"
	"net/netip"
	"time"
)

// Source is where an instance's metadata comes from.
type Source interface {
	// Instance reads the instance as EC2 has it now. An unknown instance
	// is an error.
	Instance(ctx context.Context, id string) (Instance, error)
}

// Instance is what IMDS tells about one EC2 instance.
type Instance struct {
	ID     string
	Type   string
	Region string
	AZ     string
	// AccountID is the owner's account, for the identity document.
	AccountID string
	// LocalIPv4 is the primary ENI's primary address.
	LocalIPv4 netip.Addr
	// Interfaces are the attached ENIs, the primary (device 0) first.
	Interfaces []Interface
	// Role, if set, is the instance profile's role name; its credentials
	// are served under iam/security-credentials/<Role>.
	Role        string
	Credentials Credentials
}

// Interface is one attached ENI as IMDS lists it under
// network/interfaces/macs/<MAC>/.
type Interface struct {
	MAC            string
	ID             string // eni-…
	DeviceNumber   int
	NetworkCard    int
	SubnetID       string
	SubnetCIDR     netip.Prefix
	VPCID          string
	VPCCIDRs       []netip.Prefix
	SecurityGroups []string
	// LocalIPv4s are the ENI's private addresses, its primary first.
	LocalIPv4s   []netip.Addr
	IPv4Prefixes []netip.Prefix
	// IPv6s and IPv6Prefixes are the ENI's IPv6 addresses and /80s;
	// SubnetIPv6CIDRs and VPCIPv6CIDRs the IPv6 blocks of its subnet and
	// VPC (empty: none).
	IPv6s           []netip.Addr
	IPv6Prefixes    []netip.Prefix
	SubnetIPv6CIDRs []netip.Prefix
	VPCIPv6CIDRs    []netip.Prefix
}

// Credentials are an instance role's temporary keys.
type Credentials struct {
	AccessKeyID     string
	SecretAccessKey string
	Token           string
	Expiration      time.Time
}
