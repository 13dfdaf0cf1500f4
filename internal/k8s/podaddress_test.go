package k8s

import (
	"encoding/json"
	"reflect"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// The typed object goes on the wire exactly as the unstructured one vpcni
// wrote before there were Go types, and reads back what the API server
// returns for objects already stored: existing PodAddresses keep working.
func TestPodAddressWireShape(t *testing.T) {
	spec := v1alpha1.PodAddressSpec{Node: "n1", PodNamespace: "default", PodName: "web-0", PodUID: "u1",
		ContainerID: "abc", IfName: "eth0", Address: "10.0.0.5", MAC: "02:00:00:00:00:01", Gateway: "169.254.1.1"}
	// The object the agent wrote before, spelled out: the name is the hash
	// of node, container ID and interface, so it must never change.
	old := map[string]any{
		"apiVersion": "vpcni.io/v1alpha1",
		"kind":       "PodAddress",
		"metadata": map[string]any{
			"name":   "pa-819016393d299432cace",
			"labels": map[string]any{"vpcni.io/node": "n1"},
		},
		"spec": map[string]any{"node": "n1", "podNamespace": "default", "podName": "web-0", "podUID": "u1",
			"containerID": "abc", "ifName": "eth0", "address": "10.0.0.5", "mac": "02:00:00:00:00:01", "gateway": "169.254.1.1"},
	}
	data, err := json.Marshal(NewPodAddress(spec))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(data, &got); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, old) {
		t.Fatalf("on the wire:\n got %s\nwant %v", data, old)
	}

	// As stored: the server's own metadata added, and a provider port.
	stored := `{"apiVersion":"vpcni.io/v1alpha1","kind":"PodAddress","metadata":{"name":"pa-819016393d299432cace",
		"uid":"9c1d","resourceVersion":"42","creationTimestamp":"2026-01-01T00:00:00Z","labels":{"vpcni.io/node":"n1"}},
		"spec":{"node":"n1","podNamespace":"default","podName":"web-0","podUID":"u1","containerID":"abc","ifName":"eth0",
		"address":"10.0.0.5","mac":"02:00:00:00:00:01","gateway":"169.254.1.1","providerPort":"port-1"}}`
	var pa v1alpha1.PodAddress
	if err := json.Unmarshal([]byte(stored), &pa); err != nil {
		t.Fatal(err)
	}
	want := spec
	want.ProviderPort = "port-1"
	if !reflect.DeepEqual(pa.Spec, want) || pa.Name != PodAddressName("n1", "abc", "eth0") || pa.UID != "9c1d" || pa.Labels[LabelNode] != "n1" {
		t.Fatalf("read back: %+v", pa)
	}
	if keys, _ := PodIndex(&pa); len(keys) != 1 || keys[0] != "default/web-0" {
		t.Fatalf("pod index: %v", keys)
	}
	if keys, err := PodIndex(&corev1.Pod{}); len(keys) != 0 || err != nil {
		t.Fatalf("pod index of a pod: %v, %v", keys, err)
	}

	// A dual-stack pod's object: address and gateway are its first
	// family's, as an older reader expects; addresses and gateways all.
	dual := `{"apiVersion":"vpcni.io/v1alpha1","kind":"PodAddress","metadata":{"name":"pa-1"},
		"spec":{"node":"n1","podNamespace":"default","podName":"web-0","containerID":"abc","ifName":"eth0",
		"address":"10.0.0.5","addresses":["10.0.0.5","fd00::5"],"gateway":"169.254.1.1","gateways":["169.254.1.1","fe80::1"]}}`
	var pd v1alpha1.PodAddress
	if err := json.Unmarshal([]byte(dual), &pd); err != nil {
		t.Fatal(err)
	}
	if got, err := AddressesOf(&pd); err != nil || len(got) != 2 || got[1].String() != "fd00::5" || pd.Spec.Gateways[1] != "fe80::1" {
		t.Fatalf("dual-stack read back: %v %v %+v", got, err, pd.Spec)
	}
}

func TestPodAddressNameIsValidAndDistinct(t *testing.T) {
	valid := regexp.MustCompile(`^[a-z0-9]([-a-z0-9]*[a-z0-9])?$`)
	seen := map[string]bool{}
	for _, c := range [][3]string{{"n1", "abc", "eth0"}, {"n1", "abc", "net1"}, {"n2", "abc", "eth0"}, {"n1", "ABC_x.y", "eth0"}} {
		n := PodAddressName(c[0], c[1], c[2])
		if !valid.MatchString(n) || len(n) > 63 {
			t.Fatalf("%q is not a valid object name", n)
		}
		if seen[n] {
			t.Fatalf("%v collides", c)
		}
		seen[n] = true
	}
}

func TestNodeLabel(t *testing.T) {
	if got := NodeLabel("node-1.example"); got != "node-1.example" {
		t.Fatalf("a valid name is its own label: %q", got)
	}
	long := strings.Repeat("a", 64)
	got := NodeLabel(long)
	if got == long || len(got) > 63 || NodeLabel(long) != got || NodeLabel(long+"b") == got {
		t.Fatalf("a 64-character name: %q", got)
	}
}
