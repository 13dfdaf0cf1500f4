package openstack

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/provider"
)

// PodNetworks on OpenStack: the pods of a PodNetwork take their addresses
// from NICs of their own — Neutron ports vpcni creates on the PodNetwork's
// network, with its security groups, and attaches to the node's VM through
// Nova, as secondary NICs are (secondary.go). Every pod address is an
// extra fixed IP on such a port, so Neutron filters each pod by the
// PodNetwork's groups exactly as it would a VM, and pods of two
// PodNetworks never share a port. A NIC holds maxAddresses pods; a new one
// goes on the PodNetwork's subnet with most free addresses, and is given
// back once the network's pool releases its last address on it. The VM's maxNICs is shared by every
// PodNetwork and the node's own secondary NICs: a node whose VM has no NIC
// slot left serves no new network (nor a full one's next NIC). With
// portPerPod each pod gets a NIC of its own (maxAddresses 1 on it): a NIC
// slot per pod.

// NetworkSpec is a PodNetwork's openstack section.
type NetworkSpec struct {
	NetworkID      string   `json:"networkID"`
	SubnetIDs      []string `json:"subnetIDs"`
	SecurityGroups []string `json:"securityGroups,omitempty"`
	PortPerPod     bool     `json:"portPerPod,omitempty"`
}

// network is the provider of one PodNetwork on this node: a Provider of
// its own (its own writer lock, subnets and NIC kind) on the node's VM.
type network struct {
	p    *Provider
	spec NetworkSpec
	// source is Info's Subnet, written once at connect: Info runs without
	// the provider's lock, and p.nets grows under it.
	source string
}

var _ provider.Provider = (*network)(nil)

// NewNetwork connects the provider of PodNetwork name on this node: it
// logs in as cfg says, finds the node's VM (by its port, as New does) and
// reads the network's subnets and security groups, refusing a spec that
// cannot be served as it stands.
func NewNetwork(ctx context.Context, cfg Config, nodeIP netip.Addr, name string, raw json.RawMessage) (provider.Provider, error) {
	var spec NetworkSpec
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&spec); err != nil {
		return nil, fmt.Errorf("PodNetwork %s: its openstack section: %w", name, err)
	}
	switch {
	case spec.NetworkID == "":
		return nil, fmt.Errorf("PodNetwork %s: openstack.networkID is empty", name)
	case len(spec.SubnetIDs) == 0:
		return nil, fmt.Errorf("PodNetwork %s: openstack.subnetIDs is empty", name)
	case cfg.Mode == "passthrough":
		return nil, fmt.Errorf("PodNetwork %s: the node runs mode passthrough (a port per pod), whose pods this vpcnid does not put on PodNetworks yet: use mode fixed-ips on nodes that serve PodNetworks", name)
	}
	// The node's own settings reach the cloud; the network's pods never
	// touch the VM port, whose subnet is not read.
	cfg.Mode, cfg.SecondaryNICs = "fixed-ips", max(cfg.MaxNICs-1, 1)
	if spec.PortPerPod {
		// A NIC per pod: its port holds the pod's address beside its own,
		// and no other pod's.
		cfg.MaxAddresses = 1
	}
	cfg.SubnetID, cfg.Subnets, cfg.SubnetTags = "", slices.Clone(spec.SubnetIDs), nil
	p, err := connect(ctx, cfg, nil)
	if err != nil {
		return nil, err
	}
	p.network, p.groups = name, slices.Clone(spec.SecurityGroups)
	c, cancel := context.WithTimeout(ctx, cfg.Timeout.Duration)
	defer cancel()
	if err := p.findPort(c, "", nodeIP); err != nil {
		return nil, err
	}
	if p.instanceID = cfg.InstanceID; p.instanceID == "" {
		p.instanceID = p.port.DeviceID
	}
	if p.instanceID == "" {
		return nil, fmt.Errorf("VM port %s has no device_id: set instanceID (the node's Nova server), which PodNetwork %s needs to attach its NICs", p.portID, name)
	}
	for _, id := range spec.SubnetIDs {
		s, err := p.subnetInfo(c, id)
		if err != nil {
			return nil, fmt.Errorf("PodNetwork %s: %w", name, err)
		}
		if s.networkID != spec.NetworkID {
			return nil, fmt.Errorf("PodNetwork %s: subnet %s (%s) is on network %s, not on its networkID %s", name, id, s.prefix, s.networkID, spec.NetworkID)
		}
	}
	p.selected = slices.Clone(spec.SubnetIDs)
	for _, id := range spec.SecurityGroups {
		// A group that does not exist would fail the first port's create
		// with a 404 a person must decode; say it now.
		if _, err := answered(groups.Get(c, p.nc, id).Extract()); err != nil {
			return nil, explain(fmt.Errorf("PodNetwork %s: security group %s: %w", name, id, err))
		}
	}
	var subs []string
	for _, id := range spec.SubnetIDs {
		subs = append(subs, fmt.Sprintf("%s (%s)", id, p.nets[id].prefix))
	}
	sg := "the project's default security group"
	if len(spec.SecurityGroups) > 0 {
		sg = "security groups " + strings.Join(spec.SecurityGroups, ", ")
	}
	if spec.PortPerPod {
		sg += ", a NIC per pod"
	}
	source := fmt.Sprintf("pod network %s: network %s, subnets %s; %s", name, spec.NetworkID, strings.Join(subs, ", "), sg)
	return &network{p: p, spec: spec, source: source}, nil
}

// Assign implements provider.Provider: every address on a NIC of the
// network (explicit ones on a NIC of their subnet).
func (n *network) Assign(ctx context.Context, req provider.AssignRequest) ([]alloc.Lease, error) {
	p := n.p
	p.mu.Lock()
	defer p.mu.Unlock()
	nics, err := p.attachedNICs(ctx, kindNetwork)
	if err != nil {
		return nil, err
	}
	var out []alloc.Lease
	var explicit []netip.Addr
	for _, a := range req.Addresses {
		if i := slices.IndexFunc(nics, func(m nicPort) bool { return slices.Contains(m.pods(), a) }); i >= 0 {
			out = append(out, p.nicLease(a, nics[i]))
			continue
		}
		explicit = append(explicit, a)
	}
	more, err := p.assignOnNICs(ctx, nics, explicit, max(req.Count, 0))
	return append(out, more...), err
}

// Release implements provider.Provider; a NIC left without pods goes.
func (n *network) Release(ctx context.Context, addrs []netip.Addr) error {
	n.p.mu.Lock()
	defer n.p.mu.Unlock()
	return n.p.releaseSecondary(ctx, addrs)
}

// Held implements provider.Provider: the pod addresses on the network's
// NICs of this VM.
func (n *network) Held(ctx context.Context) ([]alloc.Lease, error) {
	n.p.mu.Lock()
	defer n.p.mu.Unlock()
	// Count the VM's free NIC slots at each resync too, for Info's
	// capacity (another network may have taken one since).
	if _, err := n.p.nicRoom(ctx); err != nil {
		return nil, err
	}
	return n.p.heldSecondary(ctx)
}

// Info implements provider.Provider: the network, its subnets and groups,
// and its bound — maxAddresses on each NIC the VM may still take.
func (n *network) Info() provider.Info {
	p := n.p
	capacity := p.cfg.SecondaryNICs * p.cfg.MaxAddresses
	why := fmt.Sprintf("maxAddresses %d on each of up to %d NICs (maxNICs %d less the VM's primary NIC; the node's other networks share them)", p.cfg.MaxAddresses, p.cfg.SecondaryNICs, p.cfg.MaxNICs)
	if free, ok := p.freeSlots(); ok {
		// What the VM can still take: its NICs of this network and the
		// free slots (which every network counts as its own).
		nics := int(p.ownNICs.Load()) + free
		capacity = min(nics, p.cfg.SecondaryNICs) * p.cfg.MaxAddresses
		why = fmt.Sprintf("maxAddresses %d on each of its %d NICs and the VM's %d free NIC slots (maxNICs %d; the node's other networks share the slots)", p.cfg.MaxAddresses, p.ownNICs.Load(), free, p.cfg.MaxNICs)
	}
	free, ok := p.freeSlots()
	if !ok {
		free = -1
	}
	return provider.Info{
		Name: "openstack", Calls: p.calls.snapshot(),
		Capacity: capacity, CapacityReason: why,
		Subnet: n.source, FreeNICs: free, NICAddresses: p.cfg.MaxAddresses,
	}
}

// networkRoom is how many addresses a PodNetwork the node does not serve
// yet could get here (Registration.NetworkRoom): a NIC of its own in each
// of the VM's free slots (def.FreeNICs, counted by the default provider),
// maxAddresses on each, or one with portPerPod. ok false until the slots
// were counted.
func networkRoom(cfg Config, raw json.RawMessage, def provider.Info) (int, bool) {
	var spec NetworkSpec
	if def.FreeNICs < 0 || json.Unmarshal(raw, &spec) != nil {
		return 0, false
	}
	if cfg.Mode == "passthrough" {
		return 0, true // NewNetwork refuses it
	}
	per := cfg.MaxAddresses
	if spec.PortPerPod {
		per = 1
	}
	return def.FreeNICs * per, true
}
