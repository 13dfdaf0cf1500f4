package cluster_test

import (
	"context"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/leaks"
	"github.com/vpcni/vpcni/internal/provider/aws/ec2test"
)

// clock is the collector's, moved by the test.
type clock struct{ now time.Time }

func (c *clock) Now() time.Time { return c.now }

// verdicts maps each ENI the pass judged to its verdict, released ones
// marked so.
func verdicts(fs []leaks.Finding) map[string]string {
	out := map[string]string{}
	for _, f := range fs {
		v := string(f.Verdict)
		if f.Released {
			v = "released"
		}
		out[f.Resource] = v
	}
	return out
}

func expectVerdicts(t *testing.T, pass string, fs []leaks.Finding, want map[string]string) {
	t.Helper()
	got := verdicts(fs)
	for id, v := range want {
		if got[id] != v {
			t.Errorf("%s: ENI %s is %q, want %q (findings %+v)", pass, id, got[id], v, fs)
		}
	}
	if len(got) != len(want) {
		t.Errorf("%s: judged %v, want exactly %v", pass, got, want)
	}
}

// The leak collector on EC2, against ENIs the agents' own providers made
// (so the tags it reads are theirs): a Node's ENI is kept; the ENI left
// detached by a gone instance and one attached to a running instance that
// is no Node are released after the grace — the second detached first —
// while an address on one that an AddressReservation names keeps it; an
// ENI of another cluster in the account is not even read.
func TestCollectorReleasesProviderENIs(t *testing.T) {
	b := newBed(t, "  clusterName: "+clusterName+"\n")
	a := b.node(t, "10.30.1.10", 5) // a Node
	gone := b.node(t, "10.30.1.20", 5)
	stray := b.node(t, "10.30.1.30", 5) // runs, but is no Node
	eniA, eniGone, eniStray := b.extra(t, a.ID), b.extra(t, gone.ID), b.extra(t, stray.ID)
	// An ENI whose DeleteOnTermination a crash left unset outlives its
	// instance, detached.
	if _, err := b.c.ModifyNetworkInterfaceAttribute(ctx(t), &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: eniGone.NetworkInterfaceId,
		Attachment: &types.NetworkInterfaceAttachmentChanges{AttachmentId: eniGone.Attachment.AttachmentId, DeleteOnTermination: aws.Bool(false)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.c.TerminateInstances(ctx(t), &ec2.TerminateInstancesInput{InstanceIds: []string{gone.ID}}); err != nil {
		t.Fatal(err)
	}
	other := b.handENI(t, map[string]string{"vpcni.io/owner": "vpcni", "vpcni.io/instance-id": "i-0123456789abcdef0", "vpcni.io/cluster": "another"}, "10.30.1.90")

	held, err := b.cloud(t).Leaks(ctx(t), leaks.Scope{ClusterID: "uid-1"})
	if err != nil {
		t.Fatal(err)
	}
	// Node a registered without spec.providerID (no cloud provider): its
	// InternalIP ties the ENI to it.
	reserved := map[netip.Addr]string{}
	cluster := func(context.Context) (*leaks.Cluster, error) {
		c := leaks.NewCluster()
		c.AddNode("node-a", []netip.Addr{netip.MustParseAddr("10.30.1.10")})
		for a, owner := range reserved {
			c.Reservations[a] = owner
		}
		return c, nil
	}
	clk := &clock{now: time.Now()}
	col := &leaks.Collector{Cloud: held, Cluster: cluster, Grace: time.Minute, Period: time.Minute, Log: slog.New(slog.DiscardHandler), Now: clk.Now}
	idA, idGone, idStray := aws.ToString(eniA.NetworkInterfaceId), aws.ToString(eniGone.NetworkInterfaceId), aws.ToString(eniStray.NetworkInterfaceId)

	fs, err := col.Pass(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	expectVerdicts(t, "first pass", fs, map[string]string{idA: "held", idGone: "orphan", idStray: "orphan"})
	for _, f := range fs {
		if f.Resource == idGone && (f.Kind != leaks.ENI || f.Instance != gone.ID || len(f.Carries) != 3 || !strings.Contains(f.Release, "detaches the ENI")) {
			t.Errorf("the gone instance's ENI as judged: %+v", f)
		}
	}

	// After the grace; meanwhile a sticky pod's reservation names an
	// address on the stray instance's ENI.
	clk.now = clk.now.Add(2 * time.Minute)
	reserved[secondaries(eniStray)[0]] = "default/web-0"
	fs, err = col.Pass(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	expectVerdicts(t, "after the grace", fs, map[string]string{idA: "held", idGone: "released", idStray: "held"})
	if b.exists(idGone) || !b.exists(idA) || !b.exists(idStray) || !b.exists(other) {
		t.Errorf("after the grace: gone's ENI exists %v (want false); a's %v, stray's %v, another cluster's %v (want true)",
			b.exists(idGone), b.exists(idA), b.exists(idStray), b.exists(other))
	}

	// The reservation gone, the stray ENI's grace starts again.
	clear(reserved)
	fs, _ = col.Pass(ctx(t))
	expectVerdicts(t, "reservation gone", fs, map[string]string{idA: "held", idStray: "orphan"})
	clk.now = clk.now.Add(2 * time.Minute)
	fs, err = col.Pass(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	expectVerdicts(t, "its grace over", fs, map[string]string{idA: "held", idStray: "released"})
	if b.exists(idStray) || !b.exists(idA) {
		t.Errorf("the stray instance's ENI exists %v (want false, detached and deleted); a's %v", b.exists(idStray), b.exists(idA))
	}
	if n := len(b.ep.ENIs(t, stray.ID)); n != 1 {
		t.Errorf("the stray instance has %d ENIs attached, want its primary only", n)
	}
}

// Without clusterName every ENI of vpcni's in the account is read, and only
// those this cluster claimed are ever released: a held ENI gets the claim
// tag (vpcni.io/cluster-id), and is released once orphaned; one never held
// here stays unclaimed.
func TestCollectorClaims(t *testing.T) {
	b := newBed(t, "")
	tags := func(instance string) map[string]string {
		return map[string]string{"vpcni.io/owner": "vpcni", "vpcni.io/instance-id": instance}
	}
	mine := b.handENI(t, tags("i-00000000000000001"), "10.30.1.40", "10.30.1.41")
	theirs := b.handENI(t, tags("i-00000000000000002"), "10.30.1.50")
	held, err := b.cloud(t).Leaks(ctx(t), leaks.Scope{ClusterID: "uid-1"})
	if err != nil {
		t.Fatal(err)
	}
	if id, ok := held.Instance("aws:///us-east-1a/i-00000000000000001"); !ok || id != "i-00000000000000001" {
		t.Errorf("instance of a providerID: %q %v", id, ok)
	}
	if _, ok := held.Instance("openstack:///vm-1"); ok {
		t.Error("an openstack providerID read as an instance")
	}
	node := true
	cluster := func(context.Context) (*leaks.Cluster, error) {
		c := leaks.NewCluster()
		if node {
			c.AddNode("n1", nil)
			c.Instances["i-00000000000000001"] = "n1"
		}
		return c, nil
	}
	clk := &clock{now: time.Now()}
	col := &leaks.Collector{Cloud: held, Cluster: cluster, Grace: time.Minute, Period: time.Minute, Log: slog.New(slog.DiscardHandler), Now: clk.Now}
	fs, err := col.Pass(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	expectVerdicts(t, "first pass", fs, map[string]string{mine: "held", theirs: "unclaimed"})
	out, err := b.c.DescribeNetworkInterfaces(ctx(t), &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{mine}})
	if err != nil || len(out.NetworkInterfaces) != 1 {
		t.Fatal(err)
	}
	if got := ec2test.Tag(out.NetworkInterfaces[0], "vpcni.io/cluster-id"); got != "uid-1" {
		t.Errorf("the held ENI's claim tag is %q, want uid-1", got)
	}

	node = false
	col.Pass(ctx(t))
	clk.now = clk.now.Add(2 * time.Minute)
	fs, err = col.Pass(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	expectVerdicts(t, "its node gone, after the grace", fs, map[string]string{mine: "released", theirs: "unclaimed"})
	if b.exists(mine) || !b.exists(theirs) {
		t.Errorf("claimed orphan exists %v (want false); unclaimed exists %v (want true)", b.exists(mine), b.exists(theirs))
	}

	// The collector's cloud needs the cluster's ID for its claims.
	noID, err := b.cloud(t).Leaks(ctx(t), leaks.Scope{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := noID.Holdings(ctx(t)); err == nil || !strings.Contains(err.Error(), "cluster's ID") {
		t.Errorf("holdings without a cluster ID: %v", err)
	}
}

// A role without DeleteNetworkInterface: the release fails naming the
// action to add, the ENI stays and is tried again next pass.
func TestCollectorDenied(t *testing.T) {
	b := newBed(t, "  clusterName: "+clusterName+"\n")
	id := b.handENI(t, map[string]string{"vpcni.io/owner": "vpcni", "vpcni.io/instance-id": "i-00000000000000003", "vpcni.io/cluster": clusterName}, "10.30.1.60")
	held, err := b.cloud(t).Leaks(ctx(t), leaks.Scope{ClusterID: "uid-1"})
	if err != nil {
		t.Fatal(err)
	}
	clk := &clock{now: time.Now()}
	col := &leaks.Collector{Cloud: held, Cluster: func(context.Context) (*leaks.Cluster, error) { return leaks.NewCluster(), nil },
		Grace: time.Minute, Period: time.Minute, Log: slog.New(slog.DiscardHandler), Now: clk.Now}
	col.Pass(ctx(t))
	clk.now = clk.now.Add(2 * time.Minute)
	b.s.Deny("DeleteNetworkInterface")
	fs, err := col.Pass(ctx(t))
	if err != nil || len(fs) != 1 {
		t.Fatalf("%+v %v", fs, err)
	}
	if f := fs[0]; f.Released || !strings.Contains(f.Error, "may not call ec2:DeleteNetworkInterface") || !b.exists(id) {
		t.Errorf("a denied release: %+v, ENI exists %v", f, b.exists(id))
	}
	b.s.Allow("DeleteNetworkInterface")
	if fs, _ := col.Pass(ctx(t)); len(fs) != 1 || !fs[0].Released || b.exists(id) {
		t.Errorf("the release allowed again: %+v, ENI exists %v", fs, b.exists(id))
	}
}
