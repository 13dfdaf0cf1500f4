package neutronapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// call sends one request and returns the status and decoded body.
func call(t *testing.T, h http.Handler, method, path, body string, header ...string) (int, map[string]any) {
	t.Helper()
	req := httptest.NewRequest(method, path, bytes.NewBufferString(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	out := map[string]any{}
	_ = json.Unmarshal(rec.Body.Bytes(), &out)
	return rec.Code, out
}

func neutronType(out map[string]any) string {
	e, _ := out["NeutronError"].(map[string]any)
	s, _ := e["type"].(string)
	return s
}

func setup(t *testing.T) (http.Handler, string, string) {
	h := New().Handler()
	_, n := call(t, h, "POST", "/v2.0/networks", `{"network":{"name":"n"}}`)
	netID := n["network"].(map[string]any)["id"].(string)
	_, s := call(t, h, "POST", "/v2.0/subnets", fmt.Sprintf(`{"subnet":{"network_id":%q,"cidr":"10.9.0.0/29","ip_version":4}}`, netID))
	return h, netID, s["subnet"].(map[string]any)["id"].(string)
}

func TestIfMatchIsCompareAndSwap(t *testing.T) {
	h, netID, _ := setup(t)
	_, p := call(t, h, "POST", "/v2.0/ports", fmt.Sprintf(`{"port":{"network_id":%q}}`, netID))
	port := p["port"].(map[string]any)
	id, rev := port["id"].(string), int(port["revision_number"].(float64))
	code, _ := call(t, h, "PUT", "/v2.0/ports/"+id, `{"port":{"description":"a"}}`, "If-Match", fmt.Sprintf("revision_number=%d", rev))
	if code != 200 {
		t.Fatalf("PUT with the current revision: %d", code)
	}
	code, out := call(t, h, "PUT", "/v2.0/ports/"+id, `{"port":{"description":"b"}}`, "If-Match", fmt.Sprintf("revision_number=%d", rev))
	if code != 412 || neutronType(out) != "RevisionNumberConstraintFailed" {
		t.Fatalf("PUT with a stale revision: %d %v, want 412 RevisionNumberConstraintFailed", code, out)
	}
}

func TestBulkCreateIsAllOrNothing(t *testing.T) {
	h, netID, subID := setup(t)
	// .2 twice: the second fails, so neither stays.
	body := fmt.Sprintf(`{"ports":[{"network_id":%[1]q,"fixed_ips":[{"subnet_id":%[2]q,"ip_address":"10.9.0.2"}]},{"network_id":%[1]q,"fixed_ips":[{"subnet_id":%[2]q,"ip_address":"10.9.0.2"}]}]}`, netID, subID)
	code, out := call(t, h, "POST", "/v2.0/ports", body)
	if code != 409 || neutronType(out) != "IpAddressAlreadyAllocated" || !strings.Contains(fmt.Sprint(out), "10.9.0.2") {
		t.Fatalf("bulk with a duplicate: %d %v", code, out)
	}
	_, list := call(t, h, "GET", "/v2.0/ports", "")
	if n := len(list["ports"].([]any)); n != 0 {
		t.Fatalf("%d ports left after a failed bulk create", n)
	}
	// The subnet fills up: .2-.6 (gateway .1, broadcast .7).
	for i := range 5 {
		if code, out := call(t, h, "POST", "/v2.0/ports", fmt.Sprintf(`{"port":{"network_id":%q}}`, netID)); code != 201 {
			t.Fatalf("port %d: %d %v", i, code, out)
		}
	}
	code, out = call(t, h, "POST", "/v2.0/ports", fmt.Sprintf(`{"port":{"network_id":%q}}`, netID))
	if code != 409 || neutronType(out) != "IpAddressGenerationFailure" {
		t.Fatalf("port on a full subnet: %d %v", code, out)
	}
}

func TestAddressPairLimit(t *testing.T) {
	h, netID, _ := setup(t)
	_, p := call(t, h, "POST", "/v2.0/ports", fmt.Sprintf(`{"port":{"network_id":%q}}`, netID))
	id := p["port"].(map[string]any)["id"].(string)
	pairs := make([]string, 11)
	for i := range pairs {
		pairs[i] = fmt.Sprintf(`{"ip_address":"192.168.0.%d"}`, i+1)
	}
	code, _ := call(t, h, "PUT", "/v2.0/ports/"+id, `{"port":{"allowed_address_pairs":[`+strings.Join(pairs[:10], ",")+`]}}`)
	if code != 200 {
		t.Fatalf("10 pairs: %d", code)
	}
	code, out := call(t, h, "PUT", "/v2.0/ports/"+id, `{"port":{"allowed_address_pairs":[`+strings.Join(pairs, ",")+`]}}`)
	if code != 400 || neutronType(out) != "AllowedAddressPairExhausted" {
		t.Fatalf("11 pairs: %d %v", code, out)
	}
}
