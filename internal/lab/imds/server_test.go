package imds

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials/ec2rolecreds"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"

	"github.com/vpcni/vpcni/internal/testbed/mototest"
)

var motoURL string

func TestMain(m *testing.M) { os.Exit(mototest.Main(m, "lab-imds", &motoURL)) }

func ctx(t *testing.T) context.Context { return mototest.Ctx(t) }

// memory is a Source held in memory that a test changes as EC2 would.
type memory struct {
	mu   sync.Mutex
	inst Instance
}

func (m *memory) Instance(_ context.Context, id string) (Instance, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if id != m.inst.ID {
		return Instance{}, errors.New("no such instance")
	}
	return m.inst, nil
}

func (m *memory) set(f func(*Instance)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f(&m.inst)
}

func sample() Instance {
	return Instance{
		ID: "i-0123456789abcdef0", Type: "m5.large", Region: "eu-west-1", AZ: "eu-west-1b", AccountID: "123456789012",
		LocalIPv4: netip.MustParseAddr("10.0.1.10"),
		Interfaces: []Interface{{
			MAC: "02:00:00:00:00:01", ID: "eni-0000000000000001", SubnetID: "subnet-1", VPCID: "vpc-1",
			SubnetCIDR: netip.MustParsePrefix("10.0.1.0/24"), VPCCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16"), netip.MustParsePrefix("100.64.0.0/16")},
			SecurityGroups: []string{"sg-1", "sg-2"},
			LocalIPv4s:     []netip.Addr{netip.MustParseAddr("10.0.1.10"), netip.MustParseAddr("10.0.1.20")},
		}, {
			MAC: "02:00:00:00:00:02", ID: "eni-0000000000000002", DeviceNumber: 1, SubnetID: "subnet-1", VPCID: "vpc-1",
			SubnetCIDR: netip.MustParsePrefix("10.0.1.0/24"), VPCCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/16")},
			LocalIPv4s:   []netip.Addr{netip.MustParseAddr("10.0.1.30")},
			IPv4Prefixes: []netip.Prefix{netip.MustParsePrefix("10.0.1.64/28")},
		}},
		Role:        "node-role",
		Credentials: Credentials{AccessKeyID: "AKIDEXAMPLE", SecretAccessKey: "secret", Token: "session", Expiration: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)},
	}
}

// client is the SDK's IMDS client as the provider builds it: IMDSv2 only.
func client(url string) *imds.Client {
	return imds.New(imds.Options{Endpoint: url, EnableFallback: aws.FalseTernary})
}

func get(t *testing.T, c *imds.Client, path string) (string, error) {
	t.Helper()
	out, err := c.GetMetadata(ctx(t), &imds.GetMetadataInput{Path: path})
	if err != nil {
		return "", err
	}
	defer out.Content.Close()
	b, err := io.ReadAll(out.Content)
	return string(b), err
}

// The SDK's IMDSv2 client (no v1 fallback) reads every path aws-vpc-cni
// reads, with the values the source holds; the region comes from the
// identity document.
func TestSDKReadsEveryPath(t *testing.T) {
	src := &memory{inst: sample()}
	srv := httptest.NewServer(New(src, src.inst.ID, Options{}))
	defer srv.Close()
	c := client(srv.URL)
	want := map[string]string{
		"mac":                         "02:00:00:00:00:01",
		"instance-id":                 "i-0123456789abcdef0",
		"instance-type":               "m5.large",
		"local-ipv4":                  "10.0.1.10",
		"placement/availability-zone": "eu-west-1b",
		"placement/region":            "eu-west-1",
		"network/interfaces/macs/":    "02:00:00:00:00:01/\n02:00:00:00:00:02/",
		"network/interfaces/macs":     "02:00:00:00:00:01/\n02:00:00:00:00:02/",
		"network/interfaces/macs/02:00:00:00:00:01/device-number":          "0",
		"network/interfaces/macs/02:00:00:00:00:01/interface-id":           "eni-0000000000000001",
		"network/interfaces/macs/02:00:00:00:00:01/network-card":           "0",
		"network/interfaces/macs/02:00:00:00:00:01/subnet-id":              "subnet-1",
		"network/interfaces/macs/02:00:00:00:00:01/vpc-id":                 "vpc-1",
		"network/interfaces/macs/02:00:00:00:00:01/security-group-ids":     "sg-1\nsg-2",
		"network/interfaces/macs/02:00:00:00:00:01/local-ipv4s":            "10.0.1.10\n10.0.1.20",
		"network/interfaces/macs/02:00:00:00:00:01/subnet-ipv4-cidr-block": "10.0.1.0/24",
		"network/interfaces/macs/02:00:00:00:00:01/vpc-ipv4-cidr-blocks":   "10.0.0.0/16\n100.64.0.0/16",
		"network/interfaces/macs/02:00:00:00:00:02/device-number":          "1",
		"network/interfaces/macs/02:00:00:00:00:02/ipv4-prefix":            "10.0.1.64/28",
		"iam/security-credentials/":                                        "node-role",
	}
	for path, v := range want {
		got, err := get(t, c, path)
		if err != nil || got != v {
			t.Errorf("GET %s = %q, %v; want %q", path, got, err, v)
		}
	}
	fields, err := get(t, c, "network/interfaces/macs/02:00:00:00:00:01/")
	for _, f := range []string{"device-number", "interface-id", "local-ipv4s", "network-card", "security-group-ids", "subnet-id", "vpc-ipv4-cidr-blocks"} {
		if err != nil || !strings.Contains("\n"+fields+"\n", "\n"+f+"\n") {
			t.Errorf("field listing %q, %v: no %s", fields, err, f)
		}
	}
	region, err := c.GetRegion(ctx(t), &imds.GetRegionInput{})
	if err != nil || region.Region != "eu-west-1" {
		t.Errorf("GetRegion = %+v, %v", region, err)
	}
	doc, err := c.GetInstanceIdentityDocument(ctx(t), &imds.GetInstanceIdentityDocumentInput{})
	if err != nil || doc.InstanceID != "i-0123456789abcdef0" || doc.AccountID != "123456789012" || doc.PrivateIP != "10.0.1.10" || doc.AvailabilityZone != "eu-west-1b" || doc.InstanceType != "m5.large" {
		t.Errorf("identity document = %+v, %v", doc, err)
	}
}

// A path that does not exist, and ipv4-prefix on an ENI without prefixes,
// are 404s the SDK reports as such (aws-vpc-cni reads the latter as "no
// prefixes").
func TestUnknownPathsAre404(t *testing.T) {
	src := &memory{inst: sample()}
	srv := httptest.NewServer(New(src, src.inst.ID, Options{}))
	defer srv.Close()
	c := client(srv.URL)
	for _, p := range []string{"network/interfaces/macs/02:00:00:00:00:01/ipv4-prefix", "no-such-thing", "network/interfaces/macs/02:00:00:00:00:99/device-number"} {
		_, err := get(t, c, p)
		var re interface{ HTTPStatusCode() int }
		if !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusNotFound {
			t.Errorf("GET %s: %v, want a 404", p, err)
		}
	}
}

// The SDK's instance-role provider takes the node's keys from IMDS.
func TestRoleCredentials(t *testing.T) {
	src := &memory{inst: sample()}
	srv := httptest.NewServer(New(src, src.inst.ID, Options{}))
	defer srv.Close()
	p := ec2rolecreds.New(func(o *ec2rolecreds.Options) { o.Client = client(srv.URL) })
	creds, err := p.Retrieve(ctx(t))
	if err != nil || creds.AccessKeyID != "AKIDEXAMPLE" || creds.SecretAccessKey != "secret" || creds.SessionToken != "session" || !creds.CanExpire {
		t.Fatalf("role credentials = %+v, %v", creds, err)
	}
}

func do(t *testing.T, method, url string, hdr map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx(t), method, url, nil)
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp, string(b)
}

// IMDSv2 only: the token PUT needs a TTL of 1..21600 s and answers with
// that TTL in the response header; a GET needs an unexpired token.
func TestTokenRules(t *testing.T) {
	src := &memory{inst: sample()}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var clock sync.Mutex
	srv := httptest.NewServer(New(src, src.inst.ID, Options{Now: func() time.Time { clock.Lock(); defer clock.Unlock(); return now }}))
	defer srv.Close()
	for _, ttl := range []string{"", "0", "21601", "x"} {
		if resp, _ := do(t, "PUT", srv.URL+TokenPath, map[string]string{TTLHeader: ttl}); resp.StatusCode != http.StatusBadRequest {
			t.Errorf("token with TTL %q: %s, want 400", ttl, resp.Status)
		}
	}
	if resp, _ := do(t, "GET", srv.URL+TokenPath, map[string]string{TTLHeader: "60"}); resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET of the token path: %s, want 405", resp.Status)
	}
	resp, tok := do(t, "PUT", srv.URL+TokenPath, map[string]string{TTLHeader: "60"})
	if resp.StatusCode != http.StatusOK || resp.Header.Get(TTLHeader) != "60" || tok == "" {
		t.Fatalf("token: %s, TTL header %q, token %q", resp.Status, resp.Header.Get(TTLHeader), tok)
	}
	url := srv.URL + "/latest/meta-data/instance-id"
	if resp, _ := do(t, "GET", url, nil); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET without a token (IMDSv1): %s, want 401", resp.Status)
	}
	if resp, _ := do(t, "GET", url, map[string]string{TokenHeader: "forged"}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET with a forged token: %s, want 401", resp.Status)
	}
	if resp, body := do(t, "GET", url, map[string]string{TokenHeader: tok}); resp.StatusCode != http.StatusOK || body != src.inst.ID {
		t.Errorf("GET with the token: %s %q", resp.Status, body)
	}
	clock.Lock()
	now = now.Add(61 * time.Second)
	clock.Unlock()
	if resp, _ := do(t, "GET", url, map[string]string{TokenHeader: tok}); resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET with an expired token: %s, want 401", resp.Status)
	}
}

// With a lag, a change at the source shows only once it is that old: an
// address EC2 assigned is missing from local-ipv4s meanwhile, as on EC2.
func TestLag(t *testing.T) {
	src := &memory{inst: sample()}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var clock sync.Mutex
	tick := func(d time.Duration) { clock.Lock(); now = now.Add(d); clock.Unlock() }
	s := New(src, src.inst.ID, Options{Lag: 5 * time.Second, Now: func() time.Time { clock.Lock(); defer clock.Unlock(); return now }})
	srv := httptest.NewServer(s)
	defer srv.Close()
	c := client(srv.URL)
	path := "network/interfaces/macs/02:00:00:00:00:01/local-ipv4s"
	if got, err := get(t, c, path); err != nil || got != "10.0.1.10\n10.0.1.20" {
		t.Fatalf("before: %q, %v", got, err)
	}
	tick(time.Second)
	src.set(func(i *Instance) {
		i.Interfaces[0].LocalIPv4s = append(i.Interfaces[0].LocalIPv4s, netip.MustParseAddr("10.0.1.21"))
	})
	for range 4 {
		tick(time.Second)
		if got, err := get(t, c, path); err != nil || got != "10.0.1.10\n10.0.1.20" {
			t.Fatalf("within the lag: %q, %v; want the old list", got, err)
		}
	}
	tick(2 * time.Second)
	if got, err := get(t, c, path); err != nil || got != "10.0.1.10\n10.0.1.20\n10.0.1.21" {
		t.Fatalf("after the lag: %q, %v; want the new address", got, err)
	}
	s.SetLag(0)
	src.set(func(i *Instance) { i.Interfaces[0].LocalIPv4s = i.Interfaces[0].LocalIPv4s[:1] })
	if got, err := get(t, c, path); err != nil || got != "10.0.1.10" {
		t.Fatalf("without lag: %q, %v", got, err)
	}
}

// FromEC2 serves an instance that lives in moto_server: its ENIs with
// their device numbers, addresses, subnets and VPC CIDRs as EC2's API has
// them, read through the SDK.
func TestFromEC2(t *testing.T) {
	ec := (&mototest.Server{URL: motoURL}).Client()
	vpc, err := ec.CreateVpc(ctx(t), &ec2.CreateVpcInput{CidrBlock: aws.String("10.31.0.0/16")})
	if err != nil {
		t.Fatal(err)
	}
	vpcID := aws.ToString(vpc.Vpc.VpcId)
	sn, err := ec.CreateSubnet(ctx(t), &ec2.CreateSubnetInput{VpcId: &vpcID, CidrBlock: aws.String("10.31.1.0/24"), AvailabilityZone: aws.String("us-east-1a")})
	if err != nil {
		t.Fatal(err)
	}
	subnetID := aws.ToString(sn.Subnet.SubnetId)
	img, err := ec.DescribeImages(ctx(t), &ec2.DescribeImagesInput{})
	if err != nil || len(img.Images) == 0 {
		t.Fatalf("images: %v", err)
	}
	run, err := ec.RunInstances(ctx(t), &ec2.RunInstancesInput{ImageId: img.Images[0].ImageId, MinCount: aws.Int32(1), MaxCount: aws.Int32(1),
		InstanceType: types.InstanceTypeM5Large, SubnetId: &subnetID, PrivateIpAddress: aws.String("10.31.1.10")})
	if err != nil {
		t.Fatal(err)
	}
	id := aws.ToString(run.Instances[0].InstanceId)
	eni, err := ec.CreateNetworkInterface(ctx(t), &ec2.CreateNetworkInterfaceInput{SubnetId: &subnetID, PrivateIpAddress: aws.String("10.31.1.30")})
	if err != nil {
		t.Fatal(err)
	}
	eniID := aws.ToString(eni.NetworkInterface.NetworkInterfaceId)
	if _, err := ec.AttachNetworkInterface(ctx(t), &ec2.AttachNetworkInterfaceInput{InstanceId: &id, NetworkInterfaceId: &eniID, DeviceIndex: aws.Int32(1)}); err != nil {
		t.Fatal(err)
	}
	src := FromEC2(ec)
	src.Role, src.Credentials = "node", Credentials{AccessKeyID: "testing", SecretAccessKey: "testing"}
	srv := httptest.NewServer(New(src, id, Options{}))
	defer srv.Close()
	c := client(srv.URL)
	mac, err := get(t, c, "mac")
	if err != nil {
		t.Fatal(err)
	}
	macs, err := get(t, c, "network/interfaces/macs/")
	if err != nil || len(strings.Fields(macs)) != 2 {
		t.Fatalf("macs = %q, %v; want 2", macs, err)
	}
	second := strings.TrimSuffix(strings.Fields(strings.ReplaceAll(macs, mac+"/", ""))[0], "/")
	for path, want := range map[string]string{
		"local-ipv4":    "10.31.1.10",
		"instance-type": "m5.large",
		"network/interfaces/macs/" + mac + "/device-number":          "0",
		"network/interfaces/macs/" + mac + "/local-ipv4s":            "10.31.1.10",
		"network/interfaces/macs/" + mac + "/subnet-id":              subnetID,
		"network/interfaces/macs/" + mac + "/vpc-ipv4-cidr-blocks":   "10.31.0.0/16",
		"network/interfaces/macs/" + mac + "/subnet-ipv4-cidr-block": "10.31.1.0/24",
		"network/interfaces/macs/" + second + "/device-number":       "1",
		"network/interfaces/macs/" + second + "/interface-id":        eniID,
		"network/interfaces/macs/" + second + "/local-ipv4s":         "10.31.1.30",
		"placement/availability-zone":                                "us-east-1a",
		"placement/region":                                           mototest.Region,
		"iam/security-credentials/":                                  "node",
	} {
		if got, err := get(t, c, path); err != nil || got != want {
			t.Errorf("GET %s = %q, %v; want %q", path, got, err, want)
		}
	}
	var doc struct{ InstanceID, Region string }
	if raw, err := c.GetDynamicData(ctx(t), &imds.GetDynamicDataInput{Path: "instance-identity/document"}); err != nil {
		t.Error(err)
	} else if b, _ := io.ReadAll(raw.Content); json.Unmarshal(b, &doc) != nil || doc.InstanceID != id || doc.Region != mototest.Region {
		t.Errorf("identity document %s", b)
	}
}
