package openstack

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/gophercloud/gophercloud/v2"
)

// Each OpenStack service words a policy refusal (403) its own way; what
// the user needs from it is the rule, which names what to change:
//
//	Neutron  {"NeutronError": {"type": "PolicyNotAuthorized",
//	          "message": "rule:update_port:allowed_address_pairs is disallowed by policy"}}
//	         (an attribute's check names its parent too:
//	          "(rule:create_port and rule:create_port:mac_address) is disallowed by policy")
//	Nova     {"forbidden": {"code": 403,
//	          "message": "Policy doesn't allow os_compute_api:os-attach-interfaces:create to be performed."}}
//	Keystone {"error": {"code": 403, "title": "Forbidden",
//	          "message": "You are not authorized to perform the requested action: identity:get_user."}}
var (
	neutronRule = regexp.MustCompile(`rule:([A-Za-z0-9_:.\-]+)`)
	novaRule    = regexp.MustCompile(`Policy doesn't allow ([A-Za-z0-9_:.\-]+) to be performed`)
	identRule   = regexp.MustCompile(`requested action: ([A-Za-z0-9_:.\-]+?)\.?$`)
)

// Denied is a policy refusal (HTTP 403) of an OpenStack service, read
// from its answer.
type Denied struct {
	// Service is "Neutron", "Nova" or "Keystone" (from the answer's shape).
	Service string
	// Rules are the policy rules the refusal names, the most specific
	// ones: Neutron checks a call's attributes as one expression and names
	// all of it ("(rule:update_port and (rule:update_port:fixed_ips and
	// (rule:update_port:fixed_ips:ip_address and
	// rule:update_port:fixed_ips:subnet_id)))"), so the rules no other
	// named rule refines ("update_port:fixed_ips:ip_address",
	// "update_port:fixed_ips:subnet_id"); none when the answer names none.
	Rules []string
	// Message is the service's own words.
	Message string
	// Method and URL are the call refused.
	Method, URL string
}

// DeniedBy reads a 403 in err; ok is false for any other error.
func DeniedBy(err error) (d Denied, ok bool) {
	var code gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &code) || code.Actual != http.StatusForbidden {
		return d, false
	}
	d.Method, d.URL = code.Method, code.URL
	var body struct {
		NeutronError *struct {
			Message string `json:"message"`
		} `json:"NeutronError"`
		Forbidden *struct {
			Message string `json:"message"`
		} `json:"forbidden"`
		Error *struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(code.Body, &body) // an answer of another shape names no rule
	switch {
	case body.NeutronError != nil:
		d.Service, d.Message = "Neutron", body.NeutronError.Message
		var all []string
		for _, m := range neutronRule.FindAllStringSubmatch(d.Message, -1) {
			all = append(all, m[1])
		}
		for _, r := range all {
			if !slices.ContainsFunc(all, func(o string) bool { return strings.HasPrefix(o, r+":") }) {
				d.Rules = append(d.Rules, r)
			}
		}
	case body.Forbidden != nil:
		d.Service, d.Message = "Nova", body.Forbidden.Message
		if m := novaRule.FindStringSubmatch(d.Message); m != nil {
			d.Rules = []string{m[1]}
		}
	case body.Error != nil:
		d.Service, d.Message = "Keystone", body.Error.Message
		if m := identRule.FindStringSubmatch(d.Message); m != nil {
			d.Rules = []string{m[1]}
		}
	default:
		d.Service, d.Message = "the cloud", strings.TrimSpace(string(code.Body))
	}
	return d, true
}

// Fix says which role or policy change lets the call through, by the
// rules' defaults in Neutron's and Nova's shipped policies: an admin-only
// attribute among the rules decides it, then a network owner's one.
func (d Denied) Fix() string {
	find := func(match func(string) bool) string {
		if i := slices.IndexFunc(d.Rules, match); i >= 0 {
			return d.Rules[i]
		}
		return ""
	}
	suffix := func(s ...string) func(string) bool {
		return func(r string) bool {
			return slices.ContainsFunc(s, func(x string) bool { return strings.HasSuffix(r, x) })
		}
	}
	prefix := func(s ...string) func(string) bool {
		return func(r string) bool {
			return slices.ContainsFunc(s, func(x string) bool { return strings.HasPrefix(r, x) })
		}
	}
	if len(d.Rules) == 0 {
		return fmt.Sprintf("%s named no rule: its log says which; give the credentials a role that rule allows", d.Service)
	}
	if r := find(suffix("floatingip:floating_ip_address")); r != "" {
		return "naming the address of a new floating IP is admin-only by default: allocate the floating IP first (openstack floating ip create --floating-ip-address …) and name that one, or have the cloud's admin grant " + r
	}
	adminOnly := suffix(":external_fixed_ips", ":enable_snat", ":device_owner", ":distributed", ":ha")
	if r := find(func(r string) bool { return adminOnly(r) || strings.Contains(r, "binding:") }); r != "" {
		return r + " is admin-only by default: leave that attribute out, or have the cloud's admin grant " + r + " in " + d.Service + "'s policy"
	}
	if r := find(prefix("update_port:allowed_address_pairs", "update_port:fixed_ips", "create_port:fixed_ips",
		"create_port:mac_address", "create_port:allowed_address_pairs")); r != "" {
		return "by default only the network's owner or an admin passes " + r + ": use credentials of the network's project, " +
			"mode passthrough (ports of its own, which a member may create), or have the cloud's admin grant " + r + " in Neutron's policy"
	}
	r := d.Rules[0]
	switch {
	case strings.Contains(r, "floatingip"):
		return "the credentials need the member role in the floating IP's project (Neutron's default for " + r + "), or the cloud's admin to grant " + r
	case strings.Contains(r, "router") || strings.Contains(r, "extraroutes"):
		return "the credentials need the member role in the router's project (Neutron's default for " + r + "), or the cloud's admin to grant " + r
	case strings.HasPrefix(r, "os_compute_api:"):
		return "give the credentials a role Nova's policy allows for " + r + " (vpcni's calls, os-attach-interfaces and servers, need the member role in the VM's project by default), or have the cloud's admin grant " + r + " in Nova's policy"
	case strings.HasPrefix(r, "identity:"):
		return "Keystone refuses " + r + " to these credentials: an application credential may be restricted (access rules, roles), give it one with the roles vpcni needs"
	}
	return fmt.Sprintf("give the credentials a role that %s's policy allows for %s (by default the member role in the resource's project), or have the cloud's admin grant it", d.Service, r)
}

// Rule is the rules, for a person: "a and b"; "" when none is named.
func (d Denied) Rule() string { return strings.Join(d.Rules, " and ") }

// Error words the refusal for a person: the call, the rule, the fix.
func (d Denied) Error() string {
	rule := "no rule named"
	switch len(d.Rules) {
	case 0:
	case 1:
		rule = "rule " + d.Rules[0]
	default:
		rule = "rules " + d.Rule()
	}
	return fmt.Sprintf("%s's policy refused %s %s (%s: %q): %s", d.Service, d.Method, d.URL, rule, d.Message, d.Fix())
}

// explainDenied wraps err with the refusal it carries, if any; nil if err
// is no 403.
func explainDenied(err error) error {
	d, ok := DeniedBy(err)
	if !ok {
		return nil
	}
	return fmt.Errorf("%w; %s", err, d.Error())
}

// explainTLS says what to set when the server's certificate was not
// trusted; nil for any other error.
func explainTLS(err error) error {
	var unknown x509.UnknownAuthorityError
	var verify *tls.CertificateVerificationError
	var host x509.HostnameError
	var invalid x509.CertificateInvalidError
	switch {
	case errors.As(err, &host):
		return fmt.Errorf("%w (the server's certificate is not for this host name: use the name it was issued for in the URL "+
			"(authURL, the Keystone catalog's URLs), or provider.openstack.insecure: true to skip verification in a lab)", err)
	case errors.As(err, &unknown), errors.As(err, &verify), errors.As(err, &invalid):
		return fmt.Errorf("%w (the server's certificate is not signed by a CA this node trusts: set provider.openstack.caBundle "+
			"to the cloud's CA certificate (a PEM file's path, or the PEM itself), or provider.openstack.insecure: true "+
			"to skip verification in a lab)", err)
	}
	return nil
}
