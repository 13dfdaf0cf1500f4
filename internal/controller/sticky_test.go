package controller

import (
	"context"
	"io"
	"log/slog"
	"net/netip"
	"reflect"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/record"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/k8s"
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

// dead: a Node without a Ready condition, or Ready, is alive; not Ready
// (False or Unknown) or missing counts once the grace has passed since
// the transition (or since it was first seen missing), and until then
// says how long is left.
func TestDeadNode(t *testing.T) {
	k := &StickyKeeper{opts: StickyOptions{Grace: time.Minute}, goneSince: map[string]time.Time{},
		nodes: cache.NewSharedIndexInformer(&cache.ListWatch{}, &corev1.Node{}, 0, cache.Indexers{})}
	ago := func(d time.Duration) metav1.Time { return metav1.NewTime(time.Now().Add(-d)) }
	add := func(name string, conds ...corev1.NodeCondition) {
		if err := k.nodes.GetStore().Add(&corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: name}, Status: corev1.NodeStatus{Conditions: conds}}); err != nil {
			t.Fatal(err)
		}
	}
	add("fresh")
	add("ready", corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionTrue, LastTransitionTime: ago(time.Hour)})
	add("flapping", corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionFalse, LastTransitionTime: ago(10 * time.Second)})
	add("down", corev1.NodeCondition{Type: corev1.NodeReady, Status: corev1.ConditionUnknown, LastTransitionTime: ago(2 * time.Minute)},
		corev1.NodeCondition{Type: corev1.NodeMemoryPressure, Status: corev1.ConditionFalse})
	for _, c := range []struct {
		node     string
		dead     bool
		waitsFor time.Duration // at least
	}{
		{"fresh", false, 0},
		{"ready", false, 0},
		{"flapping", false, 49 * time.Second},
		{"down", true, 0},
		{"gone", false, 59 * time.Second}, // first seen missing now
	} {
		wait, why := k.dead(c.node)
		if (why != "") != c.dead || wait < c.waitsFor || (c.waitsFor == 0 && wait != 0) {
			t.Errorf("%s: wait %s, why %q; want dead=%v, wait >= %s", c.node, wait, why, c.dead, c.waitsFor)
		}
	}
	// Missing for longer than the grace: dead; back again: forgotten.
	k.goneSince["gone"] = time.Now().Add(-2 * time.Minute)
	if wait, why := k.dead("gone"); wait != 0 || !strings.Contains(why, "Node is gone") {
		t.Errorf("gone for 2m: wait %s, why %q", wait, why)
	}
	add("gone")
	if _, why := k.dead("gone"); why != "" || len(k.goneSince) != 0 {
		t.Errorf("back again: why %q, goneSince %v", why, k.goneSince)
	}
}

// Without a cloud to take a dead node's reserved address off its port,
// the keeper says so on the pod, once the node's grace is over, with what
// to do.
func TestStuckStickyAddressEvent(t *testing.T) {
	rec := record.NewFakeRecorder(4)
	k := &StickyKeeper{opts: StickyOptions{Grace: 20 * time.Millisecond}, recorder: k8s.Events{EventRecorder: rec}, goneSince: map[string]time.Time{},
		nodes: cache.NewSharedIndexInformer(&cache.ListWatch{}, &corev1.Node{}, 0, nil), log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ar := &v1alpha1.AddressReservation{ObjectMeta: metav1.ObjectMeta{Namespace: "db", Name: "pg-0"},
		Spec: v1alpha1.AddressReservationSpec{StatefulSet: "pg", Address: "10.0.0.7", Node: "n9", Port: "p9"}}
	wait, err := k.takeOver(context.Background(), ar)
	if err != nil || wait <= 0 || len(rec.Events) != 0 {
		t.Fatalf("within the grace: wait %s, err %v, %d events; want a wait and no event", wait, err, len(rec.Events))
	}
	time.Sleep(wait)
	if _, err := k.takeOver(context.Background(), ar); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-rec.Events:
		for _, want := range []string{EventStickyAddressStuck, "10.0.0.7", "n9", "-cloud-config", "AddressReservation db/pg-0"} {
			if !strings.Contains(e, want) {
				t.Errorf("event %q does not say %q", e, want)
			}
		}
	default:
		t.Fatal("no event for the stuck address")
	}
	// A dual-stack pod's reservation: the Warning names both addresses.
	dual := ar.DeepCopy()
	dual.Name, dual.Spec.Addresses = "pg-1", []string{"10.0.0.7", "fd00::7"}
	if _, err := k.takeOver(context.Background(), dual); err != nil {
		t.Fatal(err)
	}
	select {
	case e := <-rec.Events:
		if !strings.Contains(e, "addresses 10.0.0.7 and fd00::7 are held by node n9") {
			t.Errorf("event %q does not name both addresses", e)
		}
	default:
		t.Fatal("no event for the stuck dual-stack addresses")
	}
}

// What the keeper writes into a reservation from the pod's PodAddress:
// the first address once, every family's once the pod has more than one
// (a reservation from before dual-stack gains the family it lacked), the
// node and port following the pod — and nothing while the PodAddress does
// not hold every reserved address.
func TestRecordAddresses(t *testing.T) {
	addrs := func(s ...string) []netip.Addr {
		var out []netip.Addr
		for _, a := range s {
			out = append(out, netip.MustParseAddr(a))
		}
		return out
	}
	spec := func(addr string, all ...string) v1alpha1.AddressReservationSpec {
		return v1alpha1.AddressReservationSpec{StatefulSet: "pg", Address: addr, Addresses: all, Node: "n1", Port: "p1"}
	}
	for _, c := range []struct {
		name    string
		s       v1alpha1.AddressReservationSpec
		held    []netip.Addr
		node    string
		want    v1alpha1.AddressReservationSpec
		changed bool
	}{
		{"IPv4 pod, nothing recorded yet", spec(""), addrs("10.0.0.7"), "n1", spec("10.0.0.7"), true},
		{"IPv4 pod, recorded, same node", spec("10.0.0.7"), addrs("10.0.0.7"), "n1", spec("10.0.0.7"), false},
		{"IPv4 pod moved node", spec("10.0.0.7"), addrs("10.0.0.7"), "n2",
			v1alpha1.AddressReservationSpec{StatefulSet: "pg", Address: "10.0.0.7", Node: "n2", Port: "p1"}, true},
		{"IPv4 pod got another address", spec("10.0.0.7"), addrs("10.0.0.9"), "n2", spec("10.0.0.7"), false},
		{"IPv6-only pod", spec(""), addrs("fd00::7"), "n1", spec("fd00::7"), true},
		{"dual-stack pod, nothing recorded yet", spec(""), addrs("10.0.0.7", "fd00::7"), "n1", spec("10.0.0.7", "10.0.0.7", "fd00::7"), true},
		{"dual-stack pod, IPv6 first", spec(""), addrs("fd00::7", "10.0.0.7"), "n1", spec("fd00::7", "fd00::7", "10.0.0.7"), true},
		{"dual-stack pod, recorded", spec("10.0.0.7", "10.0.0.7", "fd00::7"), addrs("10.0.0.7", "fd00::7"), "n1", spec("10.0.0.7", "10.0.0.7", "fd00::7"), false},
		{"reservation from before dual-stack gains IPv6", spec("10.0.0.7"), addrs("10.0.0.7", "fd00::7"), "n1", spec("10.0.0.7", "10.0.0.7", "fd00::7"), true},
		{"dual-stack pod back with a new IPv6 address", spec("10.0.0.7", "10.0.0.7", "fd00::7"), addrs("10.0.0.7", "fd00::9"), "n2",
			spec("10.0.0.7", "10.0.0.7", "fd00::7"), false},
		{"dual-stack reservation, pod back with IPv4 alone", spec("10.0.0.7", "10.0.0.7", "fd00::7"), addrs("10.0.0.7"), "n2",
			spec("10.0.0.7", "10.0.0.7", "fd00::7"), false},
		{"two addresses of one family (refused by the CRD)", spec(""), addrs("10.0.0.7", "10.0.0.8"), "n1", spec(""), false},
	} {
		got, changed := recordAddresses(c.s, c.held, c.node, "p1")
		if !reflect.DeepEqual(got, c.want) || changed != c.changed {
			t.Errorf("%s:\n got %+v (changed %v)\nwant %+v (changed %v)", c.name, got, changed, c.want, c.changed)
		}
	}
}
