package alloc

import (
	"net"
	"net/netip"
	"testing"
)

// AddressMAC is a locally administered unicast MAC carrying the address, so
// two addresses never share one.
func TestAddressMAC(t *testing.T) {
	got := AddressMAC(netip.MustParseAddr("10.90.0.37"))
	if got != "0a:58:0a:5a:00:25" {
		t.Fatalf("AddressMAC(10.90.0.37) = %s", got)
	}
	mac, err := net.ParseMAC(got)
	if err != nil {
		t.Fatal(err)
	}
	if mac[0]&0x02 == 0 || mac[0]&0x01 != 0 {
		t.Fatalf("%s is not a locally administered unicast MAC", got)
	}
	if AddressMAC(netip.MustParseAddr("10.90.0.38")) == got {
		t.Fatal("two addresses share a MAC")
	}
}
