package openstack

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/family"
)

// The NIC settings are checked with everything else, each bad one named.
func TestNICSettingsValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want []string // "" = valid
	}{
		{Config{Endpoint: "http://n/", ComputeEndpoint: "http://c/", SubnetID: "s", Mode: "passthrough"}, nil},
		// No subnetID: each node takes its VM port's own subnet.
		{Config{Endpoint: "http://n/"}, nil},
		{Config{Endpoint: "http://n/", PortLookup: "instance", InstanceID: "i"}, nil},
		// Several subnets: a list or tags, not with subnetID, not both.
		{Config{Endpoint: "http://n/", Subnets: []string{"a", "b"}}, nil},
		{Config{Endpoint: "http://n/", SubnetTags: []string{"pods", "az1"}}, nil},
		{Config{Endpoint: "http://n/", SubnetID: "s", Subnets: []string{"a"}}, []string{"subnetID: names one subnet and subnets several"}},
		{Config{Endpoint: "http://n/", SubnetID: "s", SubnetTags: []string{"t"}}, []string{"subnetID: names one subnet and subnetTags"}},
		{Config{Endpoint: "http://n/", Subnets: []string{"a"}, SubnetTags: []string{"t"}}, []string{"subnets: and subnetTags both"}},
		{Config{Endpoint: "http://n/", Subnets: []string{"a", "", "a"}, SubnetTags: []string{"x,y"}},
			[]string{`subnets: entry 1 "" is empty`, `subnets: entry 2 "a" is empty or repeated`, `subnetTags: entry 0 "x,y"`}},
		{Config{Endpoint: "http://n/", SubnetID: "s", Mode: "passthrough"}, []string{"computeEndpoint: is required"}},
		{Config{Endpoint: "http://n/", SubnetID: "s", SecondaryNICs: 1}, []string{"computeEndpoint: is required"}},
		{Config{Endpoint: "http://n/", ComputeEndpoint: "c", SubnetID: "s", Mode: "address-pairs", SecondaryNICs: 9, MaxNICs: 4},
			[]string{"computeEndpoint: \"c\" is not", "secondaryNICs: 9 is outside 0..3", "secondaryNICs: is for mode fixed-ips"}},
		{Config{Endpoint: "http://n/", ComputeEndpoint: "http://c/", SubnetID: "s", MaxNICs: 1}, []string{"maxNICs: 1 is outside 2..64"}},
	} {
		c.cfg.Defaults()
		err := c.cfg.Validate()
		if len(c.want) == 0 {
			if err != nil {
				t.Errorf("%+v: %v", c.cfg, err)
			}
			continue
		}
		for _, w := range c.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%+v: %v; want it to say %q", c.cfg, err, w)
			}
		}
	}
}

// The IPv6 settings: subnetIDv6 in mode fixed-ips alone, modeV6 and its
// prefixRangeV6.
func TestIPv6SettingsValidate(t *testing.T) {
	for _, c := range []struct {
		cfg  Config
		want string // "" = valid
	}{
		{Config{Endpoint: "http://n/", SubnetIDv6: "s6"}, ""},
		{Config{Endpoint: "http://n/", SubnetIDv6: "s6", ModeV6: "prefix-pair", PrefixRangeV6: "fd00:10:0:0:1::/80"}, ""},
		{Config{Endpoint: "http://n/", ModeV6: "prefix-pair", PrefixRangeV6: "fd00:10::1:0:0:0/96"}, ""},
		{Config{Endpoint: "http://n/", SubnetIDv6: "s6", Mode: "address-pairs"}, "subnetIDv6: IPv6 pod addresses are fixed IPs"},
		{Config{Endpoint: "http://n/", ModeV6: "prefix-pair"}, "prefixRangeV6: \"\" is not an IPv6 range"},
		{Config{Endpoint: "http://n/", ModeV6: "prefix-pair", PrefixRangeV6: "fd00:10::/112"}, "prefixRangeV6: \"fd00:10::/112\""},
		{Config{Endpoint: "http://n/", ModeV6: "prefix-pair", PrefixRangeV6: "fd00:10::5/80"}, "its first address"},
		{Config{Endpoint: "http://n/", ModeV6: "prefix-pair", PrefixRangeV6: "10.0.0.0/8"}, "prefixRangeV6"},
		{Config{Endpoint: "http://n/", PrefixRangeV6: "fd00:10::/80"}, "prefixRangeV6: is for modeV6 prefix-pair"},
		{Config{Endpoint: "http://n/", ModeV6: "slaac"}, `modeV6: "slaac" is not one of`},
	} {
		c.cfg.Defaults()
		err := c.cfg.Validate()
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v", c.cfg, err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v: %v; want it to say %q", c.cfg, err, c.want)
		}
	}
}

// IPv6 with secondary NICs (or a mode other than fixed-ips) is refused
// before anything is asked of Neutron, saying why and what to change.
func TestIPv6RefusedWithSecondaryNICs(t *testing.T) {
	cfg := Config{Endpoint: "http://127.0.0.1:1/", ComputeEndpoint: "http://127.0.0.1:1/", SubnetID: "s", SecondaryNICs: 2, MaxAddresses: 10}
	cfg.Defaults()
	_, err := NewFamilies(t.Context(), cfg, netip.MustParseAddr("10.0.0.5"), []family.Family{family.V4, family.V6})
	for _, want := range []string{"secondaryNICs 2", "IPv4 pod addresses only", "no more pods than maxAddresses (10)", "set secondaryNICs 0"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("dual-stack with secondaryNICs: %v; want it refused saying %q", err, want)
		}
	}
	if _, err := NewFamilies(t.Context(), cfg, netip.MustParseAddr("10.0.0.5"), []family.Family{family.V4}); err == nil || strings.Contains(err.Error(), "secondaryNICs 2") {
		t.Errorf("IPv4 alone with secondaryNICs: %v; want past the IPv6 check (then no Neutron to reach)", err)
	}
}
