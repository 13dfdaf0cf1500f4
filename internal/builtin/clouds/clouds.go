// Package clouds links every cloud's cluster side this build ships: each
// registers itself when imported, as the cloud its -cloud-config section
// names (internal/cloudconfig). vpcni-controller and vpcnictl import it;
// vpcnid, which needs only the providers (internal/builtin), does not. A
// new cloud is its own package plus one line here (and its provider one
// line in internal/builtin).
package clouds

import (
	_ "github.com/vpcni/vpcni/internal/provider/aws/cluster"
	_ "github.com/vpcni/vpcni/internal/provider/openstack/cluster"
)
