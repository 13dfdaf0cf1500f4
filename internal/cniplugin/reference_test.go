package cniplugin_test

import (
	"reflect"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/cniplugin"
	"github.com/vpcni/vpcni/internal/docref"
)

// TestEveryConflistKeyDocumentedOnce: every top-level key of vpcni's entry
// in a conflist — CNI's own and vpcni's — has exactly one row in
// docs/configuration.md's "conflist key" table, and that table names no
// key NetConf does not read. (ipam's and dns's insides are CNI's.)
func TestEveryConflistKeyDocumentedOnce(t *testing.T) {
	want := map[string]string{}
	var walk func(t reflect.Type)
	walk = func(t reflect.Type) {
		for i := 0; i < t.NumField(); i++ {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case name == "-" || !f.IsExported():
			case f.Anonymous && name == "":
				walk(f.Type)
			default:
				want[name] = ""
			}
		}
	}
	walk(reflect.TypeFor[cniplugin.NetConf]())
	want["timeoutSeconds"] = "30"
	if _, ok := want["socket"]; !ok || len(want) < 6 {
		t.Fatalf("NetConf's keys %v: the walk is broken", want)
	}
	rows, err := docref.Read("../..", docref.ReferenceFiles)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range docref.Check(rows, "conflist key", want, nil) {
		t.Error(p)
	}
}
