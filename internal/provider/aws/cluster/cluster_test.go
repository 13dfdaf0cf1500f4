package cluster_test

import (
	"errors"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/floatingip"
	vpcaws "github.com/vpcni/vpcni/internal/provider/aws"
	"github.com/vpcni/vpcni/internal/provider/aws/cluster"
)

// assign puts addresses on an ENI by name, as a node's agent does for a
// sticky pod.
func assign(t *testing.T, b *bed, eni string, addrs ...string) error {
	t.Helper()
	_, err := b.c.AssignPrivateIpAddresses(ctx(t), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &eni, PrivateIpAddresses: addrs})
	return err
}

// A sticky pod's address leaves a dead node's ENI — the primary or one
// of vpcni's, whichever holds it — and another instance can then take it;
// before, EC2 refuses it there. An ENI's own address is never taken; an
// address the dead node no longer holds is done.
func TestTakeOff(t *testing.T) {
	b := newBed(t, "  clusterName: "+clusterName+"\n")
	dead := b.node(t, "10.30.1.10", 5)
	next := b.node(t, "10.30.1.20", 0)
	c := b.cloud(t)
	// One of the addresses the dead node's provider put on its primary ENI.
	out, err := b.c.DescribeNetworkInterfaces(ctx(t), &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{dead.ENI}})
	if err != nil {
		t.Fatal(err)
	}
	sticky := secondaries(out.NetworkInterfaces[0])[0].String()
	if err := assign(t, b, next.ENI, sticky); err == nil || !strings.Contains(err.Error(), "InUse") {
		t.Fatalf("another instance took %s while the dead node's ENI held it: %v", sticky, err)
	}
	if err := c.TakeOff(ctx(t), dead.ENI, []netip.Addr{netip.MustParseAddr(sticky)}); err != nil {
		t.Fatal(err)
	}
	if slices.Contains(b.ep.ENIAddrs(t, dead.ENI), netip.MustParseAddr(sticky)) {
		t.Errorf("%s still on the dead node's ENI", sticky)
	}
	if err := assign(t, b, next.ENI, sticky); err != nil {
		t.Errorf("the next node takes %s: %v", sticky, err)
	}

	// On the dead node's ENI of vpcni's, found by its instance.
	extra := b.extra(t, dead.ID)
	onExtra := secondaries(extra)[0]
	if err := c.TakeOff(ctx(t), dead.ENI, []netip.Addr{onExtra}); err != nil {
		t.Fatal(err)
	}
	if got := b.ep.ENIAddrs(t, aws.ToString(extra.NetworkInterfaceId)); slices.Contains(got, onExtra) || len(got) != 2 {
		t.Errorf("ENI %s holds %v after %s was taken off (want its own and one more)", aws.ToString(extra.NetworkInterfaceId), got, onExtra)
	}

	// Its own address stays; one now on another instance is not the dead
	// node's to give (and is no error: the dead node holds it no more).
	own := addrOf(extra)
	if err := c.TakeOff(ctx(t), dead.ENI, []netip.Addr{own}); err == nil || !strings.Contains(err.Error(), "own address: never taken off") {
		t.Errorf("taking an ENI's own address: %v", err)
	}
	if err := c.TakeOff(ctx(t), dead.ENI, []netip.Addr{netip.MustParseAddr(sticky)}); err != nil {
		t.Errorf("an address the dead node no longer holds: %v", err)
	}
	if !slices.Contains(b.ep.ENIAddrs(t, next.ENI), netip.MustParseAddr(sticky)) {
		t.Errorf("%s left the next node's ENI", sticky)
	}

	// The dead node's instance terminated with its primary ENI: an ENI of
	// vpcni's it left detached gives the address back.
	left := b.handENI(t, map[string]string{"vpcni.io/owner": "vpcni", "vpcni.io/cluster": clusterName}, "10.30.1.80", "10.30.1.81")
	if err := c.TakeOff(ctx(t), "eni-0123456789abcdef0", []netip.Addr{netip.MustParseAddr("10.30.1.81")}); err != nil {
		t.Fatal(err)
	}
	if got := b.ep.ENIAddrs(t, left); len(got) != 1 {
		t.Errorf("the left ENI holds %v", got)
	}
}

// An address in a /28 prefix leaves with its prefix, and only from an
// instance that no longer runs: a running one may still have pods on the
// prefix's other addresses.
func TestTakeOffPrefix(t *testing.T) {
	b := newBed(t, "")
	b.ep.InstanceType = "m5.large" // Nitro
	dead := b.node(t, "10.30.1.10", 0)
	if _, err := b.c.AssignPrivateIpAddresses(ctx(t), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &dead.ENI, Ipv4PrefixCount: aws.Int32(1)}); err != nil {
		t.Fatal(err)
	}
	out, err := b.c.DescribeNetworkInterfaces(ctx(t), &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{dead.ENI}})
	if err != nil || len(out.NetworkInterfaces[0].Ipv4Prefixes) != 1 {
		t.Fatalf("%+v %v", out, err)
	}
	primary := out.NetworkInterfaces[0]
	prefix := netip.MustParsePrefix(aws.ToString(primary.Ipv4Prefixes[0].Ipv4Prefix))
	a := prefix.Addr().Next().Next()
	c := b.cloud(t)
	if err := c.TakeOff(ctx(t), dead.ENI, []netip.Addr{a}); err == nil || !strings.Contains(err.Error(), "still runs") || !strings.Contains(err.Error(), prefix.String()) {
		t.Errorf("a prefix address of a running instance: %v", err)
	}
	if got := b.ep.ENIAddrs(t, dead.ENI); len(got) != 17 {
		t.Errorf("the running instance's ENI holds %d addresses, want its own and the prefix's 16", len(got))
	}

	// Terminated with DeleteOnTermination unset, its primary ENI stays,
	// detached, with the prefix.
	if _, err := b.c.ModifyNetworkInterfaceAttribute(ctx(t), &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: &dead.ENI,
		Attachment: &types.NetworkInterfaceAttachmentChanges{AttachmentId: primary.Attachment.AttachmentId, DeleteOnTermination: aws.Bool(false)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.TerminateInstances(ctx(t), &ec2.TerminateInstancesInput{InstanceIds: []string{dead.ID}}); err != nil {
		t.Fatal(err)
	}
	if err := c.TakeOff(ctx(t), dead.ENI, []netip.Addr{a}); err != nil {
		t.Fatal(err)
	}
	if got := b.ep.ENIAddrs(t, dead.ENI); len(got) != 1 {
		t.Errorf("the dead instance's ENI holds %v, want its own address only", got)
	}
}

// What EC2 says holds an address: the ENI and its instance, how it holds
// it (found by the address filter, or in a prefix by the subnet's ENIs);
// nothing for a free address.
func TestHolders(t *testing.T) {
	b := newBed(t, "")
	b.ep.InstanceType = "m5.large"
	n := b.node(t, "10.30.1.10", 0)
	if err := assign(t, b, n.ENI, "10.30.1.77"); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.AssignPrivateIpAddresses(ctx(t), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &n.ENI, Ipv4PrefixCount: aws.Int32(1)}); err != nil {
		t.Fatal(err)
	}
	var prefix netip.Prefix
	for _, e := range b.s.ENIs() {
		if e.ID == n.ENI {
			prefix = e.Prefixes[0]
		}
	}
	c := b.cloud(t)
	for addr, want := range map[string]string{
		"10.30.1.10":                  n.ENI + " " + n.ID + " the own address of ENI " + n.ENI + " (device 0)",
		"10.30.1.77":                  n.ENI + " " + n.ID + " a secondary address of ENI " + n.ENI + " (device 0)",
		prefix.Addr().Next().String(): n.ENI + " " + n.ID + " in prefix " + prefix.String() + " of ENI " + n.ENI + " (device 0)",
		"10.30.1.250":                 "",
		"192.168.9.9":                 "",
	} {
		hs, err := c.Holders(ctx(t), netip.MustParseAddr(addr))
		var got []string
		for _, h := range hs {
			got = append(got, h.Resource+" "+h.Instance+" "+h.How)
		}
		if err != nil || strings.Join(got, "; ") != want {
			t.Errorf("holders of %s: %q %v, want %q", addr, got, err, want)
		}
	}
}

// The aws section: region required, the agent's own keys allowed, an
// unknown key refused; no router beside it; floating IPs none, refused
// with the reason when a pod asks.
func TestSection(t *testing.T) {
	dir := t.TempDir()
	load := func(body string) (cloudconfig.Config, error) {
		p := filepath.Join(dir, "cloud.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return cloudconfig.Load(p)
	}
	fc, err := load("aws:\n  region: eu-west-1\n  prefixMode: true\n  subnets: [subnet-1]\n  attachTimeout: 1m\n  imdsEndpoint: http://x\n")
	if err != nil {
		t.Fatal(err)
	}
	s := fc.Settings.(*cluster.Settings)
	if fc.Cloud != "aws" || s.Timeout.String() != "30s" || s.Retries != 5 {
		t.Errorf("section %+v", s)
	}
	c := fc.Open(nil)
	if i := c.Info(); i.Name != "aws" || !i.Subnet || i.NoRouter == "" {
		t.Errorf("info %+v", i)
	}
	for body, want := range map[string]string{
		"aws: {}\n":                                         "aws.region: is required",
		"aws: {region: eu-west-1, bogus: 1}\n":              "bogus",
		"aws: {region: Europe}\n":                           `aws.region: "Europe" is not an AWS region name`,
		"aws: {region: eu-west-1, endpoint: ftp://x}\n":     `aws.endpoint: "ftp://x" is not an http(s) URL`,
		"aws: {region: eu-west-1}\nroutes: {routerID: r}\n": "routes: the aws cloud has no router for it: pods take addresses on the VPC's own subnets",
	} {
		if _, err := load(body); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want it to say %q", body, err, want)
		}
	}
	if _, err := c.Router(ctx(t), "r"); !errors.Is(err, cluster.ErrNoRouter) {
		t.Errorf("router door: %v", err)
	}
	fips, err := c.FloatingIPs(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	if at, err := fips.At(ctx(t), netip.MustParseAddr("10.0.0.9")); err != nil || len(at) != 0 {
		t.Errorf("floating IPs at an address: %+v %v", at, err)
	}
	_, err = fips.Ensure(ctx(t), floatingip.Want{Owner: "default/web"})
	if !errors.Is(err, floatingip.ErrInvalid) || !strings.Contains(err.Error(), "no floating IPs for pods") {
		t.Errorf("a pod asks for a floating IP: %v", err)
	}
}

// Every key of the agent's provider.aws section is one the aws section
// takes, so one file serves both.
func TestAgentKeys(t *testing.T) {
	keys := func(typ reflect.Type) []string {
		var out []string
		var walk func(reflect.Type)
		walk = func(typ reflect.Type) {
			for f := range typ.Fields() {
				if f.Anonymous {
					walk(f.Type)
					continue
				}
				if k, _, _ := strings.Cut(f.Tag.Get("json"), ","); k != "" {
					out = append(out, k)
				}
			}
		}
		walk(typ)
		return out
	}
	agent, section := keys(reflect.TypeFor[vpcaws.Config]()), keys(reflect.TypeFor[cluster.Settings]())
	if len(agent) < 10 {
		t.Fatalf("read %d keys of provider.aws: the walk is broken", len(agent))
	}
	for _, k := range agent {
		if !slices.Contains(section, k) {
			t.Errorf("provider.aws key %q is not one the aws section of -cloud-config takes", k)
		}
	}
}
