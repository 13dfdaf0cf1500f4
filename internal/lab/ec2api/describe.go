package ec2api

import (
	"cmp"
	"encoding/base64"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// maxResults reads MaxResults (0: not given), which EC2 bounds per action
// and refuses beside explicit IDs. A bad value is InvalidParameterValue:
// the errors page also lists InvalidMaxResults; which one these actions
// give was not verified.
func maxResults(f form, lo, hi int, withIDs bool) (int, *apiError) {
	n, given, aerr := f.integer("MaxResults")
	switch {
	case aerr != nil:
		return 0, aerr
	case !given:
		return 0, nil
	case withIDs:
		return 0, errorf(400, "InvalidParameterCombination", "The parameter MaxResults cannot be used with IDs.")
	case n < lo || n > hi:
		return 0, invalidValue("Value ( %d ) for parameter maxResults is invalid. Expecting a value between %d and %d.", n, lo, hi)
	}
	return n, nil
}

// checkFilters refuses a filter name the action does not know with a 4xx
// InvalidFilter (moto answers a 500 HTML page).
func checkFilters(f form, known []string) ([]filter, *apiError) {
	filters := f.filters()
	for _, fl := range filters {
		if !slices.Contains(known, fl.name) && !strings.HasPrefix(fl.name, "tag:") && fl.name != "tag-key" {
			return nil, errFilter(fl.name)
		}
	}
	return filters, nil
}

// page sorts items by key and cuts the page after NextToken (the last key
// of the page before, opaque to the caller); limit 0 is everything.
func page[T any](f form, items []T, key func(T) string, limit int) ([]T, string, *apiError) {
	slices.SortFunc(items, func(a, b T) int { return cmp.Compare(key(a), key(b)) })
	if tok := f.str("NextToken"); tok != "" {
		after, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil {
			return nil, "", errorf(400, "InvalidNextToken", "The token '%s' is invalid.", tok)
		}
		items = slices.DeleteFunc(items, func(t T) bool { return key(t) <= string(after) })
	}
	if limit == 0 || len(items) <= limit {
		return items, "", nil
	}
	items = items[:limit]
	return items, base64.RawURLEncoding.EncodeToString([]byte(key(items[limit-1]))), nil
}

func keep[T any](items []T, filters []filter, match func(T, filter) bool) []T {
	return slices.DeleteFunc(items, func(t T) bool {
		return slices.ContainsFunc(filters, func(fl filter) bool { return !match(t, fl) })
	})
}

func tagged(tags map[string]string, fl filter, fields map[string][]string) bool {
	if m, isTag := fl.matchTags(tags); isTag {
		return m
	}
	return fl.match(fields[fl.name]...)
}

func (s *Server) describeInstanceTypes(f form) (result, *apiError) {
	names := f.list("InstanceType")
	limit, aerr := maxResults(f, 5, 100, false)
	if aerr != nil {
		return nil, aerr
	}
	filters, aerr := checkFilters(f, []string{"instance-type", "hypervisor", "bare-metal", "current-generation",
		"network-info.maximum-network-interfaces", "network-info.ipv4-addresses-per-interface",
		"network-info.ipv6-addresses-per-interface", "network-info.maximum-network-cards"})
	if aerr != nil {
		return nil, aerr
	}
	var types []InstanceType
	if len(names) == 0 {
		types = slices.Collect(maps.Values(s.types))
	}
	var unknown []string
	for _, n := range names {
		if t, ok := s.types[n]; ok {
			types = append(types, t)
		} else {
			unknown = append(unknown, n)
		}
	}
	if len(unknown) > 0 {
		return nil, errInstanceType(unknown...)
	}
	types = keep(types, filters, func(t InstanceType, fl filter) bool {
		return fl.match(map[string]string{
			"instance-type": t.Name, "hypervisor": t.Hypervisor, "bare-metal": strconv.FormatBool(t.BareMetal),
			"current-generation":                        "true",
			"network-info.maximum-network-interfaces":   strconv.Itoa(t.MaxENIs),
			"network-info.ipv4-addresses-per-interface": strconv.Itoa(t.IPv4PerENI),
			"network-info.ipv6-addresses-per-interface": strconv.Itoa(t.IPv6PerENI),
			"network-info.maximum-network-cards":        strconv.Itoa(len(t.cards())),
		}[fl.name])
	})
	types, next, aerr := page(f, types, func(t InstanceType) string { return t.Name }, limit)
	if aerr != nil {
		return nil, aerr
	}
	out := &describeTypesResult{NextToken: next}
	for _, t := range types {
		out.Types = append(out.Types, xmlType(t))
	}
	return out, nil
}

func (s *Server) describeSubnets(f form) (result, *apiError) {
	limit, aerr := maxResults(f, 5, 1000, f.has("SubnetId.1"))
	if aerr != nil {
		return nil, aerr
	}
	filters, aerr := checkFilters(f, []string{"subnet-id", "vpc-id", "availability-zone", "cidr-block", "cidr", "state", "owner-id",
		"ipv6-cidr-block-association.ipv6-cidr-block"})
	if aerr != nil {
		return nil, aerr
	}
	var subnets []*subnet
	for _, id := range f.list("SubnetId") {
		sn, ok := s.subnets[id]
		if !ok {
			return nil, errSubnetNotFound(id)
		}
		subnets = append(subnets, sn)
	}
	if !f.has("SubnetId.1") {
		subnets = slices.Collect(maps.Values(s.subnets))
	}
	subnets = keep(subnets, filters, func(sn *subnet, fl filter) bool {
		return tagged(sn.tags, fl, map[string][]string{"subnet-id": {sn.id}, "vpc-id": {sn.vpcID},
			"availability-zone": {sn.az}, "cidr-block": {sn.cidr.String()}, "cidr": {sn.cidr.String()},
			"state": {"available"}, "owner-id": {s.account}, "ipv6-cidr-block-association.ipv6-cidr-block": cidr6s(sn.cidr6)})
	})
	subnets, _, aerr = page(f, subnets, func(sn *subnet) string { return sn.id }, limit)
	if aerr != nil {
		return nil, aerr
	}
	out := &describeSubnetsResult{}
	for _, sn := range subnets {
		out.Subnets = append(out.Subnets, xmlSubnet{ID: sn.id, VPCID: sn.vpcID, CIDR: sn.cidr.String(), AZ: sn.az,
			Available: max(sn.available(), 0), State: "available", OwnerID: s.account, Tags: xmlTags(sn.tags),
			IPv6: xmlCIDR6(sn.cidr6, sn.assoc6, "")})
	}
	return out, nil
}

func (s *Server) describeVPCs(f form) (result, *apiError) {
	filters, aerr := checkFilters(f, []string{"vpc-id", "cidr", "cidr-block-association.cidr-block", "state", "owner-id"})
	if aerr != nil {
		return nil, aerr
	}
	var vpcs []*vpc
	for _, id := range f.list("VpcId") {
		v, ok := s.vpcs[id]
		if !ok {
			return nil, errVPCNotFound(id)
		}
		vpcs = append(vpcs, v)
	}
	if !f.has("VpcId.1") {
		vpcs = slices.Collect(maps.Values(s.vpcs))
	}
	vpcs = keep(vpcs, filters, func(v *vpc, fl filter) bool {
		return tagged(v.tags, fl, map[string][]string{"vpc-id": {v.id}, "cidr": {v.cidr.String()},
			"cidr-block-association.cidr-block": {v.cidr.String()}, "state": {"available"}, "owner-id": {s.account}})
	})
	slices.SortFunc(vpcs, func(a, b *vpc) int { return cmp.Compare(a.id, b.id) })
	out := &describeVPCsResult{}
	for _, v := range vpcs {
		out.VPCs = append(out.VPCs, xmlVPC{ID: v.id, CIDR: v.cidr.String(), State: "available", Owner: s.account,
			Assocs: []xmlCIDRAssoc{{ID: "vpc-cidr-assoc-" + strings.TrimPrefix(v.id, "vpc-"), CIDR: v.cidr.String(), State: "associated"}},
			IPv6:   xmlCIDR6(v.cidr6, v.assoc6, "Amazon"),
			Tags:   xmlTags(v.tags)})
	}
	return out, nil
}

func cidr6s(p netip.Prefix) []string {
	if !p.IsValid() {
		return nil
	}
	return []string{p.String()}
}

// xmlCIDR6 is an IPv6 block's association, none for an invalid block.
func xmlCIDR6(p netip.Prefix, id, pool string) []xmlCIDR6Assoc {
	if !p.IsValid() {
		return nil
	}
	return []xmlCIDR6Assoc{{ID: id, CIDR: p.String(), State: "associated", Pool: pool}}
}

func (s *Server) describeSecurityGroups(f form) (result, *apiError) {
	filters, aerr := checkFilters(f, []string{"group-id", "group-name", "vpc-id", "owner-id"})
	if aerr != nil {
		return nil, aerr
	}
	var groups []*securityGroup
	for _, id := range f.list("GroupId") {
		g, ok := s.groups[id]
		if !ok {
			return nil, errGroupNotFound(id)
		}
		groups = append(groups, g)
	}
	if !f.has("GroupId.1") {
		groups = slices.Collect(maps.Values(s.groups))
	}
	names := f.list("GroupName")
	groups = keep(groups, filters, func(g *securityGroup, fl filter) bool {
		return tagged(g.tags, fl, map[string][]string{"group-id": {g.id}, "group-name": {g.name}, "vpc-id": {g.vpcID}, "owner-id": {s.account}})
	})
	groups = slices.DeleteFunc(groups, func(g *securityGroup) bool { return len(names) > 0 && !slices.Contains(names, g.name) })
	slices.SortFunc(groups, func(a, b *securityGroup) int { return cmp.Compare(a.id, b.id) })
	out := &describeGroupsResult{}
	for _, g := range groups {
		out.Groups = append(out.Groups, xmlSecurityGroup{ID: g.id, Name: g.name, Description: g.name, VPCID: g.vpcID,
			OwnerID: s.account, Tags: xmlTags(g.tags)})
	}
	return out, nil
}
