package config_test

import (
	"testing"
	"time"

	_ "github.com/vpcni/vpcni/internal/builtin"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/provider/static"
)

// The example shipped in deploy/ must load as it is.
func TestShippedExampleLoads(t *testing.T) {
	cfg, err := config.Load("../../deploy/examples/vpcnid.yaml")
	if err != nil {
		t.Fatalf("deploy/examples/vpcnid.yaml: %v", err)
	}
	if s, ok := cfg.Provider.Settings.(*static.Config); !ok || len(s.Ranges) != 1 || cfg.Cooldown.Seconds() != 30 || cfg.Datapath.Mode != "veth" {
		t.Fatalf("example loaded wrong: %+v", cfg)
	}
}

// The blocks example loads: one configuration for every node.
func TestShippedBlocksExampleLoads(t *testing.T) {
	cfg, err := config.Load("../../deploy/examples/vpcnid-blocks.yaml")
	if err != nil {
		t.Fatalf("deploy/examples/vpcnid-blocks.yaml: %v", err)
	}
	if s, ok := cfg.Provider.Settings.(*static.Config); !ok || s.Blocks == nil || s.Blocks.WaitDuration() != 10*time.Second || cfg.Kubernetes.Mode != "on" {
		t.Fatalf("example loaded wrong: %+v", cfg)
	}
}
