package k8s

import (
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/vpcni/vpcni/internal/alloc"
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

func TestIsPodOf(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	pod := func(uid string, mirror string, at time.Time) *corev1.Pod {
		p := &corev1.Pod{}
		p.UID = types.UID(uid)
		p.CreationTimestamp = metav1.NewTime(at)
		if mirror != "" {
			p.Annotations = map[string]string{corev1.MirrorPodAnnotationKey: mirror}
		}
		return p
	}
	for _, c := range []struct {
		name string
		pod  *corev1.Pod
		uid  string
		want bool
	}{
		{"same UID", pod("u1", "", created), "u1", true},
		{"another pod of that name", pod("u2", "", created), "u1", false},
		{"static pod: the mirror names the kubelet's UID", pod("api-uid", "u1", created), "u1", true},
		{"no UID recorded, pod older than the attachment", pod("u9", "", created.Add(-time.Hour)), "", true},
		{"no UID recorded, pod made after it", pod("u9", "", created.Add(time.Hour)), "", false},
	} {
		if got := isPodOf(c.pod, &alloc.Allocation{PodUID: c.uid, Created: created}); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
