package cluster_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/lab/ec2api"
	"github.com/vpcni/vpcni/internal/provider"
	_ "github.com/vpcni/vpcni/internal/provider/aws/cluster"
	"github.com/vpcni/vpcni/internal/provider/aws/ec2test"
)

// TestMain gives the cluster side the keys a controller would have in its
// environment (the lab accepts any), and keeps the SDK from the machine's
// own AWS files. (Instance metadata stays on: the nodes' providers read
// their lab IMDS.)
func TestMain(m *testing.M) {
	for k, v := range map[string]string{
		"AWS_ACCESS_KEY_ID": "AKIDCLUSTERTEST", "AWS_SECRET_ACCESS_KEY": "secret",
		"AWS_CONFIG_FILE": os.DevNull, "AWS_SHARED_CREDENTIALS_FILE": os.DevNull,
	} {
		os.Setenv(k, v)
	}
	os.Exit(m.Run())
}

// bed is the lab's EC2 endpoint on loopback with one VPC and subnet, the
// nodes' instances in it (each with its IMDS and a provider, as the agent
// runs), and the aws cloud of a -cloud-config naming it.
type bed struct {
	s       *ec2api.Server
	ep      *ec2test.Endpoint
	c       *ec2.Client
	az      string
	subnet  string
	cfgPath string
}

const clusterName = "vpcni-test" // ec2test's providers tag their ENIs with it

func newBed(t *testing.T, section string) *bed {
	t.Helper()
	s := ec2api.New(ec2api.Options{})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	c := ec2.New(ec2.Options{Region: "us-east-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("AKIDSEED", "secret", "")})
	b := &bed{s: s, c: c, az: "us-east-1a"}
	b.ep = &ec2test.Endpoint{URL: srv.URL, Client: c, Seed: ec2test.LabSeed{Server: s}, Source: s, InstanceType: "t3.small", AZ: b.az}
	b.subnet = b.ep.NewVPC(t, netip.MustParsePrefix("10.30.0.0/16"), netip.MustParsePrefix("10.30.1.0/24"))[0]
	b.cfgPath = filepath.Join(t.TempDir(), "cloud.yaml")
	body := fmt.Sprintf("aws:\n  region: us-east-1\n  endpoint: %s\n%s", srv.URL, section)
	if err := os.WriteFile(b.cfgPath, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return b
}

// cloud opens the aws cloud as vpcni-controller does, from its file.
func (b *bed) cloud(t *testing.T) cloudconfig.Cloud {
	t.Helper()
	fc, err := cloudconfig.Load(b.cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	return fc.Open(nil)
}

// node runs an instance with ip and its agent's provider, and has the
// provider take n addresses: a t3.small's primary ENI holds 3, so more
// make the provider create and attach an ENI of its own.
func (b *bed) node(t *testing.T, ip string, n int) ec2test.Instance {
	t.Helper()
	node, inst := b.ep.NewInstance(t, b.subnet, netip.MustParseAddr(ip))
	if _, err := node.Provider.Assign(ctx(t), provider.AssignRequest{Count: n}); err != nil {
		t.Fatalf("node %s takes %d addresses: %v", ip, n, err)
	}
	return inst
}

// extra is the ENI of vpcni's the provider attached to instance id.
func (b *bed) extra(t *testing.T, id string) types.NetworkInterface {
	t.Helper()
	for _, n := range b.ep.ENIs(t, id) {
		if ec2test.Tag(n, "vpcni.io/owner") == "vpcni" {
			return n
		}
	}
	t.Fatalf("instance %s has no ENI of vpcni's", id)
	return types.NetworkInterface{}
}

// exists says whether EC2 still has the ENI.
func (b *bed) exists(id string) bool {
	return slices.ContainsFunc(b.s.ENIs(), func(e ec2api.ENI) bool { return e.ID == id })
}

// handENI creates an available ENI in the bed's subnet with tags and
// addresses, as a crashed agent or another cluster's would have left it.
func (b *bed) handENI(t *testing.T, tags map[string]string, addrs ...string) string {
	t.Helper()
	var spec []types.PrivateIpAddressSpecification
	for i, a := range addrs {
		spec = append(spec, types.PrivateIpAddressSpecification{PrivateIpAddress: aws.String(a), Primary: aws.Bool(i == 0)})
	}
	var ts []types.Tag
	for k, v := range tags {
		ts = append(ts, types.Tag{Key: aws.String(k), Value: aws.String(v)})
	}
	out, err := b.c.CreateNetworkInterface(ctx(t), &ec2.CreateNetworkInterfaceInput{SubnetId: &b.subnet, PrivateIpAddresses: spec,
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface, Tags: ts}}})
	if err != nil {
		t.Fatal(err)
	}
	return aws.ToString(out.NetworkInterface.NetworkInterfaceId)
}

func ctx(t *testing.T) context.Context { return ec2test.Ctx(t) }

func addrOf(n types.NetworkInterface) netip.Addr {
	return netip.MustParseAddr(aws.ToString(n.PrivateIpAddress))
}

// secondaries are an ENI's addresses but its own.
func secondaries(n types.NetworkInterface) []netip.Addr {
	var out []netip.Addr
	for _, a := range n.PrivateIpAddresses {
		if !aws.ToBool(a.Primary) {
			out = append(out, netip.MustParseAddr(aws.ToString(a.PrivateIpAddress)))
		}
	}
	return out
}
