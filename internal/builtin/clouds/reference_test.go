package clouds_test

import (
	"reflect"
	"testing"

	_ "github.com/vpcni/vpcni/internal/builtin"        // the providers, whose sections a cloud may share
	_ "github.com/vpcni/vpcni/internal/builtin/clouds" // every cloud a -cloud-config may name (this package)
	"github.com/vpcni/vpcni/internal/cloudconfig"
	"github.com/vpcni/vpcni/internal/docref"
	"github.com/vpcni/vpcni/internal/provider"
	"github.com/vpcni/vpcni/internal/routes"
)

// TestEveryCloudFileKeyDocumentedOnce: every key of vpcni-controller's
// cloud file has exactly one row in docs/configuration.md's "cloud file
// key" tables, with its default. A cloud whose section is its provider's
// (it embeds the provider's config and nothing else) has one row, its
// name: the keys are provider.<name>'s, documented there. Keys a section
// accepts only to ignore them (unexported, the agent's) need none.
func TestEveryCloudFileKeyDocumentedOnce(t *testing.T) {
	keys := map[string]string{}
	var r routes.Config
	r.Defaults()
	docref.Fields("routes", reflect.ValueOf(r), keys)
	if len(cloudconfig.Names()) < 2 {
		t.Fatalf("clouds %v: internal/builtin/clouds links fewer than it should", cloudconfig.Names())
	}
	for _, name := range cloudconfig.Names() {
		s, err := cloudconfig.NewSettings(name)
		if err != nil {
			t.Fatal(err)
		}
		s.Defaults()
		if sharesProvider(name, s) {
			keys[name] = ""
			continue
		}
		docref.Fields(name, reflect.ValueOf(s), keys)
	}
	rows, err := docref.Read("../../..", docref.ReferenceFiles)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range docref.Check(rows, "cloud file key", keys, nil) {
		t.Error(p)
	}
}

// sharesProvider: the cloud's section is exactly the provider's of the
// same name, embedded.
func sharesProvider(name string, s cloudconfig.Settings) bool {
	ps, err := provider.NewSettings(name)
	if err != nil {
		return false
	}
	t := reflect.TypeOf(s).Elem()
	return t.NumField() == 1 && t.Field(0).Anonymous && t.Field(0).Type == reflect.TypeOf(ps).Elem()
}
