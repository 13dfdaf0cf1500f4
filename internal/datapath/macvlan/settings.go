package macvlan

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"

	"github.com/vpcni/vpcni/internal/datapath/svcpath"
)

// DefaultServiceCIDR is Kubernetes' default Service range.
const DefaultServiceCIDR = svcpath.DefaultServiceCIDR

// Settings is the section of vpcnid.yaml of either mode (datapath.macvlan,
// datapath.ipvlan): the service path's Service CIDRs and the parent.
type Settings struct {
	svcpath.Settings
	// Parent is the node interface pods' sub-interfaces hang off (default:
	// the uplink). It must sit on the network the provider's addresses
	// belong to.
	Parent string `json:"parent,omitempty"`
}

// Defaults implements datapath.Settings.
func (s *Settings) Defaults() { s.Settings.Defaults() }

// Validate implements datapath.Settings: every bad field at once.
func (s *Settings) Validate() error {
	errs := []error{s.Settings.Validate()}
	if s.Parent != "" && (len(s.Parent) > 15 || strings.ContainsAny(s.Parent, "/ \t\n:") || s.Parent == "." || s.Parent == "..") {
		errs = append(errs, fmt.Errorf("parent: %q is not an interface name", s.Parent))
	}
	return errors.Join(errs...)
}

// cidrs are the validated Service CIDRs.
func (s *Settings) cidrs() []netip.Prefix { return s.CIDRs() }
