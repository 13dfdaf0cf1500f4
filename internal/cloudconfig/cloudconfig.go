// Package cloudconfig is vpcni-controller's -cloud-config file: how the
// controller reaches the cloud for its cluster-wide work (floating IPs,
// router routes). It has the shape of the agent's provider section, so one
// Secret can serve both:
//
//	openstack:
//	  auth: {authURL: …, applicationCredentialID: …, applicationCredentialSecret: …}
//	  # or credentialsFile: /etc/vpcni/cloud/credentials.yaml, or endpoint: (no Keystone)
//	  timeout: 15s
//
// Fields the agent needs for its own port (subnetID, mode, …) are allowed
// and ignored.
package cloudconfig

import (
	"context"
	"errors"
	"fmt"
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
}

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
// call the file gives.
func (c Config) Neutron(ctx context.Context) (*gophercloud.ServiceClient, time.Duration, error) {
	nc, err := openstack.NeutronClient(ctx, *c.OpenStack)
	return nc, c.OpenStack.Timeout.Duration, err
}
