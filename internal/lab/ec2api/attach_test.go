package ec2api

import (
	"errors"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// TestAttachRules: EC2's attachment checks that moto skips — device index
// taken, ENI in use, other AZ, card out of range, the per-card and
// per-type ENI limits, the primary's detach, an in-use ENI's delete.
func TestAttachRules(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	a := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId
	b := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId
	c := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId
	other := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.bz}).NetworkInterfaceId
	attach := func(eni string, dev, card int32) error {
		_, err := l.c.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: &eni, InstanceId: &l.inst.ID, DeviceIndex: &dev, NetworkCardIndex: &card})
		return err
	}
	wantCode(t, "device index 0 taken by the primary", attach(a, 0, 0), "InvalidParameterValue", 400)
	wantCode(t, "card 1 on a one-card t3.medium", attach(a, 1, 1), "InvalidParameterValue", 400)
	wantCode(t, "ENI in another AZ", attach(other, 1, 0), "InvalidParameterValue", 400)
	if err := attach(a, 1, 0); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "the same device index again", attach(b, 1, 0), "InvalidParameterValue", 400)
	wantCode(t, "an ENI in use", attach(a, 2, 0), "InvalidNetworkInterface.InUse", 400)
	if err := attach(b, 2, 0); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "a 4th ENI on a t3.medium", attach(c, 3, 0), "AttachmentLimitExceeded", 400)
	_, err := l.c.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: &a})
	wantCode(t, "delete an in-use ENI", err, "InvalidNetworkInterface.InUse", 400)
	primary := l.eni(t, l.inst.ENIID)
	_, err = l.c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: primary.Attachment.AttachmentId, Force: aws.Bool(true)})
	wantCode(t, "detach the primary (device 0)", err, "OperationNotPermitted", 400)
	if *primary.Attachment.DeleteOnTermination != true || *primary.Attachment.DeviceIndex != 0 {
		t.Fatalf("primary attachment: %+v", primary.Attachment)
	}

	// p5.48xlarge: 32 cards of 2 ENIs each. The primary holds card 0's
	// device 0; card 0 takes one more, card 5 two.
	p5, err := l.s.RunInstance(RunOptions{Type: "p5.48xlarge", SubnetID: l.sub})
	if err != nil {
		t.Fatal(err)
	}
	var extra []string
	for range 5 {
		extra = append(extra, *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId)
	}
	attachTo := func(eni string, dev, card int32) error {
		out, err := l.c.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: &eni, InstanceId: &p5.ID, DeviceIndex: &dev, NetworkCardIndex: &card})
		if err == nil && *out.NetworkCardIndex != card {
			t.Fatalf("attached on card %d, asked %d", *out.NetworkCardIndex, card)
		}
		return err
	}
	if err := attachTo(extra[0], 1, 0); err != nil {
		t.Fatal(err)
	}
	wantCode(t, "a third ENI on p5 card 0", attachTo(extra[1], 2, 0), "AttachmentLimitExceeded", 400)
	for i, e := range extra[2:4] {
		if err := attachTo(e, int32(i), 5); err != nil {
			t.Fatalf("card 5 device %d: %v", i, err)
		}
	}
	wantCode(t, "card 32 of 32", attachTo(extra[4], 0, 32), "InvalidParameterValue", 400)
	if got := *l.eni(t, extra[3]).Attachment.NetworkCardIndex; got != 5 {
		t.Fatalf("NetworkCardIndex %d, want 5", got)
	}
	// Device 0 of a card other than the default one is not the primary.
	must[*ec2.DetachNetworkInterfaceOutput](t, "detach card 5 device 0")(l.c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: l.eni(t, extra[2]).Attachment.AttachmentId}))
}

// TestTerminate: terminating deletes the ENIs marked DeleteOnTermination
// (the primary among them) and leaves the others available (moto leaves
// them all attached).
func TestTerminate(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	keep := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId
	drop := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{SecondaryPrivateIpAddressCount: aws.Int32(3)}).NetworkInterfaceId
	l.attach(t, keep, l.inst.ID, 1)
	att := l.attach(t, drop, l.inst.ID, 2)
	must[*ec2.ModifyNetworkInterfaceAttributeOutput](t, "DoT")(l.c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{
		NetworkInterfaceId: &drop, Attachment: &types.NetworkInterfaceAttachmentChanges{AttachmentId: &att, DeleteOnTermination: aws.Bool(true)}}))
	_, err := l.c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{
		NetworkInterfaceId: &keep, Attachment: &types.NetworkInterfaceAttachmentChanges{AttachmentId: &att, DeleteOnTermination: aws.Bool(true)}})
	wantCode(t, "DoT with another ENI's attachment", err, "InvalidAttachmentID.NotFound", 400)
	before := l.available(t, l.sub)
	out := must[*ec2.TerminateInstancesOutput](t, "terminate")(l.c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{l.inst.ID}}))
	if len(out.TerminatingInstances) != 1 || out.TerminatingInstances[0].CurrentState.Name != types.InstanceStateNameTerminated {
		t.Fatalf("terminate answered %+v", out.TerminatingInstances)
	}
	for _, gone := range []string{drop, l.inst.ENIID} {
		_, err := l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{gone}})
		wantCode(t, "a DeleteOnTermination ENI after terminate", err, "InvalidNetworkInterfaceID.NotFound", 400)
	}
	if e := l.eni(t, keep); e.Status != types.NetworkInterfaceStatusAvailable || e.Attachment != nil {
		t.Fatalf("kept ENI: %s %+v", e.Status, e.Attachment)
	}
	if n := l.available(t, l.sub); n != before+5 {
		t.Fatalf("available %d → %d, want +5 (primary, and drop's 4)", before, n)
	}
	di := must[*ec2.DescribeInstancesOutput](t, "describe")(l.c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{l.inst.ID}}))
	if in := di.Reservations[0].Instances[0]; in.State.Name != types.InstanceStateNameTerminated || len(in.NetworkInterfaces) != 0 {
		t.Fatalf("terminated instance: %+v", in)
	}
	if _, err := l.s.Instance(ctx, l.inst.ID); err == nil {
		t.Fatal("IMDS source still serves a terminated instance")
	}
}

// TestDescribeInstances: the instance's view of its ENIs, as
// DescribeInstances decodes it.
func TestDescribeInstances(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	e := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId
	l.attach(t, e, l.inst.ID, 1)
	out := must[*ec2.DescribeInstancesOutput](t, "describe")(l.c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{
		Filters: []types.Filter{{Name: aws.String("instance-id"), Values: []string{l.inst.ID}}}}))
	in := out.Reservations[0].Instances[0]
	if *in.InstanceId != l.inst.ID || in.InstanceType != "t3.medium" || *in.Placement.AvailabilityZone != "us-east-1a" ||
		*in.PrivateIpAddress != l.inst.IP.String() || *in.SubnetId != l.sub || len(in.NetworkInterfaces) != 2 ||
		in.State.Name != types.InstanceStateNameRunning {
		t.Fatalf("instance: %+v", in)
	}
	var devs []int32
	for _, ni := range in.NetworkInterfaces {
		devs = append(devs, *ni.Attachment.DeviceIndex)
		if ni.Attachment.Status != types.AttachmentStatusAttached || *ni.MacAddress == "" || len(ni.PrivateIpAddresses) != 1 {
			t.Fatalf("instance ENI: %+v", ni)
		}
	}
	if !slices.Equal(devs, []int32{0, 1}) {
		t.Fatalf("device indexes %v", devs)
	}
}

// TestHooks: OnAttach sees the ENI attaching before it is in use, and its
// error fails the attach; OnDetach runs on detach; OnChange follows every
// change of addresses, attachments or source/destination check (not of
// tags), one hook at a time, in order.
func TestHooks(t *testing.T) {
	t.Parallel()
	s := New(Options{})
	var mu sync.Mutex
	var log []string
	busy := false
	enter := func(what string) {
		mu.Lock()
		defer mu.Unlock()
		if busy {
			t.Errorf("%s while another hook runs", what)
		}
		busy = true
		log = append(log, what)
	}
	leave := func() { mu.Lock(); busy = false; mu.Unlock() }
	fail := errors.New("no such link")
	s.OnAttach = func(inst string, e ENI) error {
		enter("attach " + e.ID + " " + e.Status)
		defer leave()
		if e.InstanceID != inst || e.MAC == "" || e.DeviceIndex == 0 {
			t.Errorf("OnAttach got %+v for %s", e, inst)
		}
		if e.Tags["fail"] == "yes" {
			return fail
		}
		return nil
	}
	s.OnDetach = func(inst string, e ENI) { enter("detach " + e.ID + " " + e.Status); leave() }
	var last []ENI
	s.OnChange = func(enis []ENI) { enter("change"); last = enis; leave() }
	l := world(t, start(t, s))
	mu.Lock()
	log = nil
	mu.Unlock()

	id := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId
	att := l.attach(t, id, l.inst.ID, 1)
	must[*ec2.CreateTagsOutput](t, "tag")(l.c.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{id}, Tags: []types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}}))
	must[*ec2.AssignPrivateIpAddressesOutput](t, "assign")(l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &id, SecondaryPrivateIpAddressCount: aws.Int32(2)}))
	must[*ec2.ModifyNetworkInterfaceAttributeOutput](t, "sdc")(l.c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: &id, SourceDestCheck: &types.AttributeBooleanValue{Value: aws.Bool(false)}}))
	i := slices.IndexFunc(last, func(e ENI) bool { return e.ID == id })
	if i < 0 || len(last[i].PrivateIPs) != 3 || last[i].SourceDestCheck || last[i].Status != "in-use" || last[i].InstanceID != l.inst.ID {
		t.Fatalf("OnChange's last view of %s: %+v", id, last)
	}
	must[*ec2.DetachNetworkInterfaceOutput](t, "detach")(l.c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: &att}))
	bad := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface,
		Tags: []types.Tag{{Key: aws.String("fail"), Value: aws.String("yes")}}}}}).NetworkInterfaceId
	_, err := l.c.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: &bad, InstanceId: &l.inst.ID, DeviceIndex: aws.Int32(1)})
	if err == nil || status(err) != 500 {
		t.Fatalf("attach with a failing hot-plug: %v", err)
	}
	if e := l.eni(t, bad); e.Status != types.NetworkInterfaceStatusAvailable || e.Attachment != nil {
		t.Fatalf("after a failed hot-plug: %s %+v", e.Status, e.Attachment)
	}
	want := []string{"change", // create
		"attach " + id + " attaching", "change", // attach; the tag changes nothing
		"change",                                // assign
		"change",                                // source/dest check
		"change",                                // detaching
		"detach " + id + " detaching", "change", // detached
		"change",                                 // create bad
		"attach " + bad + " attaching", "change"} // failed: available again
	mu.Lock()
	defer mu.Unlock()
	if !slices.Equal(log, want) {
		t.Fatalf("hooks ran:\n%q\nwant:\n%q", log, want)
	}
}

// TestAsyncAttach: with delays, attach and detach answer at once and the
// ENI shows attaching/detaching until the delay has passed; IMDS lists it
// only once attached.
func TestAsyncAttach(t *testing.T) {
	t.Parallel()
	l := world(t, start(t, New(Options{AttachDelay: 300 * time.Millisecond, DetachDelay: 300 * time.Millisecond})))
	id := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{}).NetworkInterfaceId
	att := l.attach(t, id, l.inst.ID, 1)
	if e := l.eni(t, id); e.Status != types.NetworkInterfaceStatusAttaching || e.Attachment.Status != types.AttachmentStatusAttaching {
		t.Fatalf("right after attach: %s / %s", e.Status, e.Attachment.Status)
	}
	if in, _ := l.s.Instance(ctx, l.inst.ID); len(in.Interfaces) != 1 {
		t.Fatalf("IMDS lists %d interfaces while the second is attaching", len(in.Interfaces))
	}
	waitStatus(t, l, id, types.NetworkInterfaceStatusInUse)
	if in, _ := l.s.Instance(ctx, l.inst.ID); len(in.Interfaces) != 2 {
		t.Fatalf("IMDS lists %d interfaces once attached", len(in.Interfaces))
	}
	must[*ec2.DetachNetworkInterfaceOutput](t, "detach")(l.c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: &att}))
	if e := l.eni(t, id); e.Status != types.NetworkInterfaceStatusDetaching || e.Attachment.Status != types.AttachmentStatusDetaching {
		t.Fatalf("right after detach: %s", e.Status)
	}
	if in, _ := l.s.Instance(ctx, l.inst.ID); len(in.Interfaces) != 2 {
		t.Fatalf("IMDS lists %d interfaces while the second is detaching (its link is still there)", len(in.Interfaces))
	}
	_, err := l.c.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: &id})
	wantCode(t, "delete while detaching", err, "InvalidNetworkInterface.InUse", 400)
	must[*ec2.DetachNetworkInterfaceOutput](t, "detach again while detaching")(l.c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: &att}))
	waitStatus(t, l, id, types.NetworkInterfaceStatusAvailable)
	if in, _ := l.s.Instance(ctx, l.inst.ID); len(in.Interfaces) != 1 {
		t.Fatalf("IMDS lists %d interfaces once detached", len(in.Interfaces))
	}
}

func waitStatus(t *testing.T, l *lab, id string, want types.NetworkInterfaceStatus) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for l.eni(t, id).Status != want {
		if time.Now().After(deadline) {
			t.Fatalf("%s: still %s, want %s", id, l.eni(t, id).Status, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestIMDSSource: Instance tells IMDS what EC2 has: the ENIs by device,
// each with its MAC, subnet, VPC CIDR and addresses (primary first), the
// prefixes, and the role's credentials.
func TestIMDSSource(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	in, err := l.s.RunInstance(RunOptions{Type: "m5.large", SubnetID: l.sub, IP: netip.MustParseAddr("10.0.1.50"), Role: "node-role"})
	if err != nil {
		t.Fatal(err)
	}
	id := *l.createENI(t, &ec2.CreateNetworkInterfaceInput{SecondaryPrivateIpAddressCount: aws.Int32(1), Ipv4PrefixCount: aws.Int32(1)}).NetworkInterfaceId
	l.attach(t, id, in.ID, 1)
	got, err := l.s.Instance(ctx, in.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != in.ID || got.Type != "m5.large" || got.Region != "us-east-1" || got.AZ != "us-east-1a" ||
		got.LocalIPv4 != netip.MustParseAddr("10.0.1.50") || got.Role != "node-role" || got.Credentials.AccessKeyID == "" ||
		time.Until(got.Credentials.Expiration) < time.Hour || len(got.Interfaces) != 2 {
		t.Fatalf("instance: %+v", got)
	}
	p, s := got.Interfaces[0], got.Interfaces[1]
	e := l.eni(t, id)
	if p.DeviceNumber != 0 || p.MAC != in.MAC || p.ID != in.ENIID || s.DeviceNumber != 1 || s.ID != id || s.MAC != *e.MacAddress ||
		s.SubnetCIDR.String() != "10.0.1.0/24" || len(s.VPCCIDRs) != 1 || s.VPCCIDRs[0].String() != "10.0.0.0/16" ||
		len(s.LocalIPv4s) != 2 || s.LocalIPv4s[0].String() != *e.PrivateIpAddress || len(s.IPv4Prefixes) != 1 ||
		s.IPv4Prefixes[0].String() != *e.Ipv4Prefixes[0].Ipv4Prefix || len(s.SecurityGroups) != 1 {
		t.Fatalf("interfaces: %+v", got.Interfaces)
	}
	// The role's keys are accepted (as any key is) and counted.
	role := sdk(l.url, got.Credentials.AccessKeyID)
	must[*ec2.DescribeInstancesOutput](t, "with the role's key")(role.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{in.ID}}))
	if n := l.s.CallsBy(got.Credentials.AccessKeyID); n != 1 {
		t.Fatalf("calls by the role's key: %d", n)
	}
	if _, err := l.s.Instance(ctx, "i-0123456789abcdef0"); err == nil {
		t.Fatal("an unknown instance is not an error")
	}
	if _, err := l.s.RunInstance(RunOptions{Type: "m5.large", SubnetID: l.sub, IP: netip.MustParseAddr("10.0.1.50")}); err == nil {
		t.Fatal("RunInstance on an address in use")
	}
}
