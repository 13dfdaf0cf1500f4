package aws

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/netip"
	"strconv"
	"strings"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"

	"github.com/vpcni/vpcni/internal/provider"
)

// identity is who the node is, as the instance metadata service (IMDSv2)
// tells it: what IMDS is good for. What the instance's ENIs hold is never
// taken from IMDS — it lags EC2 after every assignment (aws-vpc-cni
// issues #3019 and #3887 gave pods duplicate addresses by trusting it) —
// but read from EC2's DescribeNetworkInterfaces.
type identity struct {
	instanceID   string
	instanceType string
	region       string
	az           string
	// The primary ENI (device 0): its MAC, ID, subnet and VPC.
	mac       string
	eniID     string
	subnetID  string
	subnet    netip.Prefix
	vpcID     string
	vpcCIDRs  []netip.Prefix
	groups    []string
	localIPv4 netip.Addr
	// devices maps each attached ENI's MAC to its device number, as IMDS
	// last showed it.
	devices map[string]int
}

// newIMDS is an IMDSv2-only client: a token first, never the v1 fallback.
func newIMDS(cfg Config) *imds.Client {
	return imds.New(imds.Options{
		Endpoint:       cfg.IMDSEndpoint,
		EnableFallback: aws.FalseTernary,
		HTTPClient:     awshttp.NewBuildableClient().WithTimeout(cfg.Timeout.Duration),
	})
}

// readIdentity asks IMDS who the node is.
func readIdentity(ctx context.Context, c *imds.Client) (identity, error) {
	var id identity
	get := func(path string) (string, error) {
		out, err := c.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
		if err != nil {
			return "", imdsError(path, err)
		}
		defer out.Content.Close()
		b, err := io.ReadAll(out.Content)
		if err != nil {
			return "", imdsError(path, err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	var err error
	read := func(path string, into *string) {
		if err == nil {
			*into, err = get(path)
		}
	}
	read("instance-id", &id.instanceID)
	read("instance-type", &id.instanceType)
	read("placement/availability-zone", &id.az)
	read("mac", &id.mac)
	id.mac = strings.ToLower(id.mac)
	dir := "network/interfaces/macs/" + id.mac + "/"
	read(dir+"interface-id", &id.eniID)
	read(dir+"subnet-id", &id.subnetID)
	read(dir+"vpc-id", &id.vpcID)
	var subnet, vpcs, groups, local, macs string
	read(dir+"subnet-ipv4-cidr-block", &subnet)
	read(dir+"vpc-ipv4-cidr-blocks", &vpcs)
	read(dir+"security-group-ids", &groups)
	read("local-ipv4", &local)
	read("network/interfaces/macs/", &macs)
	if err != nil {
		return id, err
	}
	region, err := c.GetRegion(ctx, &imds.GetRegionInput{})
	if err != nil {
		return id, imdsError("the identity document's region", err)
	}
	id.region = region.Region
	var errs []error
	if id.subnet, err = netip.ParsePrefix(subnet); err != nil {
		errs = append(errs, fmt.Errorf("IMDS subnet-ipv4-cidr-block %q: %w", subnet, err))
	}
	for _, f := range strings.Fields(vpcs) {
		p, err := netip.ParsePrefix(f)
		if err != nil {
			errs = append(errs, fmt.Errorf("IMDS vpc-ipv4-cidr-blocks %q: %w", f, err))
			continue
		}
		id.vpcCIDRs = append(id.vpcCIDRs, p)
	}
	id.groups = strings.Fields(groups)
	id.localIPv4, _ = netip.ParseAddr(local)
	id.devices = map[string]int{}
	for _, m := range strings.Fields(macs) {
		m = strings.ToLower(strings.TrimSuffix(m, "/"))
		n, err := get("network/interfaces/macs/" + m + "/device-number")
		if err != nil {
			continue // an ENI leaving as IMDS is read: its number does not matter
		}
		if d, err := strconv.Atoi(n); err == nil {
			id.devices[m] = d
		}
	}
	if d, ok := id.devices[id.mac]; ok && d != 0 {
		errs = append(errs, fmt.Errorf("IMDS gives the primary MAC %s device number %d, not 0", id.mac, d))
	}
	if id.instanceID == "" || id.eniID == "" || id.subnetID == "" {
		errs = append(errs, errors.New("IMDS left the instance ID, the primary ENI or its subnet empty"))
	}
	return id, errors.Join(errs...)
}

// imdsError says what IMDS did not answer, and what to check.
func imdsError(what string, err error) error {
	var re *awshttp.ResponseError
	if errors.As(err, &re) && re.HTTPStatusCode() == http.StatusNotFound {
		return fmt.Errorf("instance metadata %s: not there (404): %w", what, err)
	}
	return fmt.Errorf("instance metadata %s: %w (vpcni reads IMDSv2 at 169.254.169.254, or imdsEndpoint; vpcnid runs in the host network — from a pod's own network namespace the token's answer needs the instance's metadata hop limit ≥ 2: aws ec2 modify-instance-metadata-options --http-put-response-hop-limit 2): %w", what, err, provider.ErrUnavailable)
}
