package ec2api

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"
)

// eniParam is the ENI named by parameter key.
func (s *Server) eniParam(f form, key string) (*ENI, *apiError) {
	id := f.str(key)
	if id == "" {
		return nil, errorf(400, "MissingParameter", "The request must contain the parameter %s", key)
	}
	return s.eniByID(id)
}

func (s *Server) eniByID(id string) (*ENI, *apiError) {
	if !eniIDShape.MatchString(id) {
		return nil, errMalformed("InvalidNetworkInterfaceId.Malformed", id, "eni-...")
	}
	e, ok := s.enis[id]
	if !ok {
		return nil, errENINotFound(id)
	}
	return e, nil
}

func (s *Server) instanceByID(id string) (*instance, *apiError) {
	if !instanceIDShape.MatchString(id) {
		return nil, errMalformed("InvalidInstanceID.Malformed", id, "i-...")
	}
	in, ok := s.instances[id]
	if !ok {
		return nil, errInstanceNotFound(id)
	}
	return in, nil
}

func (s *Server) createENI(f form) (_ result, aerr *apiError) {
	token := f.str("ClientToken")
	if e := s.enis[s.tokens[token]]; token != "" && e != nil {
		return &createENIResult{ENI: s.xmlENI(e), ClientToken: token}, nil
	}
	id := f.str("SubnetId")
	if id == "" {
		return nil, errorf(400, "MissingParameter", "The request must contain the parameter SubnetId")
	}
	sn, found := s.subnets[id]
	if !found {
		return nil, errSubnetNotFound(id)
	}
	groups, aerr := s.resolveGroups(sn.vpcID, f.list("SecurityGroupId"))
	if aerr != nil {
		return nil, aerr
	}
	var primary netip.Addr
	if raw := f.str("PrivateIpAddress"); raw != "" {
		if primary, aerr = parseAddr(raw); aerr != nil {
			return nil, aerr
		}
	}
	var secondaries []netip.Addr
	for _, m := range f.members("PrivateIpAddresses") {
		a, aerr := parseAddr(f.str(m + ".PrivateIpAddress"))
		if aerr != nil {
			return nil, aerr
		}
		isPrimary, aerr := f.boolean(m + ".Primary")
		switch {
		case aerr != nil:
			return nil, aerr
		case isPrimary && primary.IsValid() && primary != a:
			return nil, errorf(400, "InvalidParameterCombination", "Only one primary private IP address may be specified.")
		case isPrimary:
			primary = a
		default:
			secondaries = append(secondaries, a)
		}
	}
	explicit := slices.DeleteFunc(append([]netip.Addr{primary}, secondaries...), func(a netip.Addr) bool { return !a.IsValid() })
	for i, a := range explicit {
		if slices.Contains(explicit[:i], a) {
			return nil, invalidValue("Address %s is given twice", a)
		}
		if aerr := checkFree(sn, a); aerr != nil {
			return nil, aerr
		}
	}
	count, _, aerr := f.integer("SecondaryPrivateIpAddressCount")
	if aerr != nil {
		return nil, aerr
	}
	pcount, _, aerr := f.integer("Ipv4PrefixCount")
	if aerr != nil {
		return nil, aerr
	}
	var rawPrefixes []string
	for _, m := range f.members("Ipv4Prefix") {
		rawPrefixes = append(rawPrefixes, f.str(m+".Ipv4Prefix"))
	}
	if count < 0 || pcount < 0 {
		return nil, invalidValue("A count may not be negative.")
	}
	if pcount > 0 && len(rawPrefixes) > 0 {
		return nil, errorf(400, "InvalidParameterCombination", "Ipv4PrefixCount and Ipv4Prefixes may not be specified together.")
	}
	need := count
	if !primary.IsValid() {
		need++
	}
	picked, aerr := sn.pick(need, explicit...)
	if aerr != nil {
		return nil, aerr
	}
	ips := explicit
	if !primary.IsValid() {
		ips = append([]netip.Addr{picked[0]}, explicit...)
		picked = picked[1:]
	}
	ips = append(ips, picked...)

	e := s.newENI(sn, groups, f.str("Description"))
	for _, m := range f.members("TagSpecification") {
		if rt := f.str(m + ".ResourceType"); rt != "network-interface" {
			aerr = invalidValue("'%s' is not a valid taggable resource type for this operation.", rt)
		}
		for k, v := range f.tags(m + ".Tag") {
			e.Tags[k] = v
		}
	}
	s.take(e, ips, nil) // before picking prefixes, which must not cover them
	defer func() {
		if aerr != nil {
			s.forget(e)
		}
	}()
	if aerr != nil {
		return nil, aerr
	}
	var prefixes []netip.Prefix
	for _, raw := range rawPrefixes {
		p, aerr := checkPrefix(sn, raw)
		if aerr != nil {
			return nil, aerr
		}
		prefixes = append(prefixes, p)
		s.take(e, nil, []netip.Prefix{p})
	}
	if pcount > 0 {
		if prefixes, aerr = sn.pickPrefixes(pcount); aerr != nil {
			return nil, aerr
		}
		s.take(e, nil, prefixes)
	}
	if aerr = s.createENI6(f, e); aerr != nil {
		return nil, aerr
	}
	if token != "" {
		s.tokens[token] = e.ID
	}
	s.changed()
	return &createENIResult{ENI: s.xmlENI(e), ClientToken: token}, nil
}

func strs[T fmt.Stringer](items []T) []string {
	out := make([]string, len(items))
	for i, x := range items {
		out[i] = x.String()
	}
	return out
}

func parseAddr(raw string) (netip.Addr, *apiError) {
	a, err := netip.ParseAddr(raw)
	if err != nil || !a.Is4() {
		return netip.Addr{}, invalidValue("Invalid IPv4 address %q", raw)
	}
	return a, nil
}

// forget deletes an ENI and frees what it held.
func (s *Server) forget(e *ENI) {
	s.release(e, slices.Clone(e.PrivateIPs), slices.Clone(e.Prefixes))
	s.release6(e, slices.Clone(e.IPv6s), slices.Clone(e.IPv6Prefixes))
	delete(s.enis, e.ID)
	delete(s.macs, e.MAC)
}

func (s *Server) deleteENI(f form) (result, *apiError) {
	e, aerr := s.eniParam(f, "NetworkInterfaceId")
	if aerr != nil {
		return nil, aerr
	}
	if e.attached() {
		return nil, errInUse(e.ID)
	}
	s.forget(e)
	s.changed()
	return ok(), nil
}

// attach checks and books the attachment under the lock, then finishes it
// (OnAttach, then in-use) at once or after AttachDelay.
func (s *Server) attach(f form) (result, *apiError) {
	eniID, attID, card, delay, aerr := s.beginAttach(f)
	if aerr != nil {
		return nil, aerr
	}
	if delay == 0 {
		if err := s.finishAttach(eniID, attID); err != nil {
			return nil, errorf(500, "InternalError", "Attaching %s failed: %v", eniID, err)
		}
	}
	return &attachResult{AttachmentID: attID, NetworkCardIndex: card}, nil
}

func (s *Server) beginAttach(f form) (eniID, attID string, card int, delay time.Duration, _ *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, aerr := s.eniParam(f, "NetworkInterfaceId")
	if aerr != nil {
		return "", "", 0, 0, aerr
	}
	in, aerr := s.instanceByID(f.str("InstanceId"))
	if aerr != nil {
		return "", "", 0, 0, aerr
	}
	if in.state != "running" {
		return "", "", 0, 0, errorf(400, "IncorrectInstanceState", "The instance '%s' is not in a valid state for this operation.", in.id)
	}
	dev, given, aerr := f.integer("DeviceIndex")
	if aerr != nil {
		return "", "", 0, 0, aerr
	}
	if !given {
		return "", "", 0, 0, errorf(400, "MissingParameter", "The request must contain the parameter DeviceIndex")
	}
	card, _, aerr = f.integer("NetworkCardIndex")
	if aerr != nil {
		return "", "", 0, 0, aerr
	}
	t := s.types[in.typ]
	cards := t.cards()
	// The codes of the checks below that the errors page does not name
	// (device index taken, other AZ, bad card) are InvalidParameterValue:
	// not verified against EC2.
	switch {
	case dev < 0:
		return "", "", 0, 0, invalidValue("Value (%d) for parameter deviceIndex is invalid.", dev)
	case card < 0 || card >= len(cards):
		return "", "", 0, 0, invalidValue("Network card index %d is not valid: instance type %s has %d network cards.", card, t.Name, len(cards))
	case e.attached():
		return "", "", 0, 0, errInUse(e.ID)
	case e.VPCID != in.vpcID || e.AZ != in.az:
		return "", "", 0, 0, invalidValue("The network interface %s (%s) and the instance %s (%s) are not in the same VPC and availability zone.", e.ID, e.AZ, in.id, in.az)
	}
	onCard, total := 0, 0
	for _, o := range s.attachedTo(in.id) {
		if o.NetworkCard == card && o.DeviceIndex == dev {
			return "", "", 0, 0, invalidValue("Instance '%s' already has an interface attached at device index '%d'.", in.id, dev)
		}
		if o.NetworkCard == card {
			onCard++
		}
		total++
	}
	if onCard >= cards[card] || total >= t.MaxENIs {
		return "", "", 0, 0, errorf(400, "AttachmentLimitExceeded", "Interface count %d exceeds the limit for %s (network card %d holds %d).", total+1, t.Name, card, cards[card])
	}
	// An ENI holding more addresses than the type allows per interface:
	// the code EC2 gives here was not verified.
	if slots(e) > t.IPv4PerENI {
		return "", "", 0, 0, errIPLimit()
	}
	if slots6(e) > t.IPv6PerENI {
		return "", "", 0, 0, errIPv6Limit()
	}
	e.Status, e.InstanceID, e.AttachmentID, e.DeviceIndex, e.NetworkCard = "attaching", in.id, newID("eni-attach-"), dev, card
	e.DeleteOnTermination, e.AttachTime = false, time.Now().UTC()
	if s.attachDelay > 0 {
		id, att := e.ID, e.AttachmentID
		s.timers = append(s.timers, time.AfterFunc(s.attachDelay, func() { _ = s.finishAttach(id, att) }))
	}
	return e.ID, e.AttachmentID, card, s.attachDelay, nil
}

// finishAttach runs OnAttach for a booked attachment, then makes the ENI
// in-use, or available again if the hook failed.
func (s *Server) finishAttach(eniID, attID string) error {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	s.drain() // the hooks of earlier changes first
	s.mu.Lock()
	e := s.enis[eniID]
	if s.closed || e == nil || e.AttachmentID != attID || e.Status != "attaching" {
		s.mu.Unlock()
		return nil
	}
	snap := e.clone()
	s.mu.Unlock()
	var err error
	if s.OnAttach != nil {
		err = s.OnAttach(snap.InstanceID, snap)
	}
	s.mu.Lock()
	if e.AttachmentID == attID && e.Status == "attaching" {
		if err != nil {
			clearAttachment(e)
		} else {
			e.Status = "in-use"
		}
		s.changed()
	}
	s.mu.Unlock()
	s.drain()
	if err != nil {
		return fmt.Errorf("hot-plugging %s into %s: %w", eniID, snap.InstanceID, err)
	}
	return nil
}

func clearAttachment(e *ENI) {
	e.Status, e.InstanceID, e.AttachmentID, e.DeviceIndex, e.NetworkCard = "available", "", "", 0, 0
	e.DeleteOnTermination, e.AttachTime = false, time.Time{}
}

func (s *Server) detach(f form) (result, *apiError) {
	eniID, attID, start, aerr := s.beginDetach(f)
	if aerr != nil {
		return nil, aerr
	}
	if start && s.detachDelay == 0 {
		s.finishDetach(eniID, attID)
	}
	return ok(), nil
}

// beginDetach marks the ENI detaching; start is false if it already was.
func (s *Server) beginDetach(f form) (eniID, attID string, start bool, _ *apiError) {
	s.mu.Lock()
	defer s.mu.Unlock()
	attID = f.str("AttachmentId")
	if !attachmentIDShape.MatchString(attID) {
		return "", "", false, errMalformed("InvalidNetworkInterfaceAttachmentId.Malformed", attID, "eni-attach-...")
	}
	var e *ENI
	for _, o := range s.enis {
		if o.AttachmentID == attID {
			e = o
		}
	}
	switch {
	case e == nil:
		return "", "", false, errAttachmentNotFound(attID)
	case e.Status == "detaching": // asked again while it detaches
		return e.ID, attID, false, nil
	case e.Status == "attaching":
		return "", "", false, invalidValue("The attachment '%s' is still attaching.", attID)
	case e.DeviceIndex == 0 && e.NetworkCard == s.types[s.instances[e.InstanceID].typ].DefaultCard:
		return "", "", false, errorf(400, "OperationNotPermitted", "The network interface at device index 0 and networkCard index %d cannot be detached.", e.NetworkCard)
	}
	e.Status = "detaching"
	s.changed()
	if s.detachDelay > 0 {
		id := e.ID
		s.timers = append(s.timers, time.AfterFunc(s.detachDelay, func() { s.finishDetach(id, attID) }))
	}
	return e.ID, attID, true, nil
}

// finishDetach runs OnDetach, then makes the ENI available.
func (s *Server) finishDetach(eniID, attID string) {
	s.hookMu.Lock()
	defer s.hookMu.Unlock()
	s.drain()
	s.mu.Lock()
	e := s.enis[eniID]
	if s.closed || e == nil || e.AttachmentID != attID || e.Status != "detaching" {
		s.mu.Unlock()
		return
	}
	snap := e.clone()
	s.mu.Unlock()
	if s.OnDetach != nil {
		s.OnDetach(snap.InstanceID, snap)
	}
	s.mu.Lock()
	if e.AttachmentID == attID && e.Status == "detaching" {
		clearAttachment(e)
		s.changed()
	}
	s.mu.Unlock()
	s.drain()
}

// modifyENI changes one attribute per call, as EC2 does.
func (s *Server) modifyENI(f form) (result, *apiError) {
	e, aerr := s.eniParam(f, "NetworkInterfaceId")
	if aerr != nil {
		return nil, aerr
	}
	var given []string
	for _, k := range []string{"SourceDestCheck.Value", "Description.Value", "SecurityGroupId.1", "Attachment.AttachmentId"} {
		if f.has(k) {
			given = append(given, k)
		}
	}
	switch {
	case len(given) == 0:
		return nil, errorf(400, "MissingParameter", "An attribute to modify must be specified.")
	case len(given) > 1:
		return nil, errorf(400, "InvalidParameterCombination", "Fields for multiple attribute types specified: %v", given)
	}
	switch given[0] {
	case "SourceDestCheck.Value":
		v, aerr := f.boolean("SourceDestCheck.Value")
		if aerr != nil {
			return nil, aerr
		}
		if v != e.SourceDestCheck {
			e.SourceDestCheck = v
			s.changed()
		}
	case "Description.Value":
		e.Description = f.str("Description.Value")
	case "SecurityGroupId.1":
		groups, aerr := s.resolveGroups(e.VPCID, f.list("SecurityGroupId"))
		if aerr != nil {
			return nil, aerr
		}
		e.Groups = groups
	default:
		att := f.str("Attachment.AttachmentId")
		if !e.attached() || e.AttachmentID != att {
			return nil, errAttachmentNotFound(att)
		}
		if f.has("Attachment.DeleteOnTermination") {
			v, aerr := f.boolean("Attachment.DeleteOnTermination")
			if aerr != nil {
				return nil, aerr
			}
			e.DeleteOnTermination = v
		}
	}
	return ok(), nil
}

var eniFilters = []string{"network-interface-id", "subnet-id", "vpc-id", "availability-zone", "status", "mac-address",
	"description", "interface-type", "requester-managed", "owner-id", "source-dest-check", "group-id",
	"private-ip-address", "addresses.private-ip-address", "ipv4-prefix", "ipv6-addresses.ipv6-address", "ipv6-prefix", "attachment.instance-id",
	"attachment.attachment-id", "attachment.device-index", "attachment.status", "attachment.delete-on-termination",
	"attachment.instance-owner-id", "attachment.network-card-index"}

func (s *Server) eniMatches(e *ENI, fl filter) bool {
	if m, isTag := fl.matchTags(e.Tags); isTag {
		return m
	}
	var ips []string
	for _, a := range e.PrivateIPs {
		ips = append(ips, a.String())
	}
	var prefixes []string
	for _, p := range e.Prefixes {
		prefixes = append(prefixes, p.String())
	}
	att := func(v string) bool { return e.attached() && fl.match(v) }
	switch fl.name {
	case "network-interface-id":
		return fl.match(e.ID)
	case "subnet-id":
		return fl.match(e.SubnetID)
	case "vpc-id":
		return fl.match(e.VPCID)
	case "availability-zone":
		return fl.match(e.AZ)
	case "status":
		return fl.match(e.Status)
	case "mac-address":
		return fl.match(e.MAC)
	case "description":
		return fl.match(e.Description)
	case "interface-type":
		return fl.match("interface")
	case "requester-managed":
		return fl.match("false")
	case "owner-id":
		return fl.match(s.account)
	case "source-dest-check":
		return fl.match(strconv.FormatBool(e.SourceDestCheck))
	case "group-id":
		return fl.match(e.Groups...)
	case "private-ip-address", "addresses.private-ip-address":
		// every address of the ENI, secondaries too (moto matches only
		// the primary)
		return fl.match(ips...)
	case "ipv4-prefix":
		return fl.match(prefixes...)
	case "ipv6-addresses.ipv6-address":
		return fl.match(strs(e.IPv6s)...)
	case "ipv6-prefix":
		return fl.match(strs(e.IPv6Prefixes)...)
	case "attachment.instance-id":
		return att(e.InstanceID)
	case "attachment.attachment-id":
		return att(e.AttachmentID)
	case "attachment.device-index":
		return att(strconv.Itoa(e.DeviceIndex))
	case "attachment.network-card-index":
		return att(strconv.Itoa(e.NetworkCard))
	case "attachment.status":
		return att(attachmentStatus(e.Status))
	case "attachment.delete-on-termination":
		return att(strconv.FormatBool(e.DeleteOnTermination))
	case "attachment.instance-owner-id":
		return att(s.account)
	}
	return false
}

func (s *Server) describeENIs(f form) (result, *apiError) {
	ids := f.list("NetworkInterfaceId")
	limit, aerr := maxResults(f, 5, 1000, len(ids) > 0)
	if aerr != nil {
		return nil, aerr
	}
	filters, aerr := checkFilters(f, eniFilters)
	if aerr != nil {
		return nil, aerr
	}
	var found []*ENI
	if len(ids) > 0 {
		for _, id := range ids {
			e, aerr := s.eniByID(id)
			if aerr != nil {
				return nil, aerr
			}
			found = append(found, e)
		}
	} else {
		for _, e := range s.enis {
			found = append(found, e)
		}
	}
	found = slices.DeleteFunc(found, func(e *ENI) bool {
		return slices.ContainsFunc(filters, func(fl filter) bool { return !s.eniMatches(e, fl) })
	})
	found, next, aerr := page(f, found, func(e *ENI) string { return e.ID }, limit)
	if aerr != nil {
		return nil, aerr
	}
	out := &describeENIsResult{NextToken: next}
	for _, e := range found {
		out.ENIs = append(out.ENIs, s.xmlENI(e))
	}
	return out, nil
}
