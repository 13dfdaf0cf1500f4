package k8se2e

import (
	"bufio"
	"cmp"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// The pod-startup benchmark's clocks. The API's timestamps (creation,
// conditions, container starts) are whole seconds; two finer ones exist
// on this host, and both are on the same clock as the kubelets':
//   - when each pod was created: `kubectl create -o name` prints each pod
//     as soon as the API server answered its POST (it creates them one
//     after another), read here as the lines arrive;
//   - when it was running as the cluster sees it: the kubelet's
//     pod-startup tracker logs, per pod, "Observed pod startup duration"
//     with observedRunningTime in nanoseconds: when the kubelet's status
//     manager's write of the pod's running status succeeded at the API
//     server (RecordStatusUpdated). That includes the kubelet's queue of
//     status writes (its API client's QPS limit), which a 200-pod burst
//     fills; it is the same queue with any CNI or none, which is why each
//     plugin is compared with the no-CNI floor of its own round. The same
//     line's watchObservedRunningTime, the end point of Kubernetes' SLI
//     (kubelet_pod_start_sli_duration_seconds), is when the kubelet's
//     watch next brought the pod back: here it came up to 10 s after the
//     pod was Ready for some pods, which would time the watch, not the
//     pod.

// createStreaming runs `kubectl create -f file -o name` and returns each
// created object's name ("su-…", without "pod/") with the time its line
// was read.
func (n *node) createStreaming(file string) (map[string]time.Time, error) {
	cmd := exec.Command("nsenter", "--net=/run/netns/"+nodeNS, "--", n.env["VPCNI_K8S_KUBECTL"], "--kubeconfig", n.env["VPCNI_K8S_KUBECONFIG"],
		"create", "-f", file, "-o", "name")
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	created, readErr := readCreated(out)
	if err := cmd.Wait(); err != nil {
		return created, fmt.Errorf("kubectl create: %w: %s", err, stderr.String())
	}
	return created, readErr
}

func readCreated(r io.Reader) (map[string]time.Time, error) {
	created := map[string]time.Time{}
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		at := time.Now()
		name := strings.TrimPrefix(strings.TrimSpace(sc.Text()), "pod/")
		if name != "" {
			created[name] = at
		}
	}
	return created, sc.Err()
}

// kubeletLog is the file the fixture's kubelet of the node with env logs
// to (scripts/k8s-node.sh: $STATE/logs, a joined node's in a directory of
// its name).
func kubeletLog(env map[string]string) string {
	logs := filepath.Join(cmp.Or(os.Getenv("VPCNI_K8S_STATE"), "/var/tmp/vpcni-k8s"), "logs")
	if env["VPCNI_K8S_JOINED"] != "" {
		logs = filepath.Join(logs, env["VPCNI_K8S_NODE"])
	}
	return filepath.Join(logs, "kubelet.log")
}

// logMark is where each node's kubelet log ended before a batch: only what
// follows is read for it (the logs are appended to across runs, and pod
// names repeat between runs).
type logMark map[string]int64

func (n *node) markKubeletLogs() logMark {
	m := logMark{}
	for _, e := range n.envs() {
		f := kubeletLog(e)
		st, err := os.Stat(f)
		if err != nil {
			n.t.Fatalf("the kubelet's log (the pods' sub-second running times): %v", err)
		}
		m[f] = st.Size()
	}
	return m
}

var startupLine = regexp.MustCompile(`"Observed pod startup duration" pod="([^"/]+)/([^"]+)".* observedRunningTime="([^"]+)"`)

// observedRunning reads, from each kubelet's log past the mark, the time
// each pod's running status reached the API server (the kubelet's
// observedRunningTime); the last line for a pod wins.
func observedRunning(m logMark) (map[string]time.Time, error) {
	out := map[string]time.Time{}
	for f, off := range m {
		fh, err := os.Open(f)
		if err != nil {
			return nil, err
		}
		if _, err := fh.Seek(off, io.SeekStart); err != nil {
			fh.Close()
			return nil, err
		}
		err = parseObservedRunning(fh, out)
		fh.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
	}
	return out, nil
}

func parseObservedRunning(r io.Reader, out map[string]time.Time) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.Contains(line, "Observed pod startup duration") {
			continue
		}
		mm := startupLine.FindStringSubmatch(line)
		if mm == nil {
			return fmt.Errorf("unexpected pod-startup line %q", line)
		}
		at, err := parseKlogTime(mm[3])
		if err != nil {
			return fmt.Errorf("line %q: %w", line, err)
		}
		out[mm[2]] = at
	}
	return sc.Err()
}

// parseKlogTime reads a time.Time as the kubelet logs it (Go's String:
// "2006-01-02 15:04:05.999999999 -0700 MST m=+1.5").
func parseKlogTime(s string) (time.Time, error) {
	s, _, _ = strings.Cut(s, " m=")
	return time.Parse("2006-01-02 15:04:05.999999999 -0700 MST", s)
}

// quantile is the q-quantile (0..1) of v by linear interpolation between
// the order statistics (as numpy's default): with few rounds, a median and
// quartiles that do not jump to one round's value.
func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (pos-float64(lo))*(s[hi]-s[lo])
}

// spread is a figure over rounds: its median and interquartile range.
type spread struct{ med, q1, q3 float64 }

func spreadOf(v []float64) spread {
	return spread{quantile(v, 0.5), quantile(v, 0.25), quantile(v, 0.75)}
}

func (s spread) String() string { return fmt.Sprintf("%.2f [IQR %.2f–%.2f]", s.med, s.q1, s.q3) }

// interpolated is the histogram's q-quantile interpolated linearly within
// its bucket, as Prometheus' histogram_quantile does (the first bucket
// from 0); past the last finite bound it is that bound and beyond is true.
func (h addHist) interpolated(q float64) (v float64, beyond bool) {
	bounds := make([]float64, 0, len(h.le))
	for b := range h.le {
		bounds = append(bounds, b)
	}
	slices.Sort(bounds)
	rank := q * h.count
	lower, below := 0.0, 0.0
	for _, b := range bounds {
		if math.IsInf(b, 1) {
			break
		}
		if c := h.le[b]; c >= rank {
			if c == below {
				return b, false
			}
			return lower + (b-lower)*(rank-below)/(c-below), false
		}
		lower, below = b, h.le[b]
	}
	return lower, true
}

// TestStartupClocks checks the parsers of the two fine clocks on lines as
// the kubelet (v1.36) and kubectl write them, and the statistics.
func TestStartupClocks(t *testing.T) {
	log := `I1127 15:56:47.129561   11906 pod_startup_latency_tracker.go:148] "Observed pod startup duration" pod="default/su-vpcni-0-184" podStartSLOduration=38.129536959 podStartE2EDuration="38.129536959s" totalImagesPullingTime="0s" totalInitContainerRuntime="0s" isStatefulPod=false podCreationTimestamp="2026-11-27 15:56:09 +0000 UTC" imagePullSessionsCount=0 imagePullSessionsStartsCount=0 observedRunningTime="2026-11-27 15:56:47.128263603 +0000 UTC m=+122.504892849" watchObservedRunningTime="2026-11-27 15:56:47.129536959 +0000 UTC m=+122.506166204"
I1127 15:56:47.2   11906 kubelet.go:1] "SyncLoop UPDATE" pods=["default/su-vpcni-0-184"]
`
	got := map[string]time.Time{}
	if err := parseObservedRunning(strings.NewReader(log), got); err != nil {
		t.Fatal(err)
	}
	want := time.Date(2026, 11, 27, 15, 56, 47, 128263603, time.UTC)
	if len(got) != 1 || !got["su-vpcni-0-184"].Equal(want) {
		t.Fatalf("parsed %v, want su-vpcni-0-184 at %s", got, want)
	}
	created, err := readCreated(strings.NewReader("pod/su-a\npod/su-b\n"))
	if err != nil || len(created) != 2 || created["su-a"].IsZero() || created["su-b"].Before(created["su-a"]) {
		t.Fatalf("readCreated: %v %v", created, err)
	}
	if s := spreadOf([]float64{4, 1, 3, 2}); s.med != 2.5 || s.q1 != 1.75 || s.q3 != 3.25 {
		t.Errorf("spread of 1..4: %+v", s)
	}
	h := addHist{le: map[float64]float64{0.5: 50, 1: 100, math.Inf(1): 100}, count: 100}
	if v, beyond := h.interpolated(0.99); beyond || math.Abs(v-0.99) > 1e-9 {
		t.Errorf("p99 of 50 in (0,0.5] and 50 in (0.5,1]: %v beyond=%v, want 0.99", v, beyond)
	}
	h = addHist{le: map[float64]float64{0.5: 50, 10: 90, math.Inf(1): 100}, count: 100}
	if v, beyond := h.interpolated(0.99); !beyond || v != 10 {
		t.Errorf("p99 past the last bound: %v beyond=%v, want 10 and beyond", v, beyond)
	}
}
