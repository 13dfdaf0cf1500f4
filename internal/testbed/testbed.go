// Package testbed builds the small single-node network vpcni's demo,
// benchmarks and integration tests run on, from network namespaces only
// (nothing is added to the root namespace):
//
//	<prefix>-seg   the L2 segment: bridge br0 (gateway .1)
//	<prefix>-node  the node: eth0 .10 on the segment, runs vpcnid
//	<prefix>-nbr   a neighbour host on the same segment: eth0 .20
//
// Pods are further namespaces, <prefix>-p<N>, wired by the real plugin.
package testbed

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/vpcni/vpcni/internal/netnsutil"
)

// Topology is one built testbed.
type Topology struct {
	Prefix string
	// Subnet of the segment; the node is .10, the neighbour .20, the
	// gateway .1.
	Subnet  netip.Prefix
	Gateway netip.Addr
	NodeIP  netip.Addr
	NbrIP   netip.Addr
	RunDir  string // pid files and state of what the testbed started
	// Subnet6, if valid (WithIPv6), is the segment's IPv6 subnet too:
	// the gateway ::1, the node ::10, the neighbour ::20 on it.
	Subnet6  netip.Prefix
	Gateway6 netip.Addr
	NodeIP6  netip.Addr
	NbrIP6   netip.Addr
	children []*Process
}

// WithIPv6 puts the segment on an IPv6 subnet as well (call before Up):
// the gateway, the node and the neighbour get ::1, ::10 and ::20 of it
// beside their IPv4 addresses, and IPv6 default routes via the gateway.
func (t *Topology) WithIPv6(subnet netip.Prefix) *Topology {
	t.Subnet6 = subnet.Masked()
	base := t.Subnet6.Addr().As16()
	at := func(last byte) netip.Addr { b := base; b[15] = last; return netip.AddrFrom16(b) }
	t.Gateway6, t.NodeIP6, t.NbrIP6 = at(1), at(0x10), at(0x20)
	return t
}

// NodeNS, NbrNS and SegNS are the namespaces' names.
func (t *Topology) NodeNS() string { return t.Prefix + "-node" }

// NbrNS is the neighbour host's namespace.
func (t *Topology) NbrNS() string { return t.Prefix + "-nbr" }

// SegNS is the segment's namespace.
func (t *Topology) SegNS() string { return t.Prefix + "-seg" }

// PodNS names pod i's namespace.
func (t *Topology) PodNS(i int) string { return fmt.Sprintf("%s-p%d", t.Prefix, i) }

// New describes a testbed; nothing is built until Up.
func New(prefix string, subnet netip.Prefix) *Topology {
	base := subnet.Masked().Addr().As4()
	at := func(last byte) netip.Addr { b := base; b[3] = last; return netip.AddrFrom4(b) }
	return &Topology{
		Prefix: prefix, Subnet: subnet.Masked(),
		Gateway: at(1), NodeIP: at(10), NbrIP: at(20),
		RunDir: filepath.Join("/run/vpcni-testbed", prefix),
	}
}

// Up builds the testbed, first clearing what a crashed earlier run with the
// same prefix left behind.
func (t *Topology) Up() (err error) {
	t.Down()
	defer func() {
		if err != nil {
			t.Down()
		}
	}()
	if err := os.MkdirAll(t.RunDir, 0o700); err != nil {
		return err
	}
	for _, ns := range []string{t.SegNS(), t.NodeNS(), t.NbrNS()} {
		if err := netnsutil.Add(ns); err != nil {
			return err
		}
	}
	bits := strconv.Itoa(t.Subnet.Bits())
	seg := t.SegNS()
	if err := netnsutil.Exec(seg, "ip", "link", "add", "br0", "type", "bridge"); err != nil {
		return err
	}
	steps := [][]string{
		{"ip", "link", "set", "br0", "up"},
		{"ip", "addr", "add", t.Gateway.String() + "/" + bits, "dev", "br0"},
	}
	bits6 := strconv.Itoa(t.Subnet6.Bits())
	if t.Subnet6.IsValid() {
		// nodad: the segment's addresses are the testbed's own, and an
		// address still in DAD cannot be used for a second.
		steps = append(steps, []string{"ip", "-6", "addr", "add", t.Gateway6.String() + "/" + bits6, "dev", "br0", "nodad"})
	}
	for _, s := range steps {
		if err := netnsutil.Exec(seg, s...); err != nil {
			return err
		}
	}
	for _, h := range []struct {
		ns, port string
		ip, ip6  netip.Addr
	}{{t.NodeNS(), "node0", t.NodeIP, t.NodeIP6}, {t.NbrNS(), "nbr0", t.NbrIP, t.NbrIP6}} {
		if err := netnsutil.VethBetween(seg, h.port, h.ns, "eth0", nil); err != nil {
			return err
		}
		for _, s := range [][]string{
			{"ip", "link", "set", h.port, "master", "br0"},
			{"ip", "link", "set", h.port, "up"},
		} {
			if err := netnsutil.Exec(seg, s...); err != nil {
				return err
			}
		}
		steps := [][]string{
			{"ip", "addr", "add", h.ip.String() + "/" + bits, "dev", "eth0"},
			{"ip", "link", "set", "eth0", "up"},
			{"ip", "route", "add", "default", "via", t.Gateway.String()},
		}
		if t.Subnet6.IsValid() {
			steps = append(steps,
				[]string{"ip", "-6", "addr", "add", h.ip6.String() + "/" + bits6, "dev", "eth0", "nodad"},
				[]string{"ip", "-6", "route", "add", "default", "via", t.Gateway6.String()})
		}
		for _, s := range steps {
			if err := netnsutil.Exec(h.ns, s...); err != nil {
				return err
			}
		}
	}
	return nil
}

// Down stops every process the testbed started (also those a crashed run
// recorded) and deletes every namespace with its prefix.
func (t *Topology) Down() error {
	var errs []error
	for _, p := range t.children {
		errs = append(errs, p.Stop())
	}
	t.children = nil
	errs = append(errs, StopRecorded(t.RunDir))
	for _, ns := range netnsutil.List(t.Prefix + "-") {
		errs = append(errs, netnsutil.Delete(ns))
	}
	os.RemoveAll(t.RunDir)
	return errors.Join(errs...)
}

// AddPod creates pod i's namespace.
func (t *Topology) AddPod(i int) (string, error) {
	name := t.PodNS(i)
	return netnsutil.Path(name), netnsutil.Add(name)
}

// Track makes Down stop p.
func (t *Topology) Track(p *Process) { t.children = append(t.children, p) }

// HostPort formats an address and port.
func HostPort(ip netip.Addr, port int) string {
	return net.JoinHostPort(ip.String(), strconv.Itoa(port))
}

// StopRecorded kills the processes whose pid files lie in dir, if they still
// run the command recorded with them (a recycled PID is left alone).
func StopRecorded(dir string) error {
	files, _ := filepath.Glob(filepath.Join(dir, "*.pid"))
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		pidStr, exe, _ := strings.Cut(strings.TrimSpace(string(data)), " ")
		pid, err := strconv.Atoi(pidStr)
		if err == nil && pid > 1 && runs(pid, exe) {
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
				errs = append(errs, fmt.Errorf("stop leftover pid %d: %w", pid, err))
			}
			waitGone(pid, 5*time.Second)
		}
		os.Remove(f)
	}
	return errors.Join(errs...)
}

func runs(pid int, exe string) bool {
	cmdline, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	return err == nil && exe != "" && strings.Contains(string(cmdline), exe)
}

func waitGone(pid int, d time.Duration) {
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		if st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid)); err == nil && strings.Contains(string(st), ") Z ") {
			return
		}
	}
}
