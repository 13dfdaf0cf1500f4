package nodeside

import (
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcni/vpcni/internal/alloc"
	"github.com/vpcni/vpcni/internal/k8s"
)

// TestSlimPodAnswersAsTheFullPod: every question the node side asks of a
// cached pod (is it the attachment's pod, is it on the pod network, does
// it request vpcni.io/ip, does it carry vpcni's annotations) has the same
// answer from the slim pod as from the pod the API server sent, and what
// the agent never reads is gone.
func TestSlimPodAnswersAsTheFullPod(t *testing.T) {
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	one := resource.MustParse("1")
	full := func(mutate func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
			ObjectMeta: metav1.ObjectMeta{Name: "web-1", Namespace: "default", UID: "u1", ResourceVersion: "42",
				CreationTimestamp: metav1.NewTime(created), Labels: map[string]string{"app": "web"},
				Annotations:   map[string]string{AnnotationIP: "10.0.0.5", "kubectl.kubernetes.io/last-applied-configuration": "{…}"},
				ManagedFields: []metav1.ManagedFieldsEntry{{Manager: "kubelet", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:status":{}}`)}}}},
			Spec: corev1.PodSpec{NodeName: "n1", Containers: []corev1.Container{
				{Name: "app", Image: "busybox", Command: []string{"sh"}, Resources: corev1.ResourceRequirements{
					Requests: corev1.ResourceList{k8s.IPResource: one, corev1.ResourceCPU: one}}},
				{Name: "sidecar", Image: "busybox"},
			}},
			Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.5"},
		}
		if mutate != nil {
			mutate(p)
		}
		return p
	}
	cases := map[string]*corev1.Pod{
		"requests": full(nil),
		"limits only": full(func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources = corev1.ResourceRequirements{Limits: corev1.ResourceList{k8s.IPResource: one}}
		}),
		"init request": full(func(p *corev1.Pod) {
			p.Spec.Containers[0].Resources = corev1.ResourceRequirements{}
			p.Spec.InitContainers = p.Spec.Containers[:1]
		}),
		"no request":     full(func(p *corev1.Pod) { p.Spec.Containers[0].Resources = corev1.ResourceRequirements{} }),
		"host network":   full(func(p *corev1.Pod) { p.Spec.HostNetwork = true }),
		"static":         full(func(p *corev1.Pod) { p.Annotations[corev1.MirrorPodAnnotationKey] = "kubelet-uid" }),
		"no annotations": full(func(p *corev1.Pod) { p.Annotations = nil }),
	}
	for name, p := range cases {
		obj, err := slimPod(p)
		if err != nil {
			t.Fatal(err)
		}
		s := obj.(*corev1.Pod)
		for _, att := range []*alloc.Allocation{{PodUID: "u1", Created: created}, {PodUID: "kubelet-uid", Created: created}, {PodUID: "other", Created: created}, {Created: created.Add(-time.Hour)}} {
			if got, want := isPodOf(s, att), isPodOf(p, att); got != want {
				t.Errorf("%s: isPodOf(uid %q) %v, full pod %v", name, att.PodUID, got, want)
			}
		}
		if k8s.OnPodNetwork(s) != k8s.OnPodNetwork(p) || k8s.RequestsIP(s) != k8s.RequestsIP(p) {
			t.Errorf("%s: on pod network %v requests %v; full pod %v %v", name, k8s.OnPodNetwork(s), k8s.RequestsIP(s), k8s.OnPodNetwork(p), k8s.RequestsIP(p))
		}
		if s.Annotations[AnnotationIP] != p.Annotations[AnnotationIP] || s.Annotations[corev1.MirrorPodAnnotationKey] != p.Annotations[corev1.MirrorPodAnnotationKey] {
			t.Errorf("%s: annotations %v, full pod %v", name, s.Annotations, p.Annotations)
		}
		if s.Name != p.Name || s.Namespace != p.Namespace || s.UID != p.UID || s.ResourceVersion != p.ResourceVersion || s.Spec.NodeName != p.Spec.NodeName {
			t.Errorf("%s: identity %s/%s %s rv %s node %s", name, s.Namespace, s.Name, s.UID, s.ResourceVersion, s.Spec.NodeName)
		}
		if len(s.ManagedFields) != 0 || s.Labels != nil || s.Status.Phase != "" || len(s.Annotations) > 2 {
			t.Errorf("%s: kept what the agent never reads: %+v", name, s)
		}
		for _, c := range append(s.Spec.InitContainers, s.Spec.Containers...) {
			if c.Image != "" || len(c.Resources.Requests) > 1 || len(c.Resources.Limits) > 1 {
				t.Errorf("%s: container kept %+v", name, c)
			}
		}
	}
	// What a deletion the informer missed hands over passes unchanged.
	tomb := cache.DeletedFinalStateUnknown{Key: "default/web-1", Obj: full(nil)}
	if got, _ := slimPod(tomb); got.(cache.DeletedFinalStateUnknown).Key != tomb.Key {
		t.Errorf("tombstone changed: %v", got)
	}
}

// TestWithoutManagedFields: the other informers' objects lose their
// managed fields (and a Node its image list) and keep the rest.
func TestWithoutManagedFields(t *testing.T) {
	mf := []metav1.ManagedFieldsEntry{{Manager: "kubelet"}}
	node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "n1", ResourceVersion: "7", ManagedFields: mf},
		Spec:   corev1.NodeSpec{Taints: []corev1.Taint{{Key: "k", Effect: corev1.TaintEffectNoSchedule}}},
		Status: corev1.NodeStatus{Capacity: corev1.ResourceList{k8s.IPResource: resource.MustParse("10")}, Images: []corev1.ContainerImage{{Names: []string{"busybox"}}}}}
	got, err := withoutManagedFields(node)
	if err != nil {
		t.Fatal(err)
	}
	n := got.(*corev1.Node)
	if n.ManagedFields != nil || n.Status.Images != nil {
		t.Errorf("kept %v %v", n.ManagedFields, n.Status.Images)
	}
	if n.Name != "n1" || n.ResourceVersion != "7" || len(n.Spec.Taints) != 1 || n.Status.Capacity.Name(k8s.IPResource, resource.DecimalSI).Value() != 10 {
		t.Errorf("lost what the capacity step reads: %+v", n)
	}
}
