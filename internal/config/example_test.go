package config

import "testing"

// The example shipped in deploy/ must load as it is.
func TestShippedExampleLoads(t *testing.T) {
	cfg, err := Load("../../deploy/examples/vpcnid.yaml")
	if err != nil {
		t.Fatalf("deploy/examples/vpcnid.yaml: %v", err)
	}
	if cfg.Provider.Static == nil || len(cfg.Provider.Static.Ranges) != 1 || cfg.Cooldown.Seconds() != 30 {
		t.Fatalf("example loaded wrong: %+v", cfg)
	}
}
