package k8se2e

import (
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPodStartup is the pod-startup benchmark on two real nodes: batches of
// 2 x 100 pods (100 pinned to each node) created at once, with vpcni, with
// Debian's bridge plugin and with no CNI at all (hostNetwork pods: the
// floor of these nodes), each round running all three in an order that
// rotates (round 1 vpcni, bridge, floor; round 2 bridge, floor, vpcni; …)
// so that none always goes first, into a cluster still busy deleting the
// batch before. Every pod is timed from its creation to its kubelet's
// write of its running status reaching the API server, both to the
// millisecond (startuptime_test.go: kubectl's answers as they arrive, the
// kubelet's pod-startup log), each batch from the create call to its last
// pod Ready. `make bench-startup` runs it
// (VPCNI_K8S_BENCH=1; VPCNI_K8S_STARTUP_ROUNDS, default 3, and
// VPCNI_K8S_STARTUP_PODS_PER_NODE, default 100, shrink it) and it prints
//
//	pod-startup: pods=200 vpcni_p99_s=X bridge_p99_s=Y vpcni_total_s=Z bridge_total_s=W …
//
// with the p99 over every pod of a plugin's rounds and the total as the
// median of its rounds (the keys since the first run), then the floor's
// and the spread over rounds: each figure's interquartile range
// (…_iqr_s, q3 − q1), the median over rounds of each plugin's p99 less the
// floor's p99 of the same round (…_over_floor_p99_s), and the agents' own
// ADD p99 over the bursts (vpcni_add_p99_ms, from their request
// histogram, interpolated within its bucket). The `bench:` lines before it
// give every round and the per-round spread.
func TestPodStartup(t *testing.T) {
	if os.Getenv("VPCNI_K8S_BENCH") == "" {
		t.Skip("vpcni-test: the pod-startup benchmark runs from make bench-startup (VPCNI_K8S_BENCH=1); NOT RUN here")
	}
	rounds, perNode := 3, 100
	if s := os.Getenv("VPCNI_K8S_STARTUP_ROUNDS"); s != "" {
		rounds, _ = strconv.Atoi(s)
	}
	if s := os.Getenv("VPCNI_K8S_STARTUP_PODS_PER_NODE"); s != "" {
		perNode, _ = strconv.Atoi(s)
	}
	if rounds < 1 || perNode < 1 {
		t.Fatalf("VPCNI_K8S_STARTUP_ROUNDS=%d VPCNI_K8S_STARTUP_PODS_PER_NODE=%d: want both >= 1", rounds, perNode)
	}
	started := time.Now()
	n := upNodes(t, 2)
	script := filepath.Join(repo, "scripts/k8s-node.sh")
	names := n.nodeNames()

	// vpcni's defaults (pool of 8, batches of 8), room for 100 pods a node.
	n.overlay = n.writeOverlay("30s", 128, false)
	n.installAll()

	vpcniNet := netip.PrefixFrom(n.lab.Nodes[0].IP, 24).Masked()
	bridgeNet := netip.MustParsePrefix("10.244.0.0/16")
	kinds := []string{"vpcni", "bridge", floorKind}
	per := map[string][]float64{}      // every pod of every round
	roundP99 := map[string][]float64{} // per round
	totals := map[string][]float64{}   // per round
	var adds addHist
	var addP99s []float64
	phases := map[string]addHist{}
	for r := 0; r < rounds; r++ {
		order := append(slices.Clone(kinds[r%3:]), kinds[:r%3]...)
		if (r/3)%2 == 1 {
			slices.Reverse(order)
		}
		for _, kind := range order {
			var confs []string
			want := vpcniNet
			if kind == "bridge" {
				// Debian's bridge conflist, named to sort before vpcni's
				// 00-vpcni.conflist: while it is there, each node's
				// containerd uses it.
				for _, name := range names {
					env := []string{"BRIDGE_CONF=00-bridge.conflist"}
					if name != names[0] {
						env = append(env, "NODE="+name)
					}
					confs = append(confs, strings.TrimSpace(lastLine(mustRun(t, env, "bash", script, "cni", "bridge"))))
				}
				want = bridgeNet
				time.Sleep(2 * time.Second) // containerd reloads its CNI config
			}
			before := n.cniAdds()
			phasesBefore := map[string]addHist{}
			if kind == "vpcni" {
				for _, ph := range addPhases {
					phasesBefore[ph] = n.addPhase(ph)
				}
			}
			tag := fmt.Sprintf("%s-%d", kind, r)
			if kind == floorKind {
				tag = fmt.Sprintf("hostnet-%d", r)
			}
			secs, total := n.startupBatch(tag, names, perNode, want, kind == floorKind)
			per[kind] = append(per[kind], secs...)
			roundP99[kind] = append(roundP99[kind], percentile(secs, 99))
			totals[kind] = append(totals[kind], total)
			t.Logf("round %d %s: %d pods, p50 %.3fs p99 %.3fs max %.3fs, batch %.2fs", r+1, kind, len(secs),
				percentile(secs, 50), percentile(secs, 99), percentile(secs, 100), total)
			if kind == "vpcni" {
				// vpcni's own share of each pod's start: the agents' time
				// on its ADD, from their histogram.
				round := n.cniAdds().minus(before)
				if round.count < float64(len(secs)) {
					t.Fatalf("the agents served %.0f ADDs for %d pods", round.count, len(secs))
				}
				adds = adds.plus(round)
				p99, beyond := round.interpolated(0.99)
				addP99s = append(addP99s, p99)
				t.Logf("round %d vpcni: the agents' ADD: %.0f, mean %.0f ms, p99 %.0f ms%s (bucket <= %g s)", r+1, round.count,
					1000*round.sum/round.count, 1000*p99, beyondNote(beyond), round.quantile(0.99))
				// Where the ADD's time went: its wait for an address
				// against wiring and recording.
				for _, ph := range addPhases {
					d := n.addPhase(ph).minus(phasesBefore[ph])
					phases[ph] = phases[ph].plus(d)
					pp, pb := d.interpolated(0.99)
					t.Logf("round %d vpcni: the agents' ADD, %s: mean %.0f ms, p99 %.0f ms%s", r+1, ph, 1000*d.sum/max(d.count, 1), 1000*pp, beyondNote(pb))
				}
			}
			for _, c := range confs {
				if err := os.Remove(c); err != nil {
					t.Fatal(err)
				}
			}
			if len(confs) > 0 {
				time.Sleep(2 * time.Second)
			}
		}
	}
	for _, kind := range kinds {
		fmt.Printf("bench: %s per-pod p50 %.3fs p99 %.3fs over %d pods; per round: p99 %v s, batch %v s; over rounds: p99 %s s, batch %s s\n", kind,
			percentile(per[kind], 50), percentile(per[kind], 99), len(per[kind]), roundTo(roundP99[kind]), roundTo(totals[kind]),
			spreadOf(roundP99[kind]), spreadOf(totals[kind]))
	}
	// Each plugin against the floor of its own round: the rounds' load
	// differs (what the other helpers' and the last batch's deletion leave),
	// a pairwise difference does not carry it.
	over := map[string]spread{}
	for _, kind := range kinds[:2] {
		var d []float64
		for r := range roundP99[kind] {
			d = append(d, roundP99[kind][r]-roundP99[floorKind][r])
		}
		over[kind] = spreadOf(d)
		fmt.Printf("bench: %s p99 over the same round's no-CNI p99: %s s (per round %v)\n", kind, over[kind], roundTo(d))
	}
	addP99, beyond := adds.interpolated(0.99)
	if adds.count > 0 {
		fmt.Printf("bench: vpcni's agents' ADD over %.0f requests (%d bursts of %d): mean %.0f ms, p99 %.0f ms%s (bucket <= %g s; per burst %v ms)\n",
			adds.count, rounds, 2*perNode, 1000*adds.sum/adds.count, 1000*addP99, beyondNote(beyond), adds.quantile(0.99), roundTo(scale(addP99s, 1000)))
	}
	phaseP99 := map[string]float64{}
	for _, ph := range addPhases {
		h := phases[ph]
		p, b := h.interpolated(0.99)
		phaseP99[ph] = 1000 * p
		fmt.Printf("bench: vpcni's agents' ADD, %s part, over %.0f new ADDs: mean %.0f ms, p99 %.0f ms%s\n", ph, h.count, 1000*h.sum/max(h.count, 1), 1000*p, beyondNote(b))
	}
	fmt.Printf("bench: load average %s after %s\n", loadAvg(), time.Since(started).Round(time.Second))
	fmt.Printf("pod-startup: pods=%d vpcni_p99_s=%.2f bridge_p99_s=%.2f vpcni_total_s=%.2f bridge_total_s=%.2f floor_p99_s=%.2f floor_total_s=%.2f rounds=%d vpcni_p99_iqr_s=%.2f bridge_p99_iqr_s=%.2f floor_p99_iqr_s=%.2f vpcni_total_iqr_s=%.2f bridge_total_iqr_s=%.2f floor_total_iqr_s=%.2f vpcni_over_floor_p99_s=%.2f bridge_over_floor_p99_s=%.2f vpcni_add_p99_ms=%.0f vpcni_address_p99_ms=%.0f vpcni_wire_p99_ms=%.0f\n",
		2*perNode, percentile(per["vpcni"], 99), percentile(per["bridge"], 99), median(totals["vpcni"]), median(totals["bridge"]),
		percentile(per[floorKind], 99), median(totals[floorKind]), rounds,
		iqr(roundP99["vpcni"]), iqr(roundP99["bridge"]), iqr(roundP99[floorKind]),
		iqr(totals["vpcni"]), iqr(totals["bridge"]), iqr(totals[floorKind]),
		over["vpcni"].med, over["bridge"].med, 1000*addP99, phaseP99["address"], phaseP99["wire"])
}

// floorKind is the batch no CNI serves: hostNetwork pods (a sandbox and a
// container each, no network namespace, no CNI call).
const floorKind = "floor"

func iqr(v []float64) float64 { s := spreadOf(v); return s.q3 - s.q1 }

func scale(v []float64, k float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = k * x
	}
	return out
}

func beyondNote(beyond bool) string {
	if beyond {
		return " or more (past the histogram's last bound)"
	}
	return ""
}

// loadAvg is the 1-minute load average.
func loadAvg() string {
	b, _ := os.ReadFile("/proc/loadavg")
	if f := strings.Fields(string(b)); len(f) > 0 {
		return f[0]
	}
	return "?"
}

const startupPod = `apiVersion: v1
kind: Pod
metadata:
  name: %[1]s
  labels: {bench: startup}
spec:
  terminationGracePeriodSeconds: 1
  nodeSelector: {kubernetes.io/hostname: %[2]s}
  hostNetwork: %[4]t
  containers:
    - name: c
      image: %[3]s
      imagePullPolicy: Never
      command: [sleep, "3600"]
---
`

// startupBatch creates perNode pods on each node in one kubectl create and
// times each from its creation (kubectl's answer for it) to its running
// status reaching the API server (the kubelet's log), to the millisecond; the
// batch's time is from the create call until a poll (every 250 ms) finds
// every pod Ready. It checks every pod's address came from the plugin
// under test (hostNetwork pods: their node's), then deletes the pods and
// waits for them to be gone. (A kubectl watch, for finer times, ended by
// itself mid-batch here; the log and the poll cannot miss a pod.)
func (n *node) startupBatch(tag string, nodes []string, perNode int, want netip.Prefix, hostNetwork bool) ([]float64, float64) {
	t := n.t
	var manifest strings.Builder
	total := perNode * len(nodes)
	for i := 0; i < total; i++ {
		fmt.Fprintf(&manifest, startupPod, fmt.Sprintf("su-%s-%03d", tag, i), nodes[i%len(nodes)], n.env["VPCNI_K8S_BUSYBOX_IMAGE"], hostNetwork)
	}
	f := filepath.Join(t.TempDir(), "pods.yaml")
	if err := os.WriteFile(f, []byte(manifest.String()), 0o644); err != nil {
		t.Fatal(err)
	}

	mark := n.markKubeletLogs()
	start := time.Now()
	created, err := n.createStreaming(f)
	if err != nil {
		t.Fatal(err)
	}
	var ps []timedPod
	eventually(t, 10*time.Minute, fmt.Sprintf("%d pods Ready (%s)", total, tag), func() (bool, string) {
		ps = n.timedPods("bench=startup")
		ready := 0
		for _, p := range ps {
			if !p.readyAt().IsZero() {
				ready++
			}
		}
		return ready == total, fmt.Sprintf("%d pods, %d Ready", len(ps), ready)
	})
	batch := time.Since(start).Seconds()
	if len(ps) != total || len(created) != total {
		t.Fatalf("%d pods, kubectl created %d, want %d", len(ps), len(created), total)
	}
	// A pod is Ready only after its kubelet saw it running and logged so;
	// the log line may still be in the kubelet's buffer for a moment.
	var running map[string]time.Time
	eventually(t, 30*time.Second, fmt.Sprintf("the kubelets' log has every pod's running time (%s)", tag), func() (bool, string) {
		running, err = observedRunning(mark)
		if err != nil {
			t.Fatal(err)
		}
		missing := 0
		for name := range created {
			if _, ok := running[name]; !ok {
				missing++
			}
		}
		return missing == 0, fmt.Sprintf("%d of %d pods have no \"Observed pod startup duration\" line", missing, total)
	})
	var secs, apiSecs []float64
	bad := 0
	for _, p := range ps {
		c, ok := created[p.Metadata.Name]
		if !ok {
			t.Fatalf("pod %s was not in kubectl create's answers", p.Metadata.Name)
		}
		secs = append(secs, running[p.Metadata.Name].Sub(c).Seconds())
		apiSecs = append(apiSecs, p.readyAt().Sub(p.Metadata.CreationTimestamp).Seconds())
		if hostNetwork && p.Status.PodIP != p.Status.HostIP {
			bad++
			if bad < 4 {
				t.Errorf("hostNetwork pod %s has address %q, its node %q", p.Metadata.Name, p.Status.PodIP, p.Status.HostIP)
			}
		} else if ip, err := netip.ParseAddr(p.Status.PodIP); err != nil || !want.Contains(ip) {
			bad++
			if bad < 4 {
				t.Errorf("%s has address %q, not from %s: the wrong CNI served it", p.Metadata.Name, p.Status.PodIP, want)
			}
		}
	}
	if bad > 0 {
		t.FailNow()
	}
	n.mustKubectl("delete", "pods", "-l", "bench=startup", "--grace-period=1", "--wait=false")
	eventually(t, 5*time.Minute, "bench pods gone", func() (bool, string) {
		ps := n.pods("default", "bench=startup")
		return len(ps) == 0, fmt.Sprintf("%d pods", len(ps))
	})
	// The API's view for comparison: creationTimestamp to the Ready
	// condition, whole seconds, the condition's time taken when the
	// kubelet computed it (before its write reached the API server).
	t.Logf("%s: by the API's timestamps (whole seconds): p50 %.0fs p99 %.0fs; kubectl created the pods over %.2fs", tag,
		percentile(apiSecs, 50), percentile(apiSecs, 99), createSpan(created))
	return secs, batch
}

// createSpan is the time from the first pod's creation to the last's.
func createSpan(created map[string]time.Time) float64 {
	var first, last time.Time
	for _, at := range created {
		if first.IsZero() || at.Before(first) {
			first = at
		}
		if at.After(last) {
			last = at
		}
	}
	return last.Sub(first).Seconds()
}

// timedPod is a pod with the API's timestamps.
type timedPod struct {
	Metadata struct {
		Name              string    `json:"name"`
		CreationTimestamp time.Time `json:"creationTimestamp"`
	} `json:"metadata"`
	Status struct {
		PodIP      string `json:"podIP"`
		HostIP     string `json:"hostIP"`
		Conditions []struct {
			Type               string    `json:"type"`
			Status             string    `json:"status"`
			LastTransitionTime time.Time `json:"lastTransitionTime"`
		} `json:"conditions"`
	} `json:"status"`
}

// readyAt is when the pod turned Ready, zero while it is not.
func (p timedPod) readyAt() time.Time {
	for _, c := range p.Status.Conditions {
		if c.Type == "Ready" && c.Status == "True" {
			return c.LastTransitionTime
		}
	}
	return time.Time{}
}

func (n *node) timedPods(selector string) []timedPod {
	var l struct {
		Items []timedPod `json:"items"`
	}
	if err := n.getJSON(&l, "get", "pods", "-l", selector); err != nil {
		n.t.Fatal(err)
	}
	return l.Items
}

// percentile is the nearest-rank percentile p (0-100] of v.
func percentile(v []float64, p float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	i := int(math.Ceil(p/100*float64(len(s)))) - 1
	return s[max(0, min(i, len(s)-1))]
}

func roundTo(v []float64) []float64 {
	out := make([]float64, len(v))
	for i, x := range v {
		out[i] = math.Round(x*100) / 100
	}
	return out
}

// addHist is one of vpcnid's histograms (the ADD's,
// vpcni_cni_request_duration_seconds with verb ADD and any result, or one
// phase of it) summed over the cluster's agents: the cumulative count at
// each bucket's upper bound, the count and the sum of seconds.
type addHist struct {
	le         map[float64]float64
	count, sum float64
}

// cniAdds is the agents' ADD histogram.
func (n *node) cniAdds() addHist {
	return n.agentHist("vpcni_cni_request_duration_seconds", `verb="ADD"`)
}

// addPhases are the parts of a new ADD vpcnid times
// (vpcni_cni_add_phase_duration_seconds).
var addPhases = []string{"address", "wire", "record"}

// addPhase is the agents' histogram of one part of a new ADD.
func (n *node) addPhase(phase string) addHist {
	return n.agentHist("vpcni_cni_add_phase_duration_seconds", `phase="`+phase+`"`)
}

// agentHist scrapes metric's series that carry label from every node's
// agent (metricsAddr on the node's loopback) and sums them.
func (n *node) agentHist(metric, label string) addHist {
	line := regexp.MustCompile(`^` + metric + `_(bucket|sum|count)\{([^}]*)\} (\S+)$`)
	h := addHist{le: map[float64]float64{}}
	for i := range n.envs() {
		out := mustRun(n.t, nil, "nsenter", "--net=/run/netns/"+nodeNSName(i), "--", "curl", "-fsS", "http://127.0.0.1:19695/metrics")
		for _, l := range strings.Split(out, "\n") {
			m := line.FindStringSubmatch(l)
			if m == nil || !strings.Contains(m[2], label) {
				continue
			}
			v, err := strconv.ParseFloat(m[3], 64)
			if err != nil {
				n.t.Fatalf("metric line %q: %v", l, err)
			}
			switch m[1] {
			case "count":
				h.count += v
			case "sum":
				h.sum += v
			case "bucket":
				_, le, _ := strings.Cut(m[2], `le="`)
				bound, err := strconv.ParseFloat(strings.TrimSuffix(le, `"`), 64)
				if err != nil {
					n.t.Fatalf("metric line %q: %v", l, err)
				}
				h.le[bound] += v
			}
		}
	}
	return h
}

func (h addHist) combine(o addHist, sign float64) addHist {
	out := addHist{le: map[float64]float64{}, count: h.count + sign*o.count, sum: h.sum + sign*o.sum}
	for b, v := range h.le {
		out.le[b] = v
	}
	for b, v := range o.le {
		out.le[b] += sign * v
	}
	return out
}

func (h addHist) plus(o addHist) addHist  { return h.combine(o, 1) }
func (h addHist) minus(o addHist) addHist { return h.combine(o, -1) }

// quantile is the upper bound of the bucket that holds quantile q (+Inf
// past the last bound): the histogram says no more.
func (h addHist) quantile(q float64) float64 {
	bounds := make([]float64, 0, len(h.le))
	for b := range h.le {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	for _, b := range bounds {
		if h.le[b] >= q*h.count {
			return b
		}
	}
	return math.Inf(1)
}
