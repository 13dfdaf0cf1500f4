// Package labaws proves vpcni on the lab's AWS side: the fabric an
// EC2-style VPC gives (instances on the VPC bridge, ENIs hot-plugged into
// their node on attach, each ENI's source/destination check, per-node
// instance metadata), then vpcnid with the aws provider on it.
package labaws

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
)

func TestMain(m *testing.M) {
	testbed.RequireRoot("the AWS lab tests")
	os.Exit(m.Run())
}

// up builds an AWS lab for one test and tears it down after it.
func up(t *testing.T, tag string, nodes int, subnet string) *lab.Lab {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := lab.Up(c, lab.Config{Prefix: fmt.Sprintf("vpcna%s%d", tag, os.Getpid()%100000), Nodes: nodes,
		Subnet: netip.MustParsePrefix(subnet), Cloud: "aws"})
	if err != nil {
		t.Fatalf("lab up: %v", err)
	}
	t.Cleanup(func() {
		if err := l.Close(); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	return l
}

// ec2Client talks to the lab's endpoint as a person with the AWS CLI would.
func ec2Client(l *lab.Lab) *ec2.Client {
	return ec2.NewFromConfig(aws.Config{Region: "us-east-1", RetryMaxAttempts: 1,
		Credentials: credentials.NewStaticCredentialsProvider("lab", "lab", "")},
		func(o *ec2.Options) { o.BaseEndpoint = aws.String(l.URL) })
}

func run(t *testing.T, ns string, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if out, err := netnsutil.Output(ns, strings.Fields(c)...); err != nil {
			t.Fatalf("%s in %s: %v: %s", c, ns, err, out)
		}
	}
}

// probe is one TCP round trip from ns, sourced from src, to dst:7007.
func probe(ns string, src, dst netip.Addr) error {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return netnsutil.ProbeFrom(c, netnsutil.Path(ns), src, dst.String()+":7007")
}

// TestFabric: an instance reaches another on the VPC; its metadata is
// served on the node's loopback with a token only; an ENI attached through
// the EC2 API appears in the node as eth1 with its MAC and leaves on
// detach; an address of that ENI sent out of eth0 is dropped by the
// source/destination check, out of eth1 it passes, and with the check off
// on eth0's ENI it passes there too.
func TestFabric(t *testing.T) {
	l := up(t, "f", 1, "10.96.0.0/24")
	node := l.Nodes[0]
	echo, err := netnsutil.ServeEcho(netnsutil.Path(l.Legacy.NS), l.Legacy.IP.String()+":7007")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	if err := probe(node.NS, node.IP, l.Legacy.IP); err != nil {
		t.Fatalf("node -> legacy VM: %v", err)
	}

	imds := fmt.Sprintf("http://127.0.0.1:%d/latest/", lab.IMDSPort)
	if out, err := netnsutil.Output(node.NS, "curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", imds+"meta-data/instance-id"); err != nil || out != "401" {
		t.Fatalf("IMDS without a token: want 401, got %q (%v)", out, err)
	}
	tok, err := netnsutil.Output(node.NS, "curl", "-sf", "-X", "PUT", "-H", "X-aws-ec2-metadata-token-ttl-seconds: 60", imds+"api/token")
	if err != nil {
		t.Fatalf("IMDS token: %v: %s", err, tok)
	}
	id, err := netnsutil.Output(node.NS, "curl", "-sf", "-H", "X-aws-ec2-metadata-token: "+strings.TrimSpace(tok), imds+"meta-data/instance-id")
	if err != nil || strings.TrimSpace(id) != node.InstanceID {
		t.Fatalf("IMDS instance-id on %s: %q (%v), want %s", node.Name, id, err, node.InstanceID)
	}

	c := context.Background()
	cl := ec2Client(l)
	eni, err := cl.CreateNetworkInterface(c, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String(l.SubnetID), SecondaryPrivateIpAddressCount: aws.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	ni := eni.NetworkInterface
	att, err := cl.AttachNetworkInterface(c, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: ni.NetworkInterfaceId, InstanceId: aws.String(node.InstanceID), DeviceIndex: aws.Int32(1)})
	if err != nil {
		t.Fatal(err)
	}
	mac, err := netnsutil.Output(node.NS, "cat", "/sys/class/net/eth1/address")
	if err != nil || strings.TrimSpace(mac) != aws.ToString(ni.MacAddress) {
		t.Fatalf("eth1 in %s: MAC %q (%v), want the ENI's %s", node.NS, mac, err, aws.ToString(ni.MacAddress))
	}
	own := netip.MustParseAddr(aws.ToString(ni.PrivateIpAddress))
	var second netip.Addr
	for _, a := range ni.PrivateIpAddresses {
		if !aws.ToBool(a.Primary) {
			second = netip.MustParseAddr(aws.ToString(a.PrivateIpAddress))
		}
	}
	run(t, node.NS, "ip link set eth1 up", "ip addr add "+own.String()+"/32 dev eth1", "ip addr add "+second.String()+"/32 dev eth1",
		"ip route add "+l.Subnet.String()+" dev eth1 table 101",
		"ip route add default via "+l.Router.IP.String()+" dev eth1 table 101")
	// Out of eth0 (main table): the primary ENI does not hold it.
	if err := probe(node.NS, second, l.Legacy.IP); err == nil {
		t.Fatalf("%s left by eth0 and got through: the source/destination check should drop it", second)
	}
	run(t, node.NS, "ip rule add from "+second.String()+" lookup 101 pref 1536")
	if err := probe(node.NS, second, l.Legacy.IP); err != nil {
		t.Fatalf("%s out of its own ENI (eth1): %v", second, err)
	}
	// The control: the check off on the primary ENI, eth0 may send it.
	run(t, node.NS, "ip rule del pref 1536")
	if _, err := cl.ModifyNetworkInterfaceAttribute(c, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: aws.String(node.PortID),
		SourceDestCheck: &ec2types.AttributeBooleanValue{Value: aws.Bool(false)}}); err != nil {
		t.Fatal(err)
	}
	run(t, l.Legacy.NS, "ip neigh flush all")
	if err := probe(node.NS, second, l.Legacy.IP); err != nil {
		t.Fatalf("control: with eth0's check off, %s by eth0: %v", second, err)
	}
	if _, err := cl.DetachNetworkInterface(c, &ec2.DetachNetworkInterfaceInput{AttachmentId: att.AttachmentId}); err != nil {
		t.Fatal(err)
	}
	if out, err := netnsutil.Output(node.NS, "ip", "link", "show", "eth1"); err == nil {
		t.Fatalf("eth1 still in the node after detach: %s", out)
	}
	if err := l.FabricErr(); err != nil {
		t.Fatalf("fabric: %v", err)
	}
}
