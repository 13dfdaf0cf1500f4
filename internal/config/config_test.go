package config_test

import (
	"encoding/json"
	"github.com/vpcni/vpcni/internal/family"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	_ "github.com/vpcni/vpcni/internal/builtin"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/provider/openstack"
	"github.com/vpcni/vpcni/internal/provider/static"
)

func staticRanges(cidrs ...string) config.Provider {
	s := &static.Config{}
	for _, c := range cidrs {
		s.Ranges = append(s.Ranges, static.Range{CIDR: c})
	}
	return config.Provider{Type: "static", Settings: s}
}

func staticOf(t *testing.T, cfg config.Config) *static.Config {
	t.Helper()
	s, ok := cfg.Provider.Settings.(*static.Config)
	if !ok {
		t.Fatalf("provider settings are %T, want *static.Config", cfg.Provider.Settings)
	}
	return s
}

func TestDefaultsValidateOnceARangeIsSet(t *testing.T) {
	cfg := config.Defaults()
	if cfg.NodeName == "" {
		// Defaults takes the host name; a host without one is not what
		// this test is about.
		cfg.NodeName = "node-1"
	}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("Defaults without a static range validated")
	}
	if msg := err.Error(); !strings.HasPrefix(msg, "provider.static.ranges:") || strings.Contains(msg, "\n") {
		t.Fatalf("Defaults should miss only the ranges, got:\n%s", msg)
	}
	cfg.Provider = staticRanges("10.0.0.0/24")
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Defaults with a range: %v", err)
	}
}

func TestValidateNamesEveryBadField(t *testing.T) {
	cfg := config.Config{
		NodeName:   "",
		SocketPath: "run/vpcnid.sock",
		StateDir:   "var/lib/vpcni",
		Uplink:     "eth0 with spaces",
		MTU:        100,
		IPFamilies: []family.Family{family.V6, family.V6},
		Datapath:   config.Datapath{Mode: "no-such-mode"},
		Cooldown:   config.Duration{Duration: -time.Second},
		LogLevel:   "verbose",
		SelfHeal:   config.SelfHeal{MinInterval: config.Duration{Duration: -time.Millisecond}},
		Pool:       config.Pool{WarmTarget: -1, BatchSize: -1},
		Provider: config.Provider{Type: "static", Settings: &static.Config{Ranges: []static.Range{
			{CIDR: "10.0.0.0/24"}, // fine
			{CIDR: "10.0.1.7/24", Gateway: "10.9.9.9", Exclude: []string{"10.0.1.5", "bogus", "10.0.1.0/28"}},
			{CIDR: "not-a-cidr"},
			{CIDR: "10.0.0.0/8"},
			{CIDR: "fd00::/32"},
			{CIDR: "fd00:1::/64", Exclude: []string{"fd00:1::5", "10.0.0.9"}}, // an IPv6 range is fine; an IPv4 exclusion in it is not
		}}},
	}
	err := cfg.Validate()
	if err == nil {
		t.Fatal("Validate accepted a config full of bad fields")
	}
	msg := err.Error()
	lines := strings.Split(msg, "\n")
	want := []string{
		"nodeName:",
		"socketPath:",
		"stateDir:",
		"uplink:",
		"mtu:",
		"ipFamilies:",
		"datapath:",
		"cooldown:",
		"resync:",
		"selfHeal.period:",
		"selfHeal.minInterval:",
		"logLevel:",
		"pool.warmTarget:",
		"pool.batchSize:",
		"provider.static.ranges[1].cidr:",
		"provider.static.ranges[1].gateway:",
		"provider.static.ranges[1].exclude[1]:",
		"provider.static.ranges[2].cidr:",
		"provider.static.ranges[3].cidr:",
		"provider.static.ranges[4].cidr:",
		"provider.static.ranges[5].exclude[1]:",
	}
	for _, field := range want {
		found := false
		for _, l := range lines {
			if strings.HasPrefix(l, field) {
				found = true
			}
		}
		if !found {
			t.Errorf("error does not name %s", strings.TrimSuffix(field, ":"))
		}
	}
	for _, good := range []string{"ranges[0]", "exclude[0]", "exclude[2]"} {
		if strings.Contains(msg, good) {
			t.Errorf("error names the valid %s", good)
		}
	}
	if len(lines) != len(want) {
		t.Errorf("%d errors, want %d:\n%s", len(lines), len(want), msg)
	}
	// The messages say what is wrong, not just where.
	for _, hint := range []string{`"no-such-mode"`, "did you mean 10.0.1.0/24", "larger than a /16", `"fd00::/32" is larger than a /64`, `"10.0.0.9" is not of the family of fd00:1::/64`, `"bogus"`, "576..65535", "ipv6 named twice"} {
		if !strings.Contains(msg, hint) {
			t.Errorf("error lacks %q:\n%s", hint, msg)
		}
	}
}

func validConfig() config.Config {
	cfg := config.Defaults()
	cfg.NodeName = "node-1"
	cfg.Provider = staticRanges("10.0.0.0/24")
	return cfg
}

func TestValidateSingleFields(t *testing.T) {
	for _, tc := range []struct {
		field  string
		mutate func(*config.Config)
	}{
		{"socketPath", func(c *config.Config) { c.SocketPath = "/" + strings.Repeat("s", 107) }},
		{"uplink", func(c *config.Config) { c.Uplink = "a-very-long-ifname" }},
		{"mtu", func(c *config.Config) { c.MTU = 65536 }},
		{"cooldown", func(c *config.Config) { c.Cooldown.Duration = time.Hour + time.Second }},
		{"provider.type", func(c *config.Config) { c.Provider.Type = "gcp" }},
		{"provider.static.ranges", func(c *config.Config) { c.Provider.Settings = &static.Config{} }},
		{"kubernetes.ipResource", func(c *config.Config) { c.Kubernetes.IPResource = "yes" }},
		{"kubernetes.notReadyTaint", func(c *config.Config) { c.Kubernetes.NotReadyTaint = "true" }},
	} {
		cfg := validConfig()
		tc.mutate(&cfg)
		err := cfg.Validate()
		if err == nil || !strings.HasPrefix(err.Error(), tc.field+":") {
			t.Errorf("%s: Validate = %v, want an error naming %s", tc.field, err, tc.field)
		}
	}
	// Edges that are allowed.
	cfg := validConfig()
	cfg.MTU, cfg.Cooldown.Duration, cfg.Pool.WarmTarget, cfg.Uplink = 576, 0, 0, "eth0"
	cfg.Kubernetes.IPResource, cfg.Kubernetes.NotReadyTaint = "off", "on"
	staticOf(t, cfg).Ranges[0] = static.Range{CIDR: "10.0.0.0/16", Gateway: "10.0.255.254", Exclude: []string{"10.0.0.5", "10.0.1.0/24"}}
	if err := cfg.Validate(); err != nil {
		t.Errorf("edge values rejected: %v", err)
	}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadYAML(t *testing.T) {
	p := writeFile(t, "vpcnid.yaml", `
nodeName: node-7
cooldown: 45s
logLevel: debug
pool:
  warmTarget: 3
provider:
  type: static
  static:
    ranges:
      - cidr: 10.20.0.0/24
        gateway: 10.20.0.254
        exclude: [10.20.0.5, 10.20.0.16/28]
`)
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != "node-7" || cfg.LogLevel != "debug" {
		t.Errorf("nodeName %q logLevel %q", cfg.NodeName, cfg.LogLevel)
	}
	if cfg.Cooldown.Duration != 45*time.Second {
		t.Errorf("cooldown = %s, want 45s", cfg.Cooldown)
	}
	if cfg.Pool.WarmTarget != 3 {
		t.Errorf("warmTarget = %d, want 3", cfg.Pool.WarmTarget)
	}
	// Fields the file omits keep their defaults, even inside a section the
	// file sets.
	d := config.Defaults()
	if cfg.Pool.BatchSize != d.Pool.BatchSize || cfg.SocketPath != d.SocketPath || cfg.StateDir != d.StateDir || cfg.Datapath.Mode != d.Datapath.Mode {
		t.Errorf("defaults lost: %+v", cfg)
	}
	want := static.Range{CIDR: "10.20.0.0/24", Gateway: "10.20.0.254", Exclude: []string{"10.20.0.5", "10.20.0.16/28"}}
	if s := staticOf(t, cfg); len(s.Ranges) != 1 ||
		s.Ranges[0].CIDR != want.CIDR || s.Ranges[0].Gateway != want.Gateway ||
		strings.Join(s.Ranges[0].Exclude, ",") != strings.Join(want.Exclude, ",") {
		t.Errorf("ranges = %+v, want [%+v]", s, want)
	}
}

// A file written for the fixed batches (pool.batchSize 8, once the
// default) still loads: its batchSize bounds each call; left out, calls
// are unbounded.
func TestLoadPoolBatchSize(t *testing.T) {
	for _, tc := range []struct {
		file string
		want int
	}{
		{"pool: {warmTarget: 8, batchSize: 8}\n", 8},
		{"pool: {warmTarget: 8}\n", 0},
		{"pool: {batchSize: 0}\n", 0},
	} {
		p := writeFile(t, "vpcnid.yaml", "nodeName: n\nprovider: {static: {ranges: [{cidr: 10.0.0.0/24}]}}\n"+tc.file)
		cfg, err := config.Load(p)
		if err != nil {
			t.Fatalf("%q: %v", tc.file, err)
		}
		if cfg.Pool.BatchSize != tc.want {
			t.Errorf("%q: batchSize = %d, want %d", tc.file, cfg.Pool.BatchSize, tc.want)
		}
	}
}

func TestLoadCooldownInSeconds(t *testing.T) {
	p := writeFile(t, "vpcnid.yaml", "nodeName: n\ncooldown: 90\nprovider: {static: {ranges: [{cidr: 10.0.0.0/24}]}}\n")
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Cooldown.Duration != 90*time.Second {
		t.Errorf("cooldown = %s, want 1m30s", cfg.Cooldown)
	}
}

func TestLoadRejectsUnknownFields(t *testing.T) {
	for _, tc := range []struct{ yaml, field string }{
		{"nodeName: n\ncooldwn: 10s\n", "cooldwn"},
		{"nodeName: n\npool:\n  warmTarget: 2\n  batchSizes: 4\n", "batchSizes"},
		{"nodeName: n\nprovider:\n  static:\n    ranges:\n      - cidr: 10.0.0.0/24\n        gw: 10.0.0.1\n", "gw"},
	} {
		_, err := config.Load(writeFile(t, "vpcnid.yaml", tc.yaml))
		if err == nil {
			t.Errorf("Load accepted the unknown field %q", tc.field)
			continue
		}
		if !strings.Contains(err.Error(), `"`+tc.field+`"`) {
			t.Errorf("error for unknown field %q does not name it: %v", tc.field, err)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "nope.yaml")
	if _, err := config.Load(missing); err == nil || !os.IsNotExist(unwrapAll(err)) {
		t.Errorf("Load of a missing file = %v, want a not-exist error", err)
	}
	p := writeFile(t, "bad.yaml", "nodeName: n\nmtu: 12\nprovider: {static: {ranges: [{cidr: 10.0.0.0/24}]}}\n")
	_, err := config.Load(p)
	if err == nil || !strings.Contains(err.Error(), p) || !strings.Contains(err.Error(), "mtu:") {
		t.Errorf("Load of an invalid config = %v, want an error naming the file and mtu", err)
	}
	p = writeFile(t, "bad.yaml", "cooldown: soon\n")
	if _, err := config.Load(p); err == nil || !strings.Contains(err.Error(), "soon") {
		t.Errorf("Load with cooldown: soon = %v, want an error quoting it", err)
	}
}

func unwrapAll(err error) error {
	for {
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return err
		}
		err = u.Unwrap()
	}
}

func TestDurationJSON(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
	}{
		{`"45s"`, 45 * time.Second},
		{`"1m30s"`, 90 * time.Second},
		{`"250ms"`, 250 * time.Millisecond},
		{`45`, 45 * time.Second},
		{`0`, 0},
		{`1.5`, 1500 * time.Millisecond},
	} {
		var d config.Duration
		if err := json.Unmarshal([]byte(tc.in), &d); err != nil {
			t.Errorf("%s: %v", tc.in, err)
			continue
		}
		if d.Duration != tc.want {
			t.Errorf("%s = %s, want %s", tc.in, d.Duration, tc.want)
		}
	}
	for _, bad := range []string{`"45"`, `"soon"`, `true`, `[1]`, `{}`} {
		var d config.Duration
		if err := json.Unmarshal([]byte(bad), &d); err == nil {
			t.Errorf("%s decoded to %s, want an error", bad, d.Duration)
		}
	}
	b, err := json.Marshal(config.Duration{Duration: 90 * time.Second})
	if err != nil || string(b) != `"1m30s"` {
		t.Errorf("Marshal = %s, %v; want \"1m30s\"", b, err)
	}
	var back config.Duration
	if err := json.Unmarshal(b, &back); err != nil || back.Duration != 90*time.Second {
		t.Errorf("round trip = %s, %v", back.Duration, err)
	}
}

func TestParseAddrOrPrefix(t *testing.T) {
	for in, want := range map[string]string{
		"10.0.0.5":     "10.0.0.5/32",
		"10.0.0.0/28":  "10.0.0.0/28",
		"10.0.0.13/28": "10.0.0.0/28", // host bits dropped
	} {
		p, err := static.ParseAddrOrPrefix(in)
		if err != nil || p.String() != want {
			t.Errorf("ParseAddrOrPrefix(%q) = %s, %v; want %s", in, p, err, want)
		}
	}
	for _, bad := range []string{"", "10.0.0", "10.0.0.0/33", "host.example"} {
		if p, err := static.ParseAddrOrPrefix(bad); err == nil {
			t.Errorf("ParseAddrOrPrefix(%q) = %s, want an error", bad, p)
		}
	}
}

func TestLoadEmptyNodeNameMeansHostName(t *testing.T) {
	host, err := os.Hostname()
	if err != nil || host == "" {
		t.Skip("this machine has no host name")
	}
	p := writeFile(t, "vpcnid.yaml", "nodeName: \"\"\nprovider: {static: {ranges: [{cidr: 10.0.0.0/24}]}}\n")
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.NodeName != host {
		t.Errorf("nodeName = %q, want the host name %q", cfg.NodeName, host)
	}
}

// metricsAddr takes the node's address from the environment (the
// DaemonSet sets VPCNI_HOST_IP from status.hostIP); a variable that is not
// set is refused, naming it, rather than leaving ":9695", every address.
func TestLoadMetricsAddrFromEnv(t *testing.T) {
	p := writeFile(t, "vpcnid.yaml", "metricsAddr: ${VPCNI_TEST_HOST_IP}:9695\nprovider: {static: {ranges: [{cidr: 10.0.0.0/24}]}}\n")
	t.Setenv("VPCNI_TEST_HOST_IP", "192.0.2.7")
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.MetricsAddr != "192.0.2.7:9695" {
		t.Errorf("metricsAddr = %q, want 192.0.2.7:9695", cfg.MetricsAddr)
	}
	t.Setenv("VPCNI_TEST_HOST_IP", "")
	_, err = config.Load(p)
	if err == nil || !strings.Contains(err.Error(), "metricsAddr") || !strings.Contains(err.Error(), "$VPCNI_TEST_HOST_IP, which is not set") {
		t.Errorf("metricsAddr with its variable unset: want an error naming metricsAddr and the variable, got %v", err)
	}
}

// The sections belong to their packages: the file names one provider and
// one mode, a section for another is refused (it would be ignored), each
// section is read strictly, and both write back as they were read.
func TestSections(t *testing.T) {
	cfg, err := config.Load(writeFile(t, "vpcnid.yaml", `
nodeName: n
datapath:
  mode: veth
  veth: {garp: false}
provider:
  type: openstack
  openstack: {endpoint: "http://127.0.0.1:9696/", subnetID: s1, maxAddresses: 12}
`))
	if err != nil {
		t.Fatal(err)
	}
	os, ok := cfg.Provider.Settings.(*openstack.Config)
	if !ok || os.SubnetID != "s1" || os.MaxAddresses != 12 || os.Mode != "fixed-ips" {
		t.Fatalf("openstack section = %+v (defaults filled?)", cfg.Provider.Settings)
	}
	v, ok := cfg.Datapath.Settings.(*veth.Settings)
	if !ok || v.GARP == nil || *v.GARP {
		t.Fatalf("veth section = %+v, want garp false", cfg.Datapath.Settings)
	}
	// The short form picks the mode with its defaults.
	cfg, err = config.Load(writeFile(t, "vpcnid.yaml", "nodeName: n\ndatapath: veth\nprovider: {static: {ranges: [{cidr: 10.0.0.0/24}]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := cfg.Datapath.Settings.(*veth.Settings); !ok || v.GARP == nil || !*v.GARP {
		t.Fatalf("datapath: veth gave %+v, want veth's defaults", cfg.Datapath.Settings)
	}
	// What the config writes loads again to the same thing; a mode with
	// nothing but its defaults is written in the short form.
	data, err := json.Marshal(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(data), `"datapath":"veth"`) {
		t.Errorf("defaults-only datapath written as %s, want the short form", data)
	}
	off := false
	long := config.Datapath{Mode: "veth", Settings: &veth.Settings{GARP: &off}}
	if b, _ := json.Marshal(long); string(b) != `{"mode":"veth","veth":{"garp":false}}` {
		t.Errorf("a datapath with its own settings written as %s", b)
	}
	again, err := config.Load(writeFile(t, "again.json", string(data)))
	if err != nil {
		t.Fatalf("load what Marshal wrote (%s): %v", data, err)
	}
	if staticOf(t, again).Ranges[0].CIDR != "10.0.0.0/24" || again.Datapath.Mode != "veth" {
		t.Fatalf("round trip lost the sections: %s", data)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"nodeName: n\nprovider: {type: static, openstack: {subnetID: x}}\n", `section "openstack" is for another type`},
		{"nodeName: n\nprovider: {type: static, static: {ranges: [{cidr: 10.0.0.0/24}], extra: 1}}\n", `"extra"`},
		{"nodeName: n\ndatapath: {mode: veth, veth: {garp: true, arp: 1}}\nprovider: {static: {ranges: [{cidr: 10.0.0.0/24}]}}\n", `"arp"`},
		{"nodeName: n\nprovider: {type: openstack, openstack: {subnetID: x, maxAddresses: 0, endpoint: ftp://x}}\n", "provider.openstack.endpoint:"},
		{"nodeName: n\ndatapath: {mode: no-such-mode}\nprovider: {static: {ranges: [{cidr: 10.0.0.0/24}]}}\n", `"no-such-mode" is not a datapath mode this build knows (known: [`},
	} {
		_, err := config.Load(writeFile(t, "vpcnid.yaml", tc.yaml))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: Load = %v, want an error with %s", tc.yaml, err, tc.want)
		}
	}
}

// ipFamilies reads as written, in order; left out it is IPv4 alone.
func TestLoadIPFamilies(t *testing.T) {
	for _, tc := range []struct {
		file string
		want []family.Family
		bad  string
	}{
		{"", []family.Family{family.V4}, ""},
		{"ipFamilies: [ipv6]\n", []family.Family{family.V6}, ""},
		{"ipFamilies: [ipv6, ipv4]\n", []family.Family{family.V6, family.V4}, ""},
		{"ipFamilies: []\n", []family.Family{family.V4}, ""},
		{"ipFamilies: [ipv4, ipv4]\n", nil, "ipFamilies: address family ipv4 named twice"},
		{"ipFamilies: [ip6]\n", nil, `unknown address family "ip6"`},
	} {
		p := writeFile(t, "vpcnid.yaml", "nodeName: n\nprovider: {static: {ranges: [{cidr: 10.0.0.0/24}]}}\n"+tc.file)
		cfg, err := config.Load(p)
		if tc.bad != "" {
			if err == nil || !strings.Contains(err.Error(), tc.bad) {
				t.Errorf("%q: error %v, want %q", tc.file, err, tc.bad)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%q: %v", tc.file, err)
		}
		if got := cfg.Families(); family.Join(got) != family.Join(tc.want) {
			t.Errorf("%q: families %v, want %v", tc.file, got, tc.want)
		}
	}
}
