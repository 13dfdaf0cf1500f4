package static

import (
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
)

// The solicitation is what DAD sends (from ::, to the solicited-node
// group, hop limit 255, a checksum that verifies), and an advertisement
// is read for its target and the MAC in its target link-layer option.
func TestSolicitationAndAdvertisement(t *testing.T) {
	a := netip.MustParseAddr("fd00:26::12:3456")
	pkt, dst := solicitation(a)
	if got := netip.AddrFrom16([16]byte(pkt[24:40])); got != netip.MustParseAddr("ff02::1:ff12:3456") {
		t.Errorf("destination %s, want the solicited-node group ff02::1:ff12:3456", got)
	}
	if net.HardwareAddr(dst[:6]).String() != "33:33:ff:12:34:56" || pkt[7] != 255 || pkt[40] != 135 {
		t.Errorf("frame to %x, hop limit %d, type %d", dst[:6], pkt[7], pkt[40])
	}
	if !netip.AddrFrom16([16]byte(pkt[8:24])).IsUnspecified() || netip.AddrFrom16([16]byte(pkt[48:64])) != a {
		t.Errorf("source %x, target %x", pkt[8:24], pkt[48:64])
	}
	if icmpv6Checksum(pkt) != 0 { // a checksum over itself folds to 0
		t.Errorf("checksum %04x does not verify", binary.BigEndian.Uint16(pkt[42:]))
	}

	// The holder's answer: an advertisement with its MAC in an option.
	na := append([]byte(nil), pkt...)
	na[40] = 136
	na = append(na, 2, 1, 2, 0, 0, 0, 0, 3)
	binary.BigEndian.PutUint16(na[4:], uint16(len(na)-40))
	from := net.HardwareAddr{2, 0, 0, 0, 0, 9}
	if tgt, mac, ok := parseNA(na, from); !ok || tgt != a || mac.String() != "02:00:00:00:00:03" {
		t.Errorf("parseNA = %s %s %v, want %s from 02:00:00:00:00:03", tgt, mac, ok, a)
	}
	// Another host's own DAD solicitation is no answer.
	if _, _, ok := parseNA(pkt, from); ok {
		t.Error("a solicitation read as an advertisement")
	}
}
