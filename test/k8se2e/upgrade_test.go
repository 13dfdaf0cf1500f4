package k8se2e

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"
)

// checkUpgrade rolls vpcnid's DaemonSet back to the previous release's
// image and forward again to this one (make prev-image builds the former
// from git; VPCNI_PREV_IMAGE names its tarball), the way an operator
// would (kubectl set image; the DaemonSet's rolling update), while the
// legacy VM probes every web pod every 10 ms. Each way: no probe fails,
// the new agent adopts every allocation the old one held (the same
// addresses, the same containers), and the pods still reach each other.
func checkUpgrade(t *testing.T, n *node) {
	tarball := os.Getenv("VPCNI_PREV_IMAGE")
	if tarball == "" {
		t.Fatal("VPCNI_PREV_IMAGE is not set: make e2e-k8s and make upgrade-e2e build the previous release's image (make prev-image) and set it")
	}
	prevName, err := os.ReadFile(filepath.Join(filepath.Dir(tarball), "vpcni-image.name"))
	if err != nil {
		t.Fatal(err)
	}
	curName, err := os.ReadFile(filepath.Join(binDir, "vpcni-image.name"))
	if err != nil {
		t.Fatal(err)
	}
	prev, cur := strings.TrimSpace(string(prevName)), strings.TrimSpace(string(curName))
	mustRun(t, nil, "bash", filepath.Join(repo, "scripts/k8s-node.sh"), "import", tarball)

	web := n.pods("default", "app=web")
	allocs := func() []string {
		t.Helper()
		s, err := n.agentState()
		if err != nil {
			t.Fatalf("agent state: %v", err)
		}
		var out []string
		for _, a := range s.Allocations {
			out = append(out, a.Address.String()+"="+a.ContainerID)
		}
		sort.Strings(out)
		return out
	}
	var adopted, held, probes, failed int
	for _, step := range []struct{ name, image string }{{"rollback", prev}, {"upgrade", cur}} {
		before := allocs()
		ok, bad := probeAll(t, web, func() {
			n.mustKubectl("-n", "vpcni-system", "set", "image", "daemonset/vpcnid", "install-cni="+step.image, "vpcnid="+step.image)
			n.mustKubectl("-n", "vpcni-system", "rollout", "status", "daemonset/vpcnid", "--timeout=3m")
			eventually(t, 2*time.Minute, "the "+step.name+" agent ready on "+step.image, func() (bool, string) {
				ps := n.pods("vpcni-system", "app.kubernetes.io/name=vpcnid")
				if len(ps) != 1 || !ps[0].ready() {
					return false, fmt.Sprintf("%d agent pods", len(ps))
				}
				img := n.mustKubectl("-n", "vpcni-system", "get", "pod", ps[0].Metadata.Name, "-o", "jsonpath={.spec.containers[0].image}")
				if !strings.HasSuffix(strings.TrimSpace(img), strings.TrimPrefix(step.image, "docker.io/")) {
					return false, "agent pod runs " + img
				}
				_, err := n.agentState()
				return err == nil, fmt.Sprintf("agent state: %v", err)
			})
			time.Sleep(2 * time.Second) // probes past the new agent's first reconcile
		})
		after := allocs()
		if !slices.Equal(before, after) {
			t.Errorf("%s: the new agent holds other allocations:\nbefore %v\nafter  %v", step.name, before, after)
		}
		if bad > 0 || ok == 0 {
			t.Errorf("%s to %s: %d probes from the legacy VM ok, %d failed", step.name, step.image, ok, bad)
		}
		for i, p := range web {
			q := web[(i+1)%len(web)]
			if out, err := n.get(p.Metadata.Name, q.Status.PodIP+":8080"); err != nil || out != q.Metadata.Name {
				t.Errorf("after the %s %s -> %s: %q %v", step.name, p.Metadata.Name, q.Metadata.Name, out, err)
			}
		}
		t.Logf("vpcni-test: %s to %s: %d probes of %d pods from the legacy VM, %d failed; %d of %d allocations adopted",
			step.name, step.image, ok+bad, len(web), bad, len(after), len(before))
		probes, failed = probes+ok+bad, failed+bad
		if step.name == "upgrade" {
			held = len(before)
			if slices.Equal(before, after) {
				adopted = len(after)
			}
		}
	}
	// pods: every pod vpcni wired on the node (the web pods the legacy VM
	// probes, and the controller's replicas on the pod network).
	fmt.Printf("upgrade: pods=%d failed_probes=%d adopted=%d\n", held, failed, adopted)
	fmt.Printf("upgrade detail: from=%s to=%s probed_pods=%d probes=%d interval_ms=10 (rollback and upgrade)\n", prev, cur, len(web), probes)
}

// probeAll fetches every pod from the legacy VM every 10 ms while during
// runs, and counts the answers and the failures.
func probeAll(t *testing.T, web []pod, during func()) (ok, failed int) {
	t.Helper()
	stop := make(chan struct{})
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, p := range web {
		target := netip.AddrPortFrom(netip.MustParseAddr(p.Status.PodIP), 8080)
		wg.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
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
					ok++
				} else {
					failed++
					if failed <= 5 {
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
	return ok, failed
}
