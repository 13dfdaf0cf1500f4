// Package cluster is the aws cloud of the cluster side: the leak
// collector's look at the ENIs vpcni created (leaks.Cloud), a sticky pod's
// address taken off a dead node's ENI (the sticky keeper's TakeOff), and
// what EC2 says holds an address (vpcnictl trace), each through the
// interface its consumer owns. It registers itself as the cloud "aws" of
// -cloud-config (internal/cloudconfig); internal/builtin/clouds links it.
// (vpcnictl doctor, which reads the node's agent config, asks the
// provider itself: its provider.Doctor.)
//
// On EC2 pods take addresses on the VPC's own subnets, so no router route
// carries them: the cloud has no router for a routed pod subnet, and a
// routes section beside its section is refused. Elastic IPs are not
// served: its floating-IP door holds none and refuses a pod's request
// with the reason.
//
// It is a package apart from the provider (internal/provider/aws), and
// imports none of it, so that vpcni-controller does not link a node's
// provider (its IMDS identity, its ownership records, its pool of ENIs);
// the tags it reads are the provider's (TestCollectorReleasesProviderENIs
// reads ENIs the provider made, and TestAgentKeys checks the section's
// keys).
package cluster

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/smithy-go"

	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/leaks"
	"github.com/vpcni/vpcni/internal/routes"
	"github.com/vpcni/vpcni/internal/units"
)

// Name is the cloud's name: its section's key in -cloud-config, and the
// provider's in the agent config.
const Name = "aws"

// The tags the provider puts on the ENIs it creates (vpcni.io/owner =
// vpcni, the instance, the cluster's name), and the leak collector's
// claim, the cluster's ID.
const (
	tagOwner     = "vpcni.io/owner"
	ownerValue   = "vpcni"
	tagInstance  = "vpcni.io/instance-id"
	tagCluster   = "vpcni.io/cluster"
	tagClusterID = "vpcni.io/cluster-id"
)

func init() {
	cloudconfig.Register(cloudconfig.Registration{
		Name:        Name,
		NewSettings: func() cloudconfig.Settings { return &Settings{} },
		Open: func(s cloudconfig.Settings, log *slog.Logger) cloudconfig.Cloud {
			return &cloud{cfg: *s.(*Settings), log: log}
		},
	})
}

// Settings is the aws section of -cloud-config. It has the shape of the
// agent's provider.aws section, so one file serves both: the keys only
// the agent uses are allowed and ignored.
type Settings struct {
	// Region of the EC2 API: required (the controller may run where no
	// instance metadata tells it).
	Region string `json:"region,omitempty"`
	// Endpoint overrides the EC2 API's URL (a VPC endpoint, the lab's).
	Endpoint string `json:"endpoint,omitempty"`
	// ClusterName: the agents' clusterName. The collector then reads only
	// the ENIs tagged vpcni.io/cluster with it, and counts them as this
	// cluster's; without it, every ENI of vpcni's in the region is read,
	// and only those it claimed (vpcni.io/cluster-id) are this cluster's.
	ClusterName string `json:"clusterName,omitempty"`
	// Timeout bounds one EC2 request (default 30s); Retries is how many
	// attempts a call gets (default 5), backing off up to RetryMaxBackoff
	// (default 20s).
	Timeout         units.Duration `json:"timeout,omitempty"`
	Retries         int            `json:"retries,omitempty"`
	RetryMaxBackoff units.Duration `json:"retryMaxBackoff,omitempty"`
	agentOnly
}

// agentOnly are the provider.aws keys the cluster side does not use.
type agentOnly struct {
	IMDSEndpoint    json.RawMessage `json:"imdsEndpoint,omitempty"`
	Subnets         json.RawMessage `json:"subnets,omitempty"`
	SubnetTags      json.RawMessage `json:"subnetTags,omitempty"`
	SecurityGroups  json.RawMessage `json:"securityGroups,omitempty"`
	PrefixMode      json.RawMessage `json:"prefixMode,omitempty"`
	MaxENIs         json.RawMessage `json:"maxENIs,omitempty"`
	ENIMinLifetime  json.RawMessage `json:"eniMinLifetime,omitempty"`
	LeakedENIGrace  json.RawMessage `json:"leakedENIGrace,omitempty"`
	CleanupInterval json.RawMessage `json:"cleanupInterval,omitempty"`
	AttachTimeout   json.RawMessage `json:"attachTimeout,omitempty"`
	CIDRBackoff     json.RawMessage `json:"cidrBackoff,omitempty"`
	Tags            json.RawMessage `json:"tags,omitempty"`
	APIRate         json.RawMessage `json:"apiRate,omitempty"`
	APIBurst        json.RawMessage `json:"apiBurst,omitempty"`
}

// Defaults implements cloudconfig.Settings.
func (s *Settings) Defaults() {
	if s.Timeout.Duration == 0 {
		s.Timeout.Duration = 30 * time.Second
	}
	if s.RetryMaxBackoff.Duration == 0 {
		s.RetryMaxBackoff.Duration = 20 * time.Second
	}
	if s.Retries == 0 {
		s.Retries = 5
	}
}

var regionRe = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-\d+$`)

// Validate implements cloudconfig.Settings: every bad field at once.
func (s *Settings) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{field}, args...)...))
	}
	switch {
	case s.Region == "":
		bad("region", "is required: the EC2 region of the cluster's instances (e.g. eu-west-1)")
	case !regionRe.MatchString(s.Region):
		bad("region", "%q is not an AWS region name (e.g. eu-west-1)", s.Region)
	}
	if s.Endpoint != "" {
		if u, err := url.Parse(s.Endpoint); err != nil || u.Host == "" || u.Scheme != "http" && u.Scheme != "https" {
			bad("endpoint", "%q is not an http(s) URL", s.Endpoint)
		}
	}
	if len(s.ClusterName) > 256 {
		bad("clusterName", "longer than 256 characters (a tag value)")
	}
	if d := s.Timeout.Duration; d < 100*time.Millisecond || d > 5*time.Minute {
		bad("timeout", "%s is outside 100ms..5m", d)
	}
	if d := s.RetryMaxBackoff.Duration; d < 10*time.Millisecond || d > 5*time.Minute {
		bad("retryMaxBackoff", "%s is outside 10ms..5m", d)
	}
	if s.Retries < 1 || s.Retries > 20 {
		bad("retries", "%d is outside 1..20", s.Retries)
	}
	return errors.Join(errs...)
}

// cloud implements cloudconfig.Cloud. Its doors share one EC2 client,
// made by the first door opened.
type cloud struct {
	cfg Settings
	log *slog.Logger

	mu  sync.Mutex
	ec2 *ec2.Client
}

func (c *cloud) Info() cloudconfig.Info {
	return cloudconfig.Info{Name: Name, Subnet: true, SubnetKey: Name + ".region",
		NoRouter: "pods take addresses on the VPC's own subnets, which the VPC routes itself; drop the routes section"}
}

// login is the shared EC2 client: the SDK's default credential chain
// (the environment, a web identity — IRSA —, shared files, the instance
// role), whose credentials are fetched now so that a door that cannot
// work says so when it is opened.
func (c *cloud) login(ctx context.Context) (*ec2.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.ec2 != nil {
		return c.ec2, nil
	}
	cfg := c.cfg
	awsCfg, err := awsconfig.LoadDefaultConfig(ctx,
		awsconfig.WithRegion(cfg.Region),
		awsconfig.WithHTTPClient(awshttp.NewBuildableClient().WithTimeout(cfg.Timeout.Duration)),
		awsconfig.WithRetryer(func() aws.Retryer {
			return retry.NewStandard(func(o *retry.StandardOptions) {
				o.MaxAttempts, o.MaxBackoff = cfg.Retries, cfg.RetryMaxBackoff.Duration
			})
		}),
	)
	if err != nil {
		return nil, fmt.Errorf("AWS SDK configuration: %w", err)
	}
	if _, err := awsCfg.Credentials.Retrieve(ctx); err != nil {
		return nil, fmt.Errorf("no AWS credentials for the cluster side (give vpcni-controller's pod a role — IRSA's AWS_ROLE_ARN and web identity token, or the node's instance role — or AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY): %w", err)
	}
	c.ec2 = ec2.NewFromConfig(awsCfg, func(o *ec2.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
		}
	})
	return c.ec2, nil
}

// FloatingIPs: Elastic IPs are not served; the door holds none and
// refuses a pod's request with the reason.
func (c *cloud) FloatingIPs(context.Context) (floatingip.Cloud, error) { return noFloatingIPs{}, nil }

// ErrNoRouter is the Router door's answer: EC2 needs no router route for
// a pod (see Info.NoRouter).
var ErrNoRouter = errors.New("the aws cloud has no router for a routed pod subnet: pods take addresses on the VPC's own subnets, which the VPC routes itself")

func (c *cloud) Router(context.Context, string) (routes.Cloud, error) { return nil, ErrNoRouter }

func (c *cloud) Leaks(ctx context.Context, scope leaks.Scope) (leaks.Cloud, error) {
	if scope.Router != "" {
		return nil, ErrNoRouter
	}
	ec, err := c.login(ctx)
	if err != nil {
		return nil, err
	}
	return &Leaks{EC2: ec, ClusterName: c.cfg.ClusterName, ClusterID: scope.ClusterID, Log: c.log}, nil
}

func (c *cloud) TakeOff(ctx context.Context, port string, addrs []netip.Addr) error {
	ec, err := c.login(ctx)
	if err != nil {
		return err
	}
	return TakeOff(ctx, ec, c.cfg.ClusterName, port, addrs)
}

func (c *cloud) Holders(ctx context.Context, addr netip.Addr) ([]cloudconfig.Holder, error) {
	ec, err := c.login(ctx)
	if err != nil {
		return nil, err
	}
	return Holders(ctx, ec, addr)
}

// errNoFloatingIPs is what a pod asking for a floating IP is told.
var errNoFloatingIPs = fmt.Errorf("the aws cloud has no floating IPs for pods: vpcni does not serve Elastic IPs (a pod's address is the VPC's own; reach it from outside through a load balancer): %w", floatingip.ErrInvalid)

// noFloatingIPs is the aws cloud's floating IPs: none.
type noFloatingIPs struct{}

func (noFloatingIPs) Owned(context.Context, string) ([]floatingip.FIP, error)  { return nil, nil }
func (noFloatingIPs) At(context.Context, netip.Addr) ([]floatingip.FIP, error) { return nil, nil }
func (noFloatingIPs) Ensure(context.Context, floatingip.Want) (floatingip.FIP, error) {
	return floatingip.FIP{}, errNoFloatingIPs
}
func (noFloatingIPs) Detach(context.Context, string, func(floatingip.FIP) bool) ([]floatingip.FIP, error) {
	return nil, nil
}

// controllerPolicy is the least IAM policy of the cluster side's role.
const controllerPolicy = "ec2:DescribeNetworkInterfaces, ec2:DescribeInstances, ec2:DescribeSubnets, ec2:DetachNetworkInterface, " +
	"ec2:DeleteNetworkInterface, ec2:UnassignPrivateIpAddresses, ec2:UnassignIpv6Addresses (IPv6 pods), ec2:CreateTags (on network-interface/*)"

// code is the EC2 error code of err ("" if EC2 gave none).
func code(err error) string {
	var api smithy.APIError
	if errors.As(err, &api) {
		return api.ErrorCode()
	}
	return ""
}

// explain wraps an EC2 refusal with what a person can do about it.
func explain(err error) error {
	switch code(err) {
	case "UnauthorizedOperation", "AccessDenied":
		act := "the action named"
		var op *smithy.OperationError
		if errors.As(err, &op) {
			act = "ec2:" + op.OperationName
		}
		return fmt.Errorf("%w (the cluster side's IAM role may not call %s: add it; its least policy is %s)", err, act, controllerPolicy)
	case "AuthFailure", "InvalidClientTokenId", "SignatureDoesNotMatch":
		return fmt.Errorf("%w (EC2 did not accept the credentials: check the role or keys vpcni-controller runs with)", err)
	}
	return err
}

// instanceOf reads a Node's spec.providerID, aws:///<zone>/<instance-id>
// (the AWS cloud provider's).
func instanceOf(providerID string) (string, bool) {
	rest, ok := strings.CutPrefix(providerID, "aws://")
	if !ok {
		return "", false
	}
	id := rest[strings.LastIndex(rest, "/")+1:]
	return id, strings.HasPrefix(id, "i-")
}
