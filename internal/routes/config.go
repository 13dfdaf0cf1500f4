package routes

import (
	"errors"
	"fmt"
	"time"

	"github.com/vpcni/vpcni/internal/units"
)

// Config is the routes section of vpcni-controller's -cloud-config (read
// by internal/cloudconfig beside the cloud's own section):
//
//	routes:
//	  routerID: …
//	  maxRoutes: 30          # optional: 0 learns it from the cloud
//	  resync: 30s
type Config struct {
	// RouterID is the cloud's router that routes the pod blocks (a Neutron
	// router's ID).
	RouterID string `json:"routerID"`
	// MaxRoutes is the router's max_routes (neutron.conf) when known; 0
	// learns it from the first RoutesExhausted answer.
	MaxRoutes int `json:"maxRoutes,omitempty"`
	// Resync is how often the router and ports are read again, to repair
	// a route or pair removed by hand (default 30s).
	Resync units.Duration `json:"resync,omitempty"`
	// Probe is how long a learned limit is trusted while blocks wait for
	// routes, before one atomic try finds whether it was raised (10m).
	Probe units.Duration `json:"probe,omitempty"`
}

// Defaults fills what the section leaves out.
func (c *Config) Defaults() {
	if c.Resync.Duration == 0 {
		c.Resync.Duration = 30 * time.Second
	}
	if c.Probe.Duration == 0 {
		c.Probe.Duration = 10 * time.Minute
	}
}

// Validate checks every field at once, relative to the section
// ("routerID: …").
func (c *Config) Validate() error {
	var errs []error
	if c.RouterID == "" {
		errs = append(errs, errors.New("routerID: is required: the Neutron router that routes the pod blocks"))
	}
	if c.MaxRoutes < 0 || c.MaxRoutes > 10000 {
		errs = append(errs, fmt.Errorf("maxRoutes: %d is outside 0..10000 (0: learn it from Neutron)", c.MaxRoutes))
	}
	if d := c.Resync.Duration; d < time.Second || d > time.Hour {
		errs = append(errs, fmt.Errorf("resync: %s is outside 1s..1h", d))
	}
	if d := c.Probe.Duration; d < time.Second || d > 24*time.Hour {
		errs = append(errs, fmt.Errorf("probe: %s is outside 1s..24h", d))
	}
	return errors.Join(errs...)
}
