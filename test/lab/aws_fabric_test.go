package lab

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	ec2types "github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/ebpf"
	"github.com/vpcni/vpcni/internal/family"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	awsprovider "github.com/vpcni/vpcni/internal/provider/aws"
	"github.com/vpcni/vpcni/internal/testbed"
)

// awsLabUp builds an AWS-style lab (the lab's EC2 endpoint, instance
// metadata per node) for one test and tears it down after it.
// With subnet6 ("" for none) its VPC and subnet have that IPv6 block too.
func awsLabUp(t *testing.T, tag string, nodes int, subnet string, subnet6 ...string) *lab.Lab {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cfg := lab.Config{Prefix: fmt.Sprintf("vpcni%s%d", tag, os.Getpid()%100000), Nodes: nodes,
		Subnet: netip.MustParsePrefix(subnet), Cloud: "aws"}
	if len(subnet6) > 0 {
		cfg.Subnet6 = netip.MustParsePrefix(subnet6[0])
	}
	l, err := lab.Up(c, cfg)
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

func runIn(t *testing.T, ns string, cmds ...string) {
	t.Helper()
	for _, c := range cmds {
		if out, err := netnsutil.Output(ns, strings.Fields(c)...); err != nil {
			t.Fatalf("%s in %s: %v: %s", c, ns, err, out)
		}
	}
}

// probeSrc is one TCP round trip from ns, sourced from src, to dst:7007.
func probeSrc(ns string, src, dst netip.Addr) error {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return netnsutil.ProbeFrom(c, netnsutil.Path(ns), src, dst.String()+":7007")
}

// TestAWSFabric: on an AWS-style lab, an instance reaches another on the VPC; its metadata is
// served on the node's loopback with a token only; an ENI attached through
// the EC2 API appears in the node as eth1 with its MAC and leaves on
// detach; an address of that ENI sent out of eth0 is dropped by the
// source/destination check, out of eth1 it passes, and with the check off
// on eth0's ENI it passes there too.
func TestAWSFabric(t *testing.T) {
	l := awsLabUp(t, "af", 1, "10.96.0.0/24")
	node := l.Nodes[0]
	echo, err := netnsutil.ServeEcho(netnsutil.Path(l.Legacy.NS), l.Legacy.IP.String()+":7007")
	if err != nil {
		t.Fatal(err)
	}
	defer echo.Close()
	if err := probeSrc(node.NS, node.IP, l.Legacy.IP); err != nil {
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
	runIn(t, node.NS, "ip link set eth1 up", "ip addr add "+own.String()+"/32 dev eth1", "ip addr add "+second.String()+"/32 dev eth1",
		"ip route add "+l.Subnet.String()+" dev eth1 table 101",
		"ip route add default via "+l.Router.IP.String()+" dev eth1 table 101")
	// Out of eth0 (main table): the primary ENI does not hold it.
	if err := probeSrc(node.NS, second, l.Legacy.IP); err == nil {
		t.Fatalf("%s left by eth0 and got through: the source/destination check should drop it", second)
	}
	runIn(t, node.NS, "ip rule add from "+second.String()+" lookup 101 pref 1536")
	if err := probeSrc(node.NS, second, l.Legacy.IP); err != nil {
		t.Fatalf("%s out of its own ENI (eth1): %v", second, err)
	}
	// The control: the check off on the primary ENI, eth0 may send it.
	runIn(t, node.NS, "ip rule del pref 1536")
	if _, err := cl.ModifyNetworkInterfaceAttribute(c, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: aws.String(node.PortID),
		SourceDestCheck: &ec2types.AttributeBooleanValue{Value: aws.Bool(false)}}); err != nil {
		t.Fatal(err)
	}
	runIn(t, l.Legacy.NS, "ip neigh flush all")
	if err := probeSrc(node.NS, second, l.Legacy.IP); err != nil {
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

// awsProvider is the agents' aws provider section on an AWS lab: the
// lab's EC2 endpoint and the node's own instance metadata on its loopback;
// credentials from the instance role the metadata serves, as on EC2.
func awsProvider(prefixMode bool) config.Provider {
	return config.Provider{Type: "aws", Settings: &awsprovider.Config{
		Endpoint:     fmt.Sprintf("http://127.0.0.1:%d/", lab.EndpointPort),
		IMDSEndpoint: fmt.Sprintf("http://127.0.0.1:%d", lab.IMDSPort),
		PrefixMode:   prefixMode}}
}

// TestAWSLab: vpcnid with the aws provider on an AWS-style lab, in the
// routed modes (veth, and ebpf's fast path on top of it). The lab's
// t3.medium holds five pod addresses on its primary ENI, so the next pods'
// go on an ENI the provider creates and attaches, which the node sees
// hot-plugged. The legacy VM reaches pods on both ENIs by their own
// addresses and they reach it: the source/destination check lets a pod's
// packets out only by the ENI that holds its address, so this proves the
// per-ENI route table and the from-pod rule (1536). Pods on the two ENIs
// reach each other on the node (rule 512). A pod reaching outside the VPC
// leaves with its node's address: SNAT is on by default with this
// provider. Then the from-pod rule is taken away while the agent is
// stopped: the legacy VM's connection to the pod on the secondary ENI
// fails (its replies leave by eth0, whose check drops them), and the
// agent's next start puts the rule back. Subtest dualstack: see
// awsDualStack.
func TestAWSLab(t *testing.T) {
	t.Run("dualstack", awsDualStack)
	for _, mode := range []string{"veth", "ebpf"} {
		t.Run(mode, func(t *testing.T) {
			c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			l := awsLabUp(t, "aw"+mode[:1], 1, "10.97.0.0/24")
			if mode == ebpf.Mode {
				mountBPFFS(t)
				t.Cleanup(func() { _ = os.RemoveAll(filepath.Join(bpffsDir, l.Prefix)) })
			}
			nodes := startAgents(t, l, "1.0.0", func(cfg *config.Config) {
				cfg.Provider = awsProvider(false)
				cfg.Datapath = config.Datapath{Mode: mode}
				if mode == ebpf.Mode {
					cfg.Datapath.Settings = &ebpf.Settings{PinPath: filepath.Join(bpffsDir, l.Prefix, cfg.NodeName), Require: true}
				}
			})
			n := nodes[0]
			var onPrimary, onENI labPod
			for i := 0; i < 10 && !onENI.ip.IsValid(); i++ {
				p := addPod(t, c, l, n, fmt.Sprintf("%s%d", mode[:1], i))
				st, err := n.agent.State()
				if err != nil {
					t.Fatal(err)
				}
				for _, a := range st.Allocations {
					switch {
					case a.ContainerID != p.id:
					case a.NIC != nil:
						onENI = p
					default:
						onPrimary = p
					}
				}
			}
			if !onENI.ip.IsValid() || !onPrimary.ip.IsValid() {
				t.Fatalf("want a pod on the primary ENI and one on a secondary ENI: %v, %v", onPrimary.ip, onENI.ip)
			}
			if _, err := netnsutil.Output(l.Nodes[0].NS, "ip", "link", "show", "eth1"); err != nil {
				t.Fatalf("no eth1 (the provider's ENI) in the node: %v", err)
			}
			legacy := netnsutil.Path(l.Legacy.NS)
			serveEcho(t, legacy, l.Legacy.IP)
			expectReach(t, c, []reachable{
				{"pod on the secondary ENI -> legacy VM", onENI.ns, l.Legacy.IP},
				{"legacy VM -> pod on the secondary ENI", legacy, onENI.ip},
				{"pod on the primary ENI -> legacy VM", onPrimary.ns, l.Legacy.IP},
				{"legacy VM -> pod on the primary ENI", legacy, onPrimary.ip},
				{"pod on the secondary ENI -> pod on the primary ENI", onENI.ns, onPrimary.ip},
				{"pod on the primary ENI -> pod on the secondary ENI", onPrimary.ns, onENI.ip},
			})
			serveWho(t, netnsutil.Path(l.External.NS), l.External.IP)
			serveWho(t, legacy, l.Legacy.IP)
			expectSource(t, c, "pod on the secondary ENI -> outside the VPC", onENI.ns, l.External.IP, l.Nodes[0].IP)
			expectSource(t, c, "pod -> legacy VM in the VPC", onENI.ns, l.Legacy.IP, onENI.ip)

			rule := "from " + onENI.ip.String() + " lookup"
			if rules, _ := netnsutil.Output(l.Nodes[0].NS, "ip", "rule"); !strings.Contains(rules, "1536:\t"+rule) {
				t.Fatalf("node rules lack 1536 %s:\n%s", rule, rules)
			}
			if err := n.agent.Stop(); err != nil {
				t.Fatal(err)
			}
			runIn(t, l.Nodes[0].NS, "ip rule del pref 1536 from "+onENI.ip.String())
			if err := probe(c, legacy, testbed.HostPort(onENI.ip, 7777)); err == nil {
				t.Fatalf("legacy VM -> pod on the secondary ENI without its from-pod rule got through: its replies should leave by eth0 and be dropped")
			}
			n.start(t)
			eventually(t, 30*time.Second, "legacy VM -> pod on the secondary ENI once the agent is back", func() error {
				return probe(c, legacy, testbed.HostPort(onENI.ip, 7777))
			})
			if err := l.FabricErr(); err != nil {
				t.Fatalf("fabric: %v", err)
			}
		})
	}
}

// awsDualStack: dual-stack pods (mode veth) on two nodes of an AWS-style
// lab whose VPC and subnet have an IPv6 block, the aws provider putting
// each pod's IPv6 address on its node's primary ENI (AssignIpv6Addresses
// by count). Pods reach each other by both families on one node and
// across the nodes, their node and the legacy VM by IPv6, and the legacy
// VM reaches them by IPv6 — the fabric delivering each address only to
// the ENI that holds it. The source/destination check is real for IPv6:
// an address taken off the ENI stops passing.
func awsDualStack(t *testing.T) {
	c, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	subnet6 := netip.MustParsePrefix("fd00:97:6::/64")
	l := awsLabUp(t, "aw6", 2, "10.97.6.0/24", subnet6.String())
	nodes := startAgents(t, l, "1.0.0", func(cfg *config.Config) {
		cfg.IPFamilies = []family.Family{family.V4, family.V6}
		cfg.Provider = awsProvider(false)
	})
	pods := []labPod{addPod(t, c, l, nodes[0], "a"), addPod(t, c, l, nodes[0], "b"), addPod(t, c, l, nodes[1], "c")}
	for i, p := range pods {
		if !p.ip.IsValid() || !subnet6.Contains(p.ip6) {
			t.Fatalf("pod %d got %s and %s, want an IPv4 address and one of %s", i, p.ip, p.ip6, subnet6)
		}
	}
	legacy, n1 := netnsutil.Path(l.Legacy.NS), netnsutil.Path(l.Nodes[0].NS)
	serveEcho(t, legacy, l.Legacy.IP6)
	serveEcho(t, n1, l.Nodes[0].IP6)
	expectReach(t, c, []reachable{
		{"pod on n1 -> pod on n1 by IPv6", pods[0].ns, pods[1].ip6},
		{"pod on n1 -> pod on n1 by IPv4", pods[0].ns, pods[1].ip},
		{"pod on n1 -> pod on n2 by IPv6", pods[0].ns, pods[2].ip6},
		{"pod on n2 -> pod on n1 by IPv6", pods[2].ns, pods[0].ip6},
		{"pod on n1 -> pod on n2 by IPv4", pods[0].ns, pods[2].ip},
		{"pod on n2 -> node n1 by IPv6", pods[2].ns, l.Nodes[0].IP6},
		{"node n1 -> its pod by IPv6", n1, pods[0].ip6},
		{"pod on n1 -> its node by IPv6", pods[0].ns, l.Nodes[0].IP6},
		{"legacy VM -> pod on n1 by IPv6", legacy, pods[0].ip6},
		{"legacy VM -> pod on n2 by IPv6", legacy, pods[2].ip6},
		{"pod on n2 -> legacy VM by IPv6", pods[2].ns, l.Legacy.IP6},
	})
	if t.Failed() {
		t.FailNow()
	}
	// The check for IPv6: the pod's address off n2's primary ENI (as
	// someone's UnassignIpv6Addresses would), the legacy VM no longer
	// reaches it; back on, it does. n2's agent is stopped meanwhile: it
	// puts a pod's missing address back on its ENI by itself, which on a
	// loaded machine came before the probe.
	if err := nodes[1].agent.Stop(); err != nil {
		t.Fatal(err)
	}
	cl := ec2Client(l)
	move := func(on bool) {
		t.Helper()
		var err error
		if on {
			_, err = cl.AssignIpv6Addresses(c, &ec2.AssignIpv6AddressesInput{NetworkInterfaceId: aws.String(l.Nodes[1].PortID), Ipv6Addresses: []string{pods[2].ip6.String()}})
		} else {
			_, err = cl.UnassignIpv6Addresses(c, &ec2.UnassignIpv6AddressesInput{NetworkInterfaceId: aws.String(l.Nodes[1].PortID), Ipv6Addresses: []string{pods[2].ip6.String()}})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	move(false)
	if err := probe(c, legacy, testbed.HostPort(pods[2].ip6, 7777)); err == nil {
		t.Fatalf("legacy VM still reaches %s with the address off n2's ENI: the IPv6 source/destination check is not enforced; the endpoint's ENIs now: %s", pods[2].ip6, eniIPv6s(c, cl))
	}
	move(true)
	if err := probe(c, legacy, testbed.HostPort(pods[2].ip6, 7777)); err != nil {
		t.Fatalf("legacy VM -> %s once the address is back on n2's ENI: %v", pods[2].ip6, err)
	}
	nodes[1].start(t)
	t.Logf("vpcni-test: aws dual-stack lab: pods %s/%s, %s/%s (n1) and %s/%s (n2) on their primary ENIs; pod <-> pod both families on a node and across, pod <-> node, legacy VM <-> pod by IPv6",
		pods[0].ip, pods[0].ip6, pods[1].ip, pods[1].ip6, pods[2].ip, pods[2].ip6)
	if err := l.FabricErr(); err != nil {
		t.Fatalf("fabric: %v", err)
	}
}

// eniIPv6s is each ENI's IPv6 addresses and prefixes as the endpoint
// says, for a failure message.
func eniIPv6s(c context.Context, cl *ec2.Client) string {
	out, err := cl.DescribeNetworkInterfaces(c, &ec2.DescribeNetworkInterfacesInput{})
	if err != nil {
		return err.Error()
	}
	var b strings.Builder
	for _, e := range out.NetworkInterfaces {
		fmt.Fprintf(&b, "\n  %s (%s):", aws.ToString(e.NetworkInterfaceId), aws.ToString(e.Description))
		for _, a := range e.Ipv6Addresses {
			fmt.Fprintf(&b, " %s", aws.ToString(a.Ipv6Address))
		}
		for _, p := range e.Ipv6Prefixes {
			fmt.Fprintf(&b, " %s", aws.ToString(p.Ipv6Prefix))
		}
	}
	return b.String()
}
