package ec2api

import (
	"io"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
)

// TestInstanceTypes: the built-in types carry EC2's real NetworkInfo, a
// test can add its own, pagination stays within 5–100 and loses nothing.
func TestInstanceTypes(t *testing.T) {
	t.Parallel()
	l := start(t, New(Options{}))
	l.s.AddInstanceType(InstanceType{Name: "lab.tiny", Hypervisor: "nitro", VCPUs: 1, MaxENIs: 2, IPv4PerENI: 3, IPv6PerENI: 0})
	out := must[*ec2.DescribeInstanceTypesOutput](t, "DescribeInstanceTypes")(l.c.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{
		InstanceTypes: []types.InstanceType{"t3.medium", "m5.large", "m5.xlarge", "c5n.18xlarge", "t2.micro", "p5.48xlarge", "lab.tiny"}}))
	type info struct {
		enis, v4, v6, cards, perCard0, defCard int32
		hyp                                    string
		metal                                  bool
	}
	got := map[string]info{}
	for _, it := range out.InstanceTypes {
		n := it.NetworkInfo
		got[string(it.InstanceType)] = info{*n.MaximumNetworkInterfaces, *n.Ipv4AddressesPerInterface, *n.Ipv6AddressesPerInterface,
			int32(len(n.NetworkCards)), *n.NetworkCards[0].MaximumNetworkInterfaces, *n.DefaultNetworkCardIndex, string(it.Hypervisor), *it.BareMetal}
		if *n.MaximumNetworkCards != int32(len(n.NetworkCards)) {
			t.Errorf("%s: MaximumNetworkCards %d, %d cards listed", it.InstanceType, *n.MaximumNetworkCards, len(n.NetworkCards))
		}
	}
	want := map[string]info{
		"t3.medium":    {3, 6, 6, 1, 3, 0, "nitro", false},
		"m5.large":     {3, 10, 10, 1, 3, 0, "nitro", false},
		"m5.xlarge":    {4, 15, 15, 1, 4, 0, "nitro", false},
		"c5n.18xlarge": {15, 50, 50, 1, 15, 0, "nitro", false},
		"t2.micro":     {2, 2, 2, 1, 2, 0, "xen", false},
		"p5.48xlarge":  {64, 50, 50, 32, 2, 0, "nitro", false},
		"lab.tiny":     {2, 3, 0, 1, 2, 0, "nitro", false},
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s: %+v, want %+v", name, got[name], w)
		}
	}
	_, err := l.c.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{"zz9.huge"}})
	wantCode(t, "unknown type", err, "InvalidInstanceType", 400)
	_, err = l.c.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{MaxResults: aws.Int32(4)})
	wantCode(t, "MaxResults 4", err, "InvalidParameterValue", 400)

	var all []string
	pages := 0
	for p := ec2.NewDescribeInstanceTypesPaginator(l.c, &ec2.DescribeInstanceTypesInput{MaxResults: aws.Int32(5)}); p.HasMorePages(); pages++ {
		out := must[*ec2.DescribeInstanceTypesOutput](t, "page")(p.NextPage(ctx))
		if len(out.InstanceTypes) > 5 {
			t.Fatalf("page of %d for MaxResults 5", len(out.InstanceTypes))
		}
		for _, it := range out.InstanceTypes {
			all = append(all, string(it.InstanceType))
		}
	}
	if n := len(builtinTypes) + 1; len(all) != n || pages != (n+4)/5 || !slices.Contains(all, "lab.tiny") {
		t.Fatalf("paginated %d types in %d pages, want %d in %d: %v", len(all), pages, n, (n+4)/5, all)
	}
	slices.Sort(all)
	if len(slices.Compact(all)) != len(builtinTypes)+1 {
		t.Fatalf("a type came twice: %v", all)
	}
}

// TestENILifecycle: create (tags, description, groups, secondaries) →
// attach → modify → detach → delete, with the shapes the SDK decodes.
func TestENILifecycle(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	sg := l.s.AddSecurityGroup(l.vpc, "nodes")
	e := l.createENI(t, &ec2.CreateNetworkInterfaceInput{Description: aws.String("vpcni test"), Groups: []string{sg},
		SecondaryPrivateIpAddressCount: aws.Int32(2),
		TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface,
			Tags: []types.Tag{{Key: aws.String("vpcni/node"), Value: aws.String("n1")}}}}})
	id := *e.NetworkInterfaceId
	if !regexp.MustCompile(`^eni-[0-9a-f]{17}$`).MatchString(id) || !regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`).MatchString(*e.MacAddress) {
		t.Fatalf("ID %q MAC %q", id, *e.MacAddress)
	}
	if e.Status != types.NetworkInterfaceStatusAvailable || *e.Description != "vpcni test" || len(e.Groups) != 1 || *e.Groups[0].GroupId != sg ||
		*e.Groups[0].GroupName != "nodes" || len(e.PrivateIpAddresses) != 3 || !*e.PrivateIpAddresses[0].Primary ||
		*e.PrivateIpAddresses[1].Primary || *e.PrivateIpAddress != *e.PrivateIpAddresses[0].PrivateIpAddress ||
		len(e.TagSet) != 1 || *e.TagSet[0].Value != "n1" || *e.SubnetId != l.sub || *e.VpcId != l.vpc || e.Attachment != nil ||
		!*e.SourceDestCheck || e.InterfaceType != types.NetworkInterfaceTypeInterface {
		t.Fatalf("created: %+v", e)
	}
	att := l.attach(t, id, l.inst.ID, 1)
	e = l.eni(t, id)
	if e.Status != types.NetworkInterfaceStatusInUse || *e.Attachment.AttachmentId != att || *e.Attachment.DeviceIndex != 1 ||
		*e.Attachment.NetworkCardIndex != 0 || e.Attachment.Status != types.AttachmentStatusAttached || *e.Attachment.InstanceId != l.inst.ID ||
		*e.Attachment.DeleteOnTermination || e.Attachment.AttachTime == nil {
		t.Fatalf("attached: %+v %+v", e, e.Attachment)
	}
	must[*ec2.ModifyNetworkInterfaceAttributeOutput](t, "DeleteOnTermination")(l.c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{
		NetworkInterfaceId: &id, Attachment: &types.NetworkInterfaceAttachmentChanges{AttachmentId: &att, DeleteOnTermination: aws.Bool(true)}}))
	must[*ec2.ModifyNetworkInterfaceAttributeOutput](t, "SourceDestCheck")(l.c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{
		NetworkInterfaceId: &id, SourceDestCheck: &types.AttributeBooleanValue{Value: aws.Bool(false)}}))
	must[*ec2.ModifyNetworkInterfaceAttributeOutput](t, "Description")(l.c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{
		NetworkInterfaceId: &id, Description: &types.AttributeValue{Value: aws.String("changed")}}))
	if e = l.eni(t, id); !*e.Attachment.DeleteOnTermination || *e.SourceDestCheck || *e.Description != "changed" {
		t.Fatalf("after modify: DoT %v SourceDestCheck %v description %q", *e.Attachment.DeleteOnTermination, *e.SourceDestCheck, *e.Description)
	}
	_, err := l.c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: &id,
		SourceDestCheck: &types.AttributeBooleanValue{Value: aws.Bool(true)}, Description: &types.AttributeValue{Value: aws.String("x")}})
	wantCode(t, "two attributes at once", err, "InvalidParameterCombination", 400)
	must[*ec2.DetachNetworkInterfaceOutput](t, "detach")(l.c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: &att}))
	if e = l.eni(t, id); e.Status != types.NetworkInterfaceStatusAvailable || e.Attachment != nil {
		t.Fatalf("detached: %s %+v", e.Status, e.Attachment)
	}
	_, err = l.c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: &att})
	wantCode(t, "second detach", err, "InvalidAttachmentID.NotFound", 400)
	must[*ec2.DeleteNetworkInterfaceOutput](t, "delete")(l.c.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: &id}))
	_, err = l.c.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: &id})
	wantCode(t, "second delete", err, "InvalidNetworkInterfaceID.NotFound", 400)
	if !strings.Contains(err.Error(), "'"+id+"'") {
		t.Fatalf("not-found message without the quoted ID: %v", err)
	}
}

// TestNotFoundAndMalformed: every ENI call names a missing ENI in quotes;
// an ID of the wrong shape is Malformed, as the errors page has it.
func TestNotFoundAndMalformed(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	missing := "eni-0123456789abcdef0"
	calls := map[string]func(id string) error{
		"Describe": func(id string) error {
			_, err := l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{id}})
			return err
		},
		"Attach": func(id string) error {
			_, err := l.c.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: &id, InstanceId: &l.inst.ID, DeviceIndex: aws.Int32(1)})
			return err
		},
		"Modify": func(id string) error {
			_, err := l.c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: &id, SourceDestCheck: &types.AttributeBooleanValue{Value: aws.Bool(false)}})
			return err
		},
		"Delete": func(id string) error {
			_, err := l.c.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: &id})
			return err
		},
		"Assign": func(id string) error {
			_, err := l.c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &id, SecondaryPrivateIpAddressCount: aws.Int32(1)})
			return err
		},
		"Unassign": func(id string) error {
			_, err := l.c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: &id, PrivateIpAddresses: []string{"10.0.1.9"}})
			return err
		},
		"CreateTags": func(id string) error {
			_, err := l.c.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{id}, Tags: []types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}})
			return err
		},
	}
	for name, call := range calls {
		err := call(missing)
		wantCode(t, name+" missing", err, "InvalidNetworkInterfaceID.NotFound", 400)
		if want := "The networkInterface ID '" + missing + "' does not exist"; !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want the message %q", name, err, want)
		}
		if name != "CreateTags" { // which resource "bogus" names cannot be told: InvalidID
			wantCode(t, name+" malformed", call("bogus"), "InvalidNetworkInterfaceId.Malformed", 400)
		}
	}
	_, err := l.c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{InstanceIds: []string{"i-0123456789abcdef0"}})
	wantCode(t, "DescribeInstances missing", err, "InvalidInstanceID.NotFound", 400)
	_, err = l.c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{SubnetIds: []string{"subnet-0123456789abcdef0"}})
	wantCode(t, "DescribeSubnets missing", err, "InvalidSubnetID.NotFound", 400)
	_, err = l.c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: aws.String("subnet-0123456789abcdef0")})
	wantCode(t, "CreateNetworkInterface in a missing subnet", err, "InvalidSubnetID.NotFound", 400)
	_, err = l.c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.sub, Groups: []string{"sg-0123456789abcdef0"}})
	wantCode(t, "CreateNetworkInterface with a missing group", err, "InvalidGroup.NotFound", 400)
	_, err = l.c.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: &l.inst.ENIID, InstanceId: aws.String("i-0123456789abcdef0"), DeviceIndex: aws.Int32(1)})
	wantCode(t, "Attach to a missing instance", err, "InvalidInstanceID.NotFound", 400)
}

// TestDryRun: every call that has DryRun answers 412 DryRunOperation and
// changes nothing.
func TestDryRun(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	e := l.createENI(t, &ec2.CreateNetworkInterfaceInput{})
	id, dry := *e.NetworkInterfaceId, aws.Bool(true)
	before := l.available(t, l.sub)
	calls := map[string]func() error{
		"CreateNetworkInterface": func() error {
			_, err := l.c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: &l.sub, DryRun: dry})
			return err
		},
		"AttachNetworkInterface": func() error {
			_, err := l.c.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{NetworkInterfaceId: &id, InstanceId: &l.inst.ID, DeviceIndex: aws.Int32(1), DryRun: dry})
			return err
		},
		"DetachNetworkInterface": func() error {
			_, err := l.c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: aws.String("eni-attach-0123456789abcdef0"), DryRun: dry})
			return err
		},
		"DeleteNetworkInterface": func() error {
			_, err := l.c.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: &id, DryRun: dry})
			return err
		},
		"ModifyNetworkInterfaceAttribute": func() error {
			_, err := l.c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: &id, SourceDestCheck: &types.AttributeBooleanValue{Value: aws.Bool(false)}, DryRun: dry})
			return err
		},
		"CreateTags": func() error {
			_, err := l.c.CreateTags(ctx, &ec2.CreateTagsInput{Resources: []string{id}, Tags: []types.Tag{{Key: aws.String("k"), Value: aws.String("v")}}, DryRun: dry})
			return err
		},
		"DeleteTags": func() error {
			_, err := l.c.DeleteTags(ctx, &ec2.DeleteTagsInput{Resources: []string{id}, DryRun: dry})
			return err
		},
		"DescribeNetworkInterfaces": func() error {
			_, err := l.c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{DryRun: dry})
			return err
		},
		"DescribeSubnets": func() error {
			_, err := l.c.DescribeSubnets(ctx, &ec2.DescribeSubnetsInput{DryRun: dry})
			return err
		},
		"DescribeInstances": func() error {
			_, err := l.c.DescribeInstances(ctx, &ec2.DescribeInstancesInput{DryRun: dry})
			return err
		},
		"DescribeInstanceTypes": func() error { // moto ignores DryRun here; EC2's model has it
			_, err := l.c.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{DryRun: dry})
			return err
		},
		"TerminateInstances": func() error {
			_, err := l.c.TerminateInstances(ctx, &ec2.TerminateInstancesInput{InstanceIds: []string{l.inst.ID}, DryRun: dry})
			return err
		},
	}
	for name, call := range calls {
		wantCode(t, name, call(), "DryRunOperation", 412)
	}
	e = l.eni(t, id)
	if e.Status != types.NetworkInterfaceStatusAvailable || !*e.SourceDestCheck || len(e.TagSet) != 0 || l.available(t, l.sub) != before {
		t.Fatalf("a DryRun changed something: %+v, available %d → %d", e, before, l.available(t, l.sub))
	}
	if n := len(l.s.ENIs()); n != 2 {
		t.Fatalf("%d ENIs after a DryRun create, want 2", n)
	}
}

// TestErrorEnvelope: the raw answers have EC2's shapes: the error
// envelope with a 4xx, and a success root with the 2016-11-15 namespace.
func TestErrorEnvelope(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	post := func(body string) (int, string) {
		req, _ := http.NewRequest("POST", l.url, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential=AKIDRAW/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=00")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	code, body := post("Action=DescribeNetworkInterfaces&Version=2016-11-15&NetworkInterfaceId.1=eni-0123456789abcdef0")
	if code != 400 || !regexp.MustCompile(`^<\?xml[^>]*>\s*<Response><Errors><Error><Code>InvalidNetworkInterfaceID.NotFound</Code><Message>The networkInterface ID 'eni-0123456789abcdef0' does not exist</Message></Error></Errors><RequestID>[0-9a-f-]{36}</RequestID></Response>$`).MatchString(body) {
		t.Fatalf("error answer %d:\n%s", code, body)
	}
	code, body = post("Action=DescribeNetworkInterfaces&Version=2016-11-15&NetworkInterfaceId.1=" + l.inst.ENIID)
	if code != 200 || !strings.Contains(body, `<DescribeNetworkInterfacesResponse xmlns="http://ec2.amazonaws.com/doc/2016-11-15/"><requestId>`) ||
		!strings.Contains(body, "<networkInterfaceSet><item><networkInterfaceId>"+l.inst.ENIID) {
		t.Fatalf("success answer %d:\n%s", code, body)
	}
	if code, body = post("Action=RunRockets&Version=2016-11-15"); code != 400 || !strings.Contains(body, "<Code>InvalidAction</Code>") {
		t.Fatalf("unknown action: %d %s", code, body)
	}
	if l.s.CallsBy("AKIDRAW") != 2 {
		t.Fatalf("calls by AKIDRAW: %d, want 2 (the unknown action is not counted)", l.s.CallsBy("AKIDRAW"))
	}
}

// TestClientToken: CreateNetworkInterface with the same ClientToken makes
// one ENI (a retry after a lost reply must not leak a second).
func TestClientToken(t *testing.T) {
	t.Parallel()
	l := newLab(t)
	a := l.createENI(t, &ec2.CreateNetworkInterfaceInput{ClientToken: aws.String("tok-1")})
	b := l.createENI(t, &ec2.CreateNetworkInterfaceInput{ClientToken: aws.String("tok-1")})
	c := l.createENI(t, &ec2.CreateNetworkInterfaceInput{ClientToken: aws.String("tok-2")})
	if *a.NetworkInterfaceId != *b.NetworkInterfaceId || *a.NetworkInterfaceId == *c.NetworkInterfaceId || len(l.s.ENIs()) != 3 {
		t.Fatalf("tokens: %s %s %s, %d ENIs", *a.NetworkInterfaceId, *b.NetworkInterfaceId, *c.NetworkInterfaceId, len(l.s.ENIs()))
	}
}
