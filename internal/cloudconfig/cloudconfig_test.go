package cloudconfig

import (
	"strings"
	"testing"
	"time"
)

func TestParse(t *testing.T) {
	c, err := Parse([]byte("endpoint: http://127.0.0.1:9696/\nsubnetID: sn-1\ntimeout: 5s\n"), "ok.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.SubnetID != "sn-1" || c.Mode != "fixed-ips" || c.Timeout.Duration != 5*time.Second {
		t.Errorf("parsed %+v: want subnet sn-1, defaults applied, timeout 5s", c)
	}
	for _, tc := range []struct{ yaml, want string }{
		{"subnetID: sn\nendpoint: ftp://x\n", "endpoint"},
		{"endpoint: http://x/\n", "subnetID"},
		{"endpoint: http://x/\nsubnetID: s\nsubnet: oops\n", "unknown field"},
		{"endpoint: http://x/\nsubnetID: s\nmode: magic\n", "mode"},
	} {
		if _, err := Parse([]byte(tc.yaml), "bad.yaml"); err == nil || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "bad.yaml") {
			t.Errorf("%q: err %v, want one naming %q and the file", tc.yaml, err, tc.want)
		}
	}
	if c, err := Load(""); c != nil || err != nil {
		t.Errorf(`Load("") = %v, %v: want no cloud`, c, err)
	}
}
