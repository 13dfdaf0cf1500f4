package family

import (
	"encoding/json"
	"net/netip"
	"testing"
)

func TestOf(t *testing.T) {
	for _, c := range []struct {
		a    string
		want Family
	}{{"10.0.0.1", V4}, {"::ffff:10.0.0.1", V4}, {"fd00::1", V6}, {"fe80::1", V6}} {
		if got := Of(netip.MustParseAddr(c.a)); got != c.want {
			t.Errorf("Of(%s) = %v, want %v", c.a, got, c.want)
		}
	}
	if Of(netip.Addr{}) != 0 {
		t.Error("an invalid address has a family")
	}
}

func TestHostDefault(t *testing.T) {
	if h := Host(netip.MustParseAddr("::ffff:10.1.2.3")); h.String() != "10.1.2.3/32" {
		t.Errorf("Host v4-mapped = %s", h)
	}
	if h := Host(netip.MustParseAddr("fd00::5")); h.String() != "fd00::5/128" {
		t.Errorf("Host v6 = %s", h)
	}
	if V4.Default().String() != "0.0.0.0/0" || V6.Default().String() != "::/0" {
		t.Errorf("defaults %s %s", V4.Default(), V6.Default())
	}
	if V4.Bits() != 32 || V6.Bits() != 128 || V4.Sys() != "ipv4" || V6.Sys() != "ipv6" {
		t.Error("bits or sys names wrong")
	}
}

func TestJSON(t *testing.T) {
	var fams []Family
	if err := json.Unmarshal([]byte(`["ipv6","IPv4"]`), &fams); err != nil {
		t.Fatal(err)
	}
	if len(fams) != 2 || fams[0] != V6 || fams[1] != V4 {
		t.Fatalf("read %v", fams)
	}
	b, err := json.Marshal(fams)
	if err != nil || string(b) != `["ipv6","ipv4"]` {
		t.Fatalf("wrote %s %v", b, err)
	}
	if err := json.Unmarshal([]byte(`["ipv5"]`), &fams); err == nil {
		t.Fatal("ipv5 accepted")
	}
	if _, err := json.Marshal(Family(5)); err == nil {
		t.Fatal("family 5 written")
	}
}

func TestCheck(t *testing.T) {
	for _, c := range []struct {
		fams []Family
		ok   bool
	}{{[]Family{V4}, true}, {[]Family{V6}, true}, {[]Family{V6, V4}, true},
		{nil, false}, {[]Family{V4, V4}, false}, {[]Family{3}, false}} {
		if err := Check(c.fams); (err == nil) != c.ok {
			t.Errorf("Check(%v) = %v", c.fams, err)
		}
	}
	if Join([]Family{V4, V6}) != "ipv4, ipv6" || !Has([]Family{V6}, V6) || Has(nil, V4) {
		t.Error("Join/Has")
	}
}
