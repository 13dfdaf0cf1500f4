package ec2api

import (
	"maps"
	"slices"
	"time"
)

// The answers' XML. Element names are the EC2 service model's wire names
// (the Go SDK matches them case-insensitively and skips unknown ones);
// lists are a wrapper element of <item>s.

const xmlns = "http://ec2.amazonaws.com/doc/2016-11-15/"

// meta is in every answer.
type meta struct {
	RequestID string `xml:"requestId"`
}

func (m *meta) setRequestID(id string) { m.RequestID = id }

type result interface{ setRequestID(string) }

type emptyResult struct {
	meta
	Return bool `xml:"return"`
}

func ok() *emptyResult { return &emptyResult{Return: true} }

type xmlTag struct {
	Key   string `xml:"key"`
	Value string `xml:"value"`
}

func xmlTags(tags map[string]string) []xmlTag {
	var out []xmlTag
	for _, k := range slices.Sorted(maps.Keys(tags)) {
		out = append(out, xmlTag{Key: k, Value: tags[k]})
	}
	return out
}

type xmlGroup struct {
	ID   string `xml:"groupId"`
	Name string `xml:"groupName"`
}

type xmlPrivateIP struct {
	IP      string `xml:"privateIpAddress"`
	Primary bool   `xml:"primary"`
}

type xmlPrefix struct {
	Prefix string `xml:"ipv4Prefix"`
}

type xmlAttachment struct {
	ID                  string `xml:"attachmentId"`
	InstanceID          string `xml:"instanceId,omitempty"`
	InstanceOwnerID     string `xml:"instanceOwnerId,omitempty"`
	DeviceIndex         int    `xml:"deviceIndex"`
	NetworkCardIndex    int    `xml:"networkCardIndex"`
	Status              string `xml:"status"`
	AttachTime          string `xml:"attachTime"`
	DeleteOnTermination bool   `xml:"deleteOnTermination"`
}

// xmlENI serves both NetworkInterface and DescribeInstances'
// InstanceNetworkInterface (a subset of the same names).
type xmlENI struct {
	ID               string         `xml:"networkInterfaceId"`
	SubnetID         string         `xml:"subnetId"`
	VPCID            string         `xml:"vpcId"`
	AZ               string         `xml:"availabilityZone"`
	Description      string         `xml:"description"`
	OwnerID          string         `xml:"ownerId"`
	RequesterManaged bool           `xml:"requesterManaged"`
	Status           string         `xml:"status"`
	MAC              string         `xml:"macAddress"`
	PrivateIP        string         `xml:"privateIpAddress"`
	SourceDestCheck  bool           `xml:"sourceDestCheck"`
	InterfaceType    string         `xml:"interfaceType"`
	Groups           []xmlGroup     `xml:"groupSet>item"`
	Attachment       *xmlAttachment `xml:"attachment"`
	PrivateIPs       []xmlPrivateIP `xml:"privateIpAddressesSet>item"`
	Prefixes         []xmlPrefix    `xml:"ipv4PrefixSet>item"`
	IPv6s            []xmlIPv6      `xml:"ipv6AddressesSet>item"`
	IPv6Prefixes     []xmlPrefix6   `xml:"ipv6PrefixSet>item"`
	Tags             []xmlTag       `xml:"tagSet>item"`
}

type xmlIPv6 struct {
	IP      string `xml:"ipv6Address"`
	Primary bool   `xml:"isPrimaryIpv6"`
}

type xmlPrefix6 struct {
	Prefix string `xml:"ipv6Prefix"`
}

func timestamp(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// attachmentStatus is the attachment's side of the ENI's status.
func attachmentStatus(eniStatus string) string {
	switch eniStatus {
	case "in-use":
		return "attached"
	default:
		return eniStatus // attaching, detaching
	}
}

func (s *Server) xmlENI(e *ENI) xmlENI {
	x := xmlENI{ID: e.ID, SubnetID: e.SubnetID, VPCID: e.VPCID, AZ: e.AZ, Description: e.Description, OwnerID: s.account,
		Status: e.Status, MAC: e.MAC, PrivateIP: e.PrimaryIP.String(), SourceDestCheck: e.SourceDestCheck,
		InterfaceType: "interface", Tags: xmlTags(e.Tags)}
	for _, g := range e.Groups {
		x.Groups = append(x.Groups, xmlGroup{ID: g, Name: s.groups[g].name})
	}
	for _, a := range e.PrivateIPs {
		x.PrivateIPs = append(x.PrivateIPs, xmlPrivateIP{IP: a.String(), Primary: a == e.PrimaryIP})
	}
	for _, p := range e.Prefixes {
		x.Prefixes = append(x.Prefixes, xmlPrefix{Prefix: p.String()})
	}
	for _, a := range e.IPv6s {
		x.IPv6s = append(x.IPv6s, xmlIPv6{IP: a.String()})
	}
	for _, p := range e.IPv6Prefixes {
		x.IPv6Prefixes = append(x.IPv6Prefixes, xmlPrefix6{Prefix: p.String()})
	}
	if e.attached() {
		x.Attachment = &xmlAttachment{ID: e.AttachmentID, InstanceID: e.InstanceID, InstanceOwnerID: s.account,
			DeviceIndex: e.DeviceIndex, NetworkCardIndex: e.NetworkCard, Status: attachmentStatus(e.Status),
			AttachTime: timestamp(e.AttachTime), DeleteOnTermination: e.DeleteOnTermination}
	}
	return x
}

type describeENIsResult struct {
	meta
	ENIs      []xmlENI `xml:"networkInterfaceSet>item"`
	NextToken string   `xml:"nextToken,omitempty"`
}

type createENIResult struct {
	meta
	ENI         xmlENI `xml:"networkInterface"`
	ClientToken string `xml:"clientToken,omitempty"`
}

type attachResult struct {
	meta
	AttachmentID     string `xml:"attachmentId"`
	NetworkCardIndex int    `xml:"networkCardIndex"`
}

type assignResult struct {
	meta
	ENI      string        `xml:"networkInterfaceId"`
	IPs      []xmlAssigned `xml:"assignedPrivateIpAddressesSet>item"`
	Prefixes []xmlPrefix   `xml:"assignedIpv4PrefixSet>item"`
}

// assign6Result: the addresses and /80s this call assigned, as strings.
type assign6Result struct {
	meta
	ENI      string   `xml:"networkInterfaceId"`
	IPs      []string `xml:"assignedIpv6Addresses>item"`
	Prefixes []string `xml:"assignedIpv6PrefixSet>item"`
}

type unassign6Result struct {
	meta
	ENI      string   `xml:"networkInterfaceId"`
	IPs      []string `xml:"unassignedIpv6Addresses>item"`
	Prefixes []string `xml:"unassignedIpv6PrefixSet>item"`
}

type xmlAssigned struct {
	IP string `xml:"privateIpAddress"`
}

type xmlNetworkCard struct {
	Index   int `xml:"networkCardIndex"`
	MaxENIs int `xml:"maximumNetworkInterfaces"`
}

type xmlInstanceType struct {
	Name              string `xml:"instanceType"`
	CurrentGeneration bool   `xml:"currentGeneration"`
	Hypervisor        string `xml:"hypervisor,omitempty"`
	BareMetal         bool   `xml:"bareMetal"`
	VCPUs             int    `xml:"vCpuInfo>defaultVCpus"`
	MemoryMiB         int    `xml:"memoryInfo>sizeInMiB"`
	Network           struct {
		MaxENIs       int              `xml:"maximumNetworkInterfaces"`
		MaxCards      int              `xml:"maximumNetworkCards"`
		DefaultCard   int              `xml:"defaultNetworkCardIndex"`
		IPv4PerENI    int              `xml:"ipv4AddressesPerInterface"`
		IPv6PerENI    int              `xml:"ipv6AddressesPerInterface"`
		IPv6Supported bool             `xml:"ipv6Supported"`
		Cards         []xmlNetworkCard `xml:"networkCards>item"`
	} `xml:"networkInfo"`
}

func xmlType(t InstanceType) xmlInstanceType {
	x := xmlInstanceType{Name: t.Name, CurrentGeneration: true, Hypervisor: t.Hypervisor, BareMetal: t.BareMetal,
		VCPUs: t.VCPUs, MemoryMiB: t.MemoryMiB}
	n := &x.Network
	n.MaxENIs, n.DefaultCard, n.IPv4PerENI, n.IPv6PerENI, n.IPv6Supported = t.MaxENIs, t.DefaultCard, t.IPv4PerENI, t.IPv6PerENI, t.IPv6PerENI > 0
	for i, c := range t.cards() {
		n.Cards = append(n.Cards, xmlNetworkCard{Index: i, MaxENIs: c})
	}
	n.MaxCards = len(n.Cards)
	return x
}

type describeTypesResult struct {
	meta
	Types     []xmlInstanceType `xml:"instanceTypeSet>item"`
	NextToken string            `xml:"nextToken,omitempty"`
}

type xmlSubnet struct {
	ID        string `xml:"subnetId"`
	VPCID     string `xml:"vpcId"`
	CIDR      string `xml:"cidrBlock"`
	AZ        string `xml:"availabilityZone"`
	Available int    `xml:"availableIpAddressCount"`
	State     string `xml:"state"`
	OwnerID   string `xml:"ownerId"`
	// IPv6 is the subnet's IPv6 block, if any (EC2 lists one association).
	IPv6       []xmlCIDR6Assoc `xml:"ipv6CidrBlockAssociationSet>item"`
	AssignIPv6 bool            `xml:"assignIpv6AddressOnCreation"`
	IPv6Native bool            `xml:"ipv6Native"`
	Tags       []xmlTag        `xml:"tagSet>item"`
}

type xmlCIDR6Assoc struct {
	ID    string `xml:"associationId"`
	CIDR  string `xml:"ipv6CidrBlock"`
	State string `xml:"ipv6CidrBlockState>state"`
	Pool  string `xml:"ipv6Pool,omitempty"`
}

type describeSubnetsResult struct {
	meta
	Subnets []xmlSubnet `xml:"subnetSet>item"`
}

type xmlCIDRAssoc struct {
	ID    string `xml:"associationId"`
	CIDR  string `xml:"cidrBlock"`
	State string `xml:"cidrBlockState>state"`
}

type xmlVPC struct {
	ID     string          `xml:"vpcId"`
	CIDR   string          `xml:"cidrBlock"`
	State  string          `xml:"state"`
	Owner  string          `xml:"ownerId"`
	Assocs []xmlCIDRAssoc  `xml:"cidrBlockAssociationSet>item"`
	IPv6   []xmlCIDR6Assoc `xml:"ipv6CidrBlockAssociationSet>item"`
	Tags   []xmlTag        `xml:"tagSet>item"`
}

type describeVPCsResult struct {
	meta
	VPCs []xmlVPC `xml:"vpcSet>item"`
}

type xmlSecurityGroup struct {
	ID          string   `xml:"groupId"`
	Name        string   `xml:"groupName"`
	Description string   `xml:"groupDescription"`
	VPCID       string   `xml:"vpcId"`
	OwnerID     string   `xml:"ownerId"`
	Tags        []xmlTag `xml:"tagSet>item"`
}

type describeGroupsResult struct {
	meta
	Groups []xmlSecurityGroup `xml:"securityGroupInfo>item"`
}

type xmlState struct {
	Code int    `xml:"code"`
	Name string `xml:"name"`
}

type xmlInstance struct {
	ID              string     `xml:"instanceId"`
	ImageID         string     `xml:"imageId"`
	State           xmlState   `xml:"instanceState"`
	Type            string     `xml:"instanceType"`
	LaunchTime      string     `xml:"launchTime"`
	AZ              string     `xml:"placement>availabilityZone"`
	Hypervisor      string     `xml:"hypervisor,omitempty"`
	SubnetID        string     `xml:"subnetId,omitempty"`
	VPCID           string     `xml:"vpcId,omitempty"`
	PrivateIP       string     `xml:"privateIpAddress,omitempty"`
	SourceDestCheck bool       `xml:"sourceDestCheck"`
	Groups          []xmlGroup `xml:"groupSet>item"`
	ENIs            []xmlENI   `xml:"networkInterfaceSet>item"`
	Tags            []xmlTag   `xml:"tagSet>item"`
}

type xmlReservation struct {
	ID        string        `xml:"reservationId"`
	OwnerID   string        `xml:"ownerId"`
	Instances []xmlInstance `xml:"instancesSet>item"`
}

type describeInstancesResult struct {
	meta
	Reservations []xmlReservation `xml:"reservationSet>item"`
	NextToken    string           `xml:"nextToken,omitempty"`
}

type xmlStateChange struct {
	ID       string   `xml:"instanceId"`
	Current  xmlState `xml:"currentState"`
	Previous xmlState `xml:"previousState"`
}

type terminateResult struct {
	meta
	Instances []xmlStateChange `xml:"instancesSet>item"`
}

type xmlTagDescription struct {
	ResourceID   string `xml:"resourceId"`
	ResourceType string `xml:"resourceType"`
	Key          string `xml:"key"`
	Value        string `xml:"value"`
}

type describeTagsResult struct {
	meta
	Tags []xmlTagDescription `xml:"tagSet>item"`
}
