package openstack

import (
	"net/netip"
	"testing"
)

// FuzzSplitMarks: any port description, on any IPv4 subnet, is parsed
// into marks within the subnet or refused with an error, never a panic,
// and quickly (a description a tenant writes is read by vpcni-controller's
// leak audit too); what it parses, joinMarks writes back so that it reads
// the same.
func FuzzSplitMarks(f *testing.F) {
	for _, s := range []struct {
		desc string
		bits uint8
	}{
		{"[vpcni:2,4-6,a]", 24},
		{"web VM [vpcni:1-3]", 24},
		{"[vpcni:=gAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA]", 24},
		{"[vpcni:]", 28},
		{"[vpcni:2] [vpcni:3]", 24},
		{"[vpcni:0-zik0zj]", 8},
		{"[vpcni:0-9zldr]", 8},
		{"[vpcni:", 24},
		{"vpcni secondary NIC of instance i-1 [vpcni-own:10.0.0.7]", 24},
	} {
		f.Add(s.desc, byte(10), byte(1), byte(0), byte(0), s.bits)
	}
	f.Fuzz(func(t *testing.T, desc string, a, b, c, d, bits byte) {
		subnet := netip.PrefixFrom(netip.AddrFrom4([4]byte{a, b, c, d}), int(bits%33)).Masked()
		rest, marked, err := splitMarks(desc, subnet)
		if err != nil {
			return
		}
		if len(marked) > maxMarked {
			t.Fatalf("%q on %s marks %d addresses, more than the %d a node holds", desc, subnet, len(marked), maxMarked)
		}
		for m := range marked {
			if !subnet.Contains(m) {
				t.Fatalf("%q on %s marks %s, outside the subnet", desc, subnet, m)
			}
		}
		again, err := joinMarks(rest, marked, subnet)
		if err != nil {
			return // too long to write back: vpcni says so and writes nothing
		}
		rest2, marked2, err := splitMarks(again, subnet)
		if err != nil || rest2 != rest || len(marked2) != len(marked) {
			t.Fatalf("%q on %s: read %q %v, written back as %q, read again %q %v (%v)", desc, subnet, rest, marked, again, rest2, marked2, err)
		}
		for m := range marked {
			if !marked2[m] {
				t.Fatalf("%q on %s: %s marked, not after writing back %q", desc, subnet, m, again)
			}
		}
	})
}
