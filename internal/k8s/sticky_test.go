package k8s

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

func TestStatefulSetOfAndKeeps(t *testing.T) {
	pod := func(name, kind, api, owner string, controller bool) *metav1.PartialObjectMetadata {
		c := controller
		return &metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Name: name, OwnerReferences: []metav1.OwnerReference{
			{Kind: kind, APIVersion: api, Name: owner, Controller: &c}}}}
	}
	for _, c := range []struct {
		pod     *metav1.PartialObjectMetadata
		set     string
		ordinal int32
		ok      bool
	}{
		{pod("web-0", "StatefulSet", "apps/v1", "web", true), "web", 0, true},
		{pod("my-web-12", "StatefulSet", "apps/v1", "my-web", true), "my-web", 12, true},
		{pod("web-0", "StatefulSet", "apps/v1", "web", false), "", 0, false}, // not its controller
		{pod("web-0", "ReplicaSet", "apps/v1", "web", true), "", 0, false},
		{pod("web-x", "StatefulSet", "apps/v1", "web", true), "", 0, false},
		{pod("db-0", "StatefulSet", "apps/v1", "web", true), "", 0, false},
		{pod("web--1", "StatefulSet", "apps/v1", "web", true), "", 0, false},
		{pod("web-0", "StatefulSet", "example.com/v1", "web", true), "", 0, false},
	} {
		set, o, ok := statefulSetOf(c.pod)
		if set != c.set || o != c.ordinal || ok != c.ok {
			t.Errorf("%s owned by %+v: %q %d %v, want %q %d %v", c.pod.Name, c.pod.OwnerReferences[0], set, o, ok, c.set, c.ordinal, c.ok)
		}
	}
	three := int32(3)
	sts := func(ann string, replicas *int32, start int32) *appsv1.StatefulSet {
		s := &appsv1.StatefulSet{ObjectMeta: metav1.ObjectMeta{Name: "web", Annotations: map[string]string{}}, Spec: appsv1.StatefulSetSpec{Replicas: replicas}}
		if ann != "" {
			s.Annotations[v1alpha1.AnnotationStickyIP] = ann
		}
		if start > 0 {
			s.Spec.Ordinals = &appsv1.StatefulSetOrdinals{Start: start}
		}
		return s
	}
	gone := sts("true", &three, 0)
	gone.DeletionTimestamp = &metav1.Time{}
	for _, c := range []struct {
		name    string
		s       *appsv1.StatefulSet
		ordinal int32
		want    bool
	}{
		{"annotated, within replicas", sts("true", &three, 0), 2, true},
		{"scaled below the ordinal", sts("true", &three, 0), 3, false},
		{"replicas unset means 1", sts("true", nil, 0), 0, true},
		{"replicas unset, ordinal 1", sts("true", nil, 0), 1, false},
		{"ordinals start at 5", sts("true", &three, 5), 7, true},
		{"below the start", sts("true", &three, 5), 2, false},
		{"not annotated", sts("", &three, 0), 0, false},
		{"annotation false", sts("false", &three, 0), 0, false},
		{"being deleted", gone, 0, false},
		{"no StatefulSet", nil, 0, false},
	} {
		if got := keeps(c.s, c.ordinal); got != c.want {
			t.Errorf("%s: keeps = %v, want %v", c.name, got, c.want)
		}
	}
}
