package cloudconfig

import (
	"context"
	"errors"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/floatingip"
	"github.com/vpcni/vpcni/internal/leaks"
	"github.com/vpcni/vpcni/internal/routes"
)

// testSection is the section of a cloud registered by this test only,
// "testcloud", so the reader is tested without a real cloud's package.
type testSection struct {
	Region string `json:"region"`
	Zone   string `json:"zone,omitempty"`
}

func (s *testSection) Defaults() {
	if s.Zone == "" {
		s.Zone = "a"
	}
}

func (s *testSection) Validate() error {
	if s.Region == "" {
		return errors.New("region: is required")
	}
	return nil
}

// testCloud opens no door: the reader's tests never call one.
type testCloud struct{ s *testSection }

var errNoDoor = errors.New("testcloud opens no door")

func (c testCloud) Info() Info {
	i := Info{Name: "testcloud"}
	if c.s.Zone == "norouter" {
		i.NoRouter = "its zone has none"
	}
	return i
}
func (testCloud) FloatingIPs(context.Context) (floatingip.Cloud, error) {
	return nil, errNoDoor
}
func (testCloud) Router(context.Context, string) (routes.Cloud, error) { return nil, errNoDoor }
func (testCloud) Leaks(context.Context, leaks.Scope) (leaks.Cloud, error) {
	return nil, errNoDoor
}
func (testCloud) TakeOff(context.Context, string, []netip.Addr) error { return errNoDoor }
func (testCloud) Holders(context.Context, netip.Addr) ([]Holder, error) {
	return nil, errNoDoor
}

func init() {
	Register(Registration{Name: "testcloud", NewSettings: func() Settings { return &testSection{} },
		Open: func(s Settings, _ *slog.Logger) Cloud { return testCloud{s.(*testSection)} }})
}

// The file names its cloud by its section's key: the registered cloud's
// section is read strictly, defaulted and validated; anything else is
// refused with the names this build knows.
func TestLoad(t *testing.T) {
	dir := t.TempDir()
	write := func(body string) string {
		p := filepath.Join(dir, "cloud.yaml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	c, err := Load(write("testcloud:\n  region: r1\n"))
	if err != nil || c.Cloud != "testcloud" || c.Settings.(*testSection).Zone != "a" || c.HasRoutes() {
		t.Fatalf("%+v, %v", c, err)
	}
	if cl, ok := c.Open(nil).(testCloud); !ok || cl.s.Region != "r1" {
		t.Errorf("opened %+v", c.Open(nil))
	}
	c, err = Load(write("testcloud: {region: r1}\nroutes: {routerID: r}\n"))
	if err != nil || !c.HasRoutes() || c.Routes.RouterID != "r" || c.Routes.Resync.Duration.String() != "30s" {
		t.Fatalf("with routes: %+v, %v", c.Routes, err)
	}
	for body, want := range map[string][]string{
		"{}\n":                             {"a cloud's section is required: one of [", "testcloud"},
		"routes: {routerID: r}\n":          {"a cloud's section is required"},
		"aws: {region: r1}\n":              {`aws: "aws" is not a cloud this build knows (known: [`, "testcloud", "optionally, routes"},
		"testcloud: {}\n":                  {"testcloud.region: is required"},
		"testcloud:\n":                     {"testcloud.region: is required"},
		"testcloud: {region: r, bogus: 1}": {"testcloud:", "bogus"},
		"testcloud: {region: r}\nroutes: {maxRoutes: -1}\n": {"routes.routerID", "routes.maxRoutes"},
		"- a list\n": {"cloud config"},
		"testcloud: {region: r, zone: norouter}\nroutes: {routerID: r}\n": {"routes: the testcloud cloud has no router for it: its zone has none"},
	} {
		_, err := Load(write(body))
		for _, w := range want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%q: %v, want it to name %s", body, err, w)
			}
		}
	}
	if _, err := Load(filepath.Join(dir, "missing.yaml")); err == nil || !strings.Contains(err.Error(), "missing.yaml") {
		t.Errorf("a missing file: %v", err)
	}
}
