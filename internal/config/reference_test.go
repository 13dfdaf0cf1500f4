package config_test

import (
	"reflect"
	"strings"
	"testing"

	_ "github.com/vpcni/vpcni/internal/builtin"
	"github.com/vpcni/vpcni/internal/config"
	"github.com/vpcni/vpcni/internal/datapath"
	"github.com/vpcni/vpcni/internal/docref"
	"github.com/vpcni/vpcni/internal/provider"
)

const repoRoot = "../.."

// fileKeys is every key path of vpcnid.yaml with its default: the agent's
// own fields (config.Defaults()), and the section of every registered
// provider and datapath mode after its own Defaults.
func fileKeys(t *testing.T) map[string]string {
	t.Helper()
	keys := map[string]string{
		"provider.type": config.Defaults().Provider.Type,
		"datapath.mode": config.Defaults().Datapath.Mode,
	}
	def := config.Defaults()
	v := reflect.ValueOf(def)
	for i := 0; i < v.NumField(); i++ {
		f := v.Type().Field(i)
		if f.Name == "Provider" || f.Name == "Datapath" {
			continue // sections by name, below
		}
		one := map[string]string{}
		// Walk a struct holding just this field, so its json name leads.
		holder := reflect.New(reflect.StructOf([]reflect.StructField{{Name: f.Name, Type: f.Type, Tag: f.Tag}})).Elem()
		holder.Field(0).Set(v.Field(i))
		docref.Fields("", holder, one)
		for k, d := range one {
			keys[k] = d
		}
	}
	if len(provider.Names()) < 3 || len(datapath.Names()) < 6 {
		t.Fatalf("registered providers %v, modes %v: internal/builtin links fewer than it should", provider.Names(), datapath.Names())
	}
	for _, name := range provider.Names() {
		s, err := provider.NewSettings(name)
		if err != nil {
			t.Fatal(err)
		}
		s.Defaults()
		docref.Fields("provider."+name, reflect.ValueOf(s), keys)
	}
	for _, name := range datapath.Names() {
		s, err := datapath.NewSettings(name)
		if err != nil {
			t.Fatal(err)
		}
		s.Defaults()
		before := len(keys)
		docref.Fields("datapath."+name, reflect.ValueOf(s), keys)
		if len(keys) == before {
			keys["datapath."+name] = "" // a mode without settings: one row says so
		}
	}
	// The node name's default is the host's: not a literal to compare.
	keys["nodeName"] = ""
	return keys
}

// TestEveryFileKeyDocumentedOnce: every key path of vpcnid.yaml — the
// agent's fields, snat, every provider's and every datapath mode's
// section — has exactly one row in docs/configuration.md's "vpcnid.yaml
// key" tables, every row there names a key the code has, and a default
// stated as one literal is the code's.
func TestEveryFileKeyDocumentedOnce(t *testing.T) {
	keys := fileKeys(t)
	for _, must := range []string{"pool.warmTarget", "snat.vpcCIDRs", "provider.openstack.auth.authURL", "provider.static.ranges[].cidr", "provider.static.blocks", "datapath.ebpf.serviceCIDRs", "selfHeal.watch"} {
		if _, ok := keys[must]; !ok {
			t.Fatalf("the walk of vpcnid.yaml's keys misses %s: it is broken (found %d keys)", must, len(keys))
		}
	}
	rows, err := docref.Read(repoRoot, docref.ReferenceFiles)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range docref.Check(rows, "vpcnid.yaml key", keys, nil) {
		t.Error(p)
	}
}

// TestFileKeysNotDescribedElsewhere: a vpcnid.yaml key is described in the
// reference only. Another page's table whose first column names a key
// path (with its section, e.g. pool.warmTarget) repeats the reference:
// that page should link to it instead.
func TestFileKeysNotDescribedElsewhere(t *testing.T) {
	keys := fileKeys(t)
	files, err := docref.Documents(repoRoot)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if f == "docs/configuration.md" || f == "deploy/helm/vpcni/README.md" { // the chart's values have paths of their own
			continue
		}
		rows, err := docref.Tables(repoRoot, f)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range rows {
			if _, ok := keys[r.Key]; ok && strings.Contains(r.Key, ".") {
				t.Errorf("%s: a table describes vpcnid.yaml key %s, which docs/configuration.md describes: link to it instead", r.Where(), r.Key)
			}
		}
	}
}
