// Package scale is `make bench-scale`: vpcni-controller at 1,000 nodes
// and 30,000 pods, by simulation. The parts that matter are real: etcd and
// kube-apiserver (internal/testbed/apiserver, on ports and a state dir of
// their own), the vpcni-controller binary as its service account with
// deploy/rbac.yaml, its pod admission webhook called by the API server
// for every pod (deploy/webhook.yaml's configuration), per-node blocks,
// the routed pod subnet on a router with Neutron's default budget, and
// the leak collector, all on the lab's Neutron-compatible endpoint. The
// nodes and their pods are kwok's (sigs.k8s.io/kwok, scripts/kwok.sh):
// Nodes that turn Ready and renew their Leases as kubelets do, pods that
// go Running. What a node's agent writes to the API server is written
// here for it: the Node's request for a block, then one PodAddress per
// pod, with an address of the node's block.
//
// It prints what it measured and ends with the summary line
//
//	scale: nodes=N pods=P webhook_p99_ms=… blocks_all_s=… leak_pass_s=… controller_rss_mb=… apiserver_qps=…
//
// VPCNI_SCALE_NODES, VPCNI_SCALE_PODS and VPCNI_SCALE_RATE (pods created
// per second) size the run; VPCNI_KWOK is the kwok binary, VPCNI_BIN the
// directory of vpcni-controller.
package scale

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	flowcontrolv1 "k8s.io/api/flowcontrol/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/pager"
	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/k8s/nodeblocks"
	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

// The bench's own state dir and loopback ports: no other fixture's.
const (
	stateDir    = "/var/tmp/vpcni-scale"
	apiPort     = 26493
	etcdPort    = 22429
	webhookAddr = "127.0.0.1:29443"
	healthAddr  = "127.0.0.1:29698"
	namespace   = "vpcni-system"
	podNS       = "scale"
	blockRange  = "10.64.0.0/14" // 4,096 blocks of /26
	blockBits   = 26
)

func envInt(t *testing.T, k string, def int) int {
	v := os.Getenv(k)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive number", k, v)
	}
	return n
}

func TestScale(t *testing.T) {
	if os.Getenv("VPCNI_SCALE") != "1" {
		t.Skip("vpcni-test: SKIPPED: the 1,000-node simulation runs under make bench-scale only (VPCNI_SCALE=1): minutes of the whole machine")
	}
	nodes := envInt(t, "VPCNI_SCALE_NODES", 1000)
	pods := envInt(t, "VPCNI_SCALE_PODS", 30000)
	podRate := envInt(t, "VPCNI_SCALE_RATE", 50)
	kwokBin, binDir := os.Getenv("VPCNI_KWOK"), os.Getenv("VPCNI_BIN")
	if kwokBin == "" || binDir == "" {
		t.Fatal("VPCNI_KWOK (bash scripts/kwok.sh) and VPCNI_BIN (make build's bin/) must be set: make bench-scale sets both")
	}
	stagesFile := filepath.Join(filepath.Dir(kwokBin), "stages.yaml")
	for _, f := range []string{kwokBin, stagesFile, filepath.Join(binDir, "vpcni-controller")} {
		if _, err := os.Stat(f); err != nil {
			t.Fatal(err)
		}
	}
	ctx := context.Background()
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// An earlier run's leftovers first: they hold the API server's clients.
	for _, p := range []string{"kwok", "vpcni-controller"} {
		if err := apiserver.StopRecorded(stateDir, p); err != nil {
			t.Fatal(err)
		}
	}
	fx, err := apiserver.Start(ctx, apiserver.Options{Dir: filepath.Join(stateDir, "apiserver"), Port: apiPort, EtcdPort: etcdPort,
		CRDs: []string{"../../deploy/vpcni.io_podaddresses.yaml", "../../deploy/vpcni.io_nodeblocks.yaml", "../../deploy/vpcni.io_addressreservations.yaml",
			"../../deploy/vpcni.io_podnetworks.yaml"}})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := fx.Stop(); err != nil {
			t.Errorf("stop the API server: %v", err)
		}
	}()
	fmt.Printf("scale: etcd + kube-apiserver up at %s in %s\n", fx.URL, fx.Started.Round(time.Millisecond))
	cfg := fx.Config
	cfg.QPS, cfg.Burst = 1000, 2000 // the driver plays 1,000 agents: no client-side throttle of its own
	cs := kubernetes.NewForConfigOrDie(cfg)
	if err := fx.Apply(ctx, namespace, "../../deploy/namespace.yaml", "../../deploy/rbac.yaml"); err != nil {
		t.Fatal(err)
	}
	if err := setupWebhook(ctx, cs); err != nil {
		t.Fatal(err)
	}
	if err := setupAccounting(ctx, cs); err != nil {
		t.Fatal(err)
	}
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: podNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	cl, err := newCloud(ctx, nodes)
	if err != nil {
		t.Fatal(err)
	}
	defer cl.close()
	cloudCfg, err := cl.configFile(stateDir)
	if err != nil {
		t.Fatal(err)
	}
	ctlKC, err := fx.KubeconfigAs(stateDir, namespace, "vpcni-controller")
	if err != nil {
		t.Fatal(err)
	}
	kwokKC, err := fx.KubeconfigAs(stateDir, "kube-system", "kwok")
	if err != nil {
		t.Fatal(err)
	}
	// The controller as deploy/blocks runs it, with the cloud: blocks,
	// routes, floating IPs, sticky IPs, orphans and the leak collector,
	// each pass of which is timed (every 20 s here, not a minute, so
	// that passes fall after the last pod).
	leakPeriod := 20 * time.Second
	ctl, err := startProc(stateDir, "vpcni-controller", filepath.Join(binDir, "vpcni-controller"),
		"-kubeconfig", ctlKC, "-id", "scale", "-lease-namespace", namespace,
		"-webhook-addr", webhookAddr, "-health-addr", healthAddr,
		"-release-grace", "30s", "-block-ranges", blockRange, "-block-size", strconv.Itoa(blockBits),
		"-cloud-config", cloudCfg, "-leak-period", leakPeriod.String())
	if err != nil {
		t.Fatal(err)
	}
	defer ctl.stop()
	fail := func(format string, args ...any) {
		t.Helper()
		t.Fatalf(format+"\nvpcni-controller's log (%s):\n%s", append(args, filepath.Join(stateDir, "vpcni-controller.log"), ctl.log(30))...)
	}
	if err := waitFor(ctx, 60*time.Second, func() error {
		if ctl.exited() {
			return errors.New("vpcni-controller exited")
		}
		if err := httpOK("http://" + healthAddr + "/readyz"); err != nil {
			return err
		}
		mwc, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "vpcni", metav1.GetOptions{})
		if err != nil {
			return err
		}
		if len(mwc.Webhooks[0].ClientConfig.CABundle) == 0 {
			return errors.New("no caBundle in the webhook configuration yet")
		}
		return nil
	}); err != nil {
		fail("the controller's webhook is not ready: %v", err)
	}
	kwok, err := startProc(stateDir, "kwok", kwokBin, "--kubeconfig", kwokKC, "--config", stagesFile,
		"--manage-nodes-with-annotation-selector", "kwok.x-k8s.io/node=fake", "--cidr", "100.64.0.0/10",
		"--node-lease-duration-seconds", "40", "--server-address", "")
	if err != nil {
		t.Fatal(err)
	}
	defer kwok.stop()

	m0 := scrape(t, cs)
	cpu0, _ := cpuSeconds(ctl.pid())
	tStart := time.Now()
	var peakRSS atomic.Int64
	stopSampling := sampleRSS(ctl.pid(), &peakRSS)
	defer stopSampling()

	// Nodes: created as a node's registration would, Ready by kwok, each
	// asking for one block as its agent would.
	fmt.Printf("scale: %d nodes, %d pods at %d/s; machine load %s\n", nodes, pods, podRate, loadavg())
	nodeName := func(i int) string { return fmt.Sprintf("kwok-%05d", i) }
	if err := parallel(32, nodes, func(i int) error {
		n := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName(i),
			Labels:      map[string]string{"type": "kwok", corev1.LabelHostname: nodeName(i)},
			Annotations: map[string]string{"kwok.x-k8s.io/node": "fake", v1alpha1.AnnotationBlocksWanted: "1"}},
			Spec: corev1.NodeSpec{ProviderID: "openstack:///" + cl.vms[i]}}
		n, err := cs.CoreV1().Nodes().Create(ctx, n, metav1.CreateOptions{})
		if err != nil {
			return err
		}
		n.Status.Addresses = []corev1.NodeAddress{{Type: corev1.NodeInternalIP, Address: cl.nodeIPs[i].String()}, {Type: corev1.NodeHostName, Address: n.Name}}
		_, err = cs.CoreV1().Nodes().UpdateStatus(ctx, n, metav1.UpdateOptions{})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	nodesCreated := time.Since(tStart)
	nbc, err := nodeblocks.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var blocks map[string]netip.Prefix
	if err := waitFor(ctx, 30*time.Minute, func() error {
		if ctl.exited() {
			return errors.New("vpcni-controller exited")
		}
		var err error
		blocks, _, err = listBlocks(ctx, nbc)
		if err == nil && len(blocks) < nodes {
			err = fmt.Errorf("%d of %d nodes have a block", len(blocks), nodes)
		}
		return err
	}); err != nil {
		fail("blocks: %v", err)
	}
	blocksAll := time.Since(tStart)
	fmt.Printf("scale: %d nodes created in %.1fs; every node has a NodeBlock %.1fs after the first was created\n", nodes, nodesCreated.Seconds(), blocksAll.Seconds())

	// The routes reconciler: every block published (Routed, or waiting
	// for the router's budget with the fix), the router full.
	var states map[string]int
	if err := waitFor(ctx, 10*time.Minute, func() error {
		var err error
		_, states, err = listBlocks(ctx, nbc)
		if err != nil {
			return err
		}
		published := 0
		for _, n := range states {
			published += n
		}
		if published < nodes {
			return fmt.Errorf("%d of %d blocks carry a Routed condition (%v)", published, nodes, states)
		}
		return nil
	}); err != nil {
		fail("routes: %v", err)
	}
	routesAll := time.Since(tStart)
	fmt.Printf("scale: routes: every block's Routed condition written %.1fs after the first node; %v; %d routes on the router (max_routes %d)\n",
		routesAll.Seconds(), states, cl.routes(), cl.srv.MaxRoutes)
	m1 := scrape(t, cs)
	fmt.Printf("scale: the controller's API requests for the nodes' blocks and routes: %s\n", requests(m0, m1, routesAll))

	// Pods: created at podRate through the API server, which calls the
	// webhook for each; then, as the node's agent after its CNI ADD, a
	// PodAddress with an address of the node's block.
	blockOf := make([]netip.Prefix, nodes)
	for i := range nodes {
		blockOf[i] = blocks[nodeName(i)]
	}
	pac, err := k8s.NewPodAddresses(cfg)
	if err != nil {
		t.Fatal(err)
	}
	perNode := make([]atomic.Int32, nodes)
	lim := rate.NewLimiter(rate.Limit(podRate), 1)
	var lat []float64
	var latMu sync.Mutex
	var patched atomic.Int64
	tPods := time.Now()
	if err := parallel(32, pods, func(i int) error {
		if err := lim.Wait(ctx); err != nil {
			return err
		}
		node := i % nodes
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("p-%06d", i), Namespace: podNS},
			Spec: corev1.PodSpec{NodeName: nodeName(node), Containers: []corev1.Container{{Name: "c", Image: "registry.k8s.io/pause:3.10"}},
				Tolerations: []corev1.Toleration{{Key: "kwok.x-k8s.io/node", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule}}}}
		t0 := time.Now()
		created, err := cs.CoreV1().Pods(podNS).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			return fmt.Errorf("pod %s: %w", p.Name, err)
		}
		ms := float64(time.Since(t0).Microseconds()) / 1000
		latMu.Lock()
		lat = append(lat, ms)
		latMu.Unlock()
		if _, ok := created.Spec.Containers[0].Resources.Requests[k8s.IPResource]; ok {
			patched.Add(1)
		}
		k := int(perNode[node].Add(1))
		addr := blockOf[node].Addr()
		for range k {
			addr = addr.Next()
		}
		if !blockOf[node].Contains(addr) {
			return fmt.Errorf("node %d: more pods than its block %s holds", node, blockOf[node])
		}
		pa := k8s.NewPodAddress(v1alpha1.PodAddressSpec{Node: nodeName(node), Address: addr.String(), PodNamespace: podNS, PodName: created.Name,
			PodUID: string(created.UID), ContainerID: "kwok-" + string(created.UID), IfName: "eth0"})
		if err := pac.Create(ctx, pa); err != nil {
			return fmt.Errorf("PodAddress of %s: %w", created.Name, err)
		}
		return nil
	}); err != nil {
		fail("pods: %v", err)
	}
	podsTook := time.Since(tPods)
	m2 := scrape(t, cs)
	slices.Sort(lat)
	fmt.Printf("scale: %d pods and their PodAddresses created in %.1fs (%.0f pods/s); machine load %s\n", pods, podsTook.Seconds(), float64(pods)/podsTook.Seconds(), loadavg())
	if int(patched.Load()) != pods {
		fail("the webhook patched %d of %d pods with a %s request", patched.Load(), pods, k8s.IPResource)
	}
	wh := histogramOf(m2, "apiserver_admission_webhook_admission_duration_seconds", map[string]string{"name": "pods.vpcni.io", "operation": "CREATE"}).
		minus(histogramOf(m1, "apiserver_admission_webhook_admission_duration_seconds", map[string]string{"name": "pods.vpcni.io", "operation": "CREATE"}))
	if int(wh.total()) < pods {
		fail("the API server called the webhook %0.f times for %d pods", wh.total(), pods)
	}
	p50, lo50, hi50 := wh.quantile(0.50)
	p99, lo99, hi99 := wh.quantile(0.99)
	fmt.Printf("scale: webhook, as the API server timed it (%.0f calls): p50 %.1f ms (bucket %g-%g ms), p99 %.1f ms (bucket %g-%g ms); buckets %s\n",
		wh.total(), p50*1000, lo50*1000, hi50*1000, p99*1000, lo99*1000, hi99*1000, wh)
	ctlWH := histogramOf(scrapeController(t), "vpcni_controller_webhook_duration_seconds", nil)
	if ctlWH.total() > 0 {
		c50, _, _ := ctlWH.quantile(0.50)
		c99, _, _ := ctlWH.quantile(0.99)
		fmt.Printf("scale: webhook, as the controller timed its handler (%.0f calls): p50 %.2f ms, p99 %.2f ms\n", ctlWH.total(), c50*1000, c99*1000)
	}
	fmt.Printf("scale: pod creation as the client saw it (webhook included): p50 %.1f ms, p99 %.1f ms, max %.1f ms\n",
		percentile(lat, 0.5), percentile(lat, 0.99), lat[len(lat)-1])
	fmt.Printf("scale: the controller's API requests while the pods came: %s\n", requests(m1, m2, podsTook))

	// The leak collector: passes that begin after the last PodAddress,
	// each over every pod and PodAddress (and the cloud's ports).
	passes0 := leakPasses(scrapeController(t))
	var leakPass float64
	if err := waitFor(ctx, 4*leakPeriod+10*time.Minute, func() error {
		cm := scrapeController(t)
		if n := leakPasses(cm); n < passes0+2 {
			return fmt.Errorf("%v leak passes since the last pod, want 2", n-passes0)
		}
		leakPass = sum(cm, "vpcni_leak_pass_seconds", nil)
		return nil
	}); err != nil {
		fail("leak collector: %v", err)
	}
	cm := scrapeController(t)
	fmt.Printf("scale: leak pass over %d pods, %d PodAddresses, %d nodes' ports: %.2fs; holdings %s\n", pods, pods, nodes, leakPass, holdings(cm))

	// At rest: what 1,000 nodes and 30,000 pods cost the API server when
	// nothing changes (kwok's Lease renewals go on).
	m3 := scrape(t, cs)
	rest := 60 * time.Second
	time.Sleep(rest)
	m4 := scrape(t, cs)
	total := time.Since(tStart)
	cpu1, _ := cpuSeconds(ctl.pid())
	rss, hwm, err := rssKiB(ctl.pid())
	if err != nil {
		fail("the controller's RSS: %v", err)
	}
	fmt.Printf("scale: the controller at rest for %s: %s\n", rest, requests(m3, m4, rest))
	ctlReqs := controllerRequests(m4) - controllerRequests(m0)
	qps := ctlReqs / total.Seconds()
	cmEnd := scrapeController(t)
	fmt.Printf("scale: the controller's Go heap now: %.1f MB in use, %.1f MB from the OS; %.0f goroutines\n",
		sum(cmEnd, "go_memstats_heap_inuse_bytes", nil)/(1<<20), sum(cmEnd, "go_memstats_sys_bytes", nil)/(1<<20), sum(cmEnd, "go_goroutines", nil))
	fmt.Printf("scale: the controller over the whole run (%.0fs): %.0f requests, %.1f/s; all clients %s; CPU %.1fs; RSS now %.1f MB, peak %.1f MB (sampled %.1f MB)\n",
		total.Seconds(), ctlReqs, qps, allRequests(m0, m4, total), cpu1-cpu0, float64(rss)/1024, float64(hwm)/1024, float64(peakRSS.Load())/1024)
	if ctl.exited() || kwok.exited() {
		fail("a process exited during the run (kwok: %v)\nkwok's log:\n%s", kwok.exited(), kwok.log(20))
	}
	fmt.Printf("scale: nodes=%d pods=%d webhook_p99_ms=%.1f blocks_all_s=%.1f leak_pass_s=%.2f controller_rss_mb=%.0f apiserver_qps=%.1f\n",
		nodes, pods, p99*1000, blocksAll.Seconds(), leakPass, float64(hwm)/1024, qps)
}

// setupWebhook installs deploy/webhook.yaml's configuration as it is but
// for where the API server finds the controller: the Service is an
// ExternalName of localhost (no cluster network here) and the port the
// controller's -webhook-addr. The API server still checks the
// certificate for the Service's name, as in a cluster.
func setupWebhook(ctx context.Context, cs kubernetes.Interface) error {
	data, err := os.ReadFile("../../deploy/webhook.yaml")
	if err != nil {
		return err
	}
	_, portText, _ := strings.Cut(webhookAddr, ":")
	port, _ := strconv.Atoi(portText)
	for _, doc := range bytes.Split(data, []byte("\n---")) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal(doc, &tm); err != nil {
			return err
		}
		switch tm.Kind {
		case "Service":
			var svc corev1.Service
			if err := yaml.Unmarshal(doc, &svc); err != nil {
				return err
			}
			svc.Spec = corev1.ServiceSpec{Type: corev1.ServiceTypeExternalName, ExternalName: "localhost"}
			if _, err := cs.CoreV1().Services(namespace).Create(ctx, &svc, metav1.CreateOptions{}); err != nil {
				return err
			}
		case "MutatingWebhookConfiguration":
			var mwc admissionregistrationv1.MutatingWebhookConfiguration
			if err := yaml.Unmarshal(doc, &mwc); err != nil {
				return err
			}
			for i := range mwc.Webhooks {
				mwc.Webhooks[i].ClientConfig.Service.Port = ptr(int32(port))
			}
			if _, err := cs.AdmissionregistrationV1().MutatingWebhookConfigurations().Create(ctx, &mwc, metav1.CreateOptions{}); err != nil {
				return err
			}
		case "Secret":
			var sec corev1.Secret
			if err := yaml.Unmarshal(doc, &sec); err != nil {
				return err
			}
			if _, err := cs.CoreV1().Secrets(namespace).Create(ctx, &sec, metav1.CreateOptions{}); err != nil {
				return err
			}
		}
	}
	return nil
}

func ptr[T any](v T) *T { return &v }

// The API server counts requests by verb and resource, not by client. Its
// priority and fairness does count by FlowSchema, so each client gets
// FlowSchemas of its own, matched first, on the priority level it would
// have had anyway (workload-low for a service account, system for the
// kubelets kwok plays): the controller one per verb, kwok one.
var verbs = []string{"get", "list", "watch", "create", "update", "patch", "delete"}

func setupAccounting(ctx context.Context, cs kubernetes.Interface) error {
	mk := func(name, pl string, prec int32, sa flowcontrolv1.ServiceAccountSubject, vs []string) *flowcontrolv1.FlowSchema {
		return &flowcontrolv1.FlowSchema{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: flowcontrolv1.FlowSchemaSpec{
			PriorityLevelConfiguration: flowcontrolv1.PriorityLevelConfigurationReference{Name: pl},
			MatchingPrecedence:         prec,
			DistinguisherMethod:        &flowcontrolv1.FlowDistinguisherMethod{Type: flowcontrolv1.FlowDistinguisherMethodByUserType},
			Rules: []flowcontrolv1.PolicyRulesWithSubjects{{
				Subjects: []flowcontrolv1.Subject{{Kind: flowcontrolv1.SubjectKindServiceAccount, ServiceAccount: &sa}},
				ResourceRules: []flowcontrolv1.ResourcePolicyRule{{Verbs: vs, APIGroups: []string{"*"}, Resources: []string{"*"},
					ClusterScope: true, Namespaces: []string{"*"}}},
				NonResourceRules: []flowcontrolv1.NonResourcePolicyRule{{Verbs: vs, NonResourceURLs: []string{"*"}}},
			}}}}
	}
	ctlSA := flowcontrolv1.ServiceAccountSubject{Namespace: namespace, Name: "vpcni-controller"}
	var schemas []*flowcontrolv1.FlowSchema
	for _, v := range verbs {
		schemas = append(schemas, mk("scale-controller-"+v, "workload-low", 50, ctlSA, []string{v}))
	}
	schemas = append(schemas, mk("scale-controller-other", "workload-low", 51, ctlSA, []string{"*"}))
	schemas = append(schemas, mk("scale-kwok", "system", 52, flowcontrolv1.ServiceAccountSubject{Namespace: "kube-system", Name: "kwok"}, []string{"*"}))
	for _, s := range schemas {
		if _, err := cs.FlowcontrolV1().FlowSchemas().Create(ctx, s, metav1.CreateOptions{}); err != nil {
			return fmt.Errorf("FlowSchema %s: %w", s.Name, err)
		}
	}
	// kwok plays every kubelet and the node controller: cluster-admin.
	if _, err := cs.CoreV1().ServiceAccounts("kube-system").Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "kwok"}}, metav1.CreateOptions{}); err != nil {
		return err
	}
	_, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "scale-kwok"},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "cluster-admin"},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "kube-system", Name: "kwok"}}}, metav1.CreateOptions{})
	return err
}

func scrape(t *testing.T, cs kubernetes.Interface) []sample {
	t.Helper()
	data, err := cs.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		t.Fatalf("the API server's /metrics: %v", err)
	}
	return parseMetrics(string(data))
}

func scrapeController(t *testing.T) []sample {
	t.Helper()
	resp, err := http.Get("http://" + healthAddr + "/metrics")
	if err != nil {
		t.Fatalf("the controller's /metrics: %v", err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return parseMetrics(b.String())
}

const dispatched = "apiserver_flowcontrol_dispatched_requests_total"

func controllerRequests(ss []sample) float64 {
	t := 0.0
	for _, s := range ss {
		if s.name == dispatched && strings.HasPrefix(s.labels["flow_schema"], "scale-controller-") {
			t += s.value
		}
	}
	return t
}

// requests: the controller's requests between two scrapes, by verb, and
// their rate over d.
func requests(before, after []sample, d time.Duration) string {
	var parts []string
	total := 0.0
	for _, v := range append(slices.Clone(verbs), "other") {
		w := map[string]string{"flow_schema": "scale-controller-" + v}
		n := sum(after, dispatched, w) - sum(before, dispatched, w)
		total += n
		if n > 0 {
			parts = append(parts, fmt.Sprintf("%s %.0f", v, n))
		}
	}
	return fmt.Sprintf("%.0f requests in %.0fs (%.1f/s): %s", total, d.Seconds(), total/d.Seconds(), strings.Join(parts, ", "))
}

// allRequests: every client's requests by FlowSchema (kwok's, the
// controller's, and the driver's, which are the admin's: exempt).
func allRequests(before, after []sample, d time.Duration) string {
	by := map[string]float64{}
	for _, s := range after {
		if s.name == dispatched {
			by[s.labels["flow_schema"]] += s.value
		}
	}
	for _, s := range before {
		if s.name == dispatched {
			by[s.labels["flow_schema"]] -= s.value
		}
	}
	ctl := 0.0
	var parts []string
	for k, v := range by {
		if strings.HasPrefix(k, "scale-controller-") {
			ctl += v
		} else if v > 0 {
			parts = append(parts, fmt.Sprintf("%s %.1f/s", k, v/d.Seconds()))
		}
	}
	slices.Sort(parts)
	return fmt.Sprintf("vpcni-controller %.1f/s, %s", ctl/d.Seconds(), strings.Join(parts, ", "))
}

func leakPasses(ss []sample) float64 {
	return sum(ss, "vpcni_leak_passes_total", map[string]string{"result": "ok"})
}

func holdings(ss []sample) string {
	var parts []string
	for _, s := range ss {
		if s.name == "vpcni_leak_holdings" && s.value > 0 {
			parts = append(parts, fmt.Sprintf("%s/%s %.0f", s.labels["kind"], s.labels["verdict"], s.value))
		}
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

// listBlocks reads the NodeBlocks a page at a time: each node's block,
// and how many blocks carry each Routed reason.
func listBlocks(ctx context.Context, c *nodeblocks.Client) (map[string]netip.Prefix, map[string]int, error) {
	out, states := map[string]netip.Prefix{}, map[string]int{}
	p := pager.New(func(ctx context.Context, o metav1.ListOptions) (runtime.Object, error) { return c.List(ctx, o) })
	p.PageSize = 500
	err := p.EachListItem(ctx, metav1.ListOptions{}, func(obj runtime.Object) error {
		nb := obj.(*v1alpha1.NodeBlock)
		if pf, err := netip.ParsePrefix(nb.Spec.CIDR); err == nil {
			out[nb.Spec.Node] = pf
		}
		if c := meta.FindStatusCondition(nb.Status.Conditions, v1alpha1.ConditionRouted); c != nil {
			states[c.Reason]++
		}
		return nil
	})
	return out, states, err
}

// parallel runs f(0..n-1) on workers goroutines; the first error stops it.
func parallel(workers, n int, f func(i int) error) error {
	var next atomic.Int64
	var first error
	var once sync.Once
	var stop atomic.Bool
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			for !stop.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if err := f(i); err != nil {
					once.Do(func() { first = err })
					stop.Store(true)
				}
			}
		})
	}
	wg.Wait()
	return first
}

func waitFor(ctx context.Context, limit time.Duration, check func() error) error {
	deadline := time.Now().Add(limit)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("not within %s: %w", limit, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

func httpOK(url string) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return errors.New(resp.Status)
	}
	return nil
}

// sampleRSS keeps the largest VmRSS seen, once a second, until stopped.
func sampleRSS(pid int, peak *atomic.Int64) func() {
	done := make(chan struct{})
	go func() {
		for {
			if rss, _, err := rssKiB(pid); err == nil && rss > peak.Load() {
				peak.Store(rss)
			}
			select {
			case <-done:
				return
			case <-time.After(time.Second):
			}
		}
	}()
	return func() { close(done) }
}

func loadavg() string {
	data, _ := os.ReadFile("/proc/loadavg")
	f := strings.Fields(string(data))
	if len(f) < 3 {
		return "?"
	}
	return strings.Join(f[:3], " ")
}
