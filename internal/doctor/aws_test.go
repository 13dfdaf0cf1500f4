package doctor

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/lab/ec2api"
	labimds "github.com/vpcni/vpcni/internal/lab/imds"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/aws"
)

// awsNode is one instance on the lab's EC2 endpoint with its own IMDSv2
// (its instance role's keys served there, as on EC2), and the agent's
// provider.aws section for it.
type awsNode struct {
	ec2 *ec2api.Server
	cfg aws.Config
	az  string
}

func newAWSNode(t *testing.T, typ string) *awsNode {
	t.Helper()
	s := ec2api.New(ec2api.Options{})
	api := httptest.NewServer(s.Handler())
	t.Cleanup(func() { api.Close(); s.Close() })
	vpc := s.AddVPC(netip.MustParsePrefix("10.20.0.0/16"))
	sn, err := s.AddSubnet(vpc, netip.MustParsePrefix("10.20.1.0/24"), "us-east-1a")
	if err != nil {
		t.Fatal(err)
	}
	in, err := s.RunInstance(ec2api.RunOptions{Type: typ, SubnetID: sn, Role: "vpcni-node"})
	if err != nil {
		t.Fatal(err)
	}
	md := httptest.NewServer(labimds.New(s, in.ID, labimds.Options{}))
	t.Cleanup(md.Close)
	n := &awsNode{ec2: s, cfg: aws.Config{Endpoint: api.URL, IMDSEndpoint: md.URL}, az: in.AZ}
	n.cfg.Defaults()
	return n
}

// check runs provider aws's Doctor as Run does, with the agent config "f".
func (n *awsNode) check(t *testing.T, rt http.RoundTripper) []Result {
	t.Helper()
	r, err := provider.Lookup("aws")
	if err != nil || r.Doctor == nil || r.Doctor.API != "ec2" {
		t.Fatalf("provider aws registered without its Doctor: %+v %v", r, err)
	}
	cfg := n.cfg
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return Cloud(r.Doctor.Diagnose(context.Background(), &cfg, provider.DoctorNode{ConfigFile: "f", Transport: rt}))
}

func names(rs []Result) string {
	var s []string
	for _, r := range rs {
		s = append(s, r.Name)
	}
	return strings.Join(s, ",")
}

// A node whose IMDS, credentials, limits and subnets are as vpcnid needs
// them passes every step, each saying what it found; EC2's clock is read
// through doctor's transport.
func TestCloudAWS(t *testing.T) {
	n := newAWSNode(t, "m5.large")
	clock := &DateClock{Next: http.DefaultTransport}
	rs := n.check(t, clock)
	if got := names(rs); got != "cloud imds,cloud identity,cloud ec2,cloud capacity,cloud subnets,cloud permissions" {
		t.Errorf("steps %s", got)
	}
	expect(t, find(t, rs, "cloud imds"), OK, "IMDSv2 at "+n.cfg.IMDSEndpoint+" gave a token")
	expect(t, find(t, rs, "cloud identity"), OK, "(m5.large) in "+n.az, "VPC vpc-", "[10.20.0.0/16]")
	expect(t, find(t, rs, "cloud ec2"), OK, "EC2 accepts the credentials (from ", "(device 0: 0 secondary addresses")
	expect(t, find(t, rs, "cloud capacity"), OK, "m5.large: 3 ENIs × 9 secondary addresses = 27 pod addresses", "0 of 27 slots used")
	expect(t, find(t, rs, "cloud subnets"), OK, "(10.20.1.0/24, "+n.az+"): 250 free")
	expect(t, find(t, rs, "cloud permissions"), OK, "CreateNetworkInterface", "DeleteNetworkInterface", "CreateTags", "UnassignPrivateIpAddresses have no DryRun")
	expect(t, clock.Skew("ec2"), OK)
	before := len(n.ec2.ENIs())
	if calls := n.ec2.Calls(); calls["CreateNetworkInterface"] != 1 || calls["AssignPrivateIpAddresses"] != 0 || before != 1 {
		t.Errorf("the dry runs changed something, or were not made: %d ENIs, calls %v", before, calls)
	}
}

// A permission the role lacks fails the step that needs it, naming the
// IAM action: the reads stop the steps there, a write is found by its dry
// run (403 UnauthorizedOperation where 412 DryRunOperation means allowed).
func TestCloudAWSPermissions(t *testing.T) {
	n := newAWSNode(t, "m5.large")
	n.ec2.Deny("CreateNetworkInterface", "DeleteNetworkInterface")
	rs := n.check(t, http.DefaultTransport)
	expect(t, find(t, rs, "cloud subnets"), OK)
	expect(t, find(t, rs, "cloud permissions"), Fail, "may not call ec2:CreateNetworkInterface, ec2:DeleteNetworkInterface", "UnauthorizedOperation", "add the actions named to the node's IAM role")

	n.ec2.Deny("DescribeNetworkInterfaces")
	rs = n.check(t, http.DefaultTransport)
	expect(t, find(t, rs, "cloud ec2"), Fail, "DescribeNetworkInterfaces", "UnauthorizedOperation", "add ec2:DescribeNetworkInterfaces to the node's IAM role")
	if got := names(rs); got != "cloud imds,cloud identity,cloud ec2" {
		t.Errorf("steps after EC2 refused the read: %s", got)
	}
	n.ec2.Allow("DescribeNetworkInterfaces")

	n.ec2.Deny("DescribeInstanceTypes")
	expect(t, find(t, n.check(t, http.DefaultTransport), "cloud capacity"), Fail, "add ec2:DescribeInstanceTypes")
}

// Prefix mode on a Xen instance type fails with its two ways out; on a
// Nitro type the capacity counts prefixes.
func TestCloudAWSPrefixMode(t *testing.T) {
	xen := newAWSNode(t, "t2.micro")
	xen.cfg.PrefixMode = true
	rs := xen.check(t, http.DefaultTransport)
	expect(t, find(t, rs, "cloud prefix"), Fail, `t2.micro runs on "xen"`, "set provider.aws.prefixMode in f to false, or run the node on a Nitro instance type")

	nitro := newAWSNode(t, "m5.large")
	nitro.cfg.PrefixMode = true
	rs = nitro.check(t, http.DefaultTransport)
	expect(t, find(t, rs, "cloud prefix"), OK, "m5.large runs on Nitro")
	expect(t, find(t, rs, "cloud capacity"), OK, "3 ENIs × 9 /28 prefixes = 432 pod addresses")
}

// No IMDS: the fix names the hop limit a pod's own namespace needs and
// imdsEndpoint. Subnets that match nothing fail with the keys to check;
// a full one warns.
func TestCloudAWSIMDSAndSubnets(t *testing.T) {
	n := newAWSNode(t, "m5.large")
	gone := httptest.NewServer(http.NotFoundHandler())
	gone.Close()
	cfg := n.cfg
	n.cfg.IMDSEndpoint = gone.URL
	rs := n.check(t, http.DefaultTransport)
	expect(t, find(t, rs, "cloud imds"), Fail, "IMDSv2 token", "--http-put-response-hop-limit 2", "provider.aws.imdsEndpoint in f")
	if len(rs) != 1 {
		t.Errorf("steps after IMDS failed: %s", names(rs))
	}

	n.cfg = cfg
	n.cfg.SubnetTags = map[string]string{"vpcni": "pods"}
	expect(t, find(t, n.check(t, http.DefaultTransport), "cloud subnets"), Fail, "subnetTags: no subnet in the instance's availability zone", "check provider.aws.subnets in f and subnetTags")

	// A subnet of /28 whose 11 usable addresses an ENI holds.
	full := fillSubnet(t, n)
	n.cfg.SubnetTags, n.cfg.Subnets = nil, []string{full}
	expect(t, find(t, n.check(t, http.DefaultTransport), "cloud subnets"), Warn, full, ": 0 free", "none has the 1 free addresses", "provider.aws.subnets in f")
}

// fillSubnet makes a /28 in the node's VPC and AZ with no free address.
func fillSubnet(t *testing.T, n *awsNode) string {
	t.Helper()
	var vpc string
	for _, e := range n.ec2.ENIs() {
		vpc = e.VPCID
	}
	id, err := n.ec2.AddSubnet(vpc, netip.MustParsePrefix("10.20.9.0/28"), n.az)
	if err != nil {
		t.Fatal(err)
	}
	// One instance per address: RunInstance takes the subnet's next free one.
	for i := range 11 {
		if _, err := n.ec2.RunInstance(ec2api.RunOptions{Type: "t3.nano", SubnetID: id}); err != nil {
			t.Fatalf("fill address %d: %v", i, err)
		}
	}
	if _, err := n.ec2.RunInstance(ec2api.RunOptions{Type: "t3.nano", SubnetID: id}); err == nil {
		t.Fatalf("subnet %s still had room after 11 instances", id)
	}
	return id
}
