package v1alpha1

import (
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// crd is the part of the CustomResourceDefinition that objects already
// stored, and the agents and controllers already running, depend on.
type crd struct {
	Spec struct {
		Group string `json:"group"`
		Scope string `json:"scope"`
		Names struct {
			Kind       string   `json:"kind"`
			ListKind   string   `json:"listKind"`
			Plural     string   `json:"plural"`
			Singular   string   `json:"singular"`
			ShortNames []string `json:"shortNames"`
		} `json:"names"`
		Versions []struct {
			Name    string `json:"name"`
			Served  bool   `json:"served"`
			Storage bool   `json:"storage"`
			Columns []struct {
				Name     string `json:"name"`
				Type     string `json:"type"`
				JSONPath string `json:"jsonPath"`
			} `json:"additionalPrinterColumns"`
			Schema struct {
				OpenAPIV3Schema struct {
					Required   []string `json:"required"`
					Properties struct {
						Spec struct {
							Type       string                    `json:"type"`
							Required   []string                  `json:"required"`
							Properties map[string]map[string]any `json:"properties"`
						} `json:"spec"`
					} `json:"properties"`
				} `json:"openAPIV3Schema"`
			} `json:"schema"`
		} `json:"versions"`
	} `json:"spec"`
}

// The generated CRD (deploy/, `make generate`) still serves what the
// hand-written one did: the same names, scope, columns and spec fields,
// the same required ones, and they are the Go type's JSON fields. A marker
// or field changed in types.go that would change the wire fails here,
// without the generator.
func TestCRDKeepsTheWireContract(t *testing.T) {
	data, err := os.ReadFile("../../../../deploy/vpcni.io_podaddresses.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c crd
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	s := c.Spec
	if s.Group != SchemeGroupVersion.Group || s.Scope != "Cluster" || s.Names.Kind != Kind || s.Names.ListKind != "PodAddressList" ||
		s.Names.Plural != Resource.Resource || s.Names.Singular != "podaddress" || !slices.Equal(s.Names.ShortNames, []string{"pa"}) {
		t.Fatalf("group, scope or names: %+v", s)
	}
	if len(s.Versions) != 1 || s.Versions[0].Name != SchemeGroupVersion.Version || !s.Versions[0].Served || !s.Versions[0].Storage {
		t.Fatalf("versions: %+v", s.Versions)
	}
	v := s.Versions[0]
	var cols []string
	for _, col := range v.Columns {
		cols = append(cols, col.Name+":"+col.Type+":"+col.JSONPath)
	}
	wantCols := []string{"Address:string:.spec.address", "Node:string:.spec.node", "Namespace:string:.spec.podNamespace",
		"Pod:string:.spec.podName", "Age:date:.metadata.creationTimestamp", "Addresses:string:.spec.addresses"}
	if !slices.Equal(cols, wantCols) {
		t.Errorf("printer columns %q, want %q", cols, wantCols)
	}

	root := v.Schema.OpenAPIV3Schema
	if len(root.Required) != 0 {
		t.Errorf("the schema requires %v at the top: it required nothing", root.Required)
	}
	spec := root.Properties.Spec
	// The lists a dual-stack pod's agent writes beside the first address
	// and gateway; every other field is a string, as it always was.
	lists := map[string]bool{"addresses": true, "gateways": true}
	var props []string
	for name, p := range spec.Properties {
		props = append(props, name)
		want := "string"
		if lists[name] {
			want = "array"
			if items, _ := p["items"].(map[string]any); items["type"] != "string" || p["maxItems"] != float64(2) {
				t.Errorf("spec.%s is not a list of at most 2 strings: %v", name, p)
			}
		}
		if p["type"] != want {
			t.Errorf("spec.%s has type %v, want %s", name, p["type"], want)
		}
	}
	slices.Sort(props)
	wantProps := []string{"address", "addresses", "containerID", "gateway", "gateways", "ifName", "mac", "node", "podName", "podNamespace", "podUID", "providerPort"}
	if spec.Type != "object" || !slices.Equal(props, wantProps) {
		t.Errorf("spec (%s) has fields %q, want %q", spec.Type, props, wantProps)
	}
	wantRequired := []string{"address", "containerID", "ifName", "node", "podName", "podNamespace"}
	required := slices.Sorted(slices.Values(spec.Required))
	if !slices.Equal(required, wantRequired) {
		t.Errorf("spec requires %q, want %q", required, wantRequired)
	}

	// The Go type: every field on the wire, the required ones without
	// omitempty.
	var goProps, goRequired []string
	typ := reflect.TypeFor[PodAddressSpec]()
	for i := range typ.NumField() {
		name, opts, _ := strings.Cut(typ.Field(i).Tag.Get("json"), ",")
		goProps = append(goProps, name)
		if !strings.Contains(opts, "omitempty") {
			goRequired = append(goRequired, name)
		}
	}
	slices.Sort(goProps)
	slices.Sort(goRequired)
	if !slices.Equal(goProps, wantProps) || !slices.Equal(goRequired, wantRequired) {
		t.Errorf("PodAddressSpec has JSON fields %q (required %q), want %q (required %q)", goProps, goRequired, wantProps, wantRequired)
	}
}

// The generated PodNetwork CRD: cluster-scoped under the names the docs
// give, and the schema's rule that one provider section is set (the API
// server's refusals themselves are proven against a real one in
// test/blocks).
func TestPodNetworkCRD(t *testing.T) {
	data, err := os.ReadFile("../../../../deploy/vpcni.io_podnetworks.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var c crd
	if err := yaml.Unmarshal(data, &c); err != nil {
		t.Fatal(err)
	}
	s := c.Spec
	if s.Group != SchemeGroupVersion.Group || s.Scope != "Cluster" || s.Names.Kind != "PodNetwork" ||
		s.Names.Plural != PodNetworkResource.Resource || !slices.Equal(s.Names.ShortNames, []string{"pn"}) {
		t.Fatalf("group, scope or names: %+v", s)
	}
	if !strings.Contains(string(data), "[has(self.openstack), has(self.static), has(self.aws)].filter(x,") {
		t.Error("the CRD lost the rule that exactly one provider section is set")
	}
	var props []string
	for name := range s.Versions[0].Schema.OpenAPIV3Schema.Properties.Spec.Properties {
		props = append(props, name)
	}
	slices.Sort(props)
	if want := []string{"aws", "namespaceSelector", "openstack", "podSelector", "static"}; !slices.Equal(props, want) {
		t.Errorf("spec fields %q, want %q", props, want)
	}
}
