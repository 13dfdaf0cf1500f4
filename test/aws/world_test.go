package aws

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/lab"
	"github.com/vpcni/vpcni/internal/netnsutil"
	"github.com/vpcni/vpcni/internal/testbed"
	"github.com/vpcni/vpcni/internal/testbed/chaos"
)

// The tags by which an ENI is vpcni's, for an instance (the provider's
// documented tags: a person's tooling finds vpcni's ENIs by them too).
const (
	tagOwner    = "vpcni.io/owner"
	tagInstance = "vpcni.io/instance-id"
)

// world is what TestChaos drives and checks: the lab (EC2 read in
// process, the truth), the node's agent, and the runtime's pods.
type world struct {
	t      *testing.T
	l      *lab.Lab
	node   lab.Host
	cfg    config.Config
	runDir string
	seed   uint64
	agent  *testbed.Agent
	cni    *testbed.CNI
	pods   *chaos.Pods
	// enisSeen: every ENI of vpcni's the checks saw, attached or not.
	enisSeen []string
}

// start runs vpcnid on the node (again, after a kill) and waits until it
// serves pods; it is stopped when the test ends.
func (w *world) start() {
	w.t.Helper()
	a, err := testbed.StartAgentIn(w.runDir, w.node.NS, binDir, w.cfg)
	if err != nil {
		w.t.Fatalf("seed %d: vpcnid: %v", w.seed, err)
	}
	w.t.Cleanup(func() { _ = a.Stop() })
	w.agent = a
	if err := a.WaitServing(testbed.RestartServeWait); err != nil {
		w.t.Fatalf("seed %d: %v", w.seed, err)
	}
}

// keepLog saves a failed run's agent log where it outlives the test.
func (w *world) keepLog() {
	if !w.t.Failed() || w.agent == nil {
		return
	}
	data, err := os.ReadFile(w.agent.LogPath)
	if err != nil {
		w.t.Logf("vpcnid log: %v", err)
		return
	}
	p := filepath.Join(os.TempDir(), fmt.Sprintf("vpcni-chaos-aws-%d.log", w.seed))
	if err := os.WriteFile(p, data, 0o600); err != nil {
		w.t.Logf("keep the vpcnid log: %v", err)
		return
	}
	w.t.Logf("vpcni-test: vpcnid log kept in %s", p)
}

// ec2View is what EC2 holds for the node, as the endpoint has it.
type ec2View struct {
	// where: each secondary address on the primary ENI or an ENI of
	// vpcni's attached to the instance → that ENI.
	where map[netip.Addr]string
	// enis: vpcni's ENIs attached to the instance.
	enis []string
	// problems: ENIs of vpcni's detached (left by a crash between create
	// and attach, or a detach whose delete failed), or attached and empty
	// past eniMinLifetime, or ENIs on the instance nobody here made.
	problems []string
}

func (w *world) readEC2() ec2View {
	v := ec2View{where: map[netip.Addr]string{}}
	for _, e := range w.l.EC2.ENIs() {
		ours := e.Tags[tagOwner] == "vpcni" && e.Tags[tagInstance] == w.node.InstanceID
		if ours && !slices.Contains(w.enisSeen, e.ID) {
			w.enisSeen = append(w.enisSeen, e.ID)
		}
		switch {
		case ours && e.InstanceID == "":
			v.problems = append(v.problems, fmt.Sprintf("vpcni's ENI %s is %s (made %s ago)", e.ID, e.Status, time.Since(e.CreatedAt).Round(time.Second)))
			continue
		case e.InstanceID != w.node.InstanceID:
			continue
		case e.ID != w.node.PortID && !ours:
			v.problems = append(v.problems, fmt.Sprintf("ENI %s on the instance is not vpcni's", e.ID))
			continue
		}
		n := 0
		for _, a := range e.PrivateIPs {
			if a != e.PrimaryIP {
				v.where[a] = e.ID
				n++
			}
		}
		for _, p := range e.Prefixes {
			for a := p.Masked().Addr(); p.Contains(a); a = a.Next() {
				v.where[a] = e.ID
				n++
			}
		}
		if ours {
			v.enis = append(v.enis, e.ID)
			if n == 0 && time.Since(e.CreatedAt) > eniMinLifetime {
				v.problems = append(v.problems, fmt.Sprintf("vpcni's ENI %s (%s) holds no address %s after it was made", e.ID, e.Status, time.Since(e.CreatedAt).Round(time.Second)))
			}
		}
	}
	slices.Sort(v.enis)
	return v
}

// findings count what a check found wrong.
type findings struct {
	leaked, doubled, orphans, misplaced int
	enis                                []string
}

// check compares EC2, the agent and the kernel once the pool has had time
// to settle, and returns what it found wrong.
func (w *world) check(round int) findings {
	t := w.t
	t.Helper()
	var f findings
	var lastErr string
	deadline := time.Now().Add(60 * time.Second)
	for {
		f, lastErr = findings{}, ""
		st, err := w.agent.State()
		ec2 := w.readEC2()
		f.enis = ec2.enis
		if err != nil {
			lastErr = fmt.Sprintf(" agent state: %v;", err)
		} else {
			// Every state the agent lists: free, cooling, allocated and
			// any other (set aside, leaving).
			pool := map[netip.Addr]string{}
			for state, list := range st.Pool.Addresses {
				for _, s := range list {
					pool[netip.MustParseAddr(s)] = state
				}
			}
			for a, eni := range ec2.where {
				if _, ok := pool[a]; !ok {
					f.leaked++
					lastErr += fmt.Sprintf(" EC2 holds %s on %s for the node, the agent does not know it;", a, eni)
				}
			}
			for a, state := range pool {
				if _, ok := ec2.where[a]; !ok {
					f.leaked++
					lastErr += fmt.Sprintf(" the agent counts %s (%s), EC2 does not hold it for the node;", a, state)
				}
			}
			for _, p := range ec2.problems {
				f.leaked++
				lastErr += " " + p + ";"
			}
			byIP := map[netip.Addr]string{}
			records := map[string]bool{}
			for _, al := range st.Allocations {
				if other, dup := byIP[al.Address]; dup {
					f.doubled++
					lastErr += fmt.Sprintf(" %s on %s and %s;", al.Address, other, al.ContainerID)
				}
				byIP[al.Address] = al.ContainerID
				records[al.ContainerID] = true
				if eni, ok := ec2.where[al.Address]; ok && eni != al.Interface {
					f.misplaced++
					lastErr += fmt.Sprintf(" %s's address %s is on ENI %s, its record says %s;", al.ContainerID, al.Address, eni, al.Interface)
				}
			}
			for i, isLive := range w.pods.Live() {
				if id := w.pods.ID(i); isLive != records[id] {
					f.leaked++
					lastErr += fmt.Sprintf(" container %s live=%v but recorded=%v;", id, isLive, records[id])
				}
			}
			problems, err := w.pods.Links(w.node.NS)
			if err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
			f.orphans += len(problems)
			for _, p := range problems {
				lastErr += " " + p + ";"
			}
		}
		if f.leaked+f.doubled+f.orphans+f.misplaced == 0 && lastErr == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("round %d (seed %d):%s", round, w.seed, lastErr)
			break
		}
		time.Sleep(500 * time.Millisecond)
	}
	// Every live container is wired as vpcni left it.
	for i, isLive := range w.pods.Live() {
		if !isLive {
			continue
		}
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := w.cni.Check(c, w.pods.RT(i))
		cancel()
		if err != nil {
			f.orphans++
			t.Errorf("round %d (seed %d): CHECK %s: %v", round, w.seed, w.pods.ID(i), err)
		}
	}
	return f
}

// reachable probes every live pod from the legacy VM, at the address the
// agent records for it: a pod the runtime has but nobody can reach fails
// the run.
func (w *world) reachable(round int) {
	t := w.t
	t.Helper()
	st, err := w.agent.State()
	if err != nil {
		t.Fatalf("round %d (seed %d): agent state: %v", round, w.seed, err)
	}
	if err := w.pods.ReachLive(st, netnsutil.Path(w.l.Legacy.NS), "the legacy VM"); err != nil {
		t.Fatalf("round %d (seed %d): %v", round, w.seed, err)
	}
}
