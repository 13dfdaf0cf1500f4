// Package doctor is vpcnictl doctor: a node's prerequisites and health in
// one go — the kernel features each datapath mode needs, the sysctls of
// the configured one, the uplink, the CNI conf and bin dirs, the agent,
// the cloud, the API server and the clocks — one Result per check, each
// with what to do when it is not ok.
//
// The decisions are pure functions of what was read (tested without
// root); Run reads the node, the agent, the cloud (through the Doctor of
// the node's provider, registered with it) and the API server.
package doctor

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/datapath"
)

// Status is a check's verdict.
type Status string

// The verdicts: Fail makes doctor exit non-zero, Warn does not.
const (
	OK   Status = "ok"
	Warn Status = "warn"
	Fail Status = "fail"
)

// Result is one check.
type Result struct {
	Name   string `json:"name"`
	Status Status `json:"status"`
	// Detail is what was found.
	Detail string `json:"detail"`
	// Fix is what to do, when Status is not OK.
	Fix string `json:"fix,omitempty"`
}

// Report is every check of one run.
type Report struct {
	Results []Result `json:"results"`
}

// Failed counts the checks that failed.
func (r Report) Failed() int {
	n := 0
	for _, c := range r.Results {
		if c.Status == Fail {
			n++
		}
	}
	return n
}

// Find returns the check named name (false: none ran).
func (r Report) Find(name string) (Result, bool) {
	for _, c := range r.Results {
		if c.Name == name {
			return c, true
		}
	}
	return Result{}, false
}

func (r *Report) add(res ...Result) { r.Results = append(r.Results, res...) }

// MaxSkew is the clock difference above which doctor warns: Neutron
// tokens, TLS certificates and the agent's leases and events all compare
// times across machines.
const MaxSkew = 5 * time.Second

// Kernel judges the kernel's link types: probed is each kind's probe
// error (nil: the kernel created one), needs what each registered mode
// creates, configured the node's mode ("" when its config could not be
// read). A kind the configured mode needs fails; one only other modes
// need warns and names the modes it rules out.
func Kernel(configured string, needs map[string]datapath.Needs, probed map[string]error) []Result {
	users := map[string][]string{} // kind -> modes that create it
	for mode, n := range needs {
		for _, k := range n.Links {
			users[k] = append(users[k], mode)
		}
	}
	kinds := make([]string, 0, len(users))
	for k := range users {
		kinds = append(kinds, k)
		slices.Sort(users[k])
	}
	slices.Sort(kinds)
	var out []Result
	for _, k := range kinds {
		r := Result{Name: "kernel " + k}
		err, probedIt := probed[k]
		switch {
		case !probedIt:
			r.Status, r.Detail = Warn, fmt.Sprintf("%s links were not probed", k)
		case err == nil:
			r.Status, r.Detail = OK, fmt.Sprintf("the kernel creates %s links (datapath %s)", k, strings.Join(users[k], ", "))
		default:
			r.Status = Warn
			if slices.Contains(users[k], configured) {
				r.Status = Fail
			}
			r.Detail = fmt.Sprintf("the kernel cannot create %s links (%v): rules out datapath %s", k, err, strings.Join(users[k], ", "))
			r.Fix = fmt.Sprintf("load the %s module (modprobe %s; CONFIG_%s in the kernel)", k, k, strings.ToUpper(k))
			if works := modesWithout(needs, probed); len(works) > 0 {
				r.Fix += ", or use a datapath mode this kernel supports: " + strings.Join(works, ", ")
			}
		}
		if configured != "" && r.Status == OK && slices.Contains(users[k], configured) {
			r.Detail += "; the configured mode " + configured + " needs them"
		}
		out = append(out, r)
	}
	return out
}

// modesWithout lists the modes whose every link type probed fine.
func modesWithout(needs map[string]datapath.Needs, probed map[string]error) []string {
	var out []string
	for mode, n := range needs {
		ok := true
		for _, k := range n.Links {
			if err, done := probed[k]; !done || err != nil {
				ok = false
			}
		}
		if ok {
			out = append(out, mode)
		}
	}
	slices.Sort(out)
	return out
}

// Sysctls judges the configured mode's sysctls; read returns a key's
// value (an error: it could not be read, fs.ErrNotExist when the kernel
// lacks it). agentConfig is the config's path, for the fix.
func Sysctls(mode string, list []datapath.Sysctl, read func(key string) (string, error), agentConfig string) []Result {
	var out []Result
	for _, s := range list {
		r := Result{Name: "sysctl " + s.Name()}
		v, err := read(s.Key)
		switch {
		case err != nil && s.Value == "":
			r.Status, r.Detail = Fail, fmt.Sprintf("/proc/sys/%s is missing, which datapath %s needs: %s", s.Key, mode, s.Why)
			r.Fix = "load the kernel feature that provides it (" + s.Why + "), or choose another datapath mode"
		case err != nil:
			r.Status, r.Detail = Fail, fmt.Sprintf("cannot read %s (%v); datapath %s needs it %s: %s", s.Name(), err, mode, s.Value, s.Why)
			r.Fix = "check that the uplink in " + agentConfig + " exists and that /proc/sys is mounted"
		case s.Value == "":
			r.Status, r.Detail = OK, fmt.Sprintf("/proc/sys/%s is there (%s)", s.Key, s.Why)
		case v != s.Value:
			r.Status, r.Detail = Fail, fmt.Sprintf("%s is %s, datapath %s needs %s: %s", s.Name(), v, mode, s.Value, s.Why)
			r.Fix = fmt.Sprintf("vpcnictl install-cni --agent-config %s sets it (the DaemonSet's init step), or sysctl -w %s=%s", agentConfig, s.Name(), s.Value)
		default:
			r.Status, r.Detail = OK, fmt.Sprintf("%s = %s (%s)", s.Name(), v, s.Why)
		}
		out = append(out, r)
	}
	return out
}

// Link is what the uplink check reads of a link.
type Link struct {
	Name string
	Up   bool
	MTU  int
	// IPv4 is its first global address, or its master's (a bridge that
	// took the uplink's address) when it has none; "" if neither has one.
	IPv4 string
	// Master names the bridge it is a port of ("": none).
	Master string
}

// Uplink judges the uplink: err is why it could not be found; mtu is the
// configured pod MTU (0: the uplink's).
func Uplink(l Link, err error, mtu int, agentConfig string) Result {
	r := Result{Name: "uplink"}
	switch {
	case err != nil:
		r.Status, r.Detail = Fail, err.Error()
		r.Fix = "set uplink in " + agentConfig + " to the interface on the pods' network, or give the node an IPv4 default route"
		return r
	case !l.Up:
		r.Status, r.Detail = Fail, fmt.Sprintf("%s is down", l.Name)
		r.Fix = "ip link set " + l.Name + " up, or set uplink in " + agentConfig + " to the interface on the pods' network"
		return r
	case mtu > l.MTU:
		r.Status, r.Detail = Fail, fmt.Sprintf("pods' mtu %d is above %s's %d: large packets leaving pods are dropped", mtu, l.Name, l.MTU)
		r.Fix = fmt.Sprintf("set mtu in %s to %d or less (0: the uplink's)", agentConfig, l.MTU)
		return r
	}
	if mtu == 0 {
		mtu = l.MTU
	}
	r.Status, r.Detail = OK, fmt.Sprintf("%s up, mtu %d, pods' mtu %d", l.Name, l.MTU, mtu)
	if l.Master != "" {
		r.Detail += ", port of " + l.Master
	}
	if l.IPv4 == "" {
		r.Status, r.Detail = Warn, r.Detail+", no IPv4 address"
		r.Fix = "a cloud provider finds the node's port by the uplink's address: give it one, or set provider.openstack.nodeIP or instanceID"
	} else {
		r.Detail += ", node IP " + l.IPv4
	}
	return r
}

// Agent judges the agent's answer on its socket.
func Agent(socket string, st *api.State, err error) Result {
	r := Result{Name: "agent"}
	switch {
	case err != nil:
		r.Status, r.Detail = Fail, err.Error()
		r.Fix = "start vpcnid (its DaemonSet pod on this node; its log says why it stopped), or pass --socket if it listens elsewhere"
	case !st.Ready:
		r.Status, r.Detail = Fail, fmt.Sprintf("vpcnid at %s is not ready: %s", socket, st.Reason)
		r.Fix = "vpcnictl status shows its state; its log says what it waits for"
	case st.Degraded:
		r.Status, r.Detail = Warn, fmt.Sprintf("vpcnid at %s is ready but degraded: %s", socket, st.Reason)
		r.Fix = "vpcnictl status shows its state; its log says what is wrong"
	default:
		r.Status = OK
		r.Detail = fmt.Sprintf("vpcnid at %s ready: node %s, datapath %s via %s, pool free %d, allocated %d of %d",
			socket, st.Node, st.Datapath, st.Uplink, st.Pool.Free, st.Pool.Allocated, st.Pool.Capacity)
	}
	return r
}

// Skew judges a remote clock: date is its Date header, read between sent
// and received. The header has whole seconds, so a second of difference
// is noise.
func Skew(what string, date, sent, received time.Time) Result {
	r := Result{Name: "clock " + what}
	if date.IsZero() {
		r.Status, r.Detail = Warn, what+" sent no Date header: skew unknown"
		r.Fix = "compare the clocks by hand (date -u here and there)"
		return r
	}
	mid := sent.Add(received.Sub(sent) / 2)
	skew := mid.Sub(date)
	// Date is truncated to the second: the remote clock lies in
	// [date, date+1s).
	switch {
	case skew > 0 && skew < time.Second:
		skew = 0
	case skew > 0:
		skew -= time.Second
	}
	abs := max(skew, -skew)
	r.Status = OK
	r.Detail = fmt.Sprintf("this node's clock is within %s of %s's", abs.Round(time.Second)+time.Second, what)
	if abs > MaxSkew {
		ahead := "ahead of"
		if skew < 0 {
			ahead = "behind"
		}
		r.Status = Warn
		r.Detail = fmt.Sprintf("this node's clock is %s %s %s's (more than %s)", abs.Round(time.Second), ahead, what, MaxSkew)
		r.Fix = "run time synchronisation (chrony, systemd-timesyncd) on the node and on " + what
	}
	return r
}
