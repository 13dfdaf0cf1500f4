package veth

import (
	"net"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/datapath/nlutil"
)

// announcer is the uplink's sender (nlutil.Announcer).
type announcer = nlutil.Announcer

func newAnnouncer(linkIdx int, mac net.HardwareAddr) (*announcer, error) {
	return nlutil.NewAnnouncer(linkIdx, mac)
}

// announceOn sends one gratuitous ARP for a pod's address on a NIC other
// than the uplink, from a socket of its own (pods on secondary NICs are
// few; the uplink's sender stays long-lived). Best effort, as on the
// uplink.
func (v *Veth) announceOn(linkIdx int, l alloc.Lease) {
	if v.garp == nil {
		return
	}
	mac, err := net.ParseMAC(l.NIC.MAC)
	if err != nil {
		return
	}
	s, err := newAnnouncer(linkIdx, mac)
	if err != nil {
		return
	}
	defer s.Close()
	_ = s.Announce(l.Address)
}
