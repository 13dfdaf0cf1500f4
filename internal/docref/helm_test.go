package docref

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// leaves are a values file's leaf paths with their values; an empty map
// (datapath: {}) is a leaf, a map with keys is not.
func leaves(prefix string, v any, out map[string]string) {
	if m, ok := v.(map[string]any); ok && len(m) > 0 {
		for k, sub := range m {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			leaves(p, sub, out)
		}
		return
	}
	switch v := v.(type) {
	case map[string]any:
		out[prefix] = "{}"
	case []any:
		if len(v) == 0 {
			out[prefix] = "[]"
			return
		}
		// JSON is YAML: SameValue reads the row's flow-style list.
		b, err := json.Marshal(v)
		if err != nil {
			panic(err)
		}
		out[prefix] = string(b)
	case nil:
		out[prefix] = "null"
	default:
		out[prefix] = fmt.Sprint(v)
	}
}

// TestEveryHelmValueDocumentedOnce: every leaf of the chart's values.yaml
// is covered by exactly one row of the "value" table in
// deploy/helm/vpcni/README.md — a row names a leaf, or a map whose leaves
// it covers as a whole (provider.openstack: the agent's section) — every
// row names a path values.yaml has, and a leaf's row that states its
// default as one literal states values.yaml's.
func TestEveryHelmValueDocumentedOnce(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(repoRoot, "deploy/helm/vpcni/values.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var values map[string]any
	if err := yaml.Unmarshal(data, &values); err != nil {
		t.Fatal(err)
	}
	leaf := map[string]string{}
	leaves("", values, leaf)
	if _, ok := leaf["image.repository"]; !ok {
		t.Fatalf("values.yaml's leaves %v: no image.repository, the walk is broken", leaf)
	}
	rows, err := Read(repoRoot, ReferenceFiles)
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string][]Row{}
	var documented int
	for _, r := range rows {
		if r.Kind != "value" {
			continue
		}
		documented++
		hit := false
		for l := range leaf {
			if l == r.Key || strings.HasPrefix(l, r.Key+".") {
				covered[l] = append(covered[l], r)
				hit = true
			}
		}
		if !hit {
			t.Errorf("%s: documents Helm value %s, which values.yaml does not have: remove the row (or fix its path)", r.Where(), r.Key)
		}
	}
	if documented == 0 {
		t.Fatalf("%s has no \"value\" table", Main("value"))
	}
	var paths []string
	for l := range leaf {
		paths = append(paths, l)
	}
	sort.Strings(paths)
	for _, l := range paths {
		rs := covered[l]
		if len(rs) == 1 && rs[0].Key == l {
			if msg := checkDefault(rs[0], leaf[l]); msg != "" {
				t.Error(msg + " (values.yaml)")
			}
		}
		switch len(rs) {
		case 0:
			t.Errorf("Helm value %s (default %s) is not documented: add the row \"| `%s` | `%s` | <what it does> |\" to the \"value\" table of %s", l, leaf[l], l, leaf[l], Main("value"))
		case 1:
		default:
			var where []string
			for _, r := range rs {
				where = append(where, r.Where()+" ("+r.Key+")")
			}
			t.Errorf("Helm value %s is documented %d times: %s: keep one row", l, len(rs), strings.Join(where, ", "))
		}
	}
}

const repoRoot = "../.."
