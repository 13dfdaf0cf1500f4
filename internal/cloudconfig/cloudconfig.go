// Package cloudconfig reads vpcni-controller's -cloud-config file for the
// floating IPs: how the controller reaches Neutron. The file is the one
// the routed pod subnet reads too (internal/routes.LoadCloudConfig, which
// owns the routes section); its openstack section has the shape of the
// agent's provider section, so one Secret can serve both:
//
//	openstack:
//	  auth: {authURL: …, applicationCredentialID: …, applicationCredentialSecret: …}
//	  # or credentialsFile: /etc/vpcni/cloud/credentials.yaml, or endpoint: (no Keystone)
//	  timeout: 15s
//	routes: {routerID: …}   # optional: the routed pod subnet (with -block-ranges)
//
// Fields the agent needs for its own port (subnetID, mode, …) are allowed
// and ignored.
package cloudconfig

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// Config is the file.
type Config struct {
	OpenStack *openstack.Config `json:"openstack"`
	// Routes is the routed pod subnet's section, read and checked by
	// internal/routes; here only whether it is there.
	Routes map[string]any `json:"routes,omitempty"`
}

// HasRoutes says whether the file configures the routed pod subnet.
func (c Config) HasRoutes() bool { return c.Routes != nil }

// Load reads, defaults and validates a file.
func Load(path string) (Config, error) {
	var c Config
	data, err := os.ReadFile(path)
	if err != nil {
		return c, fmt.Errorf("cloud config: %w", err)
	}
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return c, fmt.Errorf("cloud config %s: %w", path, err)
	}
	if err := c.Validate(); err != nil {
		return c, fmt.Errorf("cloud config %s: %w", path, err)
	}
	return c, nil
}

// Validate names every bad field at once. Only the login and the call
// bounds matter to the controller: the provider's own checks run with a
// placeholder subnet, and their complaints about it are not the
// controller's.
func (c *Config) Validate() error {
	if c.OpenStack == nil {
		return errors.New("openstack: the section is required (the only cloud vpcni-controller speaks to so far)")
	}
	o := *c.OpenStack
	if o.SubnetID == "" {
		o.SubnetID = "unused-by-the-controller"
	}
	o.Defaults()
	var errs []error
	if err := o.Validate(); err != nil {
		for _, line := range strings.Split(err.Error(), "\n") {
			errs = append(errs, fmt.Errorf("openstack.%s", line))
		}
	}
	if errs == nil {
		c.OpenStack.Defaults()
	}
	return errors.Join(errs...)
}

// Neutron logs in and returns a Neutron client, with the timeout of one
// call the file gives. A cloud that cannot be reached yet is tried again
// (backoff up to a minute, each failure logged) until ctx ends, as the
// routes' Connect does: the controller's other reconcilers need no cloud.
// The floating IPs and the leak collector each log in with it.
func (c Config) Neutron(ctx context.Context, log *slog.Logger) (*gophercloud.ServiceClient, time.Duration, error) {
	wait := time.Second
	for {
		nc, err := openstack.NetworkClient(ctx, *c.OpenStack)
		if err == nil {
			return nc, c.OpenStack.Timeout.Duration, nil
		}
		log.Warn("cannot log in to the cloud yet; trying again", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil, 0, fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Minute)
	}
}
