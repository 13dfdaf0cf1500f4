package ctl

import (
	"context"
	"fmt"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/lab/ec2api"
)

// trace --cloud-config on EC2: each of a pod's addresses gets what EC2
// says holds it — ok on the node's own ENI, wrong on another instance's,
// missing when nothing holds it — and a pod whose addresses come from
// another provider gets none of these.
func TestTraceCloudEC2(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDTRACE")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_CONFIG_FILE", os.DevNull)
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", os.DevNull)
	s := ec2api.New(ec2api.Options{})
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(func() { srv.Close(); s.Close() })
	vpc := s.AddVPC(netip.MustParsePrefix("10.40.0.0/16"))
	sn, err := s.AddSubnet(vpc, netip.MustParsePrefix("10.40.1.0/24"), "")
	if err != nil {
		t.Fatal(err)
	}
	run := func(ip string) ec2api.InstanceInfo {
		in, err := s.RunInstance(ec2api.RunOptions{Type: "m5.large", SubnetID: sn, IP: netip.MustParseAddr(ip)})
		if err != nil {
			t.Fatal(err)
		}
		return in
	}
	node, other := run("10.40.1.10"), run("10.40.1.20")
	// The secondary addresses each instance's agent took.
	cfg := filepath.Join(t.TempDir(), "cloud.yaml")
	if err := os.WriteFile(cfg, fmt.Appendf(nil, "aws:\n  region: us-east-1\n  endpoint: %s\n", srv.URL), 0o600); err != nil {
		t.Fatal(err)
	}
	assign := func(eni, ip string) {
		t.Helper()
		body := fmt.Sprintf("Action=AssignPrivateIpAddresses&Version=2016-11-15&NetworkInterfaceId=%s&PrivateIpAddress.1=%s", eni, ip)
		resp, err := srv.Client().Post(srv.URL, "application/x-www-form-urlencoded", strings.NewReader(body))
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("assign %s to %s: %v %v", ip, eni, resp, err)
		}
		resp.Body.Close()
	}
	assign(node.ENIID, "10.40.1.50")
	assign(other.ENIID, "10.40.1.60")

	tr := api.Trace{Pod: "default/web", NodeIP: "10.40.1.10", Provider: "aws", Attachments: []api.TraceAttachment{
		{IfName: "eth0", Address: "10.40.1.50"}, {IfName: "net1", Address: "10.40.1.60"}, {IfName: "net2", Address: "10.40.1.70"}}}
	if err := traceCloud(context.Background(), cfg, &tr); err != nil {
		t.Fatal(err)
	}
	for i, want := range []struct{ state, what, says string }{
		{api.HopOK, "aws: 10.40.1.50 is a secondary address of ENI " + node.ENIID + " (device 0) of instance " + node.ID, ""},
		{api.HopWrong, "aws: 10.40.1.60 is a secondary address of ENI " + other.ENIID + " (device 0) of instance " + other.ID, "held by " + other.ID + ", not by this node's " + node.ID},
		{api.HopMissing, "aws: what holds 10.40.1.70", "lists no port or ENI holding 10.40.1.70"},
	} {
		hops := tr.Attachments[i].Hops
		if len(hops) != 1 || hops[0].Where != api.HopCloud || hops[0].State != want.state || hops[0].What != want.what ||
			!strings.Contains(hops[0].Detail, want.says) || (want.state != api.HopOK) == (hops[0].Fix == "") {
			t.Errorf("%s: hops %+v, want one %s %q saying %q", tr.Attachments[i].Address, hops, want.state, want.what, want.says)
		}
	}

	static := api.Trace{Pod: "default/web", NodeIP: "10.40.1.10", Provider: "static", Attachments: []api.TraceAttachment{{Address: "10.40.1.70"}}}
	if err := traceCloud(context.Background(), cfg, &static); err != nil || len(static.Attachments[0].Hops) != 0 {
		t.Errorf("a static pod's trace with an aws cloud file: %+v %v", static.Attachments[0].Hops, err)
	}
}
