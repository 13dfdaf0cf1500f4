package config_test

import (
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/config"
)

// The snat section: off by default; on, it needs the VPC's CIDRs, and every
// bad CIDR is named from the top of the file, with the others' errors.
func TestSNATSection(t *testing.T) {
	if d := config.Defaults(); d.SNATOn() {
		t.Fatal("SNAT is on by default; it must be off (OpenStack's router SNATs the subnet)")
	}
	p := writeFile(t, "vpcnid.yaml", `
nodeName: n1
mtu: 99
snat:
  enabled: true
  excludeCIDRs: [192.168.7.1/24, 100.64.0.0/10]
provider: {type: static, static: {ranges: [{cidr: 10.20.0.0/24}]}}
`)
	_, err := config.Load(p)
	if err == nil {
		t.Fatal("snat enabled without vpcCIDRs loaded")
	}
	for _, want := range []string{"mtu: 99", "snat.vpcCIDRs: must list", `snat.excludeCIDRs[0]: "192.168.7.1/24" has host bits set (did you mean 192.168.7.0/24?)`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error lacks %q:\n%v", want, err)
		}
	}
	p = writeFile(t, "ok.yaml", `
nodeName: n1
snat: {enabled: true, vpcCIDRs: [10.20.0.0/16], excludeCIDRs: [100.64.0.0/10]}
provider: {type: static, static: {ranges: [{cidr: 10.20.0.0/24}]}}
`)
	cfg, err := config.Load(p)
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.SNATOn() || len(cfg.SNAT.VPCCIDRs) != 1 || cfg.SNAT.VPCCIDRs[0].String() != "10.20.0.0/16" || cfg.SNAT.ExcludeCIDRs[0].String() != "100.64.0.0/10" {
		t.Errorf("snat = %+v", cfg.SNAT)
	}
	if _, err := config.Load(writeFile(t, "typo.yaml", "nodeName: n1\nsnat: {enable: true}\nprovider: {type: static, static: {ranges: [{cidr: 10.20.0.0/24}]}}\n")); err == nil || !strings.Contains(err.Error(), "enable") {
		t.Errorf("a misspelt snat field loaded: %v", err)
	}
}

// With provider aws SNAT is on unless the file says otherwise, and needs
// no vpcCIDRs: the provider reports the VPC's (from IMDS).
func TestSNATOnByDefaultForAWS(t *testing.T) {
	cfg, err := config.Load(writeFile(t, "aws.yaml", "nodeName: n1\nprovider: {type: aws}\nsnat: {excludeCIDRs: [192.168.0.0/16]}\n"))
	if err != nil || !cfg.SNATOn() {
		t.Fatalf("aws without a snat.enabled: on %v, %v; want on", cfg.SNATOn(), err)
	}
	cfg, err = config.Load(writeFile(t, "off.yaml", "nodeName: n1\nprovider: {type: aws}\nsnat: {enabled: false}\n"))
	if err != nil || cfg.SNATOn() {
		t.Fatalf("aws with snat.enabled false: on %v, %v; want off", cfg.SNATOn(), err)
	}
	cfg, err = config.Load(writeFile(t, "static.yaml", "nodeName: n1\nprovider: {type: static, static: {ranges: [{cidr: 10.20.0.0/24}]}}\n"))
	if err != nil || cfg.SNATOn() {
		t.Fatalf("static without a snat section: on %v, %v; want off", cfg.SNATOn(), err)
	}
}
