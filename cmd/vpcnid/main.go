// Command vpcnid is the vpcni node agent. See internal/agent.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/vpcni/vpcni/internal/agent"
	_ "github.com/vpcni/vpcni/internal/builtin" // every mode and provider
	"github.com/vpcni/vpcni/internal/cniinstall"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/k8s/nodeside"
)

var (
	version                                   = "dev"
	installConflist, cniConfDir, conflistName string
)

func main() {
	configPath, showVersion := registerFlags(flag.CommandLine)
	flag.Parse()
	if *showVersion {
		fmt.Println("vpcnid", version)
		return
	}
	if err := run(*configPath); err != nil {
		slog.Error("vpcnid stopped", "err", err)
		os.Exit(1)
	}
}

// registerFlags puts vpcnid's flags on fs: main's command line, and the
// test that holds docs/configuration.md to them.
func registerFlags(fs *flag.FlagSet) (configPath *string, showVersion *bool) {
	configPath = fs.String("config", "/etc/vpcni/vpcnid.yaml", "agent configuration file (YAML or JSON)")
	showVersion = fs.Bool("version", false, "print the version and exit")
	fs.StringVar(&installConflist, "install-conflist", "", "once serving, install this CNI network configuration list into -cni-conf-dir (the node turns Ready then)")
	fs.StringVar(&cniConfDir, "cni-conf-dir", "/host/etc/cni/net.d", "the runtime's CNI conf dir, for -install-conflist")
	fs.StringVar(&conflistName, "conflist-name", cniinstall.DefaultName, "the file name -install-conflist takes in -cni-conf-dir: the runtime uses the first by name, so it must sort before any other CNI's; vpcni's own lists under other names there are deleted")
	return configPath, showVersion
}

func run(configPath string) error {
	// shadowed, with the cluster on, puts an Event on the Node when
	// another network configuration shadows vpcni's.
	var shadowed func(ours string, before []string)
	cfg, err := config.Load(configPath)
	if err != nil {
		return err
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	slog.SetDefault(log)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()

	a, err := agent.New(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer a.Close()
	sock, err := agent.OpenSocket(cfg.SocketPath)
	if err != nil {
		return err
	}
	if cfg.MetricsAddr != "" {
		addr, err := a.Metrics().Serve(ctx, cfg.MetricsAddr)
		if err != nil {
			return fmt.Errorf("metrics on %s: %w", cfg.MetricsAddr, err)
		}
		log.Info("metrics", "addr", "http://"+addr.String()+"/metrics")
	}
	if cfg.Kubernetes.Enabled() {
		rc, err := k8s.RestConfig(cfg.Kubernetes.Kubeconfig)
		if err != nil {
			return fmt.Errorf("kubernetes (mode %q; set kubernetes.mode: off to run without): %w", cfg.Kubernetes.Mode, err)
		}
		node, err := nodeside.New(rc, cfg.NodeName, a, log, nodeside.Options{
			IPResource: config.On(cfg.Kubernetes.IPResource), NotReadyTaint: config.On(cfg.Kubernetes.NotReadyTaint)})
		if err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
		a.SetCluster(node)
		shadowed = node.ConflistShadowed
		// Addresses that follow StatefulSet pods (AddressReservations).
		res, err := nodeside.NewReservations(rc)
		if err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
		a.SetReservations(res)
		go res.Run(ctx)
		// The PodNetworks, and which one each pod of the node is on.
		pns, err := nodeside.NewPodNetworks(rc, node)
		if err != nil {
			return fmt.Errorf("kubernetes: %w", err)
		}
		a.SetPodNetworks(pns)
		go pns.Run(ctx)
		nodeDone := make(chan struct{})
		go func() { node.Run(ctx); close(nodeDone) }()
		// The store closes only after the Kubernetes side stopped using it.
		defer func() {
			select {
			case <-nodeDone:
			case <-time.After(10 * time.Second):
				log.Warn("the Kubernetes side did not stop within 10s")
			}
		}()
	}
	srv := &http.Server{Handler: a.Handler(), ReadHeaderTimeout: 5 * time.Second}
	// The store closes (deferred above) only after Run has stopped using it.
	runDone := make(chan struct{})
	go func() { a.Run(ctx); close(runDone) }()
	defer func() { stop(); <-runDone }()
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(sock) }()
	log.Info("vpcnid ready", "version", version, "node", cfg.NodeName, "socket", cfg.SocketPath, "provider", cfg.Provider.Type)
	if installConflist != "" {
		if _, err := cniinstall.Conflist(installConflist, cniConfDir, conflistName); err != nil {
			return err
		}
		log.Info("CNI network configuration installed", "file", filepath.Join(cniConfDir, conflistName))
		tellConfDir(log, cniConfDir, conflistName, shadowed)
	}

	select {
	case <-ctx.Done():
	case err := <-errc:
		os.Remove(cfg.SocketPath)
		return fmt.Errorf("serve %s: %w", cfg.SocketPath, err)
	}
	// Every request already on the socket is answered: Drain takes the
	// socket's path away and accepts what is queued (a plain close would
	// reset it), then Shutdown waits for the answers.
	shutdown, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sock.Drain(shutdown); err != nil {
		log.Warn("socket not drained; requests still queued on it are reset", "err", err)
	}
	err = srv.Shutdown(shutdown)
	log.Info("vpcnid stopped; pods keep running")
	return err
}
