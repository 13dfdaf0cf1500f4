package integration

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/bedtest"
)

// TestRestartDuringAddBurst: vpcnid stopped (SIGTERM, as a DaemonSet
// rollout does) with half a burst of ADDs queued on its socket and the rest
// arriving, or killed (SIGKILL, a crash) in the middle of a burst. Every
// ADD that fails says "try again later" (CNI 11), never 999; a graceful
// stop answers every ADD that reached its socket, so its failures are only
// later ones that found no agent. Retried after the restart every ADD
// succeeds, and store, pool and kernel agree: one address per pod, none
// leaked, none given twice.
func TestRestartDuringAddBurst(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	c := e.cni("1.0.0")
	const n = 60
	paths := make([]string, n)
	for i := range n {
		paths[i] = e.Pod(200 + i)
	}
	for _, how := range []string{"term", "kill"} {
		id := func(i int) string { return fmt.Sprintf("%s-%d", how, i) }
		ips := make([]netip.Addr, n)
		errs := make([]error, n)
		var done atomic.Int32
		firstDone := make(chan struct{})
		var wg sync.WaitGroup
		burst := func(from, to int) {
			for i := from; i < to; i++ {
				wg.Go(func() {
					res, err := c.Add(bedtest.Ctx(t), testbed.Runtime(id(i), paths[i], "eth0", nil))
					if err == nil {
						ips[i] = bedtest.ResultIP(t, res)
					}
					errs[i] = err
					if done.Add(1) == 1 {
						close(firstDone)
					}
				})
			}
		}
		pid := e.Agent.Pid()
		switch how {
		case "term":
			// The agent held still (SIGSTOP) while the first half of the
			// burst queues on its socket, so the stop meets a full
			// backlog; the second half meets an agent draining or gone.
			if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
				t.Fatal(err)
			}
			burst(0, n/2)
			bedtest.WaitFor(t, 30*time.Second, "the first half of the burst queued on the agent's socket", func() bool {
				return connectionsTo(t, pid, e.Cfg.SocketPath) >= n/2
			})
			for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGCONT} {
				if err := syscall.Kill(pid, sig); err != nil {
					t.Fatal(err)
				}
			}
			burst(n/2, n)
			if err := e.Agent.Stop(); err != nil { // waits for the exit
				t.Fatal(err)
			}
		case "kill":
			// The first answer means the agent is mid-burst: the rest are
			// queued on its socket, being served, or not yet started.
			burst(0, n)
			select {
			case <-firstDone:
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: no ADD of the burst returned within 30s", how)
			}
			if err := e.Agent.Kill(); err != nil {
				t.Fatal(err)
			}
		}
		wg.Wait()

		var failed []int
		byCode, byWhat := map[uint]int{}, map[string]int{}
		for i, err := range errs {
			if err == nil {
				continue
			}
			failed = append(failed, i)
			var ce *types.Error
			if !errors.As(err, &ce) {
				t.Errorf("%s: ADD %d failed without a CNI error: %v", how, i, err)
				continue
			}
			byCode[ce.Code]++
			what, _, _ := strings.Cut(ce.Msg, " (")
			byWhat[what]++
			if ce.Code != 11 {
				t.Errorf("%s: ADD %d: code %d %q, want 11 (a retry cures it)", how, i, ce.Code, ce.Error())
			}
			// A graceful stop answers what reached its socket: a failure
			// can only be an ADD that came after and found no agent.
			if how == "term" && (i < n/2 || !strings.Contains(ce.Msg, "not running")) {
				t.Errorf("%s: ADD %d (queued before the stop: %t): %q; a graceful stop fails only later ADDs, with \"not running\"", how, i, i < n/2, ce.Error())
			}
		}
		t.Logf("%s: %d of %d ADDs failed, by CNI code %v, by message %v", how, len(failed), n, byCode, byWhat)
		if how == "kill" && len(failed) == 0 {
			t.Fatalf("kill: every ADD succeeded: the kill landed after the burst and tested nothing")
		}

		e.StartAgent()
		for _, i := range failed {
			res, err := c.Add(bedtest.Ctx(t), testbed.Runtime(id(i), paths[i], "eth0", nil))
			if err != nil {
				t.Fatalf("%s: retried ADD %d after the restart: %v", how, i, err)
			}
			ips[i] = bedtest.ResultIP(t, res)
		}

		// One address per pod, as the plugin reported it, the store
		// records it and the pool counts it; and the kernel wires exactly
		// those.
		st := e.state()
		recorded := map[string]string{}
		for _, a := range st.Allocations {
			recorded[a.ContainerID] = a.Address.String()
		}
		owner := map[netip.Addr]int{}
		for i, ip := range ips {
			if j, dup := owner[ip]; dup {
				t.Errorf("%s: ADDs %d and %d both got %s", how, j, i, ip)
			}
			owner[ip] = i
			if recorded[id(i)] != ip.String() {
				t.Errorf("%s: ADD %d got %s, the agent records %q", how, i, ip, recorded[id(i)])
			}
		}
		held := st.Pool.Addresses["allocated"]
		if len(st.Allocations) != n || st.Pool.Allocated != n || len(held) != n {
			t.Errorf("%s: %d records, pool counts %d allocated (%d listed); want %d each", how, len(st.Allocations), st.Pool.Allocated, len(held), n)
		}
		for _, a := range held {
			if !slices.ContainsFunc(st.Allocations, func(r alloc.Allocation) bool { return r.Address.String() == a }) {
				t.Errorf("%s: the pool holds %s as allocated, no record has it (leaked)", how, a)
			}
		}
		if ks := e.kernel(); len(ks.Links) != n || len(ks.Routes) != n || len(ks.Proxies) != n {
			t.Errorf("%s: node has %d links, %d routes, %d proxy entries; want %d each", how, len(ks.Links), len(ks.Routes), len(ks.Proxies), n)
		}
		if t.Failed() {
			t.FailNow()
		}

		for i := range n {
			wg.Go(func() { errs[i] = c.Del(bedtest.Ctx(t), testbed.Runtime(id(i), paths[i], "eth0", nil)) })
		}
		wg.Wait()
		for i, err := range errs {
			if err != nil {
				t.Fatalf("%s: DEL %d: %v", how, i, err)
			}
		}
		e.waitClean()
		if st := e.state(); st.Pool.Allocated != 0 || len(st.Allocations) != 0 {
			t.Fatalf("%s: after the DELs: pool %+v, %d records", how, st.Pool, len(st.Allocations))
		}
	}
}

// connectionsTo counts the connections to the unix socket at path in the
// network namespace of process pid, accepted or still queued: the server
// end of each carries the socket's path, as the listener does.
func connectionsTo(t *testing.T, pid int, path string) int {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/unix", pid))
	if err != nil {
		t.Fatal(err)
	}
	n := -1 // the listener
	for _, line := range strings.Split(string(data), "\n") {
		if strings.HasSuffix(line, " "+path) {
			n++
		}
	}
	return n
}
