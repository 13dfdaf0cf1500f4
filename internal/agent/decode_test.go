package agent

import (
	"bytes"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strconv"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/api"
)

const goodRequest = `{"containerID":"c0ffee","netns":"/var/run/netns/x","ifName":"eth0","args":"K8S_POD_NAME=web-0","config":{"cniVersion":"1.0.0","name":"vpcni","type":"vpcni"}}`

func TestDecodeRequestValid(t *testing.T) {
	req, aerr := DecodeRequest(strings.NewReader(goodRequest + "\n"))
	if aerr != nil {
		t.Fatal(aerr)
	}
	want := &api.CNIRequest{
		ContainerID: "c0ffee", Netns: "/var/run/netns/x", IfName: "eth0", Args: "K8S_POD_NAME=web-0",
		Config: json.RawMessage(`{"cniVersion":"1.0.0","name":"vpcni","type":"vpcni"}`),
	}
	if !reflect.DeepEqual(req, want) {
		t.Fatalf("decoded %+v\nwant    %+v", req, want)
	}
	// Only config is required.
	if _, aerr := DecodeRequest(strings.NewReader(`{"config":{}}`)); aerr != nil {
		t.Fatalf("minimal request: %v", aerr)
	}
}

func TestDecodeRequestRejects(t *testing.T) {
	for _, tc := range []struct{ name, body, details string }{
		{"unknown field", `{"config":{},"container":"x"}`, `"container"`},
		{"unknown field, nested request", `{"config":{},"extra":{"a":1}}`, `"extra"`},
		{"second object", `{"config":{}} {"config":{}}`, "data after"},
		{"trailing garbage", `{"config":{}}garbage`, "data after"},
		{"trailing brace", `{"config":{}}}`, "data after"},
		{"trailing bracket", `{"config":{}}]`, "data after"},
		{"no config", `{"containerID":"x"}`, "no network configuration"},
		{"null config", `{"containerID":"x","config":null}`, "no network configuration"},
		{"empty body", ``, "EOF"},
		{"not an object", `["config"]`, ""},
		{"wrong type", `{"config":{},"ifName":5}`, "ifName"},
		{"truncated", `{"config":{"name":"n"`, ""},
		{"garbage", "\x00\xff\xfe{", ""},
		{"null", `null`, "no network configuration"},
	} {
		req, aerr := DecodeRequest(strings.NewReader(tc.body))
		if aerr == nil {
			t.Errorf("%s: %q accepted as %+v", tc.name, tc.body, req)
			continue
		}
		if req != nil {
			t.Errorf("%s: a request together with an error", tc.name)
		}
		if aerr.Code != api.CodeDecodingFailure {
			t.Errorf("%s: code %d, want %d", tc.name, aerr.Code, api.CodeDecodingFailure)
		}
		if !strings.Contains(aerr.Details, tc.details) {
			t.Errorf("%s: details %q lack %q", tc.name, aerr.Details, tc.details)
		}
	}
}

func TestDecodeRequestOversized(t *testing.T) {
	// The server reads the body through the same limit. Over it is too
	// large wherever the limit falls: inside the object, or in data after
	// an object that fits.
	for name, big := range map[string]string{
		"config":         `{"config":{"name":"` + strings.Repeat("x", api.MaxRequestBytes) + `"}}`,
		"trailing space": `{"config":{}}` + strings.Repeat(" ", api.MaxRequestBytes),
	} {
		req, aerr := DecodeRequest(http.MaxBytesReader(nil, io.NopCloser(strings.NewReader(big)), api.MaxRequestBytes))
		if aerr == nil {
			t.Errorf("%s: a %d-byte request was accepted (config of %d bytes)", name, len(big), len(req.Config))
			continue
		}
		if aerr.Code != api.CodeInvalidConfig || !strings.Contains(aerr.Msg, "too large") || !strings.Contains(aerr.Msg, strconv.Itoa(api.MaxRequestBytes)) {
			t.Errorf("%s: got %+v, want invalid config (7) saying the request is over %d bytes", name, aerr, api.MaxRequestBytes)
		}
	}
}

// Through the real handler: a bad body never reaches the verb and comes
// back as a 400 carrying the CNI error, with a Content-Length.
func TestHandlerRejectsBadBodies(t *testing.T) {
	a := &Agent{log: slog.New(slog.DiscardHandler)}
	h := a.Handler()
	for name, tc := range map[string]struct {
		body string
		code uint
	}{
		"oversized":     {`{"config":{"name":"` + strings.Repeat("x", api.MaxRequestBytes) + `"}}`, api.CodeInvalidConfig},
		"unknown field": {`{"config":{},"bogus":true}`, api.CodeDecodingFailure},
		"garbage":       {"\xff\xfe", api.CodeDecodingFailure},
	} {
		for _, path := range []string{api.PathAdd, api.PathDel, api.PathCheck, api.PathGC, api.PathStatus} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, strings.NewReader(tc.body)))
			if rec.Code != http.StatusBadRequest {
				t.Errorf("%s %s: status %d, want 400", name, path, rec.Code)
				continue
			}
			if rec.Header().Get("Content-Length") == "" {
				t.Errorf("%s %s: answer without Content-Length", name, path)
			}
			var e api.Error
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Code != tc.code {
				t.Errorf("%s %s: body %q, want a CNI error with code %d", name, path, rec.Body, tc.code)
			}
		}
	}
}

// sameRequest compares two requests, the config by JSON value: re-encoding
// compacts it and escapes HTML characters, which changes bytes, not meaning.
func sameRequest(t *testing.T, a, b *api.CNIRequest) bool {
	t.Helper()
	if a.ContainerID != b.ContainerID || a.Netns != b.Netns || a.IfName != b.IfName || a.Args != b.Args {
		return false
	}
	var va, vb any
	if err := json.Unmarshal(a.Config, &va); err != nil {
		t.Fatalf("config %q of an accepted request is not JSON: %v", a.Config, err)
	}
	if err := json.Unmarshal(b.Config, &vb); err != nil {
		t.Fatalf("config %q of the re-decoded request is not JSON: %v", b.Config, err)
	}
	return reflect.DeepEqual(va, vb)
}

func FuzzDecodeRequest(f *testing.F) {
	f.Add([]byte(goodRequest))
	f.Add([]byte(`{"config":{}}`))
	f.Add([]byte(`{"config":{}} {"config":{}}`))
	f.Add([]byte(`{"config":"<&>\u2028","args":"a\u0000b"}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		req, aerr := DecodeRequest(bytes.NewReader(data))
		if aerr != nil {
			if req != nil {
				t.Fatalf("a request together with an error: %+v, %v", req, aerr)
			}
			if aerr.Code != api.CodeDecodingFailure || aerr.Msg == "" {
				t.Fatalf("error %+v, want code %d with a message", aerr, api.CodeDecodingFailure)
			}
			return
		}
		if len(req.Config) == 0 {
			t.Fatal("accepted without a config")
		}
		enc, err := json.Marshal(req)
		if err != nil {
			t.Fatalf("an accepted request does not re-encode: %v", err)
		}
		again, aerr := DecodeRequest(bytes.NewReader(enc))
		if aerr != nil {
			t.Fatalf("the re-encoded request %s is rejected: %v", enc, aerr)
		}
		if !sameRequest(t, req, again) {
			t.Fatalf("round trip changed the request:\n%+v\n%+v", req, again)
		}
	})
}
