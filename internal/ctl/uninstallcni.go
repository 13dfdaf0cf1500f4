package ctl

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/vpcni/vpcni/internal/cniinstall"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/snat"
)

// uninstallCNI undoes install-cni: the conflist goes first (the runtime
// stops sending new pods to vpcni), then the plugin; with --agent-config
// vpcni's SNAT table is deleted and the datapath mode of that config gives
// the node back what it changed (bridge mode: the uplink's addresses,
// routes, neighbours and MTU).
// Idempotent: what is already gone is fine.
func uninstallCNI(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("uninstall-cni", flag.ContinueOnError)
	binDir := fs.String("bin-dir", "/host/opt/cni/bin", "the runtime's CNI bin dir")
	confDir := fs.String("conf-dir", "/host/etc/cni/net.d", "the runtime's CNI conf dir")
	name := fs.String("name", cniinstall.DefaultName, "the conflist's file name in the conf dir")
	agentConfig := fs.String("agent-config", "", "also undo what the datapath mode of this vpcnid config changed on the node (the agent must be stopped)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	for _, f := range []string{filepath.Join(*confDir, *name), filepath.Join(*binDir, "vpcni")} {
		if err := removeFile(f, out); err != nil {
			return err
		}
	}
	if *agentConfig == "" {
		return nil
	}
	cfg, err := config.Load(*agentConfig)
	if err != nil {
		return err
	}
	mode, err := datapath.Lookup(cfg.Datapath.Mode)
	if err != nil {
		return err
	}
	// A running agent would take the node over again at its next start or
	// repair: it must be stopped for good first.
	if c, err := net.DialTimeout("unix", cfg.SocketPath, time.Second); err == nil {
		c.Close()
		return fmt.Errorf("vpcnid still serves on %s: stop it before undoing what it changed on the node", cfg.SocketPath)
	}
	// The SNAT table goes whatever the config says now: an earlier one may
	// have had SNAT on.
	if err := snat.Remove(context.Background()); err != nil {
		return fmt.Errorf("undo SNAT: %w", err)
	}
	if mode.Uninstall == nil {
		fmt.Fprintf(out, "datapath %s changed nothing on the node to undo\n", cfg.Datapath.Mode)
		return nil
	}
	if err := mode.Uninstall(datapath.Node{Uplink: cfg.Uplink, MTU: cfg.MTU}, cfg.Datapath.Settings); err != nil {
		return fmt.Errorf("undo datapath %s on the node: %w", cfg.Datapath.Mode, err)
	}
	fmt.Fprintf(out, "node given back by datapath %s\n", cfg.Datapath.Mode)
	return nil
}

func removeFile(path string, out io.Writer) error {
	err := os.Remove(path)
	switch {
	case err == nil:
		fmt.Fprintf(out, "removed %s\n", path)
	case errors.Is(err, fs.ErrNotExist):
	default:
		return err
	}
	return nil
}
