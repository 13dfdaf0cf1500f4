// Package ipvlan registers the "ipvlan" datapath mode (L2): package
// macvlan's code path with an ipvlan sub-interface, which shares its
// parent's MAC — see package macvlan for the wiring, when to choose it and
// its caveats. It needs the kernel's ipvlan (CONFIG_IPVLAN).
package ipvlan

import (
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/datapath/macvlan"
)

func init() { datapath.Register(macvlan.Registration(macvlan.IPVLAN)) }
