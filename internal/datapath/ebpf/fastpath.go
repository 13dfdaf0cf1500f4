package ebpf

import (
	"bytes"
	_ "embed"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	bpf "github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/datapath"
)

//go:generate sh bpf/build.sh

// object is the compiled bpf/fastpath.c, committed: nodes need no clang.
//
//go:embed bpf/fastpath.o
var object []byte

// The programs, as fastpath.c names them (and as bpftool lists them).
const (
	progUplink = "vpcni_uplink"
	progPod    = "vpcni_pod"
)

// filterPriority and filterHandle place vpcni's tc filter on a link's
// ingress; with the program's name they mark the filter as vpcni's, so a
// filter of anyone else's (Cilium, a person's tc) is never replaced.
const (
	filterPriority = 0xa7
	filterHandle   = 1
)

// Counters are what the programs did, by action, summed over CPUs (the
// order of fastpath.c's enum stat).
var statNames = []string{"peer_from_uplink", "peer_local", "neigh_out", "pass_nat", "pass_service", "pass_other"}

// pod is fastpath.c's struct pod: a pod of this node by address.
type pod struct {
	Ifindex uint32
	PodMAC  [6]byte
	HostMAC [6]byte
}

// prefix is an LPM trie key: length, then the address in network order.
type prefix struct {
	Len  uint32
	Addr [4]byte
}

// fastPath is the loaded programs and their maps on one node.
type fastPath struct {
	uplink, pod                          *bpf.Program
	pods, fast, services, config, counts *bpf.Map
	uplinkIdx                            int
	pinDir                               string
	// The programs' kernel IDs, to tell them from an older agent's.
	uplinkID, podID uint32
	// attachedOnce: the uplink's program was put on once; a later attach
	// is a repair.
	attachedOnce bool
}

// load loads the programs against the running kernel (its BTF at
// kernelBTF, "" = /sys/kernel/btf/vmlinux) with their maps pinned in
// pinDir, reusing the maps a previous agent pinned there when their shape
// still fits (so pods keep their entries across a restart), and pins the
// programs next to them.
func load(kernelBTF, pinDir string, uplinkIdx int) (_ *fastPath, err error) {
	spec, err := bpf.LoadCollectionSpecFromReader(bytes.NewReader(object))
	if err != nil {
		return nil, fmt.Errorf("read the embedded object: %w", err)
	}
	var kernel *btf.Spec
	if kernelBTF != "" {
		if kernel, err = btf.LoadSpec(kernelBTF); err != nil {
			return nil, fmt.Errorf("kernel BTF %s: %w", kernelBTF, err)
		}
	} else if kernel, err = btf.LoadKernelSpec(); err != nil {
		return nil, fmt.Errorf("kernel BTF: %w (the kernel needs CONFIG_DEBUG_INFO_BTF)", err)
	}
	if err := ensureBPFFS(pinDir); err != nil {
		return nil, err
	}
	for _, m := range spec.Maps {
		m.Pinning = bpf.PinByName
	}
	opts := bpf.CollectionOptions{Maps: bpf.MapOptions{PinPath: pinDir}, Programs: bpf.ProgramOptions{KernelTypes: kernel}}
	coll, err := bpf.NewCollectionWithOptions(spec, opts)
	if errors.Is(err, bpf.ErrMapIncompatible) {
		// Pinned by an agent whose maps had another shape: start afresh
		// (the new programs get fresh maps; Reconcile fills them).
		for name := range spec.Maps {
			_ = os.Remove(filepath.Join(pinDir, name))
		}
		coll, err = bpf.NewCollectionWithOptions(spec, opts)
	}
	if err != nil {
		var ve *bpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("the kernel's verifier refused the programs: %w", ve)
		}
		return nil, fmt.Errorf("load the programs: %w", err)
	}
	fp := &fastPath{
		uplink: coll.DetachProgram(progUplink), pod: coll.DetachProgram(progPod),
		pods: coll.DetachMap("pods"), fast: coll.DetachMap("fast"), services: coll.DetachMap("services"),
		config: coll.DetachMap("config"), counts: coll.DetachMap("stats"),
		uplinkIdx: uplinkIdx, pinDir: pinDir,
	}
	coll.Close()
	defer func() {
		if err != nil {
			fp.close()
		}
	}()
	if fp.uplink == nil || fp.pod == nil || fp.pods == nil || fp.fast == nil || fp.services == nil || fp.config == nil || fp.counts == nil {
		return nil, errors.New("the embedded object lacks a program or map (run go generate)")
	}
	for name, p := range map[string]*bpf.Program{progUplink: fp.uplink, progPod: fp.pod} {
		path := filepath.Join(pinDir, name)
		// The previous agent's program stays loaded while a filter holds
		// it; its pin goes, so once Reconcile moves the filters over
		// nothing holds it any more.
		_ = os.Remove(path)
		if err := p.Pin(path); err != nil {
			return nil, fmt.Errorf("pin %s: %w", path, err)
		}
	}
	if fp.uplinkID, err = progID(fp.uplink); err != nil {
		return nil, err
	}
	if fp.podID, err = progID(fp.pod); err != nil {
		return nil, err
	}
	if err := fp.config.Put(uint32(0), uint32(uplinkIdx)); err != nil {
		return nil, fmt.Errorf("config map: %w", err)
	}
	return fp, nil
}

// bpffsMagic is the BPF filesystem's statfs type.
const bpffsMagic = 0xcafe4a11

// ensureBPFFS makes pinDir on a BPF filesystem: as it is when dir already
// sits on one; else, for the usual /sys/fs/bpf/..., bpffs is mounted on
// /sys/fs/bpf (what systemd does at boot; vpcnictl install-cni does it from
// the privileged init container so that it is the host's).
func ensureBPFFS(dir string) error {
	root := dir
	for {
		var st unix.Statfs_t
		if err := unix.Statfs(root, &st); err == nil {
			if uint32(st.Type) == bpffsMagic {
				return os.MkdirAll(dir, 0o700)
			}
			break
		}
		parent := filepath.Dir(root)
		if parent == root {
			break
		}
		root = parent
	}
	if dir != "/sys/fs/bpf" && !strings.HasPrefix(dir, "/sys/fs/bpf/") {
		return fmt.Errorf("pinPath %s is not on a BPF filesystem (mount -t bpf bpf <dir>)", dir)
	}
	if err := unix.Mount("bpf", "/sys/fs/bpf", "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount the BPF filesystem on /sys/fs/bpf: %w", err)
	}
	return os.MkdirAll(dir, 0o700)
}

// close releases the process's handles; what is pinned or attached stays.
func (fp *fastPath) close() {
	for _, p := range []*bpf.Program{fp.uplink, fp.pod} {
		if p != nil {
			p.Close()
		}
	}
	for _, m := range []*bpf.Map{fp.pods, fp.fast, fp.services, fp.config, fp.counts} {
		if m != nil {
			m.Close()
		}
	}
}

// setPrefixes makes an LPM map hold exactly want.
func setPrefixes(m *bpf.Map, want []netip.Prefix) error {
	keep := map[prefix]bool{}
	for _, p := range want {
		k := prefix{Len: uint32(p.Bits()), Addr: p.Masked().Addr().As4()}
		keep[k] = true
		if err := m.Put(k, uint8(1)); err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
	}
	var k prefix
	var stale []prefix
	it := m.Iterate()
	for it.Next(&k, new(uint8)) {
		if !keep[k] {
			stale = append(stale, k)
		}
	}
	for _, k := range stale {
		if err := m.Delete(k); err != nil && !errors.Is(err, bpf.ErrKeyNotExist) {
			return err
		}
	}
	return it.Err()
}

func podKey(ip netip.Addr) [4]byte { return ip.As4() }

// entry is a pod's map value.
func entry(ifindex int, podMAC, hostMAC net.HardwareAddr) pod {
	var v pod
	v.Ifindex = uint32(ifindex)
	copy(v.PodMAC[:], podMAC)
	copy(v.HostMAC[:], hostMAC)
	return v
}

// putPod records a pod of this node.
func (fp *fastPath) putPod(ip netip.Addr, v pod) error { return fp.pods.Put(podKey(ip), v) }

// deletePod forgets a pod; an address already gone is fine.
func (fp *fastPath) deletePod(ip netip.Addr) error {
	if err := fp.pods.Delete(podKey(ip)); err != nil && !errors.Is(err, bpf.ErrKeyNotExist) {
		return err
	}
	return nil
}

// podEntries is the pods map, by address.
func (fp *fastPath) podEntries() (map[netip.Addr]pod, error) {
	out := map[netip.Addr]pod{}
	var k [4]byte
	var v pod
	it := fp.pods.Iterate()
	for it.Next(&k, &v) {
		out[netip.AddrFrom4(k)] = v
	}
	return out, it.Err()
}

// counters sums the per-CPU counters by action.
func (fp *fastPath) counters() (map[string]uint64, error) {
	out := make(map[string]uint64, len(statNames))
	for i, name := range statNames {
		var per []uint64
		if err := fp.counts.Lookup(uint32(i), &per); err != nil {
			return nil, err
		}
		var sum uint64
		for _, n := range per {
			sum += n
		}
		out[name] = sum
	}
	return out, nil
}

// progID is a loaded program's kernel ID.
func progID(p *bpf.Program) (uint32, error) {
	info, err := p.Info()
	if err != nil {
		return 0, err
	}
	id, ok := info.ID()
	if !ok {
		return 0, errors.New("the kernel does not report program IDs")
	}
	return uint32(id), nil
}

// attached says which program (by ID) vpcni's filter on the link's ingress
// runs: 0 with no such filter.
func attached(linkIdx int, name string) (uint32, error) {
	link, err := netlink.LinkByIndex(linkIdx)
	if err != nil {
		return 0, err
	}
	filters, err := netlink.FilterList(link, netlink.HANDLE_MIN_INGRESS)
	if err != nil {
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			return 0, nil // no clsact qdisc: nothing attached
		}
		return 0, err
	}
	for _, f := range filters {
		b, ok := f.(*netlink.BpfFilter)
		if ok && b.Attrs().Priority == filterPriority && b.Name == name {
			return uint32(b.Id), nil
		}
	}
	return 0, nil
}

// attach runs p on the link's ingress in direct-action mode: a clsact
// qdisc added if the link has none, vpcni's filter put in or swapped over
// to p in one step (a replace: no moment without a program).
func attach(linkIdx int, p *bpf.Program, name string) error {
	qdisc := &netlink.GenericQdisc{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: linkIdx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT},
		QdiscType:  "clsact",
	}
	if err := netlink.QdiscAdd(qdisc); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("clsact qdisc: %w", err)
	}
	f := &netlink.BpfFilter{
		FilterAttrs: netlink.FilterAttrs{
			LinkIndex: linkIdx, Parent: netlink.HANDLE_MIN_INGRESS, Handle: filterHandle,
			Priority: filterPriority, Protocol: unix.ETH_P_ALL,
		},
		Fd: p.FD(), Name: name, DirectAction: true,
	}
	if err := netlink.FilterReplace(f); err != nil {
		return fmt.Errorf("tc filter %s: %w", name, err)
	}
	return nil
}

// detach removes vpcni's filter from the link's ingress (none is fine).
func detach(linkIdx int) error {
	f := &netlink.BpfFilter{FilterAttrs: netlink.FilterAttrs{
		LinkIndex: linkIdx, Parent: netlink.HANDLE_MIN_INGRESS, Handle: filterHandle,
		Priority: filterPriority, Protocol: unix.ETH_P_ALL,
	}}
	if err := netlink.FilterDel(f); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return err
	}
	return nil
}

// pruneStale drops the entries of the pods map whose host veth is not
// there any more as recorded (gone, or its ifindex now another link's).
func (fp *fastPath) pruneStale() error {
	entries, err := fp.podEntries()
	if err != nil {
		return err
	}
	for ip, v := range entries {
		l, err := netlink.LinkByIndex(int(v.Ifindex))
		if err == nil && l.Type() == "veth" && strings.HasPrefix(l.Attrs().Alias, datapath.AliasPrefix) && bytes.Equal(l.Attrs().HardwareAddr, v.HostMAC[:]) {
			continue
		}
		if err := fp.deletePod(ip); err != nil {
			return err
		}
	}
	return nil
}

// errShaped: the host veth carries the bandwidth plugin's qdiscs.
var errShaped = errors.New("the pod's bandwidth is limited on its host veth")

// unshaped refuses a host veth with an ingress qdisc (the bandwidth
// plugin's egress limit, which cannot share the link with clsact and
// which a program ahead of it would bypass) or a tbf (its ingress limit,
// which redirect_peer would skip).
func unshaped(link netlink.Link) error {
	qdiscs, err := netlink.QdiscList(link)
	if err != nil {
		return err
	}
	for _, q := range qdiscs {
		if t := q.Type(); t == "ingress" || t == "tbf" {
			return errShaped
		}
	}
	return nil
}

// dropEmptyClsact deletes the link's clsact qdisc if it holds no filter.
func dropEmptyClsact(linkIdx int) error {
	link, err := netlink.LinkByIndex(linkIdx)
	if err != nil {
		return err
	}
	for _, parent := range []uint32{netlink.HANDLE_MIN_INGRESS, netlink.HANDLE_MIN_EGRESS} {
		if fs, err := netlink.FilterList(link, parent); err != nil || len(fs) > 0 {
			return err
		}
	}
	q := &netlink.GenericQdisc{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: linkIdx, Handle: netlink.MakeHandle(0xffff, 0), Parent: netlink.HANDLE_CLSACT}, QdiscType: "clsact"}
	if err := netlink.QdiscDel(q); err != nil && !errors.Is(err, unix.ENOENT) && !errors.Is(err, unix.EINVAL) {
		return err
	}
	return nil
}
