package ec2test

import (
	"net/netip"
	"testing"

	"github.com/vpcni/vpcni/internal/lab/ec2api"
)

// LabSeed seeds the lab's EC2 endpoint in Go, as the lab builder does:
// the Seeder of an Endpoint that is the lab's. Its instances run with the
// role "vpcni-node", whose keys their IMDS serves.
type LabSeed struct{ Server *ec2api.Server }

// Subnets implements Seeder.
func (l LabSeed) Subnets(t *testing.T, cidr netip.Prefix, az string, subnets ...netip.Prefix) []string {
	t.Helper()
	vpc := l.Server.AddVPC(cidr)
	var ids []string
	for _, p := range subnets {
		id, err := l.Server.AddSubnet(vpc, p, az)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

// Instance implements Seeder.
func (l LabSeed) Instance(t *testing.T, subnetID, typ string, ip netip.Addr) (string, string) {
	t.Helper()
	in, err := l.Server.RunInstance(ec2api.RunOptions{Type: typ, SubnetID: subnetID, IP: ip, Role: "vpcni-node"})
	if err != nil {
		t.Fatalf("run a %s with %s: %v", typ, ip, err)
	}
	return in.ID, in.ENIID
}

// SubnetIPv6 implements IPv6Seeder.
func (l LabSeed) SubnetIPv6(t *testing.T, subnetID string, block netip.Prefix) {
	t.Helper()
	if err := l.Server.AddSubnetIPv6(subnetID, block); err != nil {
		t.Fatal(err)
	}
}
