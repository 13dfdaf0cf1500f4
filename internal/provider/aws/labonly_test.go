package aws_test

import (
	"errors"
	"io"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab/ec2api"
	"github.com/vpcni/vpcni/internal/provider"
	vpcaws "github.com/vpcni/vpcni/internal/provider/aws"
	"github.com/vpcni/vpcni/internal/provider/aws/ec2test"
)

// Lab-only tests: moto_server 5.2.1 has no prefixes (AP7: Ipv4PrefixCount
// is ignored), no limits (AT5, AP6), no throttling (TH1), only AccessDenied
// for a denied action (IAM2), no IMDS the SDK can use, and never loses a
// reply; the lab's endpoint does what EC2 documents.

func labNode(t *testing.T, o ec2api.Options, adjust func(*vpcaws.Config)) (*vpcaws.Provider, ec2test.Instance, *ec2test.Endpoint, *ec2api.Server, netip.Prefix) {
	ep, s := lab(t, o)
	p, inst, cidr := node(t, ep, adjust)
	return p, inst, ep, s, cidr
}

func prefixes(t *testing.T, ep *ec2test.Endpoint, eni string) []netip.Prefix {
	out, err := ep.Client.DescribeNetworkInterfaces(ec2test.Ctx(t), &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{eni}})
	if err != nil {
		t.Fatal(err)
	}
	var ps []netip.Prefix
	for _, p := range out.NetworkInterfaces[0].Ipv4Prefixes {
		ps = append(ps, netip.MustParsePrefix(aws.ToString(p.Ipv4Prefix)))
	}
	return ps
}

// In prefix mode a refill of up to 16 addresses is one call for a /28;
// addresses of a prefix the agent did not ask for yet, or gave back, are
// idle — not held, handed out first (no call) — and the prefix leaves the
// ENI only when all 16 are given back. A restart keeps all that.
func TestPrefixMode(t *testing.T) {
	p, inst, ep, _, _ := labNode(t, ec2api.Options{}, func(c *vpcaws.Config) { c.PrefixMode = true })
	if i := p.Info(); i.Capacity != 3*9*16 || !strings.Contains(i.CapacityReason, "/28 prefixes") {
		t.Errorf("Info = %d (%s), want 432: 3 ENIs × 9 prefixes × 16", i.Capacity, i.CapacityReason)
	}
	calls := func() int64 { return p.Info().Calls["AssignPrivateIpAddresses"] }
	held := func() []netip.Addr {
		h, err := p.Held(ec2test.Ctx(t))
		if err != nil {
			t.Fatal(err)
		}
		return provider.Addresses(h)
	}
	first, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 5})
	if err != nil || len(first) != 5 || calls() != 1 {
		t.Fatalf("Assign(5) = %v, %v in %d calls; want 5 in 1", first, err, calls())
	}
	pf := prefixes(t, ep, inst.ENI)
	if len(pf) != 1 || pf[0].Bits() != 28 {
		t.Fatalf("the ENI holds prefixes %v, want one /28", pf)
	}
	for _, l := range first {
		if !pf[0].Contains(l.Address) || l.Interface != inst.ENI || l.NIC != nil {
			t.Errorf("lease %+v: want an address of %s on the primary ENI", l, pf[0])
		}
	}
	if h := held(); len(h) != 5 {
		t.Fatalf("Held = %v, want the 5 handed out (not the prefix's other 11)", h)
	}
	more, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 20})
	if err != nil || len(more) != 20 || calls() != 2 {
		t.Fatalf("Assign(20) = %d, %v after %d calls; want 11 idle and one new prefix: 2 calls in all", len(more), err, calls())
	}
	all := slices.Concat(first, more)
	fromFirst := slices.DeleteFunc(provider.Addresses(all), func(a netip.Addr) bool { return !pf[0].Contains(a) })
	if len(fromFirst) != 16 {
		t.Fatalf("%d addresses of the first prefix handed out, want all 16", len(fromFirst))
	}
	if err := p.Release(ec2test.Ctx(t), fromFirst[:3]); err != nil {
		t.Fatal(err)
	}
	if n := len(prefixes(t, ep, inst.ENI)); n != 2 || p.Info().Calls["UnassignPrivateIpAddresses"] != 0 {
		t.Fatalf("after giving back 3 addresses of a prefix: %d prefixes, %d unassigns; want 2 and none", n, p.Info().Calls["UnassignPrivateIpAddresses"])
	}
	p2 := ep.Open(t, inst, nil)
	if h, err := p2.Held(ec2test.Ctx(t)); err != nil || len(h) != 22 || slices.Contains(provider.Addresses(h), fromFirst[0]) {
		t.Fatalf("after a restart Held = %d, %v; want 22 without the 3 given back", len(h), err)
	}
	if err := p2.Release(ec2test.Ctx(t), fromFirst[3:]); err != nil {
		t.Fatal(err)
	}
	if left := prefixes(t, ep, inst.ENI); len(left) != 1 || left[0] == pf[0] {
		t.Fatalf("after giving back all 16 of %s the ENI holds %v; want only the second prefix", pf[0], left)
	}
	// The idle ones of the second prefix come first, then new prefixes:
	// 16 addresses a call at most.
	before := p2.Info().Calls["AssignPrivateIpAddresses"]
	got, err := p2.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 64})
	if err != nil || len(got) != 64 {
		t.Fatalf("Assign(64) = %d, %v", len(got), err)
	}
	if d := p2.Info().Calls["AssignPrivateIpAddresses"] - before; d > 1 {
		t.Errorf("64 addresses took %d assign calls (one call asks for every prefix the ENI has room for)", d)
	}
	if h, _ := p2.Held(ec2test.Ctx(t)); len(h) != 9+64 {
		t.Errorf("Held = %d, want 73", len(h))
	}
}

// Prefix mode spills onto a new ENI created with its prefixes.
func TestPrefixModeSpills(t *testing.T) {
	p, inst, ep, _, _ := labNode(t, ec2api.Options{}, func(c *vpcaws.Config) { c.PrefixMode = true })
	got, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 9*16 + 20})
	if err != nil || len(got) != 164 {
		t.Fatalf("Assign(164) = %d, %v", len(got), err)
	}
	m := byENI(got)
	if len(m[inst.ENI]) != 144 || len(m) != 2 {
		t.Fatalf("want 144 on the primary ENI's 9 prefixes and 20 on a new ENI: %d ENIs, %d on the primary", len(m), len(m[inst.ENI]))
	}
	enis := ep.ENIs(t, inst.ID)
	if len(enis) != 2 || len(enis[1].Ipv4Prefixes) != 2 {
		t.Fatalf("the new ENI holds %d prefixes, want 2", len(enis[1].Ipv4Prefixes))
	}
	if c := p.Info().Calls; c["CreateNetworkInterface"] != 1 || c["AssignPrivateIpAddresses"] != 1 {
		t.Errorf("calls %v: want one assign of 9 prefixes and one create with 2", c)
	}
}

// A subnet fragmented by single addresses has free addresses but no free
// aligned /28: EC2 answers InsufficientCidrBlocks. The node reports the
// fix (a CIDR reservation of type prefix) and does not ask that subnet
// again until cidrBackoff has passed.
func TestInsufficientCidrBlocks(t *testing.T) {
	p, inst, ep, s, cidr := labNode(t, ec2api.Options{}, func(c *vpcaws.Config) {
		c.PrefixMode, c.CIDRBackoff = true, config.Duration{Duration: 300 * time.Millisecond}
	})
	// One address in each /28 but the node's own.
	var spec []types.PrivateIpAddressSpecification
	for i := 1; i < 16; i++ {
		spec = append(spec, types.PrivateIpAddressSpecification{PrivateIpAddress: aws.String(at(cidr, byte(16*i+4)).String()), Primary: aws.Bool(i == 1)})
	}
	sn := ep.ENIs(t, inst.ID)[0].SubnetId
	frag, err := ep.Client.CreateNetworkInterface(ec2test.Ctx(t), &ec2.CreateNetworkInterfaceInput{SubnetId: sn, PrivateIpAddresses: spec})
	if err != nil {
		t.Fatal(err)
	}
	before, creates := s.Calls()["AssignPrivateIpAddresses"], s.Calls()["CreateNetworkInterface"]
	_, err = p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 1})
	if !errors.Is(err, provider.ErrExhausted) || !strings.Contains(err.Error(), "InsufficientCidrBlocks") || !strings.Contains(err.Error(), "create-subnet-cidr-reservation") {
		t.Fatalf("Assign on a fragmented subnet: %v; want ErrExhausted with InsufficientCidrBlocks and the fix", err)
	}
	_, err = p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 1})
	if !errors.Is(err, provider.ErrExhausted) || !strings.Contains(err.Error(), "not asked for prefixes until") {
		t.Fatalf("Assign again at once: %v; want ErrExhausted saying the subnet is backed off", err)
	}
	if n := s.Calls()["AssignPrivateIpAddresses"] - before; n != 1 {
		t.Errorf("EC2 was asked %d times, want once: the second Assign backs off", n)
	}
	if n := s.Calls()["CreateNetworkInterface"] - creates; n != 0 {
		t.Errorf("%d CreateNetworkInterface calls, want none (no ENI in a subnet without /28s)", n)
	}
	if _, err := ep.Client.DeleteNetworkInterface(ec2test.Ctx(t), &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: frag.NetworkInterface.NetworkInterfaceId}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(350 * time.Millisecond) // the backoff, and nothing else, is waited out here
	if got, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 1}); err != nil || len(got) != 1 {
		t.Fatalf("after the backoff on a subnet with room: %v, %v", got, err)
	}
}

// RequestLimitExceeded (a 503 from EC2's per-action bucket) is retried by
// the SDK's standard retryer with backoff until a token comes back; every
// attempt is counted, as EC2 counts it. And the client's own bucket paces
// the calls at apiRate.
func TestThrottling(t *testing.T) {
	t.Run("server", func(t *testing.T) {
		t.Parallel()
		p, _, _, s, _ := labNode(t, ec2api.Options{}, func(c *vpcaws.Config) {
			c.APIRate, c.APIBurst, c.RetryMaxBackoff = 1000, 1000, config.Duration{Duration: 50 * time.Millisecond}
			c.Retries = 10
		})
		s.SetBucket("AssignPrivateIpAddresses", 1, 10)
		s.Throttle(true)
		before := s.Calls()["AssignPrivateIpAddresses"]
		for i := range 4 {
			if got, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 1}); err != nil || len(got) != 1 {
				t.Fatalf("Assign %d under throttling: %v, %v", i, got, err)
			}
		}
		sent := s.Calls()["AssignPrivateIpAddresses"] - before
		if sent <= 4 {
			t.Errorf("EC2 saw %d assign requests for 4 calls: none was throttled, the test proves nothing", sent)
		}
		if counted := p.Info().Calls["AssignPrivateIpAddresses"]; counted != int64(sent) {
			t.Errorf("Info counts %d assign requests, EC2 saw %d", counted, sent)
		}
	})
	t.Run("client", func(t *testing.T) {
		t.Parallel()
		p, _, _, s, _ := labNode(t, ec2api.Options{}, func(c *vpcaws.Config) { c.APIRate, c.APIBurst = 10, 2 })
		start := time.Now()
		for range 6 {
			if _, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 1}); err != nil {
				t.Fatal(err)
			}
		}
		// A burst of 2, then 4 more tokens at 10/s.
		if d := time.Since(start); d < 350*time.Millisecond {
			t.Errorf("6 assigns took %s with a bucket of 2 at 10/s; want at least 400ms", d)
		}
		if n := s.Calls()["AssignPrivateIpAddresses"]; n != 6 {
			t.Errorf("EC2 saw %d assigns, want 6", n)
		}
	})
}

// A denied action fails at once with the IAM action named, not as the
// cloud being unavailable; at start too.
func TestUnauthorizedNamesTheAction(t *testing.T) {
	p, inst, ep, s, _ := labNode(t, ec2api.Options{}, nil)
	s.Deny("AssignPrivateIpAddresses")
	before := s.Calls()["AssignPrivateIpAddresses"]
	_, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 1})
	if err == nil || !strings.Contains(err.Error(), "UnauthorizedOperation") || !strings.Contains(err.Error(), "ec2:AssignPrivateIpAddresses") || errors.Is(err, provider.ErrUnavailable) {
		t.Fatalf("a denied assign: %v; want UnauthorizedOperation naming ec2:AssignPrivateIpAddresses", err)
	}
	if n := s.Calls()["AssignPrivateIpAddresses"] - before; n != 1 {
		t.Errorf("a denied call was sent %d times, want once (no retry)", n)
	}
	s.Deny("DescribeInstanceTypes")
	cfg := vpcaws.Config{Endpoint: ep.URL, IMDSEndpoint: inst.IMDSURL}
	cfg.Defaults()
	_, err = vpcaws.New(ec2test.Ctx(t), cfg, provider.Node{StateDir: t.TempDir()})
	if err == nil || !strings.Contains(err.Error(), "ec2:DescribeInstanceTypes") {
		t.Fatalf("start with DescribeInstanceTypes denied: %v; want the action named", err)
	}
}

// IMDS lags EC2 (here by an hour): what the node holds still comes from
// EC2 — after an assign, after a spill onto a new ENI, after a restart —
// while IMDS shows none of it.
func TestIMDSLagDoesNotMislead(t *testing.T) {
	ep, _ := lab(t, ec2api.Options{})
	ep.IMDSLag = time.Hour
	p, inst, _ := node(t, ep, nil)
	got, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 12})
	if err != nil || len(got) != 12 || len(byENI(got)) != 2 {
		t.Fatalf("Assign(12) = %v, %v; want 9 on the primary and 3 on a new ENI", got, err)
	}
	md := imds.New(imds.Options{Endpoint: inst.IMDSURL, EnableFallback: aws.FalseTernary})
	mac, _ := md.GetMetadata(ec2test.Ctx(t), &imds.GetMetadataInput{Path: "network/interfaces/macs/"})
	macs, _ := io.ReadAll(mac.Content)
	if n := len(strings.Fields(string(macs))); n != 1 {
		t.Fatalf("IMDS lists %d MACs; the lag should hide the new ENI", n)
	}
	h, err := ep.Open(t, inst, nil).Held(ec2test.Ctx(t))
	if err != nil || !sameLeases(h, got) {
		t.Fatalf("a restarted provider with IMDS an hour behind: Held = %v, %v; want %v", h, err, got)
	}
}

// A reply lost after EC2 assigned, and the SDK's retry that assigned again:
// both attempts' addresses are vpcni's (claimed through the intent), none
// is left on the primary ENI looking like a person's.
func TestLostReplyAssignsAreClaimed(t *testing.T) {
	p, inst, ep, s, _ := labNode(t, ec2api.Options{}, func(c *vpcaws.Config) { c.RetryMaxBackoff = config.Duration{Duration: 20 * time.Millisecond} })
	s.LoseReplies(1, "AssignPrivateIpAddresses")
	got, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 2})
	if err != nil || len(got) != 2 {
		t.Fatalf("Assign(2) with its first reply lost = %v, %v", got, err)
	}
	on := ep.ENIAddrs(t, inst.ENI)
	if len(on) != 5 {
		t.Fatalf("the ENI holds %v; want its own address and 2 from each attempt", on)
	}
	h, err := ep.Open(t, inst, nil).Held(ec2test.Ctx(t))
	if err != nil || len(h) != 4 {
		t.Fatalf("Held after a restart = %v, %v; want all 4 as vpcni's", h, err)
	}
	if err := p.Release(ec2test.Ctx(t), provider.Addresses(h)); err != nil {
		t.Fatal(err)
	}
	if on := ep.ENIAddrs(t, inst.ENI); len(on) != 1 {
		t.Fatalf("after releasing everything the ENI holds %v", on)
	}
}

// A crash after EC2 assigned but before the provider recorded it (here:
// the reply lost and no retry, the provider dropped) leaves an intent; the
// next start claims what the call added.
func TestInterruptedAssignSettledAtStart(t *testing.T) {
	p, inst, ep, s, _ := labNode(t, ec2api.Options{}, func(c *vpcaws.Config) { c.Retries = 1 })
	s.LoseReplies(1, "AssignPrivateIpAddresses")
	if _, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 3}); !errors.Is(err, provider.ErrUnavailable) {
		t.Fatalf("Assign with its reply lost and no retry: %v; want ErrUnavailable", err)
	}
	h, err := ep.Open(t, inst, nil).Held(ec2test.Ctx(t))
	if err != nil || len(h) != 3 {
		t.Fatalf("Held at the next start = %v, %v; want the 3 the lost call assigned", h, err)
	}
}

// When the instance has more ENIs than the provider knew of (attached by
// someone else meanwhile — a person, or another of vpcni's providers on
// the node), the count read just before a new ENI is made says so: it is
// exhaustion with the reason, and no ENI is left behind. (Should EC2
// still answer AttachmentLimitExceeded, that is exhaustion too: explain.)
func TestAttachmentLimitExceeded(t *testing.T) {
	p, inst, ep, _, _ := labNode(t, ec2api.Options{}, nil)
	if _, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 9}); err != nil {
		t.Fatal(err)
	}
	sn := ep.ENIs(t, inst.ID)[0].SubnetId
	for dev := int32(1); dev <= 2; dev++ {
		ni, err := ep.Client.CreateNetworkInterface(ec2test.Ctx(t), &ec2.CreateNetworkInterfaceInput{SubnetId: sn})
		if err == nil {
			_, err = ep.Client.AttachNetworkInterface(ec2test.Ctx(t), &ec2.AttachNetworkInterfaceInput{InstanceId: &inst.ID, NetworkInterfaceId: ni.NetworkInterface.NetworkInterfaceId, DeviceIndex: aws.Int32(dev)})
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	_, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 1})
	if !errors.Is(err, provider.ErrExhausted) || errors.Is(err, provider.ErrUnavailable) || !strings.Contains(err.Error(), "the instance has its 3 ENIs") {
		t.Fatalf("Assign with every ENI slot taken behind the provider's back: %v; want ErrExhausted saying the instance has its 3 ENIs", err)
	}
	left, err := ep.Client.DescribeNetworkInterfaces(ec2test.Ctx(t), &ec2.DescribeNetworkInterfacesInput{Filters: []types.Filter{
		{Name: aws.String("tag:vpcni.io/owner"), Values: []string{"vpcni"}}}})
	if err != nil || len(left.NetworkInterfaces) != 0 {
		t.Fatalf("vpcni's ENIs left after the failed attach: %v, %v", left, err)
	}
}

// sum is every EC2 request the provider made, all actions.
func sum(p *vpcaws.Provider) int64 {
	var n int64
	for _, c := range p.Info().Calls {
		n += c
	}
	return n
}

// What churn costs EC2, every request counted (describes too): a refill
// of the pool's batch (8) is one call, so at most 1/8 call per address
// (and one read of the ENI in the provider's life, to learn how EC2
// answers); in prefix mode one call per 16 addresses however the pool
// batches, and giving them back costs the same.
func TestCallsPerAddress(t *testing.T) {
	for _, c := range []struct {
		name   string
		prefix bool
		n      int
		max    float64
	}{{"secondary", false, 24, 1.0 / 8}, {"prefix", true, 128, 1.0 / 16}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			// c5n.18xlarge: 49 secondary addresses on the primary ENI, so
			// no ENI is attached on the way (that costs 4 calls an ENI,
			// once in its life).
			ep, _ := lab(t, ec2api.Options{})
			ep.InstanceType = "c5n.18xlarge"
			p, _, _ := node(t, ep, func(cfg *vpcaws.Config) { cfg.PrefixMode = c.prefix })
			start := sum(p)
			var all []netip.Addr
			for len(all) < c.n {
				got, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 8})
				if err != nil {
					t.Fatal(err)
				}
				all = append(all, provider.Addresses(got)...)
			}
			assigns := sum(p) - start
			slack := int64(0)
			if !c.prefix {
				slack = 1 // the one read before the first assign
			}
			if per := float64(assigns-slack) / float64(c.n); per > c.max {
				t.Errorf("%d addresses cost %d EC2 calls: %.3f a pod, want at most %.3f (%v)", c.n, assigns, per, c.max, p.Info().Calls)
			}
			start = sum(p)
			for i := 0; i < len(all); i += 8 {
				if err := p.Release(ec2test.Ctx(t), all[i:i+8]); err != nil {
					t.Fatal(err)
				}
			}
			if per := float64(sum(p)-start) / float64(c.n); per > c.max {
				t.Errorf("giving %d addresses back cost %d EC2 calls: %.3f a pod, want at most %.3f", c.n, sum(p)-start, per, c.max)
			}
			t.Logf("vpcni-test: %s: %d addresses, %d calls to assign, %d to give back: %v", c.name, c.n, assigns, sum(p)-start, p.Info().Calls)
		})
	}
}

// The SDK's default credential chain: on an instance, the instance
// profile's role keys from IMDS (the lab serves them); keys in the
// environment come first (how tests and some installs give them).
func TestCredentials(t *testing.T) {
	p, inst, ep, s, _ := labNode(t, ec2api.Options{}, nil)
	if _, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 1}); err != nil {
		t.Fatal(err)
	}
	md, err := s.Instance(ec2test.Ctx(t), inst.ID)
	if err != nil || md.Credentials.AccessKeyID == "" {
		t.Fatalf("the lab's IMDS serves no role keys: %v", err)
	}
	if n := s.CallsBy(md.Credentials.AccessKeyID); n < 4 {
		t.Errorf("%d calls signed with the instance role's key, want every one the provider made (%v)", n, p.Info().Calls)
	}
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDFROMENV")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	p2 := ep.Open(t, inst, nil)
	if _, err := p2.Held(ec2test.Ctx(t)); err != nil {
		t.Fatal(err)
	}
	if n := s.CallsBy("AKIDFROMENV"); n < 3 {
		t.Errorf("%d calls signed with the environment's key, want every one of the second provider's", n)
	}
}

// EC2 attaches an ENI asynchronously (attaching for up to ~10 s): the
// addresses of a new ENI are handed out once it is attached — the node
// has its link then — and an ENI still attaching past attachTimeout is
// kept, its addresses used once a read finds it attached.
func TestAsyncAttach(t *testing.T) {
	t.Run("waits", func(t *testing.T) {
		t.Parallel()
		p, inst, ep, _, _ := labNode(t, ec2api.Options{AttachDelay: 300 * time.Millisecond}, nil)
		start := time.Now()
		got, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 12})
		if err != nil || len(got) != 12 {
			t.Fatalf("Assign(12) = %v, %v", got, err)
		}
		enis := ep.ENIs(t, inst.ID)
		if len(enis) != 2 || enis[1].Attachment.Status != types.AttachmentStatusAttached || time.Since(start) < 300*time.Millisecond {
			t.Fatalf("Assign answered after %s with the new ENI %s: want it attached first", time.Since(start), ec2test.Describe(enis[len(enis)-1]))
		}
	})
	t.Run("times out", func(t *testing.T) {
		t.Parallel()
		p, _, _, _, _ := labNode(t, ec2api.Options{AttachDelay: 2 * time.Second}, func(c *vpcaws.Config) { c.AttachTimeout = config.Duration{Duration: time.Second} })
		got, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 12})
		if len(got) != 9 || !errors.Is(err, provider.ErrUnavailable) || !strings.Contains(err.Error(), "still attaching") {
			t.Fatalf("Assign(12) with the attach slower than attachTimeout = %d, %v; want the primary's 9 and the ENI still attaching", len(got), err)
		}
		if h, err := p.Held(ec2test.Ctx(t)); err != nil || len(h) != 9 {
			t.Fatalf("Held while the ENI attaches = %d, %v; want 9", len(h), err)
		}
		waitFor(t, "the attached ENI's addresses held", func() bool {
			h, err := p.Held(ec2test.Ctx(t))
			return err == nil && len(h) == 12
		})
	})
}

// Two assigns on the primary ENI whose replies are lost (no retry) leave
// two intents; the next assign settles the first one's before it starts,
// so each intent's gain is only its own and every address vpcni's calls
// added is claimed. Settled together, the first intent would have seen
// both calls' addresses, more than it asked for, and claimed none.
func TestTwoLostAssignsAreBothClaimed(t *testing.T) {
	p, inst, ep, s, _ := labNode(t, ec2api.Options{}, func(c *vpcaws.Config) { c.Retries = 1 })
	for range 2 {
		s.LoseReplies(1, "AssignPrivateIpAddresses")
		if _, err := p.Assign(ec2test.Ctx(t), provider.AssignRequest{Count: 2}); !errors.Is(err, provider.ErrUnavailable) {
			t.Fatalf("Assign with its reply lost and no retry: %v; want ErrUnavailable", err)
		}
	}
	if on := ep.ENIAddrs(t, inst.ENI); len(on) != 5 {
		t.Fatalf("the ENI holds %v; want its own address and 2 from each lost call", on)
	}
	h, err := ep.Open(t, inst, nil).Held(ec2test.Ctx(t))
	if err != nil || len(h) != 4 {
		t.Fatalf("Held at the next start = %v, %v; want the 4 both lost calls assigned", h, err)
	}
}
