package ctl

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath/veth"
	"github.com/vpcni/vpcni/internal/k8s"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/apiserver"
)

// The bench's own etcd + kube-apiserver: a directory and ports no other
// fixture uses, so it runs beside the tests' API server and the node e2e.
const (
	nodeScaleAPIDir   = "/var/tmp/vpcni-apiserver-nodescale"
	nodeScaleAPIPort  = 26743
	nodeScaleEtcdPort = 22779
)

// scalePoint is what the bench measured at one pod count.
type scalePoint struct {
	pods int
	// At rest, watch on: the agent that added the pods (on[0]) and the
	// one restarted with the watch back on (on[1]); off: restarted with
	// the watch off.
	on       [2]restUse
	off      restUse
	passes   []float64 // node reconcile passes over exactly pods allocations, ms
	restarts [2]restartRun
	verified [2]time.Duration // from the new agent's exec until every pod checked
}

// restUse is the agent's resources over a window at rest.
type restUse struct {
	cpuPct               float64 // CPU time over wall time, in percent of one core
	rss, anon, file, hwm float64 // MiB, from /proc/PID/status at the window's end
	threads              int
}

// benchNodeScale measures one node at its practical limit, 250 pods (the
// kubelet's default max-pods is 110; 250 is where operators stop): a real
// vpcnid on a one-node testbed, in Kubernetes mode against a real
// kube-apiserver of the bench's own (Pod objects bound to the node, so
// the agent's informers, PodAddresses and annotations are there as on a
// cluster), pods added through the real plugin, each in a namespace of its
// own, answering TCP.
//
// At each pod count (the peers, then -pods) it measures, after the node
// settled (every PodAddress published, -settle more):
//
//   - rest: the agent's RSS (anon and file parts, peak) and CPU over
//     -window, with the default configuration (selfHeal.period 30s,
//     health probes every 30s, the kernel watch on);
//   - reconcile: the node reconcile passes over exactly that many
//     allocations, as the agent times them (its debug log line): the
//     timer's, and passes the kernel watch starts after the bench
//     deletes one pod's host route (each waited for until repaired);
//   - restart: vpcnid killed (SIGKILL, damage done meanwhile as bench
//     restart does) and started again, first with the watch off, then
//     on: serve = its first answer, first ADD = a new pod's ADD succeeds,
//     restore = the damage repaired, verified = every pod at its address
//     and answering TCP from the neighbour;
//   - the watch's cost: CPU at rest with the watch off against on.
func benchNodeScale(args []string, out io.Writer) (err error) {
	fs := flag.NewFlagSet("bench node-scale", flag.ContinueOnError)
	n := fs.Int("pods", 250, "pods on the node at the limit")
	peerList := fs.String("peers", "0,100", "comma-separated smaller pod counts measured first, for the ratios")
	settle := fs.Duration("settle", 30*time.Second, "wait after the node settled (and after each restart) before a window")
	window := fs.Duration("window", 30*time.Second, "how long CPU is measured at rest")
	passes := fs.Int("passes", 5, "node reconcile passes timed per pod count (at least)")
	kube := fs.Bool("kubernetes", true, "run the agent in Kubernetes mode against the bench's own kube-apiserver (needs the cached Kubernetes build)")
	parallel := fs.Int("parallel", 8, "concurrent ADDs and probes (not timed)")
	agentBin := fs.String("agent-bin", "", "directory of the vpcnid to measure (default: beside vpcnictl)")
	repo := fs.String("repo", "", "the checkout holding deploy/ (CRDs, RBAC; default: the parent of vpcnictl's directory)")
	keepLog := fs.String("keep-log", "", "copy the agent's log to this file at the end")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	counts, err := scaleCounts(*peerList, *n)
	if err != nil {
		return err
	}
	bin, err := binDir()
	if err != nil {
		return err
	}
	if *agentBin == "" {
		*agentBin = bin
	}
	if *repo == "" {
		*repo = filepath.Dir(bin)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Hour)
	defer cancel()

	tb := testbed.New("vpcni-nscale", netip.MustParsePrefix("10.86.0.0/22"))
	if err := tb.Up(); err != nil {
		return err
	}
	defer func() { err = errors.Join(err, tb.Down()) }()
	cfg := tb.AgentConfig(tb.RunDir, "10.86.0.0/22", "10.86.0.0/26")
	cfg.MetricsAddr = ""
	cfg.LogLevel = "debug" // the reconcile passes' times
	watchOn := true
	cfg.SelfHeal.Watch = &watchOn
	var kc *scaleKube
	if *kube {
		if kc, err = startScaleKube(ctx, *repo, tb, &cfg); err != nil {
			return err
		}
		defer func() { err = errors.Join(err, kc.close()) }()
	}
	agent, err := tb.StartAgent(*agentBin, cfg)
	if err != nil {
		return err
	}
	if *keepLog != "" {
		defer func() { err = errors.Join(err, copyFile(agent.LogPath, *keepLog)) }()
	}
	cni, err := tb.NewCNI([]string{bin}, filepath.Join(tb.RunDir, "cni-cache"), testbed.VpcniConfList("1.0.0", "vpcni-nscale", cfg.SocketPath))
	if err != nil {
		return err
	}
	b, err := newRestartBed(tb, cni, *agentBin, agent, *parallel, 0)
	if err != nil {
		return err
	}
	defer b.close()

	mode := "off (static provider only)"
	if kc != nil {
		mode = "on (the bench's own kube-apiserver " + kc.srv.URL + ", a Pod object per pod)"
	}
	fmt.Fprintf(out, "node-scale: one node, pods %v through the real plugin (routed veth, static provider), Kubernetes %s; settle %s, window %s; load average %s\n",
		counts, mode, *settle, *window, loadAvg())
	var points []*scalePoint
	for _, count := range counts {
		start := time.Now()
		if err := scaleGrow(ctx, b, kc, count); err != nil {
			return fmt.Errorf("growing to %d pods: %w", count, err)
		}
		fmt.Fprintf(out, "  %d pods up in %.1f s\n", count, time.Since(start).Seconds())
		p, err := measureScale(ctx, b, kc, count, *settle, *window, *passes)
		if err != nil {
			return fmt.Errorf("at %d pods: %w", count, err)
		}
		fmt.Fprintf(out, "  %d pods measured (load average %s)\n", count, loadAvg())
		points = append(points, p)
	}
	if err := b.delPods(ctx); err != nil {
		return err
	}
	printScale(out, points)
	return nil
}

// scaleCounts is the peers below n, ascending, then n.
func scaleCounts(peers string, n int) ([]int, error) {
	if n < 1 || n > 900 {
		return nil, errors.New("-pods must be between 1 and 900 (the range holds 960 addresses)")
	}
	var counts []int
	for _, s := range strings.Split(peers, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		c, err := strconv.Atoi(s)
		if err != nil || c < 0 || c >= n {
			return nil, fmt.Errorf("-peers: %q is not a pod count below -pods", s)
		}
		counts = append(counts, c)
	}
	slices.Sort(counts)
	return append(slices.Compact(counts), n), nil
}

// scaleGrow adds pods until the node has count (their Pod objects first).
func scaleGrow(ctx context.Context, b *restartBed, kc *scaleKube, count int) error {
	from := len(b.pods)
	for i := from; i < count; i++ {
		b.pods = append(b.pods, &benchPod{id: fmt.Sprintf("rb-%04d", i), ns: b.tb.PodNS(i)})
	}
	if kc != nil {
		if err := b.each(count-from, func(i int) error { return kc.createPod(ctx, b.pods[from+i].id) }); err != nil {
			return err
		}
	}
	// An ADD that times out is tried again, as a kubelet does: on a
	// loaded machine the node's kernel locks can hold one past the
	// plugin's 30 s.
	return b.each(count-from, func(i int) error {
		tries := 0
		return b.addPod(ctx, b.pods[from+i], &tries)
	})
}

func measureScale(ctx context.Context, b *restartBed, kc *scaleKube, count int, settle, window time.Duration, passes int) (*scalePoint, error) {
	p := &scalePoint{pods: count}
	b.broken = min(3, count)
	logFrom := logSize(b.agent.LogPath)
	rest := func(u *restUse) error {
		if kc != nil {
			if err := kc.waitPublished(ctx, count); err != nil {
				return err
			}
		}
		time.Sleep(settle)
		var err error
		*u, err = atRest(b.agent, window)
		return err
	}
	if err := rest(&p.on[0]); err != nil {
		return nil, err
	}
	// The passes the timer ran meanwhile, then as many more as it takes,
	// each started by the watch on a missing host route.
	for i := 0; len(reconcilePasses(b.agent.LogPath, logFrom, count)) < passes && count > 0; i++ {
		if i >= 3*passes {
			return nil, fmt.Errorf("no node reconcile over %d allocations logged after %d host routes deleted", count, i)
		}
		if err := b.kickRoute(ctx, b.pods[i%count]); err != nil {
			return nil, err
		}
	}
	p.passes = reconcilePasses(b.agent.LogPath, logFrom, count)
	watchOff, watchOn := false, true
	for i, watch := range []*bool{&watchOff, &watchOn} {
		b.agent.Config.SelfHeal.Watch = watch
		tag := fmt.Sprintf("n%dw%v", count, *watch)
		if kc != nil {
			if err := kc.createPod(ctx, "rb-new-"+tag); err != nil {
				return nil, err
			}
		}
		run, err := b.restart(ctx, "SIGKILL", tag)
		if err != nil {
			return nil, fmt.Errorf("restart with the watch %v: %w", *watch, err)
		}
		p.restarts[i], p.verified[i] = run, run.verified
		u := &p.off
		if *watch {
			u = &p.on[1]
		}
		if err := rest(u); err != nil {
			return nil, err
		}
	}
	if count == 0 {
		p.passes = reconcilePasses(b.agent.LogPath, logFrom, count)
	}
	return p, nil
}

// kickRoute deletes the pod's host route and waits until the agent put it
// back: the kernel watch starts a node reconcile.
func (b *restartBed) kickRoute(ctx context.Context, p *benchPod) error {
	find := func() (*netlink.Route, error) {
		rs, err := b.node.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Dst: hostNet(p.ip), Protocol: veth.RouteProtocol},
			netlink.RT_FILTER_DST|netlink.RT_FILTER_PROTOCOL)
		if err != nil || len(rs) == 0 {
			return nil, err
		}
		return &rs[0], nil
	}
	r, err := find()
	if err != nil || r == nil {
		return fmt.Errorf("no host route to %s to delete: %v", p.ip, err)
	}
	if err := b.node.RouteDel(r); err != nil {
		return err
	}
	return poll(ctx, b.agent, "the host route to "+p.ip.String(), func() bool { r, _ := find(); return r != nil })
}

// atRest measures the agent's CPU over window and its memory at the end.
func atRest(a *testbed.Agent, window time.Duration) (restUse, error) {
	pid := a.Pid()
	c0, err := cpuTicks(pid)
	if err != nil {
		return restUse{}, err
	}
	t0 := time.Now()
	time.Sleep(window)
	c1, err := cpuTicks(pid)
	if err != nil {
		return restUse{}, err
	}
	wall := time.Since(t0).Seconds()
	u := restUse{cpuPct: 100 * float64(c1-c0) / clockTicks / wall}
	st, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(st), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseFloat(f[1], 64)
		switch f[0] {
		case "VmRSS:":
			u.rss = v / 1024
		case "RssAnon:":
			u.anon = v / 1024
		case "RssFile:":
			u.file = v / 1024
		case "VmHWM:":
			u.hwm = v / 1024
		case "Threads:":
			u.threads = int(v)
		}
	}
	return u, nil
}

// clockTicks is USER_HZ, the unit of /proc/PID/stat's times (100 on
// Linux for every architecture vpcni ships).
const clockTicks = 100

// cpuTicks is the process's user + system time, all threads.
func cpuTicks(pid int) (int64, error) {
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command's closing parenthesis: state is the 3rd
	// field of the line, utime the 14th, stime the 15th.
	i := strings.LastIndexByte(string(data), ')')
	f := strings.Fields(string(data[i+1:]))
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %q", pid, data)
	}
	u, err1 := strconv.ParseInt(f[11], 10, 64)
	s, err2 := strconv.ParseInt(f[12], 10, 64)
	return u + s, errors.Join(err1, err2)
}

func logSize(path string) int64 {
	if fi, err := os.Stat(path); err == nil {
		return fi.Size()
	}
	return 0
}

// reconcilePasses reads the agent's "node reconciled" debug lines after
// offset over exactly allocations allocations: their ms.
func reconcilePasses(path string, offset int64, allocations int) []float64 {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil
	}
	want := " allocations=" + strconv.Itoa(allocations) + " "
	var out []float64
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, `msg="node reconciled"`) || !strings.Contains(line, want) {
			continue
		}
		_, v, ok := strings.Cut(line, " ms=")
		if !ok {
			continue
		}
		if x, err := strconv.ParseFloat(strings.Fields(v)[0], 64); err == nil {
			out = append(out, x)
		}
	}
	return out
}

func printScale(out io.Writer, points []*scalePoint) {
	fmt.Fprintln(out, "at rest (default config: selfHeal.period 30s, health probes 30s): RSS and its anon/file parts, peak RSS, CPU in % of one core;")
	fmt.Fprintln(out, "agent = the one that added the pods, restarted = killed and started again (watch on), no watch = restarted with selfHeal.watch false")
	fmt.Fprintf(out, "%5s %8s %8s %8s %8s %8s %9s %12s %12s %8s\n", "pods", "rss MiB", "anon", "file", "peak", "threads", "cpu %", "cpu restart", "cpu nowatch", "watch %")
	for _, p := range points {
		fmt.Fprintf(out, "%5d %8.1f %8.1f %8.1f %8.1f %8d %9.3f %12.3f %12.3f %8.3f\n", p.pods, p.on[0].rss, p.on[0].anon, p.on[0].file, p.on[0].hwm,
			p.on[0].threads, p.on[0].cpuPct, p.on[1].cpuPct, p.off.cpuPct, p.watchCost())
	}
	fmt.Fprintln(out, "restarts (SIGKILL, 3 pods' proxy ARP entries removed and an orphan link added meanwhile), ms from the new vpcnid's exec:")
	fmt.Fprintf(out, "%5s %-8s %8s %10s %8s %10s %11s %9s %12s %11s\n", "pods", "watch", "stop ms", "serve ms", "", "first ADD", "tries", "restore", "verified ms", "rss after")
	for _, p := range points {
		for i, w := range []string{"off", "on"} {
			r := p.restarts[i]
			after := p.off.rss
			if i == 1 {
				after = p.on[1].rss
			}
			fmt.Fprintf(out, "%5d %-8s %8.1f %10.1f %8s %10.1f %11d %9.1f %12.1f %11.1f\n", p.pods, w, ms(r.stop), ms(r.serve), "", ms(r.add), r.addTries, ms(r.restore), ms(p.verified[i]), after)
		}
	}
	fmt.Fprintf(out, "%5s %8s %12s %10s %10s\n", "pods", "passes", "reconcile ms", "min", "max")
	for _, p := range points {
		fmt.Fprintf(out, "%5d %8d %12.2f %10.2f %10.2f\n", p.pods, len(p.passes), medianF(p.passes), slicesMin(p.passes), slicesMax(p.passes))
	}
	last := points[len(points)-1]
	for _, peer := range points[:len(points)-1] {
		ratio := func(a, b float64) string {
			if b == 0 {
				return "-"
			}
			return fmt.Sprintf("%.2fx", a/b)
		}
		fmt.Fprintf(out, "peer: pods=%d serve_ms=%.0f reconcile_ms=%.2f rss_mb=%.1f cpu_idle_pct=%.3f; %d pods against it: serve %s, reconcile %s, rss %s, cpu %s\n",
			peer.pods, peer.serve(), medianF(peer.passes), peer.rss(), peer.cpuIdle(), last.pods,
			ratio(last.serve(), peer.serve()), ratio(medianF(last.passes), medianF(peer.passes)), ratio(last.rss(), peer.rss()), ratio(last.cpuIdle(), peer.cpuIdle()))
	}
	fmt.Fprintf(out, "self-heal watch at %d pods: %.3f%% of a core at rest (on %.3f%%, off %.3f%%)\n", last.pods, last.watchCost(), last.cpuIdle(), last.off.cpuPct)
	fmt.Fprintf(out, "target: rss <= 40 MB at %d pods: %s\n", last.pods, met(last.rss() <= 40))
	fmt.Fprintf(out, "node-scale: pods=%d serve_ms=%.0f reconcile_ms=%.1f rss_mb=%.1f cpu_idle_pct=%.2f\n",
		last.pods, last.serve(), medianF(last.passes), last.rss(), last.cpuIdle())
}

// serve is the slower restart's first ADD: the agent serves pods again.
func (p *scalePoint) serve() float64 { return max(ms(p.restarts[0].add), ms(p.restarts[1].add)) }

// rss is the largest of the windows at rest.
func (p *scalePoint) rss() float64 { return max(p.on[0].rss, p.on[1].rss, p.off.rss) }

// cpuIdle is the mean of the two windows with the default configuration.
func (p *scalePoint) cpuIdle() float64 { return (p.on[0].cpuPct + p.on[1].cpuPct) / 2 }

func (p *scalePoint) watchCost() float64 { return p.cpuIdle() - p.off.cpuPct }

func medianF(v []float64) float64 { return median(v) }

func slicesMin(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	return slices.Min(v)
}

// scaleKube is the bench's Kubernetes: its own API server, the node's
// Node object, and the forward that puts the API server on the node's
// loopback.
type scaleKube struct {
	srv  *apiserver.Server
	cs   kubernetes.Interface
	pas  *k8s.PodAddresses
	node string
	stop func()
}

// startScaleKube starts the API server with vpcni's CRDs and RBAC, creates
// the Node (Ready, as its kubelet would) and points cfg at it with the
// agent's service account's rights.
func startScaleKube(ctx context.Context, repo string, tb *testbed.Topology, cfg *config.Config) (_ *scaleKube, err error) {
	deploy := filepath.Join(repo, "deploy")
	srv, err := apiserver.Start(ctx, apiserver.Options{Dir: nodeScaleAPIDir, Port: nodeScaleAPIPort, EtcdPort: nodeScaleEtcdPort, LockWait: 2 * time.Minute,
		CRDs: []string{filepath.Join(deploy, "vpcni.io_podaddresses.yaml"), filepath.Join(deploy, "vpcni.io_addressreservations.yaml")}})
	if err != nil {
		return nil, fmt.Errorf("the bench's API server (-kubernetes=false runs without): %w", err)
	}
	kc := &scaleKube{srv: srv, node: cfg.NodeName, stop: func() {}}
	defer func() {
		if err != nil {
			err = errors.Join(err, kc.close())
		}
	}()
	if err := srv.Apply(ctx, "vpcni-system", filepath.Join(deploy, "namespace.yaml"), filepath.Join(deploy, "rbac.yaml")); err != nil {
		return nil, err
	}
	if kc.cs, err = kubernetes.NewForConfig(srv.Config); err != nil {
		return nil, err
	}
	if kc.pas, err = k8s.NewPodAddresses(srv.Config); err != nil {
		return nil, err
	}
	now := metav1.NewTime(time.Now())
	node, err := kc.cs.CoreV1().Nodes().Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: kc.node}}, metav1.CreateOptions{})
	if err != nil {
		return nil, err
	}
	node.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: now, LastHeartbeatTime: now}}
	if _, err := kc.cs.CoreV1().Nodes().UpdateStatus(ctx, node, metav1.UpdateOptions{}); err != nil {
		return nil, err
	}
	host := strings.TrimPrefix(srv.URL, "https://")
	fw, err := testbed.Forward(tb.NodeNS(), host, host)
	if err != nil {
		return nil, err
	}
	kc.stop = func() { fw.Close() }
	kubeconfig, err := srv.KubeconfigAs(tb.RunDir, "vpcni-system", "vpcni-agent")
	if err != nil {
		return nil, err
	}
	cfg.Kubernetes = config.Kubernetes{Mode: "on", Kubeconfig: kubeconfig}
	return kc, nil
}

func (kc *scaleKube) close() error {
	kc.stop()
	return kc.srv.Stop()
}

// createPod creates the Pod object a pod of the node would have: bound to
// the node, a Deployment's labels and owner, one container with a probe,
// and the status its kubelet reports — what the agent's pod informer
// holds per pod on a cluster.
func (kc *scaleKube) createPod(ctx context.Context, name string) error {
	yes := true
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default",
			Labels: map[string]string{"app": "web", "pod-template-hash": "5d8f7c9b4d"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "ReplicaSet", Name: "web-5d8f7c9b4d",
				UID: "6f1c1f9e-8a1e-4c55-9a57-2a3b4c5d6e7f", Controller: &yes, BlockOwnerDeletion: &yes}}},
		Spec: corev1.PodSpec{NodeName: kc.node, Containers: []corev1.Container{{
			Name: "web", Image: "busybox:1.36", ImagePullPolicy: corev1.PullNever,
			Command:        []string{"/bin/sh", "-c", "mkdir -p /www && hostname > /www/index.html && exec httpd -f -p 8080 -h /www"},
			ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{TCPSocket: &corev1.TCPSocketAction{Port: intstr.FromInt32(8080)}}, PeriodSeconds: 1},
		}}},
	}
	created, err := kc.cs.CoreV1().Pods("default").Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil
	}
	if err != nil {
		return err
	}
	now := metav1.NewTime(time.Now())
	created.Status = corev1.PodStatus{Phase: corev1.PodRunning, HostIP: "10.86.0.10", StartTime: &now,
		Conditions: []corev1.PodCondition{
			{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
			{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		},
		ContainerStatuses: []corev1.ContainerStatus{{Name: "web", Ready: true, Image: "docker.io/library/busybox:1.36",
			ImageID:     "docker.io/library/busybox@sha256:768e5c6f5cb6db0794eec98dc7a967f40631746c32232b78a3105fb946f3ab83",
			ContainerID: "containerd://" + strings.Repeat("ab", 32),
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}}}},
	}
	_, err = kc.cs.CoreV1().Pods("default").UpdateStatus(ctx, created, metav1.UpdateOptions{})
	return err
}

// waitPublished waits until the node's PodAddresses number count: the
// agent's Kubernetes side caught up with its pods.
func (kc *scaleKube) waitPublished(ctx context.Context, count int) error {
	deadline := time.Now().Add(10 * time.Minute)
	for {
		l, err := kc.pas.List(ctx, metav1.ListOptions{LabelSelector: k8s.LabelNode + "=" + k8s.NodeLabel(kc.node)})
		if err == nil && len(l.Items) == count {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			got := -1
			if l != nil {
				got = len(l.Items)
			}
			return fmt.Errorf("the node's PodAddresses did not reach %d (have %d): %v", count, got, err)
		}
		time.Sleep(500 * time.Millisecond)
	}
}
