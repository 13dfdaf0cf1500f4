package openstack

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gophercloud/gophercloud/v2"
)

// Each service's 403 names its rule its own way; DeniedBy finds it, and
// the error says the call, the rule and the fix. Neutron's and Keystone's
// bodies are as the real servers answer (test/keystone checks Neutron's
// live); Nova's is its documented shape (nova/exception.py
// PolicyNotAuthorized, "Policy doesn't allow %(action)s to be performed.").
func TestDeniedNamesTheRule(t *testing.T) {
	for _, c := range []struct {
		body, service, rule string
		fix                 string
	}{
		{`{"NeutronError": {"type": "PolicyNotAuthorized", "message": "rule:update_port:allowed_address_pairs is disallowed by policy", "detail": ""}}`,
			"Neutron", "update_port:allowed_address_pairs", "network's owner or an admin"},
		{`{"NeutronError": {"type": "PolicyNotAuthorized", "message": "((rule:create_floatingip and rule:create_floatingip:floating_ip_address)) is disallowed by policy", "detail": ""}}`,
			"Neutron", "create_floatingip:floating_ip_address", "allocate the floating IP first"},
		{`{"NeutronError": {"type": "PolicyNotAuthorized", "message": "(rule:update_port and (rule:update_port:fixed_ips and (rule:update_port:fixed_ips:ip_address and rule:update_port:fixed_ips:subnet_id))) is disallowed by policy", "detail": ""}}`,
			"Neutron", "update_port:fixed_ips:ip_address and update_port:fixed_ips:subnet_id", "network's owner or an admin"},
		{`{"NeutronError": {"type": "PolicyNotAuthorized", "message": "rule:add_extraroutes is disallowed by policy", "detail": ""}}`,
			"Neutron", "add_extraroutes", "member role in the router's project"},
		{`{"NeutronError": {"type": "PolicyNotAuthorized", "message": "(rule:create_router and (rule:create_router:external_gateway_info and (rule:create_router:external_gateway_info:network_id and rule:create_router:external_gateway_info:external_fixed_ips))) is disallowed by policy", "detail": ""}}`,
			"Neutron", "create_router:external_gateway_info:network_id and create_router:external_gateway_info:external_fixed_ips", "external_fixed_ips is admin-only by default"},
		{`{"NeutronError": {"type": "PolicyNotAuthorized", "message": "rule:create_port:binding:host_id is disallowed by policy", "detail": ""}}`,
			"Neutron", "create_port:binding:host_id", "create_port:binding:host_id is admin-only by default"},
		{`{"forbidden": {"code": 403, "message": "Policy doesn't allow os_compute_api:os-attach-interfaces:create to be performed."}}`,
			"Nova", "os_compute_api:os-attach-interfaces:create", "need the member role in the VM's project by default"},
		{`{"error": {"code": 403, "title": "Forbidden", "message": "You are not authorized to perform the requested action: identity:list_users."}}`,
			"Keystone", "identity:list_users", "application credential may be restricted"},
		{`<html>403 Forbidden</html>`, "the cloud", "", "named no rule"},
	} {
		err := fmt.Errorf("update port p: %w", gophercloud.ErrUnexpectedResponseCode{Method: "PUT", URL: "http://n/v2.0/ports/p", Actual: 403, Body: []byte(c.body)})
		d, ok := DeniedBy(err)
		if !ok || d.Service != c.service || d.Rule() != c.rule {
			t.Errorf("%s: DeniedBy = %+v, %v; want %s rule %q", c.body, d, ok, c.service, c.rule)
			continue
		}
		msg := explainDenied(err).Error()
		for _, w := range []string{"update port p: ", "refused PUT http://n/v2.0/ports/p", c.fix} {
			if !strings.Contains(msg, w) {
				t.Errorf("%s: %s\nwant it to say %q", c.body, msg, w)
			}
		}
		if c.rule != "" && !strings.Contains(msg, "(rule "+c.rule+": ") && !strings.Contains(msg, "(rules "+c.rule+": ") {
			t.Errorf("%s: %s\nwant it to name rule %s", c.body, msg, c.rule)
		}
	}
	if _, ok := DeniedBy(gophercloud.ErrUnexpectedResponseCode{Actual: 404}); ok {
		t.Error("a 404 read as a policy refusal")
	}
}
