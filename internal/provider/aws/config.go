package aws

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
	"time"

	"github.com/vpcni/vpcni/internal/units"
)

// Config is the aws provider's section of vpcnid.yaml (provider.aws):
// pod addresses are secondary IPv4 addresses (or /28 prefixes) on the
// instance's ENIs.
type Config struct {
	// Region of the EC2 API (default: the instance's, from IMDS).
	Region string `json:"region,omitempty"`
	// Endpoint overrides the EC2 API's URL (a VPC endpoint, a test
	// emulator, the lab's), e.g. http://127.0.0.1:5000.
	Endpoint string `json:"endpoint,omitempty"`
	// IMDSEndpoint overrides the instance metadata service's URL
	// (default http://169.254.169.254, or $AWS_EC2_METADATA_SERVICE_ENDPOINT).
	IMDSEndpoint string `json:"imdsEndpoint,omitempty"`
	// Subnets (IDs) and SubnetTags (every tag must match) name the subnets
	// extra ENIs are created in, in the instance's VPC and availability
	// zone; with several, the one with the most free addresses first.
	// Neither: the primary ENI's subnet.
	Subnets    []string          `json:"subnets,omitempty"`
	SubnetTags map[string]string `json:"subnetTags,omitempty"`
	// SecurityGroups of extra ENIs (default: the primary ENI's).
	SecurityGroups []string `json:"securityGroups,omitempty"`
	// PrefixMode takes /28 prefixes (16 addresses each, one ENI slot)
	// instead of single secondary addresses: 16 times the pods per ENI and
	// one EC2 call per 16 addresses. Nitro instance types only.
	PrefixMode bool `json:"prefixMode,omitempty"`
	// MaxENIs caps the ENIs the node uses, the primary included (default
	// and upper bound: what the instance type allows on its default
	// network card).
	MaxENIs int `json:"maxENIs,omitempty"`
	// ENIMinLifetime: an extra ENI that has lost its last pod address is
	// detached and deleted only once it is this old, so churn does not
	// attach and detach ENIs (~10 s each on EC2) back to back (default 5m).
	ENIMinLifetime units.Duration `json:"eniMinLifetime,omitempty"`
	// LeakedENIGrace: an ENI vpcni created for this instance that sits
	// detached ("available") this long after its creation was left by a
	// crash between create and attach, and is deleted (default 10m).
	LeakedENIGrace units.Duration `json:"leakedENIGrace,omitempty"`
	// CleanupInterval is how often emptied and leaked ENIs are looked for
	// (default 1m).
	CleanupInterval units.Duration `json:"cleanupInterval,omitempty"`
	// AttachTimeout bounds the wait for a new ENI's attachment to complete
	// (EC2 attaches asynchronously, up to ~10 s; default 1m).
	AttachTimeout units.Duration `json:"attachTimeout,omitempty"`
	// CIDRBackoff is how long a subnet that had no free aligned /28 for a
	// prefix (InsufficientCidrBlocks) is not asked for another (default 2m).
	CIDRBackoff units.Duration `json:"cidrBackoff,omitempty"`
	// ClusterName tags vpcni's ENIs, so a cluster's leaks are told from
	// another's in one account (default: none).
	ClusterName string `json:"clusterName,omitempty"`
	// Tags are put on every ENI vpcni creates, besides its own.
	Tags map[string]string `json:"tags,omitempty"`
	// APIRate and APIBurst are the client-side token bucket per EC2 action
	// (requests per second, and how many may go at once), one for the
	// node's providers together (its own pods' and each PodNetwork's):
	// EC2's own buckets are per account and region, shared by every node
	// (default 5/s, burst 10).
	APIRate  float64 `json:"apiRate,omitempty"`
	APIBurst int     `json:"apiBurst,omitempty"`
	// Retries is how many attempts one EC2 call gets (the SDK's standard
	// retryer: RequestLimitExceeded, 5xx and transport errors back off
	// exponentially with jitter up to RetryMaxBackoff; default 5, 20s).
	Retries         int            `json:"retries,omitempty"`
	RetryMaxBackoff units.Duration `json:"retryMaxBackoff,omitempty"`
	// Timeout bounds one EC2 or IMDS request (default 30s).
	Timeout units.Duration `json:"timeout,omitempty"`
}

// Defaults implements provider.Settings.
func (c *Config) Defaults() {
	def := func(d *units.Duration, v time.Duration) {
		if d.Duration == 0 {
			d.Duration = v
		}
	}
	def(&c.ENIMinLifetime, 5*time.Minute)
	def(&c.LeakedENIGrace, 10*time.Minute)
	def(&c.CleanupInterval, time.Minute)
	def(&c.CIDRBackoff, 2*time.Minute)
	def(&c.AttachTimeout, time.Minute)
	def(&c.RetryMaxBackoff, 20*time.Second)
	def(&c.Timeout, 30*time.Second)
	if c.APIRate == 0 {
		c.APIRate = 5
	}
	if c.APIBurst == 0 {
		c.APIBurst = 10
	}
	if c.Retries == 0 {
		c.Retries = 5
	}
}

var (
	regionRe = regexp.MustCompile(`^[a-z]{2}(-[a-z]+)+-\d+$`)
	subnetRe = regexp.MustCompile(`^subnet-[0-9a-f]+$`)
	sgRe     = regexp.MustCompile(`^sg-[0-9a-f]+$`)
)

// Validate implements provider.Settings: every bad field at once.
func (c *Config) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%s: "+format, append([]any{field}, args...)...))
	}
	if c.Region != "" && !regionRe.MatchString(c.Region) {
		bad("region", "%q is not an AWS region name (e.g. eu-west-1)", c.Region)
	}
	for _, f := range []struct{ name, v string }{{"endpoint", c.Endpoint}, {"imdsEndpoint", c.IMDSEndpoint}} {
		if f.v == "" {
			continue
		}
		if u, err := url.Parse(f.v); err != nil || u.Host == "" || u.Scheme != "http" && u.Scheme != "https" {
			bad(f.name, "%q is not an http(s) URL", f.v)
		}
	}
	for i, s := range c.Subnets {
		if !subnetRe.MatchString(s) {
			bad(fmt.Sprintf("subnets[%d]", i), "%q is not a subnet ID (subnet-…)", s)
		}
	}
	for k := range c.SubnetTags {
		if k == "" {
			bad("subnetTags", "a tag key is empty")
		}
	}
	for i, s := range c.SecurityGroups {
		if !sgRe.MatchString(s) {
			bad(fmt.Sprintf("securityGroups[%d]", i), "%q is not a security group ID (sg-…)", s)
		}
	}
	if len(c.SecurityGroups) > 16 {
		bad("securityGroups", "%d groups: an ENI takes at most 16", len(c.SecurityGroups))
	}
	if c.MaxENIs < 0 || c.MaxENIs > 128 {
		bad("maxENIs", "%d is outside 0..128 (0: the instance type's)", c.MaxENIs)
	}
	within := func(field string, d units.Duration, lo, hi time.Duration) {
		if d.Duration < lo || d.Duration > hi {
			bad(field, "%s is outside %s..%s", d, lo, hi)
		}
	}
	within("eniMinLifetime", c.ENIMinLifetime, 0, 24*time.Hour)
	within("leakedENIGrace", c.LeakedENIGrace, time.Second, 7*24*time.Hour)
	within("cleanupInterval", c.CleanupInterval, 10*time.Millisecond, time.Hour)
	within("cidrBackoff", c.CIDRBackoff, 0, time.Hour)
	within("attachTimeout", c.AttachTimeout, time.Second, 10*time.Minute)
	within("retryMaxBackoff", c.RetryMaxBackoff, 10*time.Millisecond, 5*time.Minute)
	within("timeout", c.Timeout, 100*time.Millisecond, 5*time.Minute)
	if c.APIRate <= 0 || c.APIRate > 1000 {
		bad("apiRate", "%g is outside (0, 1000] requests per second", c.APIRate)
	}
	if c.APIBurst < 1 || c.APIBurst > 1000 {
		bad("apiBurst", "%d is outside 1..1000", c.APIBurst)
	}
	if c.Retries < 1 || c.Retries > 20 {
		bad("retries", "%d is outside 1..20", c.Retries)
	}
	tags := func(field string, m map[string]string) {
		for k, v := range m {
			switch {
			case k == "" || len(k) > 128:
				bad(field, "key %q must be 1..128 characters", k)
			case strings.HasPrefix(strings.ToLower(k), "aws:"):
				bad(field, "key %q: the aws: prefix is AWS's own", k)
			case strings.HasPrefix(k, tagPrefix):
				bad(field, "key %q: the %s prefix is vpcni's own", k, tagPrefix)
			case len(v) > 256:
				bad(field, "value of %q is longer than 256 characters", k)
			}
		}
	}
	tags("tags", c.Tags)
	if len(c.ClusterName) > 256 {
		bad("clusterName", "longer than 256 characters (a tag value)")
	}
	return errors.Join(errs...)
}
