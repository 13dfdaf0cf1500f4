package ipvlan

import (
	"testing"

	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/macvlan"
)

// The mode is registered under its own name with macvlan's settings: the
// same section fields (serviceCIDRs, parent) in datapath.ipvlan.
func TestRegistered(t *testing.T) {
	s, err := datapath.NewSettings("ipvlan")
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := s.(*macvlan.Settings); !ok {
		t.Fatalf("settings are %T", s)
	}
	s.Defaults()
	if err := s.Validate(); err != nil || s.(*macvlan.Settings).ServiceCIDRs[0] != macvlan.DefaultServiceCIDR {
		t.Fatalf("defaults: %+v, %v", s, err)
	}
	if r, _ := datapath.Lookup("ipvlan"); r.Prepare == nil || r.New == nil || len(r.Families) != 2 {
		t.Fatal("incomplete registration (it serves both families, as macvlan)")
	}
}
