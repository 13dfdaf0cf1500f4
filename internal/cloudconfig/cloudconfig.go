// Package cloudconfig is the cluster side's door to a cloud: it reads
// vpcni-controller's -cloud-config file (which vpcnictl audit and trace
// read too) and opens the cloud its section names, from the clouds this
// build registered — as providers register for the agent, so a new cloud
// is a package of its own plus one line in internal/builtin/clouds, never
// a switch here or in the controller.
//
// The file holds one cloud's section, named by the cloud, and optionally
// the routed pod subnet's routes section (routes.Config):
//
//	openstack:
//	  auth: {authURL: …, applicationCredentialID: …, applicationCredentialSecret: …}
//	  # or credentialsFile: /etc/vpcni/cloud/credentials.yaml, or endpoint: (no Keystone)
//	  subnetID: …            # the pods' subnet: leak collector, sticky takeover
//	  timeout: 15s
//	routes: {routerID: …}   # optional: the routed pod subnet (with -block-ranges)
//
// or, on EC2, whose VPC routes the pods' subnets itself (no routes
// section; its cloud has no router, Info.NoRouter):
//
//	aws:
//	  region: eu-west-1
//	  clusterName: …         # the agents' clusterName: the ENIs they tag
//
// A cloud's section has the shape of the agent's provider section of the
// same name, so one Secret can serve both; fields only the agent needs
// are allowed and ignored.
//
// Each reconciler and tool owns the interface it talks to the cloud
// through (floatingip.Cloud, routes.Cloud, leaks.Cloud, the sticky
// keeper's TakeOff, trace's Holders); Cloud is how a registered cloud
// hands them out.
package cloudconfig

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"os"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/leaks"
	"github.com/vpcni/vpcni/internal/registry"
	"github.com/vpcni/vpcni/internal/routes"
)

// Settings is a cloud's section of the file. Defaults fills what the
// section left out; Validate names every bad field at once, relative to
// the section ("subnetID: ...").
type Settings interface {
	Defaults()
	Validate() error
}

// Cloud is one cloud as the cluster side reaches it, made from its
// validated section. Each door logs in when it is opened (one try: the
// caller retries, see Retry); TakeOff logs in at each call.
type Cloud interface {
	// Info says what the section allows, without a call to the cloud.
	Info() Info
	// FloatingIPs opens pods' floating IPs: vpcni-controller's floating
	// IP reconciler, and trace's floating IPs of a pod.
	FloatingIPs(ctx context.Context) (floatingip.Cloud, error)
	// Router opens the routed pod subnet on router (routes.routerID):
	// the routes reconciler, and trace's route and pair of a block.
	Router(ctx context.Context, router string) (routes.Cloud, error)
	// Leaks opens what the cloud holds for vpcni in scope: the leak
	// collector and vpcnictl audit. It needs Info().Subnet.
	Leaks(ctx context.Context, scope leaks.Scope) (leaks.Cloud, error)
	// TakeOff removes pod addresses from a dead node's port (or NIC, ENI),
	// as that node's own release would: only addresses vpcni put there,
	// in one write conditional on the port as read. The sticky keeper's
	// door; it needs Info().Subnet.
	TakeOff(ctx context.Context, port string, addrs []netip.Addr) error
	// Holders says what in the cloud holds addr — a port or an ENI, and
	// the instance it is attached to — as the cloud's own API tells it:
	// vpcnictl trace's look at a pod's address and at its node's. It logs
	// in at each call.
	Holders(ctx context.Context, addr netip.Addr) ([]Holder, error)
}

// Holder is what holds an address in the cloud, as Holders finds it.
type Holder struct {
	// Resource is the port or ENI that carries the address's traffic;
	// Instance the VM it is attached to ("" when none, or not known).
	Resource string
	Instance string
	// How says how the resource holds it, e.g. "secondary address of ENI
	// eni-1 (device 1)".
	How string
}

// Info is what a cloud's section lets the cluster side do, known before
// any call to the cloud.
type Info struct {
	// Name is the cloud's registered name, its section's key.
	Name string
	// Subnet: the section names where the pods' addresses live, which the
	// leak collector, the audit and the sticky takeover need; SubnetKey
	// is the key that does, for messages ("openstack.subnetID").
	Subnet    bool
	SubnetKey string
	// NoRouter, if set, says why the cloud has no router for a routed pod
	// subnet: a routes section beside its section is refused with it.
	NoRouter string
}

// Registration is one cloud.
type Registration struct {
	// Name is the section's key, e.g. "openstack".
	Name string
	// NewSettings returns the cloud's section, empty.
	NewSettings func() Settings
	// Open makes the cloud of a validated section, without I/O; log hears
	// what its doors skip.
	Open func(s Settings, log *slog.Logger) Cloud
}

var clouds = registry.New[Registration]("cloud")

// Register adds a cloud; its package calls it from init.
func Register(r Registration) { clouds.Register(r.Name, r) }

// Names lists the registered clouds, sorted.
func Names() []string { return clouds.Names() }

// NewSettings returns the empty section of a registered cloud.
func NewSettings(name string) (Settings, error) {
	r, err := clouds.Lookup(name)
	if err != nil {
		return nil, err
	}
	return r.NewSettings(), nil
}

// routesKey is the routes section's key, beside the cloud's.
const routesKey = "routes"

// Config is the file, read and validated.
type Config struct {
	// Cloud is the cloud's name (its section's key); Settings its section.
	Cloud    string
	Settings Settings
	// Routes is the routed pod subnet's section (nil: none).
	Routes *routes.Config
}

// HasRoutes says whether the file configures the routed pod subnet.
func (c Config) HasRoutes() bool { return c.Routes != nil }

// Open makes the file's cloud (no I/O); log hears what its doors skip
// (nil: nobody).
func (c Config) Open(log *slog.Logger) Cloud {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r, _ := clouds.Lookup(c.Cloud) // Load found it
	return r.Open(c.Settings, log)
}

// Load reads, defaults and validates a file, naming every bad field.
func Load(path string) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("cloud config: %w", err)
	}
	c, err := parse(data)
	if err != nil {
		return Config{}, fmt.Errorf("cloud config %s: %w", path, err)
	}
	return c, nil
}

func parse(data []byte) (Config, error) {
	var c Config
	var sections map[string]json.RawMessage
	if err := yaml.Unmarshal(data, &sections); err != nil {
		return c, err
	}
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(sections)) {
		raw := sections[key]
		if key == routesKey {
			c.Routes = &routes.Config{}
			errs = append(errs, section(key, raw, c.Routes))
			continue
		}
		r, err := clouds.Lookup(key)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w; the file holds one cloud's section and, optionally, %s", key, err, routesKey))
			continue
		}
		if c.Cloud != "" {
			errs = append(errs, fmt.Errorf("%s and %s: the file holds one cloud's section", c.Cloud, key))
			continue
		}
		c.Cloud, c.Settings = key, r.NewSettings()
		errs = append(errs, section(key, raw, c.Settings))
	}
	if c.Cloud == "" && errors.Join(errs...) == nil {
		errs = append(errs, fmt.Errorf("a cloud's section is required: one of %v", Names()))
	}
	if c.Cloud != "" && c.Routes != nil && errors.Join(errs...) == nil {
		if no := c.Open(nil).Info().NoRouter; no != "" {
			errs = append(errs, fmt.Errorf("%s: the %s cloud has no router for it: %s", routesKey, c.Cloud, no))
		}
	}
	return c, errors.Join(errs...)
}

// section reads one section strictly into s, fills its defaults and
// validates it, naming each bad field under key ("openstack.timeout: …").
func section(key string, raw json.RawMessage, s Settings) error {
	if string(raw) == "null" {
		raw = []byte("{}")
	}
	if err := yaml.UnmarshalStrict(raw, s); err != nil {
		return fmt.Errorf("%s: %w", key, err)
	}
	s.Defaults()
	err := s.Validate()
	if err == nil {
		return nil
	}
	var errs []error
	for _, line := range strings.Split(err.Error(), "\n") {
		errs = append(errs, fmt.Errorf("%s.%s", key, line))
	}
	return errors.Join(errs...)
}

// Retry opens a door (open logs in) until it opens or ctx ends, waiting
// 1s, 2s, … up to a minute between tries, each failure logged: a cloud
// that cannot be reached yet must not stop the controller's reconcilers
// that need none.
func Retry[T any](ctx context.Context, log *slog.Logger, open func(context.Context) (T, error)) (T, error) {
	wait := time.Second
	for {
		door, err := open(ctx)
		if err == nil {
			return door, nil
		}
		log.Warn("cannot log in to the cloud yet; trying again", "err", err, "in", wait)
		select {
		case <-ctx.Done():
			var none T
			return none, fmt.Errorf("%w (last: %w)", ctx.Err(), err)
		case <-time.After(wait):
		}
		wait = min(2*wait, time.Minute)
	}
}
