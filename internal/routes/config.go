package routes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// CloudConfig is vpcni-controller's -cloud-config file: how to reach
// Neutron (the agent's provider.openstack section, same fields; subnetID
// optional) and the routed pod subnet's router.
//
//	openstack:
//	  auth: {authURL: …, applicationCredentialID: …, applicationCredentialSecret: …}
//	  # or endpoint: http://127.0.0.1:9696/ (no Keystone)
//	  subnetID: …            # optional: the VM subnet, to find a node's port by its IP
//	  maxAddressPairs: 10
//	routes:
//	  routerID: …
//	  maxRoutes: 30          # optional: 0 learns it from Neutron
//	  resync: 30s
type CloudConfig struct {
	OpenStack openstack.Config `json:"openstack"`
	Routes    RoutesConfig     `json:"routes"`
}

// RoutesConfig is the routes section.
type RoutesConfig struct {
	// RouterID is the Neutron router that routes the pod blocks.
	RouterID string `json:"routerID"`
	// MaxRoutes is the router's max_routes (neutron.conf) when known; 0
	// learns it from the first RoutesExhausted answer.
	MaxRoutes int `json:"maxRoutes,omitempty"`
	// Resync is how often the router and ports are read again, to repair
	// a route or pair removed by hand (default 30s).
	Resync config.Duration `json:"resync,omitempty"`
	// Probe is how long a learned limit is trusted while blocks wait for
	// routes, before one atomic try finds whether it was raised (10m).
	Probe config.Duration `json:"probe,omitempty"`
}

// LoadCloudConfig reads, defaults and validates a -cloud-config file,
// naming every bad field.
func LoadCloudConfig(path string) (*CloudConfig, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-cloud-config: %w", err)
	}
	var c CloudConfig
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("-cloud-config %s: %w", path, err)
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("-cloud-config %s: %w", path, err)
	}
	return &c, nil
}

// Defaults fills what the file leaves out.
func (c *CloudConfig) Defaults() {
	c.OpenStack.Defaults()
	if c.Routes.Resync.Duration == 0 {
		c.Routes.Resync.Duration = 30 * time.Second
	}
	if c.Routes.Probe.Duration == 0 {
		c.Routes.Probe.Duration = 10 * time.Minute
	}
}

// Validate checks every field at once.
func (c *CloudConfig) Validate() error {
	var errs []error
	// The provider's check insists on a subnet; the controller only
	// narrows the port lookup with one, so a copy with a stand-in is
	// checked.
	oc := c.OpenStack
	if oc.SubnetID == "" {
		oc.SubnetID = "-"
	}
	if err := oc.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("openstack: %w", err))
	}
	if c.Routes.RouterID == "" {
		errs = append(errs, errors.New("routes.routerID: is required: the Neutron router that routes the pod blocks"))
	}
	if c.Routes.MaxRoutes < 0 || c.Routes.MaxRoutes > 10000 {
		errs = append(errs, fmt.Errorf("routes.maxRoutes: %d is outside 0..10000 (0: learn it from Neutron)", c.Routes.MaxRoutes))
	}
	if d := c.Routes.Resync.Duration; d < time.Second || d > time.Hour {
		errs = append(errs, fmt.Errorf("routes.resync: %s is outside 1s..1h", d))
	}
	if d := c.Routes.Probe.Duration; d < time.Second || d > 24*time.Hour {
		errs = append(errs, fmt.Errorf("routes.probe: %s is outside 1s..24h", d))
	}
	return errors.Join(errs...)
}

// Connect logs in to Neutron as the openstack section says (Keystone, or
// a noauth endpoint), with the provider's own client construction. A
// cloud that cannot be reached yet is tried again (backoff up to a
// minute, each failure logged) until ctx ends: the controller's other
// reconcilers need no cloud and must not stop with it.
func (c *CloudConfig) Connect(ctx context.Context, log *slog.Logger) (*Neutron, error) {
	wait := time.Second
	for {
		nc, err := openstack.NetworkClient(ctx, c.OpenStack)
		if err == nil {
			return NewNeutron(nc, c.Routes.RouterID, c.OpenStack.SubnetID), nil
		}
		log.Warn("cannot log in to the cloud yet; trying again", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Minute)
	}
}
