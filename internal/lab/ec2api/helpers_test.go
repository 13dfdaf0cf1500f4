package ec2api

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"
)

// lab is a server on loopback with the real SDK client in front of it and
// a small world: a VPC with a /24 and a /28 in us-east-1a, a /24 in
// us-east-1b, and a running t3.medium in the first /24.
type lab struct {
	s                   *Server
	c                   *ec2.Client
	url                 string
	vpc, sub, small, bz string
	inst                InstanceInfo
}

var ctx = context.Background()

// start serves s (its hooks set by the caller beforehand) on a port of its
// own.
func start(t *testing.T, s *Server) *lab {
	t.Helper()
	l, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go hs.Serve(l)
	t.Cleanup(func() { hs.Close(); s.Close() })
	url := "http://" + l.Addr().String()
	return &lab{s: s, url: url, c: sdk(url, "AKIDLABTEST")}
}

// sdk is the real Go SDK client for url, retrying nothing (so a test sees
// every error the server gives).
func sdk(url, key string) *ec2.Client {
	return ec2.NewFromConfig(aws.Config{Region: "us-east-1", RetryMaxAttempts: 1, HTTPClient: bufferedBodyClient(),
		Credentials: credentials.NewStaticCredentialsProvider(key, "secret", "")},
		func(o *ec2.Options) { o.BaseEndpoint = aws.String(url) })
}

// bufferedBodyClient sends each request body from memory. The SDK's own
// body reader answers io.EOF as an error once the SDK has closed it (after
// the answer came); net/http's transport drains the body after copying it
// and, on that error, closes the connection while the answer's body is
// still being read: "use of closed network connection" (aws-sdk-go-v2
// issue 2737; the SDK retries it since PR 2949). A server on loopback
// answers fast enough to hit this about once in a few hundred calls here,
// and these clients do not retry.
func bufferedBodyClient() *http.Client {
	return &http.Client{Transport: bufferedBody{&http.Transport{}}}
}

type bufferedBody struct{ next http.RoundTripper }

func (b bufferedBody) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body == nil || r.Body == http.NoBody {
		return b.next.RoundTrip(r)
	}
	data, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	r = r.Clone(r.Context())
	r.Body = io.NopCloser(bytes.NewReader(data))
	r.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil }
	return b.next.RoundTrip(r)
}

// world seeds the small world into a started server.
func world(t *testing.T, l *lab) *lab {
	t.Helper()
	var err error
	l.vpc = l.s.AddVPC(netip.MustParsePrefix("10.0.0.0/16"))
	if l.sub, err = l.s.AddSubnet(l.vpc, netip.MustParsePrefix("10.0.1.0/24"), "us-east-1a"); err != nil {
		t.Fatal(err)
	}
	if l.small, err = l.s.AddSubnet(l.vpc, netip.MustParsePrefix("10.0.2.0/28"), "us-east-1a"); err != nil {
		t.Fatal(err)
	}
	if l.bz, err = l.s.AddSubnet(l.vpc, netip.MustParsePrefix("10.0.3.0/24"), "us-east-1b"); err != nil {
		t.Fatal(err)
	}
	if l.inst, err = l.s.RunInstance(RunOptions{Type: "t3.medium", SubnetID: l.sub}); err != nil {
		t.Fatal(err)
	}
	return l
}

func newLab(t *testing.T) *lab { return world(t, start(t, New(Options{}))) }

// code is the EC2 error code of err ("" for none).
func code(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

func status(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

// wantCode fails unless err is the EC2 error code with an HTTP status in
// the class given (400, 403, 412, 500…: the hundreds must match).
func wantCode(t *testing.T, what string, err error, want string, httpClass int) {
	t.Helper()
	if code(err) != want || status(err)/100 != httpClass/100 {
		t.Fatalf("%s: got %v (code %q, HTTP %d), want %s with HTTP %dxx", what, err, code(err), status(err), want, httpClass/100)
	}
	if httpClass == 412 && status(err) != 412 {
		t.Fatalf("%s: HTTP %d, want 412", what, status(err))
	}
}

func must[T any](t *testing.T, what string) func(T, error) T {
	return func(v T, err error) T {
		t.Helper()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		return v
	}
}

func (l *lab) createENI(t *testing.T, in *ec2.CreateNetworkInterfaceInput) types.NetworkInterface {
	t.Helper()
	if in.SubnetId == nil {
		in.SubnetId = aws.String(l.sub)
	}
	out, err := l.c.CreateNetworkInterface(ctx, in)
	if err != nil {
		t.Fatalf("CreateNetworkInterface: %v", err)
	}
	return *out.NetworkInterface
}

func (l *lab) eni(t *testing.T, id string) types.NetworkInterface {
	t.Helper()
	out, err := l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{id}})
	if err != nil {
		t.Fatalf("DescribeNetworkInterfaces %s: %v", id, err)
	}
	if len(out.NetworkInterfaces) != 1 {
		t.Fatalf("DescribeNetworkInterfaces %s: %d answers", id, len(out.NetworkInterfaces))
	}
	return out.NetworkInterfaces[0]
}

func (l *lab) attach(t *testing.T, eniID, instID string, dev int32) string {
	t.Helper()
	out, err := l.c.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: &eniID, InstanceId: &instID, DeviceIndex: &dev})
	if err != nil {
		t.Fatalf("AttachNetworkInterface %s at %d: %v", eniID, dev, err)
	}
	return *out.AttachmentId
}

func (l *lab) available(t *testing.T, subnetID string) int32 {
	t.Helper()
	out, err := l.c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: []string{subnetID}})
	if err != nil || len(out.Subnets) != 1 {
		t.Fatalf("DescribeSubnets %s: %v", subnetID, err)
	}
	return *out.Subnets[0].AvailableIpAddressCount
}

func ips(e types.NetworkInterface) []string {
	var out []string
	for _, a := range e.PrivateIpAddresses {
		out = append(out, *a.PrivateIpAddress)
	}
	return out
}

func prefixes(e types.NetworkInterface) []string {
	var out []string
	for _, p := range e.Ipv4Prefixes {
		out = append(out, *p.Ipv4Prefix)
	}
	return out
}

func ids(enis []types.NetworkInterface) []string {
	var out []string
	for _, e := range enis {
		out = append(out, *e.NetworkInterfaceId)
	}
	slices.Sort(out)
	return out
}
