package openstack

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Ownership marks: which fixed IPs of the VM port vpcni put there. They
// live in the port's description, written in the same If-Match PUT as the
// fixed IPs themselves, so marks and addresses never disagree. The format
// is "[vpcni:a,c-f]": the addresses' offsets from the subnet's first
// address in base 36, runs as ranges. Whatever else the description holds
// is kept as it is.
//
// Where it is shorter, the marks are a bitmap of the whole subnet instead:
// "[vpcni:=" and the subnet's bits (bit i = offset i, most significant
// first) in unpadded base64url. A /24 then takes 43 characters whatever
// the addresses, so a node may mark every address of a subnet up to /22
// (171 characters); larger subnets fall back to the list.
//
// The marks of an IPv6 subnet's addresses are a block of their own,
// "[vpcni6:...]", beside the IPv4 one in the same description (each
// family's code keeps the other's block as text): always the list form,
// offsets of up to 64 bits (vpcni serves IPv6 subnets of /64 and longer).
// Addresses are picked lowest first in the allocation pools, so their
// offsets stay short: a node's addresses at ::2-::41 take 4 characters.

const (
	markOpen  = "[vpcni:"
	markOpen6 = "[vpcni6:"
	// markOpenBlock starts the marks of a prefix-pair node's IPv6
	// addresses: offsets in its block, not in the subnet.
	markOpenBlock = "[vpcni6b:"
	markClose     = "]"
	// maxDescription is Neutron's limit on a description.
	maxDescription = 255
	// maxMarked is the most addresses marks may name: no node holds more
	// (maxAddresses' ceiling). A description marking more is not vpcni's,
	// and parsing it is refused rather than expanded (15 characters,
	// "[vpcni:0-9zldr]", name a whole /8: 16 million addresses, 23 s and
	// 1.5 GB to hold them all, measured).
	maxMarked = 4096
)

// Marked is what a port's description marks as vpcni's within subnet
// (vpcni-controller's leak audit reads every port's marks).
func Marked(desc string, subnet netip.Prefix) (map[netip.Addr]bool, error) {
	_, m, err := splitMarks(desc, subnet)
	return m, err
}

// MarksIPv6 says whether a port's description marks IPv6 fixed IPs as
// vpcni's (whose subnet the caller reads to parse them with Marked).
func MarksIPv6(desc string) bool { return strings.Contains(desc, markOpen6) }

// splitMarks parses a description into the text around the marks and the
// marked addresses within subnet.
func splitMarks(desc string, subnet netip.Prefix) (rest string, marked map[netip.Addr]bool, err error) {
	return splitMarksAs(desc, subnet, opener(subnet))
}

// splitMarksAs is splitMarks for the block that open starts.
func splitMarksAs(desc string, subnet netip.Prefix, open string) (rest string, marked map[netip.Addr]bool, err error) {
	marked = map[netip.Addr]bool{}
	i := strings.Index(desc, open)
	if i < 0 {
		return desc, marked, nil
	}
	j := strings.Index(desc[i:], markClose)
	if j < 0 {
		return desc, marked, fmt.Errorf("unterminated vpcni marks in port description %q", desc)
	}
	body := desc[i+len(open) : i+j]
	rest = strings.TrimSpace(desc[:i] + desc[i+j+len(markClose):])
	if strings.Contains(rest, open) {
		// Which block would be vpcni's? Writing back the first would make
		// the next read take the other.
		return desc, marked, fmt.Errorf("more than one block of vpcni marks in port description %q", desc)
	}
	base := subnet.Masked().Addr()
	size := sizeOf(subnet)
	if bm, ok := strings.CutPrefix(body, bitmapMark); ok && base.Is4() {
		bits, err := base64.RawURLEncoding.DecodeString(bm)
		if err != nil || uint64(len(bits)) != (size+7)/8 {
			return rest, marked, fmt.Errorf("bad vpcni bitmap marks %q for subnet %s in port description", bm, subnet)
		}
		for o := range size {
			if bits[o/8]&(0x80>>(o%8)) != 0 {
				if len(marked) == maxMarked {
					return rest, map[netip.Addr]bool{}, fmt.Errorf("vpcni bitmap marks in port description name more than %d addresses, more than a node holds", maxMarked)
				}
				marked[addrAt(base, o)] = true
			}
		}
		return rest, marked, nil
	}
	for _, item := range strings.Split(body, ",") {
		if item == "" {
			continue
		}
		lo, hi, isRange := strings.Cut(item, "-")
		a, err := strconv.ParseUint(lo, 36, 64)
		if err != nil {
			return rest, marked, fmt.Errorf("bad vpcni mark %q in port description", item)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 36, 64); err != nil || b < a {
				return rest, marked, fmt.Errorf("bad vpcni mark %q in port description", item)
			}
		}
		if b > lastOffset(subnet) {
			return rest, marked, fmt.Errorf("vpcni mark %q lies outside subnet %s", item, subnet)
		}
		if b-a >= uint64(maxMarked-len(marked)) {
			return rest, map[netip.Addr]bool{}, fmt.Errorf("vpcni marks in port description name more than %d addresses, more than a node holds", maxMarked)
		}
		for o := a; ; o++ {
			marked[addrAt(base, o)] = true
			if o == b { // b may be the largest offset there is
				break
			}
		}
	}
	return rest, marked, nil
}

// joinMarks writes a description holding rest and the marks for addrs.
func joinMarks(rest string, addrs map[netip.Addr]bool, subnet netip.Prefix) (string, error) {
	return joinMarksAs(rest, addrs, subnet, opener(subnet))
}

// joinMarksAs is joinMarks for the block that open starts.
func joinMarksAs(rest string, addrs map[netip.Addr]bool, subnet netip.Prefix, open string) (string, error) {
	if len(addrs) == 0 {
		return rest, nil
	}
	base := subnet.Masked().Addr()
	offs := make([]uint64, 0, len(addrs))
	for a := range addrs {
		if !subnet.Contains(a) {
			return "", fmt.Errorf("address %s is outside subnet %s", a, subnet)
		}
		offs = append(offs, offset(base, a))
	}
	slices.Sort(offs)
	var items []string
	for i := 0; i < len(offs); {
		j := i
		for j+1 < len(offs) && offs[j+1] == offs[j]+1 {
			j++
		}
		if j == i {
			items = append(items, strconv.FormatUint(offs[i], 36))
		} else {
			items = append(items, strconv.FormatUint(offs[i], 36)+"-"+strconv.FormatUint(offs[j], 36))
		}
		i = j + 1
	}
	list := strings.Join(items, ",")
	if bm := bitmapOf(offs, subnet); len(bm) < len(list) {
		list = bm
	}
	marks := open + list + markClose
	desc := marks
	if rest != "" {
		desc = rest + " " + marks
	}
	if len(desc) > maxDescription {
		return "", fmt.Errorf("the ownership marks of %d addresses no longer fit in the VM port's description (%d of %d characters)", len(addrs), len(desc), maxDescription)
	}
	return desc, nil
}

// opener starts the block of marks of subnet's family.
func opener(subnet netip.Prefix) string {
	if subnet.Addr().Is6() {
		return markOpen6
	}
	return markOpen
}

// sizeOf is how many addresses subnet has, at most 2^64-1 (an IPv6 /64
// has one more: see lastOffset).
func sizeOf(subnet netip.Prefix) uint64 {
	host := subnet.Addr().BitLen() - subnet.Bits()
	if host >= 64 {
		return math.MaxUint64
	}
	return uint64(1) << host
}

// lastOffset is the offset of subnet's last address; offsets are 64 bits
// (vpcni refuses IPv6 prefixes shorter than /64).
func lastOffset(subnet netip.Prefix) uint64 {
	if subnet.Addr().BitLen()-subnet.Bits() >= 64 {
		return math.MaxUint64
	}
	return sizeOf(subnet) - 1
}

func offset(base, a netip.Addr) uint64 {
	if base.Is6() {
		b, x := base.As16(), a.As16()
		return be64(x[8:]) - be64(b[8:])
	}
	b, x := base.As4(), a.As4()
	return uint64(be32(x) - be32(b))
}

func addrAt(base netip.Addr, off uint64) netip.Addr {
	if base.Is6() {
		b := base.As16()
		binary.BigEndian.PutUint64(b[8:], be64(b[8:])+off)
		return netip.AddrFrom16(b)
	}
	b := base.As4()
	v := be32(b) + uint32(off)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func be64(b []byte) uint64 { return binary.BigEndian.Uint64(b) }

func be32(b [4]byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// bitmapMark starts the bitmap form of the marks.
const bitmapMark = "="

// bitmapOf is the bitmap form of the marks for these offsets.
func bitmapOf(offs []uint64, subnet netip.Prefix) string {
	size := sizeOf(subnet)
	if size > 1<<16 || subnet.Addr().Is6() {
		return strings.Repeat("x", maxDescription+1) // never shorter
	}
	bits := make([]byte, (size+7)/8)
	for _, o := range offs {
		bits[o/8] |= 0x80 >> (o % 8)
	}
	return bitmapMark + base64.RawURLEncoding.EncodeToString(bits)
}

// marksFit is how many scattered addresses of subnet the marks can always
// hold in a description: the whole subnet when its bitmap fits, else the
// list's worst case (each address takes its offset's digits and a comma).
func marksFit(subnet netip.Prefix) int {
	size := uint64(1) << (32 - subnet.Bits())
	room := maxDescription - len(markOpen) - len(markClose)
	if size <= 1<<16 && len(bitmapMark)+base64.RawURLEncoding.EncodedLen(int((size+7)/8)) <= room {
		return int(size)
	}
	digits := len(strconv.FormatUint(size-1, 36))
	return min(room/(digits+1), int(size))
}

// marksFit6 is how many addresses of an IPv6 subnet the marks can hold
// beside the IPv4 block of subnet4's marks at its fullest: the IPv4 block
// at its bitmap's length where that form serves subnet4, else at half the
// description. IPv6 addresses are picked lowest first from the allocation
// pools (pool0 the first pool's first address), so their offsets are
// counted as those of the first 8192 addresses above it: a subnet where
// others hold more than that below a node's picks marks fewer, and a
// write that no longer fits fails with the reason.
func marksFit6(subnet6 netip.Prefix, pool0 netip.Addr, subnet4 netip.Prefix) int {
	room := maxDescription - len(markOpen6) - len(markClose) - 1
	size4 := uint64(1) << (32 - subnet4.Bits())
	if bm := len(bitmapMark) + base64.RawURLEncoding.EncodedLen(int((size4+7)/8)); size4 <= 1<<16 && bm <= maxDescription-len(markOpen)-len(markClose) {
		room -= len(markOpen) + bm + len(markClose)
	} else {
		room /= 2
	}
	hi := uint64(2 * maxMarked)
	if subnet6.Contains(pool0) {
		hi += offset(subnet6.Masked().Addr(), pool0)
	}
	digits := len(strconv.FormatUint(hi, 36))
	return max(room/(digits+1), 0)
}
