package k8se2e

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/cniinstall"
	"github.com/vpcni/vpcni/internal/doctor"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/store"
)

// previousRelease is the release make prev-image built from git
// (UPGRADE_FROM): its deploy/ and image, the image imported into the
// node's containerd unless the node pulls from its registry (n.ref).
// VPCNI_PREV_IMAGE names the image's tarball.
func previousRelease(t *testing.T, n *node) *release {
	tarball := os.Getenv("VPCNI_PREV_IMAGE")
	if tarball == "" {
		t.Fatal("VPCNI_PREV_IMAGE is not set: make e2e-k8s and make upgrade-e2e build the previous release (make prev-image) and set it")
	}
	dir := filepath.Dir(tarball)
	name, err := os.ReadFile(filepath.Join(dir, "vpcni-image.name"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "deploy", "kustomization.yaml")); err != nil {
		t.Fatalf("the previous release's deploy/: %v", err)
	}
	if n.registry == "" {
		mustRun(t, nil, "bash", filepath.Join(repo, "scripts/k8s-node.sh"), "import", tarball)
	}
	return &release{deploy: filepath.Join(dir, "deploy"), image: n.ref(strings.TrimSpace(string(name)))}
}

// wirings are the web pods' allocations as the agent holds them, by
// container: address and wiring (what the datapath made). The same after
// an agent change means every pod was adopted as it was, not re-wired.
func (n *node) wirings(t *testing.T, web []pod) map[string]string {
	t.Helper()
	st, err := n.agentState()
	if err != nil {
		t.Fatalf("agent state: %v", err)
	}
	names := map[string]bool{}
	for _, p := range web {
		names[p.Metadata.Name] = true
	}
	out := map[string]string{}
	for _, a := range st.Allocations {
		if a.PodNamespace == "default" && names[a.PodName] {
			w, _ := json.Marshal(a.Wiring)
			out[a.ContainerID] = a.Address.String() + " " + string(w)
		}
	}
	return out
}

// adopted counts the allocations of before that after holds unchanged.
func adopted(before, after map[string]string) int {
	n := 0
	for k, v := range before {
		if after[k] == v {
			n++
		}
	}
	return n
}

// roll changes the agent (with change) while the legacy VM probes every
// web pod (probeAll); it waits for the new agent pod ready on image and
// probes on for 2 s past it (the new agent's first reconcile and checks
// fall in that window). It returns what the probes saw and how long the
// probing ran.
func (n *node) roll(t *testing.T, web []pod, image string, change func()) (p probes, took time.Duration) {
	t.Helper()
	start := time.Now()
	p = probeAll(t, web, func() {
		change()
		n.mustKubectl("-n", "vpcni-system", "rollout", "status", "daemonset/vpcnid", "--timeout=3m")
		eventually(t, 2*time.Minute, "the agent ready on "+image, func() (bool, string) {
			ps := n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")
			if len(ps) != 1 || !ps[0].ready() {
				return false, fmt.Sprintf("%d agent pods", len(ps))
			}
			img := n.mustKubectl("-n", "vpcni-system", "get", "pod", ps[0].Metadata.Name, "-o", "jsonpath={.spec.containers[0].image}")
			if !strings.HasSuffix(strings.TrimSpace(img), image) {
				return false, "agent pod runs " + img
			}
			_, err := n.agentState()
			return err == nil, fmt.Sprintf("agent state: %v", err)
		})
		time.Sleep(2 * time.Second) // the observation window past readiness
	})
	return p, time.Since(start)
}

// checkUpgrade applies this release (its deploy/ and image, as an
// operator would: kubectl apply -k) over the previous one, which wired
// the web pods and wrote the store. No probe from the legacy VM fails; the
// new agent adopts every web pod as it was wired and has migrated the
// store to this release's schema; pods still reach each other.
func checkUpgrade(t *testing.T, n *node, web []pod) {
	prev := n.prev
	before := n.wirings(t, web)
	if st, err := n.agentState(); err != nil || st.StoreSchema != 0 {
		t.Fatalf("the previous release's agent: %+v %v (want no store schema: it predates them)", st, err)
	}
	n.prev = nil
	cur := n.ref(currentImage(t))
	if cur == prev.image {
		t.Fatalf("this release and the previous one are both %s: an upgrade must change the image's tag", cur)
	}
	p, took := n.roll(t, web, cur, func() {
		n.overlay = n.writeOverlay("5s", 64, true)
		n.mustKubectl("apply", "-k", n.overlay)
	})
	after := n.wirings(t, web)
	got := adopted(before, after)
	if err := p.check(); err != nil {
		t.Errorf("upgrade %s -> %s: %v", prev.image, cur, err)
	}
	if got != len(before) || len(before) != len(web) {
		t.Errorf("upgrade: %d of %d web pods adopted as they were wired (%d pods)\nbefore %v\nafter  %v", got, len(before), len(web), before, after)
	}
	if st, err := n.agentState(); err != nil || st.StoreSchema != store.Schema {
		t.Errorf("this release's agent: store schema %d, want %d (%v)", st.StoreSchema, store.Schema, err)
	}
	if n.registry != "" {
		checkPulled(t, n, cur)
	}
	checkPodToPod(t, n, web)
	// The previous release wrote 10-vpcni.conflist; this one writes its
	// own name and deletes that one.
	n.checkOneConflist(t, "after the upgrade", cniinstall.DefaultName)
	// The pacing is the echoes': they are what watches each pod every
	// 10 ms (the fetches are a tenth of that).
	perPod := took / time.Duration(max(1, p.echo.Sent/len(web)))
	fmt.Printf("upgrade: pods=%d failed_probes=%d adopted=%d\n", len(web), p.failed(), got)
	fmt.Printf("upgrade detail: from=%s to=%s probes=%d over=%s interval_per_pod=%s store_schema=0->%d fetches=%d fetches_failed=%d echo_gap_ms=%d\n",
		prev.image, cur, p.echo.Sent+p.fetchOK+p.fetchFailed, took.Round(100*time.Millisecond), perPod.Round(100*time.Microsecond), store.Schema,
		p.fetchOK+p.fetchFailed, p.fetchFailed, p.echo.Gap.Milliseconds())
	if perPod > 25*time.Millisecond {
		t.Errorf("the legacy VM sent each pod an echo every %s on average, not every ~10 ms: the figure above means less than it says", perPod)
	}
}

// checkRollback rolls vpcnid's DaemonSet back to the previous release's
// image and forward again (kubectl set image, as kubectl rollout undo
// would), probing every web pod (probeAll): each way no probe fails and
// every web pod is adopted as it was wired.
func checkRollback(t *testing.T, n *node) {
	prev := previousRelease(t, n)
	cur := n.ref(currentImage(t))
	web := n.pods("default", "app=web")
	for _, step := range []struct{ name, image string }{{"rollback", prev.image}, {"forward again", cur}} {
		before := n.wirings(t, web)
		p, took := n.roll(t, web, step.image, func() {
			n.mustKubectl("-n", "vpcni-system", "set", "image", "daemonset/vpcnid", "install-cni="+step.image, "vpcnid="+step.image)
		})
		after := n.wirings(t, web)
		if err := p.check(); err != nil {
			t.Errorf("%s to %s: %v", step.name, step.image, err)
		}
		if got := adopted(before, after); got != len(before) {
			t.Errorf("%s: %d of %d web pods adopted as they were wired", step.name, got, len(before))
		}
		checkPodToPod(t, n, web)
		if step.image == cur {
			n.checkOneConflist(t, "rolled forward again", cniinstall.DefaultName)
		}
		t.Logf("vpcni-test: %s to %s: %s of %d pods in %s from the legacy VM; %d web pods adopted as wired",
			step.name, step.image, p, len(web), took.Round(100*time.Millisecond), len(after))
	}
}

// probes is what probeAll saw: its echoes summed over the pods (the
// longest gap of any one pod) and its fetches.
type probes struct {
	echo                 lab.PingStats
	fetchOK, fetchFailed int
}

func (p probes) failed() int { return p.echo.Lost + p.fetchFailed }

func (p probes) String() string {
	return fmt.Sprintf("%d echoes (%d lost, longest gap %d ms) and %d fetches (%d failed)",
		p.echo.Sent, p.echo.Lost, p.echo.Gap.Milliseconds(), p.fetchOK+p.fetchFailed, p.fetchFailed)
}

// check says whether no probe failed and some of each kind were answered.
func (p probes) check() error {
	if p.failed() > 0 || p.fetchOK == 0 || p.echo.Sent == 0 {
		return fmt.Errorf("probes from the legacy VM: %s", p)
	}
	return nil
}

// probeAll watches every web pod from the legacy VM while during runs: an
// ICMP echo every 10 ms (a blip of the datapath shows as a lost echo) and
// an HTTP fetch every 100 ms (the pod answers end to end). The fetches
// are fewer because each one forks the pod's httpd: ten pods fetched every
// 10 ms asked more forks of a small node than it could serve, and the
// probes measured the node's CPU instead of vpcni.
func probeAll(t *testing.T, web []pod, during func()) probes {
	t.Helper()
	var pingers []*lab.Pinger
	for _, p := range web {
		pg, err := lab.StartPinger(netnsutil.Path(legacyNS), netip.MustParseAddr(p.Status.PodIP), 10*time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		pingers = append(pingers, pg)
	}
	stop := make(chan struct{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	var res probes
	for _, p := range web {
		target := netip.AddrPortFrom(netip.MustParseAddr(p.Status.PodIP), 8080)
		wg.Go(func() {
			tick := time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				_, err := fetch(legacyNS, target, time.Second)
				mu.Lock()
				if err == nil {
					res.fetchOK++
				} else {
					res.fetchFailed++
					if res.fetchFailed <= 5 {
						t.Logf("probe %s failed: %v", target, err)
					}
				}
				mu.Unlock()
			}
		})
	}
	during()
	close(stop)
	wg.Wait()
	for i, pg := range pingers {
		s := pg.Stop()
		if s.Lost > 0 {
			t.Logf("echoes to %s: %s", web[i].Status.PodIP, s)
		}
		res.echo.Sent += s.Sent
		res.echo.Lost += s.Lost
		res.echo.Gap = max(res.echo.Gap, s.Gap)
	}
	return res
}

// checkInAgentPod runs vpcnictl trace and doctor as an operator would, in
// the node's vpcnid container (kubectl exec): the trace of a web pod finds
// every piece ok; doctor finds the node's CNI conf dir, chained plugins,
// uplink, sysctls, agent and cloud ok from inside the pod.
func checkInAgentPod(t *testing.T, n *node) {
	web := n.pods("default", "app=web")
	if len(web) == 0 {
		t.Fatal("no web pod to trace")
	}
	agent := n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")[0].Metadata.Name
	exec := func(args ...string) (string, error) {
		return n.kubectl(append([]string{"-n", "vpcni-system", "exec", agent, "-c", "vpcnid", "--", "vpcnictl"}, args...)...)
	}
	out, err := exec("trace", "default/"+web[0].Metadata.Name, "-o", "json")
	var tr api.Trace
	if jerr := json.Unmarshal([]byte(out), &tr); err != nil || jerr != nil || !tr.OK() || len(tr.Attachments) != 1 {
		t.Errorf("vpcnictl trace in the agent pod: %v %v\n%s", err, jerr, out)
	} else {
		t.Logf("vpcni-test: vpcnictl trace in the agent pod: %d pieces of %s's path, all ok", len(tr.Attachments[0].Hops), web[0].Metadata.Name)
	}
	out, _ = exec("doctor", "-o", "json") // its exit code is the sum; the checks are read one by one
	var rep doctor.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("vpcnictl doctor in the agent pod: %v\n%s", err, out)
	}
	status := map[string]doctor.Status{}
	var lines []string
	for _, r := range rep.Results {
		status[r.Name] = r.Status
		lines = append(lines, fmt.Sprintf("%s %s: %s", r.Name, r.Status, r.Detail))
	}
	for _, name := range []string{"config", "cni conf", "cni plugins", "uplink", "agent", "cloud port", "sysctl net.ipv4.ip_forward"} {
		if status[name] != doctor.OK {
			t.Errorf("vpcnictl doctor in the agent pod: %s is %q, want ok:\n%s", name, status[name], strings.Join(lines, "\n"))
		}
	}
	t.Logf("vpcni-test: vpcnictl doctor in the agent pod: %d checks\n%s", len(rep.Results), strings.Join(lines, "\n"))
}
