package ec2api

import (
	"maps"
	"slices"
	"strings"
)

// builtinTypes are real instance types with their real numbers (as EC2's
// DescribeInstanceTypes gives them; moto ships the same data). Tests add
// others with AddInstanceType.
var builtinTypes = []InstanceType{
	{Name: "t2.micro", Hypervisor: "xen", VCPUs: 1, MemoryMiB: 1024, MaxENIs: 2, IPv4PerENI: 2, IPv6PerENI: 2},
	{Name: "t3.nano", Hypervisor: "nitro", VCPUs: 2, MemoryMiB: 512, MaxENIs: 2, IPv4PerENI: 2, IPv6PerENI: 2},
	{Name: "t3.small", Hypervisor: "nitro", VCPUs: 2, MemoryMiB: 2048, MaxENIs: 3, IPv4PerENI: 4, IPv6PerENI: 4},
	{Name: "t3.medium", Hypervisor: "nitro", VCPUs: 2, MemoryMiB: 4096, MaxENIs: 3, IPv4PerENI: 6, IPv6PerENI: 6},
	{Name: "t3.large", Hypervisor: "nitro", VCPUs: 2, MemoryMiB: 8192, MaxENIs: 3, IPv4PerENI: 12, IPv6PerENI: 12},
	{Name: "c5.large", Hypervisor: "nitro", VCPUs: 2, MemoryMiB: 4096, MaxENIs: 3, IPv4PerENI: 10, IPv6PerENI: 10},
	{Name: "m5.large", Hypervisor: "nitro", VCPUs: 2, MemoryMiB: 8192, MaxENIs: 3, IPv4PerENI: 10, IPv6PerENI: 10},
	{Name: "m5.xlarge", Hypervisor: "nitro", VCPUs: 4, MemoryMiB: 16384, MaxENIs: 4, IPv4PerENI: 15, IPv6PerENI: 15},
	{Name: "m5.2xlarge", Hypervisor: "nitro", VCPUs: 8, MemoryMiB: 32768, MaxENIs: 4, IPv4PerENI: 15, IPv6PerENI: 15},
	{Name: "m6i.large", Hypervisor: "nitro", VCPUs: 2, MemoryMiB: 8192, MaxENIs: 3, IPv4PerENI: 10, IPv6PerENI: 10},
	{Name: "m5.metal", BareMetal: true, VCPUs: 96, MemoryMiB: 393216, MaxENIs: 15, IPv4PerENI: 50, IPv6PerENI: 50},
	{Name: "c5n.18xlarge", Hypervisor: "nitro", VCPUs: 72, MemoryMiB: 196608, MaxENIs: 15, IPv4PerENI: 50, IPv6PerENI: 50},
	{Name: "trn1.32xlarge", Hypervisor: "nitro", VCPUs: 128, MemoryMiB: 524288, MaxENIs: 40, IPv4PerENI: 50, IPv6PerENI: 50,
		Cards: []int{5, 5, 5, 5, 5, 5, 5, 5}},
	{Name: "p5.48xlarge", Hypervisor: "nitro", VCPUs: 192, MemoryMiB: 2097152, MaxENIs: 64, IPv4PerENI: 50, IPv6PerENI: 50,
		Cards: slices.Repeat([]int{2}, 32)},
}

var instanceFilters = []string{"instance-id", "instance-type", "instance-state-name", "vpc-id", "subnet-id",
	"availability-zone", "private-ip-address", "network-interface.network-interface-id", "network-interface.mac-address"}

func (s *Server) describeInstances(f form) (result, *apiError) {
	ids := f.list("InstanceId")
	limit, aerr := maxResults(f, 5, 1000, len(ids) > 0)
	if aerr != nil {
		return nil, aerr
	}
	filters, aerr := checkFilters(f, instanceFilters)
	if aerr != nil {
		return nil, aerr
	}
	var found []*instance
	for _, id := range ids {
		in, aerr := s.instanceByID(id)
		if aerr != nil {
			return nil, aerr
		}
		found = append(found, in)
	}
	if len(ids) == 0 {
		found = slices.Collect(maps.Values(s.instances))
	}
	found = keep(found, filters, func(in *instance, fl filter) bool {
		fields := map[string][]string{"instance-id": {in.id}, "instance-type": {in.typ}, "instance-state-name": {in.state},
			"vpc-id": {in.vpcID}, "subnet-id": {in.subnetID}, "availability-zone": {in.az}}
		for _, e := range s.attachedTo(in.id) {
			fields["network-interface.network-interface-id"] = append(fields["network-interface.network-interface-id"], e.ID)
			fields["network-interface.mac-address"] = append(fields["network-interface.mac-address"], e.MAC)
			for _, a := range e.PrivateIPs {
				fields["private-ip-address"] = append(fields["private-ip-address"], a.String())
			}
		}
		return tagged(in.tags, fl, fields)
	})
	found, next, aerr := page(f, found, func(in *instance) string { return in.id }, limit)
	if aerr != nil {
		return nil, aerr
	}
	out := &describeInstancesResult{NextToken: next}
	for _, in := range found {
		out.Reservations = append(out.Reservations, xmlReservation{ID: "r-" + strings.TrimPrefix(in.id, "i-"),
			OwnerID: s.account, Instances: []xmlInstance{s.xmlInstance(in)}})
	}
	return out, nil
}

var stateCodes = map[string]int{"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48}

func (s *Server) xmlInstance(in *instance) xmlInstance {
	x := xmlInstance{ID: in.id, ImageID: "ami-0lab", State: xmlState{Code: stateCodes[in.state], Name: in.state},
		Type: in.typ, LaunchTime: timestamp(in.launched), AZ: in.az, Hypervisor: s.types[in.typ].Hypervisor,
		SourceDestCheck: true, Tags: xmlTags(in.tags)}
	if in.state != "running" {
		return x
	}
	x.SubnetID, x.VPCID = in.subnetID, in.vpcID
	for _, g := range in.groups {
		x.Groups = append(x.Groups, xmlGroup{ID: g, Name: s.groups[g].name})
	}
	for _, e := range s.attachedTo(in.id) {
		if e.DeviceIndex == 0 && e.NetworkCard == s.types[in.typ].DefaultCard {
			x.PrivateIP, x.SourceDestCheck = e.PrimaryIP.String(), e.SourceDestCheck
		}
		xe := s.xmlENI(e)
		xe.Attachment.InstanceID, xe.Attachment.InstanceOwnerID = "", "" // not in InstanceNetworkInterfaceAttachment
		x.ENIs = append(x.ENIs, xe)
	}
	return x
}

// terminateInstances ends instances: their ENIs are detached (OnDetach),
// and those marked DeleteOnTermination deleted, as on EC2 (moto leaves them
// attached).
func (s *Server) terminateInstances(f form) (result, *apiError) {
	ids := f.list("InstanceId")
	if len(ids) == 0 {
		return nil, errorf(400, "MissingParameter", "The request must contain the parameter InstanceId")
	}
	var found []*instance
	for _, id := range ids {
		in, aerr := s.instanceByID(id)
		if aerr != nil {
			return nil, aerr
		}
		found = append(found, in)
	}
	out := &terminateResult{}
	for _, in := range found {
		prev := in.state
		if in.state == "running" {
			for _, e := range s.attachedTo(in.id) {
				snap := e.clone()
				if s.OnDetach != nil {
					s.queue(func() { s.OnDetach(snap.InstanceID, snap) })
				}
				if e.DeleteOnTermination {
					s.forget(e)
				} else {
					clearAttachment(e)
				}
			}
			in.state = "terminated"
			s.changed()
		}
		out.Instances = append(out.Instances, xmlStateChange{ID: in.id, Current: xmlState{Code: 48, Name: "terminated"},
			Previous: xmlState{Code: stateCodes[prev], Name: prev}})
	}
	return out, nil
}

// tagsOf finds a taggable resource's tags by its ID's prefix.
func (s *Server) tagsOf(id string) (map[string]string, string, *apiError) {
	prefix, _, _ := strings.Cut(id, "-")
	switch prefix {
	case "eni":
		e, aerr := s.eniByID(id)
		if aerr != nil {
			return nil, "", aerr
		}
		return e.Tags, "network-interface", nil
	case "subnet":
		if sn, ok := s.subnets[id]; ok {
			return sn.tags, "subnet", nil
		}
		return nil, "", errSubnetNotFound(id)
	case "vpc":
		if v, ok := s.vpcs[id]; ok {
			return v.tags, "vpc", nil
		}
		return nil, "", errVPCNotFound(id)
	case "sg":
		if g, ok := s.groups[id]; ok {
			return g.tags, "security-group", nil
		}
		return nil, "", errGroupNotFound(id)
	case "i":
		in, aerr := s.instanceByID(id)
		if aerr != nil {
			return nil, "", aerr
		}
		return in.tags, "instance", nil
	}
	return nil, "", errorf(400, "InvalidID", "The ID '%s' is not valid", id)
}

func (s *Server) createTags(f form) (result, *apiError) {
	ids, tags := f.list("ResourceId"), f.tags("Tag")
	if len(ids) == 0 || len(tags) == 0 {
		return nil, errorf(400, "MissingParameter", "The request must contain the parameters ResourceId and Tag")
	}
	var targets []map[string]string
	for _, id := range ids {
		t, _, aerr := s.tagsOf(id)
		if aerr != nil {
			return nil, aerr
		}
		targets = append(targets, t)
	}
	for _, t := range targets {
		maps.Copy(t, tags)
	}
	return ok(), nil
}

// deleteTags removes the keys given (only where the value matches, if one
// is given); no keys removes every tag.
func (s *Server) deleteTags(f form) (result, *apiError) {
	ids := f.list("ResourceId")
	if len(ids) == 0 {
		return nil, errorf(400, "MissingParameter", "The request must contain the parameter ResourceId")
	}
	var targets []map[string]string
	for _, id := range ids {
		t, _, aerr := s.tagsOf(id)
		if aerr != nil {
			return nil, aerr
		}
		targets = append(targets, t)
	}
	members := f.members("Tag")
	for _, t := range targets {
		if len(members) == 0 {
			clear(t)
		}
		for _, m := range members {
			k := f.str(m + ".Key")
			if v, has := t[k]; has && (!f.has(m+".Value") || f.str(m+".Value") == v) {
				delete(t, k)
			}
		}
	}
	return ok(), nil
}

func (s *Server) describeTags(f form) (result, *apiError) {
	filters, aerr := checkFilters(f, []string{"resource-id", "resource-type", "key", "value"})
	if aerr != nil {
		return nil, aerr
	}
	var all []xmlTagDescription
	add := func(id, typ string, tags map[string]string) {
		for _, t := range xmlTags(tags) {
			all = append(all, xmlTagDescription{ResourceID: id, ResourceType: typ, Key: t.Key, Value: t.Value})
		}
	}
	for id, e := range s.enis {
		add(id, "network-interface", e.Tags)
	}
	for id, sn := range s.subnets {
		add(id, "subnet", sn.tags)
	}
	for id, v := range s.vpcs {
		add(id, "vpc", v.tags)
	}
	for id, g := range s.groups {
		add(id, "security-group", g.tags)
	}
	for id, in := range s.instances {
		add(id, "instance", in.tags)
	}
	all = keep(all, filters, func(t xmlTagDescription, fl filter) bool {
		return fl.match(map[string]string{"resource-id": t.ResourceID, "resource-type": t.ResourceType, "key": t.Key, "value": t.Value}[fl.name])
	})
	slices.SortFunc(all, func(a, b xmlTagDescription) int {
		return strings.Compare(a.ResourceID+"\x00"+a.Key, b.ResourceID+"\x00"+b.Key)
	})
	return &describeTagsResult{Tags: all}, nil
}
