package aws_test

import (
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"

	"github.com/vpcni/vpcni/internal/lab/ec2api"
	"github.com/vpcni/vpcni/internal/provider/aws/ec2test"
)

// labSeed seeds the lab's EC2 endpoint in Go, as the lab builder does.
type labSeed struct{ s *ec2api.Server }

func (l labSeed) Subnets(t *testing.T, cidr netip.Prefix, az string, subnets ...netip.Prefix) []string {
	vpc := l.s.AddVPC(cidr)
	var ids []string
	for _, p := range subnets {
		id, err := l.s.AddSubnet(vpc, p, az)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, id)
	}
	return ids
}

func (l labSeed) Instance(t *testing.T, subnetID, typ string, ip netip.Addr) (string, string) {
	in, err := l.s.RunInstance(ec2api.RunOptions{Type: typ, SubnetID: subnetID, IP: ip, Role: "vpcni-node"})
	if err != nil {
		t.Fatalf("run a %s with %s: %v", typ, ip, err)
	}
	return in.ID, in.ENIID
}

func (l labSeed) SubnetIPv6(t *testing.T, subnetID string, block netip.Prefix) {
	if err := l.s.AddSubnetIPv6(subnetID, block); err != nil {
		t.Fatal(err)
	}
}

// lab is the lab's EC2 endpoint served on loopback for one test.
func lab(t *testing.T, o ec2api.Options) (*ec2test.Endpoint, *ec2api.Server) {
	s := ec2api.New(o)
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	c := ec2.New(ec2.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDLABTEST", "secret", "")})
	return &ec2test.Endpoint{URL: srv.URL, Client: c, Seed: labSeed{s}, Source: s}, s
}

// TestContractLab runs the whole provider contract against the lab's EC2
// endpoint, which follows EC2's documentation where moto does not
// (exhaustion, unique addresses, addresses taken, exact answers).
func TestContractLab(t *testing.T) {
	ep, _ := lab(t, ec2api.Options{})
	ep.Run(t)
}
