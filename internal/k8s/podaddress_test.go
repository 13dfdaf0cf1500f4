package k8s

import (
	"regexp"
	"testing"
)

func TestPodAddressRoundTrip(t *testing.T) {
	s := PodAddressSpec{Node: "n1", PodNamespace: "default", PodName: "web-0", PodUID: "u1",
		ContainerID: "abc", IfName: "eth0", Address: "10.0.0.5", MAC: "02:00:00:00:00:01", Gateway: "169.254.1.1"}
	u := s.ToUnstructured()
	if u.GetName() != PodAddressName("n1", "abc", "eth0") || u.GetLabels()[LabelNode] != "n1" {
		t.Fatalf("object meta: %v %v", u.GetName(), u.GetLabels())
	}
	got, err := SpecOf(u)
	if err != nil || got != s {
		t.Fatalf("round trip: %+v, %v", got, err)
	}
	if keys, _ := podIndex(u); len(keys) != 1 || keys[0] != "default/web-0" {
		t.Fatalf("pod index: %v", keys)
	}
	if _, err := SpecOf("not an object"); err == nil {
		t.Fatal("SpecOf accepted a string")
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
