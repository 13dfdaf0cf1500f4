package aws_test

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/ec2/types"
	"github.com/aws/smithy-go"

	"github.com/vpcni/vpcni/internal/lab/ec2api"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/provider/aws/ec2test"
)

var (
	eniIDRe    = regexp.MustCompile(`^eni-[0-9a-f]{8,17}$`)
	attachIDRe = regexp.MustCompile(`^eni-attach-[0-9a-f]{8,17}$`)
	macRe      = regexp.MustCompile(`^[0-9a-f]{2}(:[0-9a-f]{2}){5}$`)
)

// eniView is what vpcni reads of an ENI (DescribeNetworkInterfaces), with
// the endpoint's own IDs and MACs replaced by whether they have EC2's
// shape.
type eniView struct {
	Role, Status, Subnet, Description string
	Device, Card                      int32
	AttachStatus                      string
	DeleteOnTermination               bool
	PrimaryIP                         string
	IPs                               []string // the primary marked *
	Prefixes                          []string
	Groups                            int
	Tags                              map[string]string
	Shapes                            string // "" when the ENI, attachment and MAC have EC2's shapes
}

func view(role string, n types.NetworkInterface, subnets map[string]string) eniView {
	v := eniView{Role: role, Status: string(n.Status), Subnet: subnets[aws.ToString(n.SubnetId)], Description: aws.ToString(n.Description),
		PrimaryIP: aws.ToString(n.PrivateIpAddress), Groups: len(n.Groups), Tags: map[string]string{}}
	var bad []string
	if !eniIDRe.MatchString(aws.ToString(n.NetworkInterfaceId)) {
		bad = append(bad, "ENI ID "+aws.ToString(n.NetworkInterfaceId))
	}
	if !macRe.MatchString(aws.ToString(n.MacAddress)) {
		bad = append(bad, "MAC "+aws.ToString(n.MacAddress))
	}
	if a := n.Attachment; a != nil {
		v.Device, v.Card, v.AttachStatus, v.DeleteOnTermination = aws.ToInt32(a.DeviceIndex), aws.ToInt32(a.NetworkCardIndex), string(a.Status), aws.ToBool(a.DeleteOnTermination)
		if !attachIDRe.MatchString(aws.ToString(a.AttachmentId)) {
			bad = append(bad, "attachment "+aws.ToString(a.AttachmentId))
		}
	}
	for _, a := range n.PrivateIpAddresses {
		ip := aws.ToString(a.PrivateIpAddress)
		if aws.ToBool(a.Primary) {
			ip += "*"
		}
		v.IPs = append(v.IPs, ip)
	}
	slices.Sort(v.IPs)
	for _, p := range n.Ipv4Prefixes {
		v.Prefixes = append(v.Prefixes, aws.ToString(p.Ipv4Prefix))
	}
	for _, t := range n.TagSet {
		v.Tags[aws.ToString(t.Key)] = aws.ToString(t.Value)
	}
	v.Shapes = strings.Join(bad, ", ")
	return v
}

// crossStep is one step of the scenario, run the same way on both
// endpoints; it returns what vpcni reads afterwards.
type crossRun struct {
	ep       *ec2test.Endpoint
	cidr     netip.Prefix
	subnetID string
	inst     ec2test.Instance
	eni2     string
	att2     string
}

func (r *crossRun) enis(t *testing.T) []eniView {
	t.Helper()
	subnets := map[string]string{r.subnetID: r.cidr.String()}
	var out []eniView
	for i, n := range r.ep.ENIs(t, r.inst.ID) {
		out = append(out, view([]string{"primary", "eni2", "eni3"}[i], n, subnets))
	}
	return out
}

func (r *crossRun) free(t *testing.T) int32 {
	out, err := r.ep.Client.DescribeSubnets(ec2test.Ctx(t), &ec2.DescribeSubnetsInput{SubnetIds: []string{r.subnetID}})
	if err != nil || len(out.Subnets) != 1 {
		t.Fatalf("describe subnet: %v", err)
	}
	return aws.ToInt32(out.Subnets[0].AvailableIpAddressCount)
}

func code(err error) string {
	var api smithy.APIError
	if errors.As(err, &api) {
		return api.ErrorCode() + " " + regexp.MustCompile(`'[^']*'`).FindString(api.ErrorMessage())
	}
	return fmt.Sprint(err)
}

// TestCrossCheck sends the same calls to moto_server and to the lab's
// endpoint through the real Go SDK client and compares, field by field,
// what vpcni reads back: the ENIs (status, attachment, addresses with the
// primary marked, tags, description, groups; IDs and MACs by EC2's
// shapes), the subnet's free count, the instance types' limits, the
// not-found errors with the quoted ID, and the provider's own leases.
// Where moto departs from EC2 the lab follows EC2's documentation and the
// test says so: DeleteOnTermination (moto ignores the attribute, MA1),
// and addresses picked by count (moto's are random and may repeat or be
// reserved, EX2; the lab's must be unique and usable).
func TestCrossCheck(t *testing.T) {
	labEP, _ := lab(t, ec2api.Options{})
	runs := map[string]*crossRun{"moto": {ep: motoEndpoint()}, "lab": {ep: labEP}}
	cidr := subnetCIDR()
	steps := map[string]map[string]any{}
	record := func(src, step string, v any) {
		if steps[step] == nil {
			steps[step] = map[string]any{}
		}
		steps[step][src] = v
	}
	for _, src := range []string{"moto", "lab"} {
		r := runs[src]
		r.cidr = cidr
		r.subnetID = r.ep.NewSubnet(t, cidr.String(), 251).ID
		_, r.inst = r.ep.NewInstance(t, r.subnetID, at(cidr, 10))
		ctx, c := ec2test.Ctx(t), r.ep.Client
		record(src, "1 instance", motoDoT(src, r.enis(t)))
		record(src, "1 free", r.free(t))

		if _, err := c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &r.inst.ENI,
			PrivateIpAddresses: []string{at(cidr, 20).String(), at(cidr, 21).String()}}); err != nil {
			t.Fatalf("%s: assign by address: %v", src, err)
		}
		groups := r.ep.ENIs(t, r.inst.ID)[0].Groups
		var gids []string
		for _, g := range groups {
			gids = append(gids, aws.ToString(g.GroupId))
		}
		ni, err := c.CreateNetworkInterface(ctx, &ec2.CreateNetworkInterfaceInput{SubnetId: &r.subnetID, Groups: gids,
			Description: aws.String("vpcni cross-check"),
			PrivateIpAddresses: []types.PrivateIpAddressSpecification{{PrivateIpAddress: aws.String(at(cidr, 30).String()), Primary: aws.Bool(true)},
				{PrivateIpAddress: aws.String(at(cidr, 31).String()), Primary: aws.Bool(false)}},
			TagSpecifications: []types.TagSpecification{{ResourceType: types.ResourceTypeNetworkInterface, Tags: []types.Tag{
				{Key: aws.String("vpcni.io/owner"), Value: aws.String("someone")}, {Key: aws.String("team"), Value: aws.String("net")}}}}})
		if err != nil {
			t.Fatalf("%s: create ENI: %v", src, err)
		}
		r.eni2 = aws.ToString(ni.NetworkInterface.NetworkInterfaceId)
		record(src, "2 created", view("eni2", *ni.NetworkInterface, map[string]string{r.subnetID: cidr.String()}))
		att, err := c.AttachNetworkInterface(ctx, &ec2.AttachNetworkInterfaceInput{InstanceId: &r.inst.ID, NetworkInterfaceId: &r.eni2, DeviceIndex: aws.Int32(1)})
		if err != nil {
			t.Fatalf("%s: attach: %v", src, err)
		}
		r.att2 = aws.ToString(att.AttachmentId)
		if _, err := c.ModifyNetworkInterfaceAttribute(ctx, &ec2.ModifyNetworkInterfaceAttributeInput{NetworkInterfaceId: &r.eni2,
			Attachment: &types.NetworkInterfaceAttachmentChanges{AttachmentId: &r.att2, DeleteOnTermination: aws.Bool(true)}}); err != nil {
			t.Fatalf("%s: modify: %v", src, err)
		}
		if _, err := c.UnassignPrivateIpAddresses(ctx, &ec2.UnassignPrivateIpAddressesInput{NetworkInterfaceId: &r.inst.ENI, PrivateIpAddresses: []string{at(cidr, 21).String()}}); err != nil {
			t.Fatalf("%s: unassign: %v", src, err)
		}
		record(src, "3 attached", motoDoT(src, r.enis(t)))
		record(src, "3 free", r.free(t))

		// The provider's view: nothing on these ENIs is vpcni's (a person
		// put the addresses there, and the second ENI's owner tag is not
		// vpcni's); an address asked for by name is.
		p := r.ep.Open(t, r.inst, nil)
		h, err := p.Held(ctx)
		record(src, "4 held", fmt.Sprint(h, err))
		got, err := p.Assign(ctx, provider.AssignRequest{Addresses: []netip.Addr{at(cidr, 40)}})
		for i := range got {
			got[i].Interface = strings.Replace(got[i].Interface, r.inst.ENI, "primary", 1)
		}
		record(src, "4 assign .40", fmt.Sprint(got, err))

		// Not-found errors, with the ID in single quotes.
		var errs []string
		_, err = c.DescribeNetworkInterfaces(ctx, &ec2.DescribeNetworkInterfacesInput{NetworkInterfaceIds: []string{"eni-0123456789abcdef0"}})
		errs = append(errs, code(err))
		if _, err := c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: &r.att2}); err != nil {
			t.Fatalf("%s: detach: %v", src, err)
		}
		_, err = c.DetachNetworkInterface(ctx, &ec2.DetachNetworkInterfaceInput{AttachmentId: &r.att2})
		errs = append(errs, strings.ReplaceAll(code(err), r.att2, "<attachment>"))
		if _, err := c.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: &r.eni2}); err != nil {
			t.Fatalf("%s: delete: %v", src, err)
		}
		_, err = c.DeleteNetworkInterface(ctx, &ec2.DeleteNetworkInterfaceInput{NetworkInterfaceId: &r.eni2})
		errs = append(errs, strings.ReplaceAll(code(err), r.eni2, "<eni>"))
		_, err = c.AssignPrivateIpAddresses(ctx, &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &r.eni2, SecondaryPrivateIpAddressCount: aws.Int32(1)})
		errs = append(errs, strings.ReplaceAll(code(err), r.eni2, "<eni>"))
		record(src, "5 errors", errs)

		// Instance type limits.
		it, err := c.DescribeInstanceTypes(ctx, &ec2.DescribeInstanceTypesInput{InstanceTypes: []types.InstanceType{"m5.large", "t3.medium", "c5n.18xlarge"}})
		if err != nil {
			t.Fatalf("%s: instance types: %v", src, err)
		}
		limits := map[string]string{}
		for _, x := range it.InstanceTypes {
			n := x.NetworkInfo
			limits[string(x.InstanceType)] = fmt.Sprintf("%s %d vCPUs, %d ENIs × %d IPv4, %d cards", x.Hypervisor, aws.ToInt32(x.VCpuInfo.DefaultVCpus),
				aws.ToInt32(n.MaximumNetworkInterfaces), aws.ToInt32(n.Ipv4AddressesPerInterface), aws.ToInt32(n.MaximumNetworkCards))
		}
		record(src, "6 instance types", limits)
	}
	for _, step := range slices.Sorted(maps.Keys(steps)) {
		if m, l := steps[step]["moto"], steps[step]["lab"]; !reflect.DeepEqual(m, l) {
			t.Errorf("%s: moto and the lab differ:\nmoto: %+v\nlab:  %+v", step, m, l)
		}
	}
	if e := steps["3 attached"]["lab"].([]eniView); len(e) != 2 || !e[0].DeleteOnTermination || !e[1].DeleteOnTermination {
		t.Errorf("the lab's ENIs are not deleted with the instance: %+v", e)
	}
	want := map[string]any{
		"4 held":       "[] <nil>",
		"4 assign .40": fmt.Sprintf("[{%s %s %s primary <nil> }] <nil>", at(cidr, 40), cidr, at(cidr, 1)), // the lease printed with %v, its PodNetwork ""
		"5 errors": []string{"InvalidNetworkInterfaceID.NotFound 'eni-0123456789abcdef0'", "InvalidAttachmentID.NotFound '<attachment>'",
			"InvalidNetworkInterfaceID.NotFound '<eni>'", "InvalidNetworkInterfaceID.NotFound '<eni>'"},
		"3 free": int32(251 - 4), // the instance's address, .20, .30 and .31
	}
	for step, w := range want {
		if got := steps[step]["lab"]; !reflect.DeepEqual(got, w) {
			t.Errorf("%s: the lab gave %#v, want %#v", step, got, w)
		}
	}
	for _, e := range steps["3 attached"]["lab"].([]eniView) {
		if e.Shapes != "" {
			t.Errorf("lab ENI %s: not EC2's shape: %s", e.Role, e.Shapes)
		}
	}

	// By count: where moto departs from EC2. Both put the addresses in the
	// subnet; the lab's, as EC2's, are unique, new and usable.
	for _, src := range []string{"moto", "lab"} {
		r := runs[src]
		before := r.ep.ENIAddrs(t, r.inst.ENI)
		out, err := r.ep.Client.AssignPrivateIpAddresses(ec2test.Ctx(t), &ec2.AssignPrivateIpAddressesInput{NetworkInterfaceId: &r.inst.ENI, SecondaryPrivateIpAddressCount: aws.Int32(6)})
		if err != nil {
			t.Fatalf("%s: assign by count: %v", src, err)
		}
		var answered []netip.Addr
		for _, a := range out.AssignedPrivateIpAddresses {
			answered = append(answered, netip.MustParseAddr(aws.ToString(a.PrivateIpAddress)))
		}
		for _, a := range answered {
			if !cidr.Contains(a) {
				t.Errorf("%s: %s is outside the subnet %s", src, a, cidr)
			}
		}
		if src == "moto" {
			t.Logf("vpcni-test: moto answered %d addresses for 6 asked (it lists every address of the ENI, AP1)", len(answered))
			continue
		}
		after := r.ep.ENIAddrs(t, r.inst.ENI)
		added := slices.DeleteFunc(slices.Clone(after), func(a netip.Addr) bool { return slices.Contains(before, a) })
		if len(answered) != 6 || !slices.Equal(sortedAddrs(answered), added) {
			t.Errorf("lab: answered %v, the ENI gained %v; EC2 answers with exactly the 6 it assigned", answered, added)
		}
		for _, a := range added {
			if b := a.As4(); b[3] < 4 || b[3] == 255 {
				t.Errorf("lab: handed out %s, which EC2 reserves", a)
			}
		}
	}
}

// motoDoT: moto leaves DeleteOnTermination false on an instance's primary
// ENI unless RunInstances asks (F6) and ignores ModifyNetworkInterfaceAttribute
// setting it (MA1); EC2 sets it on the primary and keeps what Modify sets,
// as the lab does (checked on the lab's own view). moto's value is set
// aside here, its other fields compared.
func motoDoT(src string, enis []eniView) []eniView {
	if src == "moto" {
		for i := range enis {
			enis[i].DeleteOnTermination = true
		}
	}
	return enis
}

func sortedAddrs(a []netip.Addr) []netip.Addr {
	a = slices.Clone(a)
	slices.SortFunc(a, netip.Addr.Compare)
	return a
}
