// Command vpcni-controller runs vpcni's cluster-wide reconcilers, one
// active replica at a time (a Lease elects the leader): releasing the
// addresses of pods that are gone while their node's agent missed the DEL
// (see internal/controller); with -block-ranges, assigning per-node blocks of
// those ranges to the nodes that ask (NodeBlocks) and taking back the
// blocks of nodes gone for good; keeping the AddressReservations of sticky
// StatefulSet pods. With -cloud-config (a cloud's section: openstack, for
// Neutron, or aws, for EC2) also: floating IPs for pods (openstack), a
// sticky pod's address taken off a dead node's port or ENI, the leak
// collector (internal/leaks) and, with a routes section (openstack), each
// block routed through the cloud's router (one extra route and one
// VM-port pair per block, within max_routes). The cloud is the one
// the file's section names, among those internal/builtin/clouds links;
// each reconciler talks to it through an interface of its own. Every
// replica, leader or not, also serves the mutating admission webhook that
// makes pods on the pod network request one vpcni.io/ip, with a
// certificate it mints and rotates itself.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"

	_ "github.com/vpcni/vpcni/internal/builtin/clouds" // the clouds a -cloud-config may name
	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/controller"
	"github.com/vpcni/vpcni/internal/ipam"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/leaks"
	"github.com/vpcni/vpcni/internal/routes"
)

var version = "dev"

func main() {
	var o options
	showVersion := o.register(flag.CommandLine)
	flag.Parse()
	o.noteSetFlags(flag.CommandLine)
	if *showVersion {
		fmt.Println("vpcni-controller", version)
		return
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		fmt.Fprintln(os.Stderr, "vpcni-controller: -log-level:", err)
		os.Exit(2)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
	if err := run(o, log); err != nil {
		log.Error("vpcni-controller stopped", "err", err)
		os.Exit(1)
	}
}

// register puts vpcni-controller's flags on fs: main's command line, and
// the test that holds docs/configuration.md to them.
func (o *options) register(fs *flag.FlagSet) (showVersion *bool) {
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig (default: $KUBECONFIG, else the pod's service account)")
	fs.StringVar(&o.namespace, "lease-namespace", envOr("POD_NAMESPACE", "vpcni-system"), "namespace of the leader election Lease")
	fs.StringVar(&o.lease, "lease-name", "vpcni-controller", "name of the leader election Lease")
	fs.StringVar(&o.identity, "id", envOr("POD_NAME", ""), "this replica's identity (default: host name)")
	fs.DurationVar(&o.grace, "release-grace", 30*time.Second, "how long a pod must be gone before its address is released")
	fs.DurationVar(&o.leaseDuration, "lease-duration", 15*time.Second, "leader lease duration")
	fs.StringVar(&o.healthAddr, "health-addr", ":9697", "address of /healthz, /readyz and /metrics (empty: off)")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn, error")
	fs.StringVar(&o.webhookAddr, "webhook-addr", ":9443", "address of the pod admission webhook, HTTPS (empty: off)")
	fs.StringVar(&o.webhookService, "webhook-service", "vpcni-webhook", "the webhook's Service, in -lease-namespace (its certificate names it)")
	fs.StringVar(&o.webhookSecret, "webhook-secret", "vpcni-webhook-cert", "the Secret, in -lease-namespace, holding the webhook's CA and certificate")
	fs.StringVar(&o.webhookConfig, "webhook-config", "vpcni", "the MutatingWebhookConfiguration whose caBundle is kept current")
	fs.DurationVar(&o.certValidity, "cert-validity", 90*24*time.Hour, "lifetime of the webhook's serving certificate (renewed when a third is left; the CA lives four times as long)")
	fs.StringVar(&o.blockRanges, "block-ranges", "", "comma-separated CIDRs, IPv4, IPv6 or both (dual-stack), split into per-node blocks (NodeBlocks) for agents in blocks mode (empty: no blocks)")
	fs.IntVar(&o.blockSize, "block-size", 26, "prefix length of one IPv4 block, e.g. 26 for 64 addresses; when -block-ranges are all IPv6, the IPv6 block's (unless -block-size-v6 is given)")
	fs.IntVar(&o.blockSizeV6, "block-size-v6", 80, "prefix length of one IPv6 block, e.g. 80 (a /64 of -block-ranges holds 65536, the most one family may have) or 120 for a /112")
	fs.DurationVar(&o.stickyGrace, "sticky-dead-node-grace", time.Minute, "how long a Node must be gone or not Ready before the controller takes a sticky pod's address off its port (needs -cloud-config)")
	fs.BoolVar(&o.stickyIPs, "sticky-ips", true, "keep AddressReservations for the pods of StatefulSets annotated vpcni.io/sticky-ip: \"true\" (needs the AddressReservation CRD)")
	fs.DurationVar(&o.blockGrace, "block-reclaim-grace", 5*time.Minute, "how long a Node must be gone before its blocks are given back (once no PodAddress of it uses them)")
	fs.StringVar(&o.cloudConfig, "cloud-config", "", "the cloud, for what only the controller does: YAML with an openstack section (the keys of vpcnid.yaml's provider.openstack): floating IPs for pods and, with openstack.subnetID, a sticky pod's address taken off a dead node's port; with a routes section (routes.routerID) and -block-ranges also the routed pod subnet — or an aws section (region, endpoint, clusterName; the keys of provider.aws allowed): a sticky pod's address taken off a dead node's ENI (empty: none of these)")
	fs.BoolVar(&o.floatingIPs, "floating-ips", true, "with -cloud-config: serve pods' vpcni.io/floating-ip annotations (and detach a gone pod's floating IPs at once); false leaves floating IPs to the leak collector alone")
	fs.BoolVar(&o.leakGC, "leak-gc", true, "with -cloud-config (openstack.subnetID, or aws): release what the cloud holds for vpcni that nothing in the cluster names (Neutron: marked fixed IPs of gone nodes' ports, reservation and NIC ports of gone VMs, floating IPs of gone pods; EC2: the ENIs vpcni created for instances that are no Node) once orphaned for -leak-grace; vpcnictl audit shows the same comparison")
	fs.DurationVar(&o.leakGrace, "leak-grace", 10*time.Minute, "how long a holding must stay orphaned, pass after pass, before the leak collector releases it")
	fs.DurationVar(&o.leakPeriod, "leak-period", time.Minute, "how often the leak collector compares the cloud with the cluster")
	fs.StringVar(&o.clusterID, "cluster-id", "", "this cluster's name in the tags that claim what the leak collector may release (Neutron's vpcni-cluster=<ID>, EC2's vpcni.io/cluster-id; default: the UID of namespace kube-system)")
	fs.StringVar(&o.floatingNetwork, "floating-network", "", "external network (name or ID) pods' floating IPs come from unless a pod's vpcni.io/floating-network says otherwise")
	return fs.Bool("version", false, "print the version and exit")
}

type options struct {
	kubeconfig, namespace, lease, identity, healthAddr, logLevel string
	webhookAddr, webhookService, webhookSecret, webhookConfig    string
	grace, leaseDuration, certValidity, blockGrace               time.Duration
	blockRanges, cloudConfig, floatingNetwork, clusterID         string
	blockSize, blockSizeV6                                       int
	blockSizeV6Set                                               bool
	stickyIPs                                                    bool
	stickyGrace                                                  time.Duration
	leakGC, floatingIPs                                          bool
	leakGrace, leakPeriod                                        time.Duration
}

// blocks reads -block-ranges, -block-size and -block-size-v6 (nil: no
// blocks), naming every problem: the IPv4 blocks, or those of the only
// family, first; the IPv6 blocks second when the ranges are dual-stack.
func (o options) blocks() ([]ipam.Blocks, error) {
	if o.blockRanges == "" {
		return nil, nil
	}
	var v4, v6 []netip.Prefix
	var errs []error
	for _, f := range strings.Split(o.blockRanges, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(f))
		if err != nil {
			errs = append(errs, fmt.Errorf("-block-ranges: %q is not a CIDR", f))
			continue
		}
		if p.Addr().Is4() {
			v4 = append(v4, p)
		} else {
			v6 = append(v6, p)
		}
	}
	var out []ipam.Blocks
	if len(v4) > 0 {
		b, err := ipam.NewBlocks(v4, o.blockSize)
		if err != nil {
			errs = append(errs, fmt.Errorf("-block-ranges (IPv4)/-block-size: %w", err))
		}
		out = append(out, b)
	}
	if len(v6) > 0 {
		// IPv6 only: -block-size is the IPv6 block's, as before dual-stack
		// blocks, unless -block-size-v6 is given.
		bits, flag := o.blockSizeV6, "-block-size-v6"
		if len(v4) == 0 && !o.blockSizeV6Set {
			bits, flag = o.blockSize, "-block-size"
		}
		b, err := ipam.NewBlocks(v6, bits)
		if err != nil {
			errs = append(errs, fmt.Errorf("-block-ranges (IPv6)/%s: %w", flag, err))
		}
		out = append(out, b)
	}
	if o.blockGrace < 0 {
		errs = append(errs, errors.New("-block-reclaim-grace must not be negative"))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return out, nil
}

// noteSetFlags records which flags the command line gave (after Parse).
func (o *options) noteSetFlags(fs *flag.FlagSet) {
	fs.Visit(func(f *flag.Flag) { o.blockSizeV6Set = o.blockSizeV6Set || f.Name == "block-size-v6" })
}

// allRanges are every family's block ranges: the routed pod subnet routes
// the blocks of each (an IPv6 block via its node's IPv6 address).
func allRanges(blocks []ipam.Blocks) []netip.Prefix {
	var out []netip.Prefix
	for _, b := range blocks {
		out = append(out, b.Ranges...)
	}
	return out
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

func run(o options, log *slog.Logger) error {
	if o.grace < 0 || o.leaseDuration < 3*time.Second {
		return errors.New("-release-grace must not be negative and -lease-duration must be at least 3s")
	}
	if o.identity == "" {
		o.identity, _ = os.Hostname()
	}
	blocks, err := o.blocks()
	if err != nil {
		return err
	}
	if o.stickyGrace <= 0 {
		return errors.New("-sticky-dead-node-grace must be positive")
	}
	// -cloud-config: read and checked before leading, so a bad file stops
	// the replica at once. Its cloud serves the floating IPs and the
	// sticky takeover; a routes section, the routed pod subnet.
	var cloud cloudconfig.Cloud
	var routesCfg *routes.Config
	if o.cloudConfig != "" {
		fc, err := cloudconfig.Load(o.cloudConfig)
		if err != nil {
			return err
		}
		cloud = fc.Open(log)
		if fc.HasRoutes() {
			if blocks == nil {
				return errors.New("-cloud-config's routes section routes the nodes' blocks: it needs -block-ranges")
			}
			routesCfg = fc.Routes
		}
	}
	// A sticky pod's address taken off a dead node's port, and the leak
	// collector, which compares the pods' subnet with the cluster, need
	// the section to say where the pods' addresses live
	// (openstack.subnetID; aws: its region).
	podSubnet := cloud != nil && cloud.Info().Subnet
	var stickyCloud controller.StickyCloud
	if podSubnet {
		stickyCloud = cloud
	}
	if o.leakGrace <= 0 || o.leakPeriod <= 0 {
		return errors.New("-leak-grace and -leak-period must be positive (a grace of zero would release on first sight)")
	}
	var leakGC *leaks.Collector
	if o.leakGC && podSubnet {
		leakGC = &leaks.Collector{Grace: o.leakGrace, Period: o.leakPeriod, Log: log.With("reconciler", "leaks")}
	}
	cfg, err := k8s.RestConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	// /healthz fails for a leader that stopped renewing its lease or whose
	// reconciler failed: the kubelet restarts it and another replica leads.
	leaderHealth := leaderelection.NewLeaderHealthzAdaptor(20 * time.Second)
	var runErr atomic.Value
	// The leader's block figures, on /metrics beside /healthz.
	blockMetrics := &controller.BlockMetrics{}
	routeMetrics := &controller.RouteMetrics{}
	var certs *controller.Certs
	if o.webhookAddr != "" {
		certs, err = serveWebhook(ctx, cfg, cs, o, log)
		if err != nil {
			return err
		}
	}
	if o.healthAddr != "" {
		ln, err := net.Listen("tcp", o.healthAddr)
		if err != nil {
			return fmt.Errorf("health endpoint: %w", err)
		}
		mux := http.NewServeMux()
		reg := prometheus.NewRegistry()
		reg.MustRegister(controller.Collectors(blockMetrics, routeMetrics, leakGC)...)
		// The process's own figures, as vpcnid serves them: a controller
		// without blocks or a cloud has no others, and its memory is worth
		// watching either way.
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
			if err := leaderHealth.Check(r); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			if err, _ := runErr.Load().(error); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
			fmt.Fprintln(w, "ok")
		})
		// Ready: the webhook serves a certificate (the Service sends the
		// API server only to replicas that do).
		mux.HandleFunc("/readyz", func(w http.ResponseWriter, r *http.Request) {
			if certs != nil {
				if err := certs.Ready(); err != nil {
					http.Error(w, err.Error(), http.StatusServiceUnavailable)
					return
				}
			}
			fmt.Fprintln(w, "ok")
		})
		srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(ln) }()
		defer srv.Close()
	}
	lock := &resourcelock.LeaseLock{
		LeaseMeta:  metav1.ObjectMeta{Namespace: o.namespace, Name: o.lease},
		Client:     cs.CoordinationV1(),
		LockConfig: resourcelock.ResourceLockConfig{Identity: o.identity},
	}
	log.Info("vpcni-controller starting", "version", version, "id", o.identity, "lease", o.namespace+"/"+o.lease)
	leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
		Lock:            lock,
		WatchDog:        leaderHealth,
		ReleaseOnCancel: true,
		LeaseDuration:   o.leaseDuration,
		RenewDeadline:   o.leaseDuration * 2 / 3,
		RetryPeriod:     o.leaseDuration / 7,
		Name:            "vpcni-controller",
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				log.Info("leading: reconcilers start", "id", o.identity)
				// Each reconciler runs until the lease is lost; one that
				// fails stops the replica (its /healthz says why).
				fail := func(name string, err error) {
					if err != nil && ctx.Err() == nil {
						runErr.Store(fmt.Errorf("%s reconciler: %w", name, err))
						stop()
					}
				}
				var wg sync.WaitGroup
				if blocks != nil {
					wg.Go(func() {
						a, err := controller.NewBlockAssigner(cfg, controller.BlockOptions{Families: blocks, Grace: o.blockGrace}, log)
						if err == nil {
							blockMetrics.Set(a)
							err = a.Run(ctx)
							blockMetrics.Set(nil)
						}
						fail("blocks", err)
					})
				}
				if routesCfg != nil {
					wg.Go(func() {
						r, err := newRouteReconciler(ctx, cfg, cloud, routesCfg, allRanges(blocks), log)
						if err == nil {
							routeMetrics.Set(r)
							err = r.Run(ctx)
							routeMetrics.Set(nil)
						}
						fail("routes", err)
					})
				}
				if o.stickyIPs {
					wg.Go(func() {
						k, err := controller.NewStickyKeeper(cfg, controller.StickyOptions{Cloud: stickyCloud, Grace: o.stickyGrace}, log)
						if err == nil {
							err = k.Run(ctx)
						}
						fail("sticky", err)
					})
				}
				if cloud != nil && o.floatingIPs {
					wg.Go(func() {
						fips, err := cloudconfig.Retry(ctx, log, cloud.FloatingIPs)
						if err == nil {
							var r *controller.FloatingIPs
							if r, err = controller.NewFloatingIPs(cfg, fips, o.floatingNetwork, log); err == nil {
								err = r.Run(ctx)
							}
						}
						fail("floating-ips", err)
					})
				}
				if leakGC != nil {
					wg.Go(func() {
						err := connectLeaks(ctx, cfg, cs, o, leakGC, cloud, routesCfg, allRanges(blocks), log)
						if err == nil {
							err = leakGC.Run(ctx)
						}
						fail("leaks", err)
					})
				}
				orphans, err := controller.NewOrphans(cfg, o.grace, log)
				if err == nil {
					err = orphans.Run(ctx)
				}
				fail("orphans", err)
				wg.Wait()
			},
			OnStoppedLeading: func() {
				log.Info("no longer leading", "id", o.identity)
				// A replica that lost its lease exits, so no two reconcile
				// at once; the Deployment restarts it as a follower.
				stop()
			},
			OnNewLeader: func(id string) {
				if id != o.identity {
					log.Info("following", "leader", id)
				}
			},
		},
	})
	if err, _ := runErr.Load().(error); err != nil {
		return err
	}
	return nil
}

// serveWebhook starts the pod admission webhook on this replica: its
// certificate kept by controller.Certs (shared with the other replicas through
// the Secret), served over HTTPS until ctx ends.
func serveWebhook(ctx context.Context, cfg *rest.Config, cs kubernetes.Interface, o options, log *slog.Logger) (*controller.Certs, error) {
	certs, err := controller.NewCerts(cs, controller.CertOptions{Namespace: o.namespace, Secret: o.webhookSecret, Service: o.webhookService,
		WebhookConfig: o.webhookConfig, Validity: o.certValidity}, log)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	ln, err := net.Listen("tcp", o.webhookAddr)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	mux := http.NewServeMux()
	networks, err := controller.NewPodNetworkCache(cfg, log)
	if err != nil {
		return nil, fmt.Errorf("webhook: %w", err)
	}
	go networks.Run(ctx, cs)
	mux.Handle(controller.WebhookPath, controller.WebhookHandler(log, networks))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second,
		TLSConfig: &tls.Config{MinVersion: tls.VersionTLS12, GetCertificate: certs.GetCertificate}}
	go certs.Run(ctx)
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	go func() { <-ctx.Done(); _ = srv.Close() }()
	log.Info("pod admission webhook", "addr", ln.Addr().String(), "path", controller.WebhookPath, "service", o.namespace+"/"+o.webhookService)
	return certs, nil
}

// connectLeaks logs in to the cloud and gives the leak collector its
// cloud (the pods' subnet, this cluster's ID; with a routed pod subnet
// also its router and block ranges) and its reader of the cluster.
func connectLeaks(ctx context.Context, cfg *rest.Config, cs kubernetes.Interface, o options, c *leaks.Collector, cloud cloudconfig.Cloud, rc *routes.Config, ranges []netip.Prefix, log *slog.Logger) error {
	scope := leaks.Scope{ClusterID: o.clusterID}
	if rc != nil {
		scope.Router, scope.Ranges = rc.RouterID, ranges
	}
	// The cluster's ID first: it is read from the cluster, the login
	// may wait for the cloud.
	if scope.ClusterID == "" {
		var err error
		if scope.ClusterID, err = controller.ClusterID(ctx, cfg); err != nil {
			return err
		}
	}
	held, err := cloudconfig.Retry(ctx, log, func(ctx context.Context) (leaks.Cloud, error) { return cloud.Leaks(ctx, scope) })
	if err != nil {
		return err
	}
	r, err := controller.NewClusterReader(cfg, held.Instance)
	if err != nil {
		return err
	}
	c.Cloud, c.Cluster = held, r.Read
	// What an operator must act on goes on the controller's Lease as an
	// Event (kubectl -n vpcni-system describe lease vpcni-controller).
	events := record.NewBroadcaster()
	events.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events(o.namespace)})
	context.AfterFunc(ctx, events.Shutdown)
	recorder := events.NewRecorder(scheme.Scheme, corev1.EventSource{Component: "vpcni-controller"})
	lease := &corev1.ObjectReference{Kind: "Lease", APIVersion: "coordination.k8s.io/v1", Namespace: o.namespace, Name: o.lease}
	// kubectl describe finds an object's Events by its UID too.
	if l, err := cs.CoordinationV1().Leases(o.namespace).Get(ctx, o.lease, metav1.GetOptions{}); err == nil {
		lease.UID = l.UID
	}
	c.Tell = func(reason, msg string) { recorder.Event(lease, corev1.EventTypeWarning, reason, msg) }
	return nil
}

// newRouteReconciler logs in to the cloud and builds the routed pod
// subnet's reconciler over the block ranges.
func newRouteReconciler(ctx context.Context, cfg *rest.Config, cloud cloudconfig.Cloud, rc *routes.Config, ranges []netip.Prefix, log *slog.Logger) (*controller.RouteReconciler, error) {
	router, err := cloudconfig.Retry(ctx, log, func(ctx context.Context) (routes.Cloud, error) { return cloud.Router(ctx, rc.RouterID) })
	if err != nil {
		return nil, err
	}
	rec, err := routes.New(router, routes.Options{Ranges: ranges, MaxRoutes: rc.MaxRoutes, Probe: rc.Probe.Duration}, log.With("reconciler", "routes"))
	if err != nil {
		return nil, err
	}
	return controller.NewRouteReconciler(cfg, rec, controller.RouteOptions{Resync: rc.Resync.Duration}, log)
}
