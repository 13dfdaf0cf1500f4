package aws

import (
	"context"
	"testing"
	"time"
)

// The node's providers (its own pods' and each PodNetwork's) draw from one
// bucket per action: a token one takes, the other waits for. Their counts
// stay their own.
func TestMeterSharedPerInstance(t *testing.T) {
	node, network, other := newMeter(1, 1), newMeter(1, 1), newMeter(1, 1)
	node.shareWith("i-0meter00000000001")
	network.shareWith("i-0meter00000000001")
	other.shareWith("i-0meter00000000002")
	ctx := context.Background()
	if err := node.wait(ctx, "AssignPrivateIpAddresses"); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if err := network.wait(short, "AssignPrivateIpAddresses"); err == nil {
		t.Error("the PodNetwork's provider took a token the node's provider had just used: the bucket is not shared")
	}
	if err := network.wait(short, "DescribeSubnets"); err != nil {
		t.Errorf("another action's bucket: %v", err)
	}
	if err := other.wait(short, "AssignPrivateIpAddresses"); err != nil {
		t.Errorf("another instance's bucket: %v", err)
	}
	if n, m := node.snapshot()["AssignPrivateIpAddresses"], network.snapshot()["AssignPrivateIpAddresses"]; n != 1 || m != 0 {
		t.Errorf("counts %d and %d, want 1 and 0 (each provider's own)", n, m)
	}
}
