package cluster

import (
	"context"
	"errors"

	"github.com/vpcni/vpcni/internal/doctor"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// diagnose is provider openstack's cloud check (doctor.CloudCheck): the
// provider's start-up steps (openstack.Diagnose), each with its fix.
func diagnose(ctx context.Context, s provider.Settings, node doctor.CloudNode) []doctor.Step {
	cfg := s.(*openstack.Config)
	var out []doctor.Step
	for _, st := range openstack.Diagnose(ctx, *cfg, node.IP, node.Transport) {
		d := doctor.Step{Name: st.Name, Detail: st.Detail, Err: st.Err, Warn: st.Warn}
		switch {
		case st.Err != nil:
			d.Fix = cloudFix(st, cfg.Mode, node.AgentConfig)
		case st.Warn && st.Name == "quota":
			d.Fix = "ask the cloud's admin for a larger port quota (openstack quota set --ports), or let these credentials read it"
		case st.Warn:
			d.Fix = "raise maxAddresses (fixed-ips) or maxAddressPairs (Neutron's max_allowed_address_pair) in " + node.AgentConfig + ", or add nodes"
		}
		out = append(out, d)
	}
	return out
}

func cloudFix(s openstack.Step, mode, agentConfig string) string {
	if errors.Is(s.Err, provider.ErrUnavailable) {
		return "check that this node reaches the cloud's endpoints (Keystone, Neutron): routes, DNS, security groups, proxies"
	}
	switch s.Name {
	case "login":
		return "check provider.openstack.auth or credentialsFile in " + agentConfig + ": an application credential with the member role in the VM port's project"
	case "subnet":
		return "check provider.openstack.subnetID in " + agentConfig + " (openstack subnet show)"
	case "port":
		return "set provider.openstack.nodeIP in " + agentConfig + " to this node's address on the pods' network, or portLookup: instance with instanceID (the Nova server)"
	case "policy":
		if mode != "passthrough" {
			return "use provider.openstack.mode: passthrough with datapath passthrough: it creates ports of its own and attaches them to the VM through Nova, which a member may do; or have the network's owner (or an admin) run vpcni's credentials"
		}
	}
	return "see the detail; vpcnid fails at start the same way"
}
