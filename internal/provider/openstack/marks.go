package openstack

import (
	"encoding/base64"
	"fmt"
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

const (
	markOpen  = "[vpcni:"
	markClose = "]"
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

// splitMarks parses a description into the text around the marks and the
// marked addresses within subnet.
func splitMarks(desc string, subnet netip.Prefix) (rest string, marked map[netip.Addr]bool, err error) {
	marked = map[netip.Addr]bool{}
	i := strings.Index(desc, markOpen)
	if i < 0 {
		return desc, marked, nil
	}
	j := strings.Index(desc[i:], markClose)
	if j < 0 {
		return desc, marked, fmt.Errorf("unterminated vpcni marks in port description %q", desc)
	}
	body := desc[i+len(markOpen) : i+j]
	rest = strings.TrimSpace(desc[:i] + desc[i+j+len(markClose):])
	if strings.Contains(rest, markOpen) {
		// Which block would be vpcni's? Writing back the first would make
		// the next read take the other.
		return desc, marked, fmt.Errorf("more than one block of vpcni marks in port description %q", desc)
	}
	base := subnet.Masked().Addr()
	size := uint64(1) << (32 - subnet.Bits())
	if bm, ok := strings.CutPrefix(body, bitmapMark); ok {
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
		a, err := strconv.ParseUint(lo, 36, 32)
		if err != nil {
			return rest, marked, fmt.Errorf("bad vpcni mark %q in port description", item)
		}
		b := a
		if isRange {
			if b, err = strconv.ParseUint(hi, 36, 32); err != nil || b < a {
				return rest, marked, fmt.Errorf("bad vpcni mark %q in port description", item)
			}
		}
		if b >= size {
			return rest, marked, fmt.Errorf("vpcni mark %q lies outside subnet %s", item, subnet)
		}
		if b-a >= uint64(maxMarked-len(marked)) {
			return rest, map[netip.Addr]bool{}, fmt.Errorf("vpcni marks in port description name more than %d addresses, more than a node holds", maxMarked)
		}
		for o := a; o <= b; o++ {
			marked[addrAt(base, o)] = true
		}
	}
	return rest, marked, nil
}

// joinMarks writes a description holding rest and the marks for addrs.
func joinMarks(rest string, addrs map[netip.Addr]bool, subnet netip.Prefix) (string, error) {
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
	marks := markOpen + list + markClose
	desc := marks
	if rest != "" {
		desc = rest + " " + marks
	}
	if len(desc) > maxDescription {
		return "", fmt.Errorf("the ownership marks of %d addresses no longer fit in the VM port's description (%d of %d characters)", len(addrs), len(desc), maxDescription)
	}
	return desc, nil
}

func offset(base, a netip.Addr) uint64 {
	b, x := base.As4(), a.As4()
	return uint64(be32(x) - be32(b))
}

func addrAt(base netip.Addr, off uint64) netip.Addr {
	b := base.As4()
	v := be32(b) + uint32(off)
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

func be32(b [4]byte) uint32 {
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// bitmapMark starts the bitmap form of the marks.
const bitmapMark = "="

// bitmapOf is the bitmap form of the marks for these offsets.
func bitmapOf(offs []uint64, subnet netip.Prefix) string {
	size := uint64(1) << (32 - subnet.Bits())
	if size > 1<<16 {
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
