package static

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
)

// Config is the static provider's section of vpcnid.yaml
// (provider.static): the ranges pods take addresses from.
type Config struct {
	Ranges []Range `json:"ranges"`
}

// Range is one subnet (or part of one) pods may use.
type Range struct {
	// CIDR is the subnet, e.g. 10.0.0.0/24.
	CIDR string `json:"cidr"`
	// Gateway of the subnet; never handed to a pod (default: first host).
	Gateway string `json:"gateway,omitempty"`
	// Exclude lists addresses or CIDRs inside the subnet never handed out
	// (nodes, routers, DHCP servers ...).
	Exclude []string `json:"exclude,omitempty"`
}

// Defaults implements provider.Settings: nothing to fill.
func (c *Config) Defaults() {}

// Validate implements provider.Settings: every bad range field at once.
func (c *Config) Validate() error {
	if len(c.Ranges) == 0 {
		return errors.New("ranges: at least one range is required for the static provider")
	}
	var errs []error
	for i, r := range c.Ranges {
		errs = append(errs, r.validate(fmt.Sprintf("ranges[%d]", i))...)
	}
	return errors.Join(errs...)
}

func (r Range) validate(field string) []error {
	var errs []error
	p, err := netip.ParsePrefix(r.CIDR)
	if err != nil {
		return []error{fmt.Errorf("%s.cidr: %q is not a CIDR", field, r.CIDR)}
	}
	if !p.Addr().Is4() {
		errs = append(errs, fmt.Errorf("%s.cidr: %q: only IPv4 is supported so far", field, r.CIDR))
	}
	if p.Masked() != p {
		errs = append(errs, fmt.Errorf("%s.cidr: %q has host bits set (did you mean %s?)", field, r.CIDR, p.Masked()))
	}
	if p.Bits() < 16 {
		errs = append(errs, fmt.Errorf("%s.cidr: %q is larger than a /16; split the subnet into per-node ranges", field, r.CIDR))
	}
	if r.Gateway != "" {
		if gw, err := netip.ParseAddr(r.Gateway); err != nil || !p.Contains(gw) {
			errs = append(errs, fmt.Errorf("%s.gateway: %q is not an address inside %s", field, r.Gateway, r.CIDR))
		}
	}
	for j, e := range r.Exclude {
		if _, err := ParseAddrOrPrefix(e); err != nil {
			errs = append(errs, fmt.Errorf("%s.exclude[%d]: %w", field, j, err))
		}
	}
	return errs
}

// ParseAddrOrPrefix reads "10.0.0.5" as 10.0.0.5/32 and "10.0.0.0/28" as is.
func ParseAddrOrPrefix(s string) (netip.Prefix, error) {
	if strings.Contains(s, "/") {
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return p, fmt.Errorf("%q is not an address or CIDR", s)
		}
		return p.Masked(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return netip.Prefix{}, fmt.Errorf("%q is not an address or CIDR", s)
	}
	return netip.PrefixFrom(a, a.BitLen()), nil
}
