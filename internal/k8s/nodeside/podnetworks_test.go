package nodeside

import (
	"context"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// The agent learns a pod's PodNetwork from the node's pod cache, and a
// PodNetwork's section for its provider from the watched PodNetworks; a
// PodNetwork of another provider is refused with the reason.
func TestPodNetworksFromCaches(t *testing.T) {
	pods := cache.NewSharedIndexInformer(nil, &corev1.Pod{}, 0, cache.Indexers{})
	for name, network := range map[string]string{"web-0": "web", "plain": ""} {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "shop", UID: types.UID("uid-" + name)}}
		if network != "" {
			p.Annotations = map[string]string{v1alpha1.AnnotationNetwork: network}
		}
		if err := pods.GetIndexer().Add(p); err != nil {
			t.Fatal(err)
		}
	}
	pns := cache.NewSharedIndexInformer(nil, &v1alpha1.PodNetwork{}, 0, cache.Indexers{})
	web := &v1alpha1.PodNetwork{ObjectMeta: metav1.ObjectMeta{Name: "web"}, Spec: v1alpha1.PodNetworkSpec{
		OpenStack: &v1alpha1.OpenStackPodNetwork{NetworkID: "n1", SubnetIDs: []string{"s1"}, SecurityGroups: []string{"sg-web"}}}}
	if err := pns.GetStore().Add(web); err != nil {
		t.Fatal(err)
	}
	p := &PodNetworks{inf: pns, node: &Node{pods: pods}}
	for pod, want := range map[string]string{"web-0": "web", "plain": ""} {
		if got, err := p.NetworkOf(context.Background(), "shop", pod, "uid-"+pod); err != nil || got != want {
			t.Errorf("NetworkOf(shop/%s) = %q, %v; want %q", pod, got, err, want)
		}
	}
	spec, err := p.Spec(context.Background(), "web", "openstack")
	if err != nil || string(spec) != `{"networkID":"n1","subnetIDs":["s1"],"securityGroups":["sg-web"]}` {
		t.Errorf("Spec(web, openstack) = %s, %v", spec, err)
	}
	if _, err := p.Spec(context.Background(), "web", "aws"); err == nil || !strings.Contains(err.Error(), "has no aws section") {
		t.Errorf("Spec(web, aws) = %v; want the PodNetwork refused for want of an aws section", err)
	}
}

// A pod recreated under the same name while the cache still holds the old
// one: the runtime's UID tells them apart, and the API server's pod is
// read; a UID the API server does not have either is an error, not the
// default network.
func TestPodNetworkOfARecreatedPod(t *testing.T) {
	pods := cache.NewSharedIndexInformer(nil, &corev1.Pod{}, 0, cache.Indexers{})
	old := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "shop", UID: "uid-old",
		Annotations: map[string]string{v1alpha1.AnnotationNetwork: "web"}}}
	if err := pods.GetIndexer().Add(old); err != nil {
		t.Fatal(err)
	}
	now := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "web-0", Namespace: "shop", UID: "uid-new",
		Annotations: map[string]string{v1alpha1.AnnotationNetwork: "db"}}}
	pns := cache.NewSharedIndexInformer(nil, &v1alpha1.PodNetwork{}, 0, cache.Indexers{})
	p := &PodNetworks{inf: pns, node: &Node{pods: pods, cs: fake.NewClientset(now)}}
	if got, err := p.NetworkOf(context.Background(), "shop", "web-0", "uid-new"); err != nil || got != "db" {
		t.Errorf("the recreated pod's network: %q, %v; want db, the API server's", got, err)
	}
	if got, err := p.NetworkOf(context.Background(), "shop", "web-0", "uid-old"); err != nil || got != "web" {
		t.Errorf("the cached pod's network: %q, %v; want web", got, err)
	}
	if _, err := p.NetworkOf(context.Background(), "shop", "web-0", "uid-other"); err == nil || !strings.Contains(err.Error(), "recreated") {
		t.Errorf("a UID neither has: %v; want an error saying the pod was recreated", err)
	}
}
