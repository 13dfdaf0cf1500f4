package cniplugin_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcni/vpcni/internal/api"
	"github.com/vpcni/vpcni/internal/cniplugin"
)

const validConf = `{"cniVersion":"1.0.0","name":"vpcni","type":"vpcni"}`

func TestParseConfigValid(t *testing.T) {
	conf, err := cniplugin.ParseConfig([]byte(validConf))
	if err != nil {
		t.Fatal(err)
	}
	if conf.Name != "vpcni" || conf.CNIVersion != "1.0.0" || conf.Type != "vpcni" {
		t.Errorf("decoded %+v", conf.NetConf)
	}
	if conf.Socket != api.DefaultSocket {
		t.Errorf("socket = %q, want the default %q", conf.Socket, api.DefaultSocket)
	}
	if conf.TimeoutSeconds != 0 {
		t.Errorf("timeoutSeconds = %d, want 0 (the default)", conf.TimeoutSeconds)
	}

	conf, err = cniplugin.ParseConfig([]byte(`{"cniVersion":"1.1.0","name":"n","type":"vpcni","socket":"/tmp/a.sock","timeoutSeconds":600,"dns":{"nameservers":["10.0.0.10"]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if conf.Socket != "/tmp/a.sock" || conf.TimeoutSeconds != 600 {
		t.Errorf("socket %q timeoutSeconds %d, want /tmp/a.sock and 600", conf.Socket, conf.TimeoutSeconds)
	}
}

func cniError(t *testing.T, err error) *types.Error {
	t.Helper()
	var e *types.Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not a *types.Error", err, err)
	}
	return e
}

func TestParseConfigBadFields(t *testing.T) {
	for _, tc := range []struct{ conf, field string }{
		{`{"cniVersion":"1.0.0","type":"vpcni"}`, `"name"`},
		{`{"name":"n","type":"vpcni"}`, `"cniVersion"`},
		{`{"cniVersion":"1.0.0","name":"n"}`, `"type"`},
		{`{"cniVersion":"1.0.0","name":"n","type":"vpcni","ipam":{"type":"host-local"}}`, `"ipam"`},
		{`{"cniVersion":"1.0.0","name":"n","type":"vpcni","socket":"run/vpcnid.sock"}`, `"socket"`},
		{`{"cniVersion":"1.0.0","name":"n","type":"vpcni","timeoutSeconds":-1}`, `"timeoutSeconds"`},
		{`{"cniVersion":"1.0.0","name":"n","type":"vpcni","timeoutSeconds":601}`, `"timeoutSeconds"`},
	} {
		conf, err := cniplugin.ParseConfig([]byte(tc.conf))
		if err == nil {
			t.Errorf("%s: accepted as %+v", tc.conf, conf)
			continue
		}
		e := cniError(t, err)
		if e.Code != types.ErrInvalidNetworkConfig {
			t.Errorf("%s: code %d, want %d", tc.conf, e.Code, types.ErrInvalidNetworkConfig)
		}
		if !strings.Contains(e.Details, tc.field) {
			t.Errorf("%s: details %q do not name %s", tc.conf, e.Details, tc.field)
		}
	}
}

func TestParseConfigNamesEveryBadField(t *testing.T) {
	_, err := cniplugin.ParseConfig([]byte(`{"ipam":{"type":"dhcp"},"socket":"x","timeoutSeconds":9999}`))
	e := cniError(t, err)
	if e.Code != types.ErrInvalidNetworkConfig {
		t.Fatalf("code %d, want %d", e.Code, types.ErrInvalidNetworkConfig)
	}
	for _, f := range []string{`"name"`, `"cniVersion"`, `"type"`, `"ipam"`, `"socket"`, `"timeoutSeconds"`} {
		if !strings.Contains(e.Details, f) {
			t.Errorf("details do not name %s:\n%s", f, e.Details)
		}
	}
}

func TestParseConfigMalformed(t *testing.T) {
	for _, bad := range []string{``, `{`, `not json`, `{"name":"n",}`, `{"name":5}`, `[]`, `{"timeoutSeconds":"30"}`} {
		_, err := cniplugin.ParseConfig([]byte(bad))
		if err == nil {
			t.Errorf("%q accepted", bad)
			continue
		}
		if e := cniError(t, err); e.Code != types.ErrDecodingFailure {
			t.Errorf("%q: code %d, want %d (%v)", bad, e.Code, types.ErrDecodingFailure, e)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte(validConf))
	f.Add([]byte(`{"cniVersion":"0.4.0","name":"n","type":"vpcni","socket":"/run/x.sock","timeoutSeconds":5}`))
	f.Add([]byte(`{"cniVersion":"1.0.0","name":"n","type":"vpcni","ipam":{"type":"host-local"}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		conf, err := cniplugin.ParseConfig(data)
		if err != nil {
			var e *types.Error
			if !errors.As(err, &e) {
				t.Fatalf("error %v (%T) is not a CNI error", err, err)
			}
			if e.Code != types.ErrDecodingFailure && e.Code != types.ErrInvalidNetworkConfig {
				t.Fatalf("error code %d, want %d or %d", e.Code, types.ErrDecodingFailure, types.ErrInvalidNetworkConfig)
			}
			if conf != nil {
				t.Fatalf("a config (%+v) together with an error", conf)
			}
			return
		}
		if conf.Name == "" || conf.CNIVersion == "" || conf.Type == "" {
			t.Fatalf("accepted without name, cniVersion or type: %+v", conf.NetConf)
		}
		if !filepath.IsAbs(conf.Socket) {
			t.Fatalf("socket %q is not absolute", conf.Socket)
		}
		if conf.IPAM.Type != "" {
			t.Fatalf("accepted an ipam section of type %q", conf.IPAM.Type)
		}
		if conf.TimeoutSeconds < 0 || conf.TimeoutSeconds > 600 {
			t.Fatalf("accepted timeoutSeconds %d", conf.TimeoutSeconds)
		}
	})
}
