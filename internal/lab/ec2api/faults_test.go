package ec2api

import (
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// TestThrottling: with throttling on, a small bucket runs dry into a 503
// RequestLimitExceeded and refills with time; buckets are per action; off
// is unlimited.
func TestThrottling(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	assign := func() error {
		_, err := l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &l.inst.ENIID, SecondaryPrivateIpAddressCount: aws.Int32(1)})
		if err == nil {
			_, err = l.c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: &l.inst.ENIID,
				PrivateIpAddresses: ips(l.eni(t, l.inst.ENIID))[1:]})
		}
		return err
	}
	l.s.SetBucket("AssignPrivateIpAddresses", 3, 10)
	for range 10 {
		if err := assign(); err != nil {
			t.Fatalf("throttling is off, yet: %v", err)
		}
	}
	l.s.Throttle(true)
	for i := range 3 {
		if err := assign(); err != nil {
			t.Fatalf("call %d of a bucket of 3: %v", i+1, err)
		}
	}
	err := assign()
	wantCode(t, "the 4th call", err, "RequestLimitExceeded", 503)
	if status(err) != 503 {
		t.Fatalf("HTTP %d, want 503", status(err))
	}
	must[*ec2.DescribeSubnetsOutput](t, "another action's bucket")(l.c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{}))
	time.Sleep(150 * time.Millisecond) // 10/s refills one token in 100 ms
	if err := assign(); err != nil {
		t.Fatalf("after the refill: %v", err)
	}
	l.s.Throttle(false)
	if err := assign(); err != nil {
		t.Fatalf("throttling off again: %v", err)
	}
}

// TestThrottleBuckets: EC2's table — an unfiltered, unpaginated
// DescribeNetworkInterfaces takes the bucket of 50, a filtered one that of
// 100.
func TestThrottleBuckets(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	l.s.faults.mu.Lock()
	l.s.faults.now = func() time.Time { return time.Unix(1e9, 0) } // no refill during the test
	l.s.faults.mu.Unlock()
	l.s.Throttle(true)
	unfiltered := func() error {
		_, err := l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{})
		return err
	}
	filtered := func() error {
		_, err := l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{Filters: []types.Filter{{Name: aws.String("vpc-id"), Values: []string{l.vpc}}}})
		return err
	}
	for i := range 50 {
		if err := unfiltered(); err != nil {
			t.Fatalf("unfiltered call %d: %v", i+1, err)
		}
	}
	wantCode(t, "unfiltered call 51", unfiltered(), "RequestLimitExceeded", 503)
	for i := range 100 {
		if err := filtered(); err != nil {
			t.Fatalf("filtered call %d: %v", i+1, err)
		}
	}
	wantCode(t, "filtered call 101", filtered(), "RequestLimitExceeded", 503)
	if got := l.s.Calls()["DescribeNetworkInterfaces"]; got != 152 {
		t.Fatalf("counted %d calls, want 152 (throttled ones too)", got)
	}
}

// TestDeny: a denied action answers 403 UnauthorizedOperation naming the
// IAM action; Allow lifts it; DryRun of a denied action is denied too.
func TestDeny(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	l.s.Deny("AssignPrivateIpAddresses", "CreateNetworkInterface")
	_, err := l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &l.inst.ENIID, SecondaryPrivateIpAddressCount: aws.Int32(1)})
	wantCode(t, "denied assign", err, "UnauthorizedOperation", 403)
	if status(err) != 403 || !strings.Contains(err.Error(), "ec2:AssignPrivateIpAddresses") {
		t.Fatalf("denial does not name the action: %v", err)
	}
	_, err = l.c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.sub, DryRun: aws.Bool(true)})
	wantCode(t, "denied DryRun", err, "UnauthorizedOperation", 403)
	must[*ec2.DescribeNetworkInterfacesOutput](t, "an allowed action")(l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{}))
	if e := l.eni(t, l.inst.ENIID); len(e.PrivateIpAddresses) != 1 {
		t.Fatalf("a denied assign changed the ENI: %v", ips(e))
	}
	l.s.Allow("AssignPrivateIpAddresses")
	must[*ec2.AssignPrivateIpAddressesOutput](t, "allowed again")(l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &l.inst.ENIID, SecondaryPrivateIpAddressCount: aws.Int32(1)}))
	if c := l.s.Calls(); c["AssignPrivateIpAddresses"] != 2 || c["CreateNetworkInterface"] != 1 {
		t.Fatalf("calls: %v", c)
	}
}

// TestLoseReplies: a call whose reply is lost still takes effect; the
// client sees a transport error, and the next call is answered.
func TestLoseReplies(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	l.s.LoseReplies(1, "AssignPrivateIpAddresses")
	_, err := l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &l.inst.ENIID, SecondaryPrivateIpAddressCount: aws.Int32(2)})
	if err == nil || code(err) != "" {
		t.Fatalf("lost reply: %v, want a transport error", err)
	}
	if e := l.eni(t, l.inst.ENIID); len(e.PrivateIpAddresses) != 3 {
		t.Fatalf("the call whose reply was lost did not take effect: %v", ips(e))
	}
	must[*ec2.AssignPrivateIpAddressesOutput](t, "next call")(l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &l.inst.ENIID, SecondaryPrivateIpAddressCount: aws.Int32(1)}))
}
