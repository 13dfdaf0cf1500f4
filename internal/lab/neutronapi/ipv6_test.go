package neutronapi

import (
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
)

// fixedIPs lists a port answer's addresses.
func fixedIPs(port map[string]any) []string {
	var out []string
	for _, f := range port["fixed_ips"].([]any) {
		out = append(out, f.(map[string]any)["ip_address"].(string))
	}
	slices.Sort(out)
	return out
}

// IPv6 subnets as Neutron serves them: a subnet whose addresses Neutron
// hands out (no mode, or dhcpv6-stateful) gives a port as many explicit
// addresses as it asks for; an automatic-address one (slaac,
// dhcpv6-stateless) gives every port of the network its EUI-64 address,
// refuses any other with AllocationOnAutoAddressSubnet, and keeps it
// through an update that leaves it out.
func TestIPv6Subnets(t *testing.T) {
	h, netID, v4ID := setup(t)
	code, out := call(t, h, "POST", "/v2.0/subnets", fmt.Sprintf(`{"subnet":{"network_id":%q,"cidr":"fd00:9::/64","ip_version":6,"ipv6_address_mode":"dhcpv6-stateful"}}`, netID))
	if code != 201 {
		t.Fatalf("stateful IPv6 subnet: %d %v", code, out)
	}
	stateful := out["subnet"].(map[string]any)
	if stateful["gateway_ip"] != "fd00:9::1" || stateful["ip_version"].(float64) != 6 {
		t.Fatalf("stateful subnet %v", stateful)
	}
	v6ID := stateful["id"].(string)

	// A port with no fixed IPs named gets one of each family.
	_, p := call(t, h, "POST", "/v2.0/ports", fmt.Sprintf(`{"port":{"network_id":%q}}`, netID))
	if got := fixedIPs(p["port"].(map[string]any)); len(got) != 2 || !strings.Contains(got[1], ":") && !strings.Contains(got[0], ":") {
		t.Fatalf("default port addresses %v, want one IPv4 and one IPv6", got)
	}
	// Several explicit IPv6 addresses on one port, beside an IPv4 one.
	code, p = call(t, h, "POST", "/v2.0/ports", fmt.Sprintf(`{"port":{"network_id":%q,"fixed_ips":[{"subnet_id":%q},{"subnet_id":%q,"ip_address":"fd00:9::a"},{"subnet_id":%q,"ip_address":"fd00:9::b"}]}}`, netID, v4ID, v6ID, v6ID))
	if code != 201 {
		t.Fatalf("explicit IPv6 fixed IPs: %d %v", code, p)
	}
	if got := fixedIPs(p["port"].(map[string]any)); len(got) != 3 || !slices.Contains(got, "fd00:9::a") || !slices.Contains(got, "fd00:9::b") {
		t.Fatalf("port addresses %v", got)
	}
	// Taken is taken, in IPv6 as in IPv4.
	code, out = call(t, h, "POST", "/v2.0/ports", fmt.Sprintf(`{"port":{"network_id":%q,"fixed_ips":[{"subnet_id":%q,"ip_address":"fd00:9::a"}]}}`, netID, v6ID))
	if code != 409 || neutronType(out) != "IpAddressAlreadyAllocated" {
		t.Fatalf("an IPv6 address twice: %d %v", code, out)
	}
	// A /96 pair is an allowed address pair like any other.
	port := p["port"].(map[string]any)
	code, out = call(t, h, "PUT", "/v2.0/ports/"+port["id"].(string), `{"port":{"allowed_address_pairs":[{"ip_address":"fd00:9::1:0:0/96"}]}}`)
	if code != 200 {
		t.Fatalf("IPv6 /96 pair: %d %v", code, out)
	}

	// An automatic-address subnet on a second network.
	_, n := call(t, h, "POST", "/v2.0/networks", `{"network":{"name":"slaac"}}`)
	slaacNet := n["network"].(map[string]any)["id"].(string)
	code, out = call(t, h, "POST", "/v2.0/subnets", fmt.Sprintf(`{"subnet":{"network_id":%q,"cidr":"fd00:a::/80","ip_version":6,"ipv6_address_mode":"slaac","ipv6_ra_mode":"slaac"}}`, slaacNet))
	if code != 400 {
		t.Fatalf("a SLAAC subnet that is not a /64: %d %v", code, out)
	}
	_, out = call(t, h, "POST", "/v2.0/subnets", fmt.Sprintf(`{"subnet":{"network_id":%q,"cidr":"fd00:a::/64","ip_version":6,"ipv6_address_mode":"slaac","ipv6_ra_mode":"slaac"}}`, slaacNet))
	slaacID := out["subnet"].(map[string]any)["id"].(string)
	_, out = call(t, h, "POST", "/v2.0/subnets", fmt.Sprintf(`{"subnet":{"network_id":%q,"cidr":"10.9.1.0/24","ip_version":4}}`, slaacNet))
	v4b := out["subnet"].(map[string]any)["id"].(string)
	code, out = call(t, h, "POST", "/v2.0/ports", fmt.Sprintf(`{"port":{"network_id":%q,"fixed_ips":[{"subnet_id":%q,"ip_address":"fd00:a::5"}]}}`, slaacNet, slaacID))
	if code != 400 || neutronType(out) != "AllocationOnAutoAddressSubnet" {
		t.Fatalf("an explicit address on a SLAAC subnet: %d %v, want 400 AllocationOnAutoAddressSubnet", code, out)
	}
	code, out = call(t, h, "POST", "/v2.0/ports", fmt.Sprintf(`{"port":{"network_id":%q,"fixed_ips":[{"subnet_id":%q}]}}`, slaacNet, v4b))
	if code != 201 {
		t.Fatalf("a port on the SLAAC network: %d %v", code, out)
	}
	sp := out["port"].(map[string]any)
	mac := sp["mac_address"].(string)
	hw, err := net.ParseMAC(mac)
	if err != nil {
		t.Fatal(err)
	}
	w := netip.MustParseAddr("fd00:a::").As16()
	copy(w[8:], []byte{hw[0] ^ 2, hw[1], hw[2], 0xff, 0xfe, hw[3], hw[4], hw[5]})
	want := netip.AddrFrom16(w).String()
	got := fixedIPs(sp)
	if len(got) != 2 || !slices.Contains(got, want) {
		t.Fatalf("port on a SLAAC network with MAC %s has %v, want its EUI-64 address %s beside its IPv4 one", mac, got, want)
	}
	// An update that names only the IPv4 address keeps the EUI-64 one.
	code, out = call(t, h, "PUT", "/v2.0/ports/"+sp["id"].(string), fmt.Sprintf(`{"port":{"fixed_ips":[{"subnet_id":%q}]}}`, v4b))
	if code != 200 || !slices.Contains(fixedIPs(out["port"].(map[string]any)), want) {
		t.Fatalf("update leaving the EUI-64 address out: %d %v", code, out)
	}
}
