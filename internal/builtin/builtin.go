// Package builtin links every datapath mode and provider this build ships:
// each registers itself by name when imported. A new mode or provider is
// its own package plus one line here.
package builtin

import (
	_ "github.com/vpcni/vpcni/internal/datapath/bridge"
	_ "github.com/vpcni/vpcni/internal/datapath/ebpf"
	_ "github.com/vpcni/vpcni/internal/datapath/ipvlan"
	_ "github.com/vpcni/vpcni/internal/datapath/macvlan"
	_ "github.com/vpcni/vpcni/internal/datapath/passthrough"
	_ "github.com/vpcni/vpcni/internal/datapath/veth"
	_ "github.com/vpcni/vpcni/internal/provider/aws"
	_ "github.com/vpcni/vpcni/internal/provider/openstack"
	_ "github.com/vpcni/vpcni/internal/provider/static"
)
