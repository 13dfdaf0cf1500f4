package sticky

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
	"github.com/vpcni/vpcni/internal/controller"
	"github.com/vpcni/vpcni/internal/k8s"
)

// The namespace of the dual-stack API tests' reservations and pods (kept
// apart from the move tests', which their cleanup empties).
const dualNamespace = "sticky-dual"

// What the API server accepts of a dual-stack pod's PodAddress and
// AddressReservation, with the generated CRDs: every family's address,
// first family first; an object written before dual-stack (address
// alone) created and updated as before; a reservation's addresses kept
// once recorded (another family may join) and refused when malformed.
// Then the controller's readers on those objects: the leak audit sees
// both families' addresses owned and reserved.
func TestDualStackObjectsOnTheAPIServer(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(fixture.Config)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: dualNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pas, err := k8s.NewPodAddresses(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	ars, err := k8s.NewAddressReservations(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}

	// PodAddresses.
	pa := func(name, address string, addrs, gws []string) *v1alpha1.PodAddress {
		return k8s.NewPodAddress(v1alpha1.PodAddressSpec{Node: "dual-n1", PodNamespace: dualNamespace, PodName: name,
			ContainerID: "c-" + name, IfName: "eth0", Address: address, Addresses: addrs, Gateways: gws, ProviderPort: "port-" + name})
	}
	created := map[string]*v1alpha1.PodAddress{}
	for _, p := range []*v1alpha1.PodAddress{
		pa("old-0", "10.70.0.1", nil, nil),
		pa("v4-0", "10.70.0.2", []string{"10.70.0.2"}, []string{"169.254.1.1"}),
		pa("v6-0", "fd00:70::3", []string{"fd00:70::3"}, []string{"fe80::1"}),
		pa("dual-0", "10.70.0.4", []string{"10.70.0.4", "fd00:70::4"}, []string{"169.254.1.1", "fe80::1"}),
		pa("dual-1", "fd00:70::5", []string{"fd00:70::5", "10.70.0.5"}, []string{"fe80::1", ""}),
	} {
		if err := pas.Create(ctx, p); err != nil {
			t.Fatalf("PodAddress of %s %q: %v", p.Spec.PodName, p.Spec.Addresses, err)
		}
		created[p.Spec.PodName] = p
		t.Cleanup(func() { _ = pas.Delete(context.Background(), p.Name, metav1.DeleteOptions{}) })
	}
	got, err := pas.Get(ctx, created["dual-0"].Name)
	if err != nil {
		t.Fatal(err)
	}
	if addrs, err := k8s.AddressesOf(got); err != nil || len(addrs) != 2 || addrs[1] != netip.MustParseAddr("fd00:70::4") ||
		got.Spec.Address != "10.70.0.4" || !slices.Equal(got.Spec.Gateways, []string{"169.254.1.1", "fe80::1"}) {
		t.Errorf("dual-stack PodAddress read back: %+v (%v, %v)", got.Spec, addrs, err)
	}
	// kubectl get pa -o wide: the Addresses column lists both families.
	raw, err := cs.Discovery().RESTClient().Get().AbsPath("/apis/vpcni.io/v1alpha1/podaddresses", created["dual-0"].Name).
		SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io").DoRaw(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var table struct {
		Columns []struct{ Name string } `json:"columnDefinitions"`
		Rows    []struct{ Cells []any } `json:"rows"`
	}
	if err := json.Unmarshal(raw, &table); err != nil || len(table.Rows) != 1 || len(table.Rows[0].Cells) != len(table.Columns) {
		t.Fatalf("PodAddress as a table: %v: %s", err, raw)
	}
	cells := map[string]string{}
	for i, c := range table.Columns {
		cells[c.Name] = fmt.Sprint(table.Rows[0].Cells[i])
	}
	if cells["Address"] != "10.70.0.4" || !strings.Contains(cells["Addresses"], "10.70.0.4") || !strings.Contains(cells["Addresses"], "fd00:70::4") {
		t.Errorf("kubectl get pa -o wide shows %v", cells)
	}
	t.Logf("vpcni-test: kubectl get pa -o wide: Address %s, Addresses %s", cells["Address"], cells["Addresses"])

	for _, bad := range []struct {
		name       string
		addrs, gws []string
		says       string
	}{
		{"bad-0", []string{"10.70.0.300"}, nil, "IPv4 or IPv6 address"},
		{"bad-1", []string{"10.70.0.6", "fd00:70::6", "10.70.0.7"}, nil, "must have at most 2 items"},
		{"bad-2", []string{"10.70.0.6"}, []string{"gateway"}, "each gateway"},
	} {
		err := pas.Create(ctx, pa(bad.name, bad.addrs[0], bad.addrs, bad.gws))
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), bad.says) {
			t.Errorf("PodAddress %q gateways %q: %v, want Invalid saying %q", bad.addrs, bad.gws, err, bad.says)
		}
	}

	// AddressReservations.
	ar := func(name, address string, addrs ...string) *v1alpha1.AddressReservation {
		return &v1alpha1.AddressReservation{ObjectMeta: metav1.ObjectMeta{Namespace: dualNamespace, Name: name},
			Spec: v1alpha1.AddressReservationSpec{StatefulSet: "db", Address: address, Addresses: addrs, Node: "dual-n1", Port: "port-1"}}
	}
	get := func(name string) *v1alpha1.AddressReservation {
		t.Helper()
		l, err := ars.List(ctx, metav1.ListOptions{FieldSelector: "metadata.namespace=" + dualNamespace + ",metadata.name=" + name})
		if err != nil || len(l.Items) != 1 {
			t.Fatalf("AddressReservation %s: %v (%d)", name, err, len(l.Items))
		}
		return &l.Items[0]
	}
	for _, r := range []*v1alpha1.AddressReservation{
		ar("db-0", "10.70.0.1"), // as recorded before dual-stack
		ar("db-1", "fd00:70::3"),
		ar("db-2", "10.70.0.4", "10.70.0.4", "fd00:70::4"),
		ar("db-3", ""),
	} {
		if err := ars.Create(ctx, r); err != nil {
			t.Fatalf("AddressReservation %s %q %q: %v", r.Name, r.Spec.Address, r.Spec.Addresses, err)
		}
		t.Cleanup(func() { _ = ars.Delete(context.Background(), dualNamespace, r.Name, metav1.DeleteOptions{}) })
	}
	for _, bad := range []struct {
		r    *v1alpha1.AddressReservation
		says string
	}{
		{ar("bad-0", "fd00:70:0::9"), "canonical"},
		{ar("bad-1", "10.70.0.9", "10.70.0.9", "10.70.0.10"), "at most one address per family"},
		{ar("bad-2", "10.70.0.9", "fd00:70::9"), "address must be one of addresses"},
		{ar("bad-3", "10.70.0.9", "10.70.0.9", "FD00:70::9"), "canonical"},
		{ar("bad-4", "10.70.0.9", "10.70.0.9", "fd00:70::9", "fd00:70::10"), "must have at most 2 items"},
	} {
		err := ars.Create(ctx, bad.r)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), bad.says) {
			_ = ars.Delete(ctx, dualNamespace, bad.r.Name, metav1.DeleteOptions{})
			t.Errorf("AddressReservation %q %q: %v, want Invalid saying %q", bad.r.Spec.Address, bad.r.Spec.Addresses, err, bad.says)
		}
	}
	update := func(name string, change func(*v1alpha1.AddressReservationSpec)) error {
		r := get(name)
		change(&r.Spec)
		return ars.Update(ctx, r)
	}
	// An old reservation moves with its pod as before, and gains the
	// family it did not have.
	if err := update("db-0", func(s *v1alpha1.AddressReservationSpec) { s.Node = "dual-n2" }); err != nil {
		t.Errorf("old reservation's node: %v", err)
	}
	if err := update("db-0", func(s *v1alpha1.AddressReservationSpec) { s.Addresses = []string{"10.70.0.1", "fd00:70::1"} }); err != nil {
		t.Errorf("old reservation gains IPv6: %v", err)
	}
	if err := update("db-3", func(s *v1alpha1.AddressReservationSpec) {
		s.Address, s.Addresses = "fd00:70::8", []string{"fd00:70::8", "10.70.0.8"}
	}); err != nil {
		t.Errorf("first record of a dual-stack pod: %v", err)
	}
	// Once recorded, no address changes or goes.
	for name, change := range map[string]func(*v1alpha1.AddressReservationSpec){
		"another IPv6 address": func(s *v1alpha1.AddressReservationSpec) { s.Addresses = []string{"10.70.0.4", "fd00:70::99"} },
		"IPv6 dropped":         func(s *v1alpha1.AddressReservationSpec) { s.Addresses = []string{"10.70.0.4"} },
		"addresses dropped":    func(s *v1alpha1.AddressReservationSpec) { s.Addresses = nil },
		"first address moved":  func(s *v1alpha1.AddressReservationSpec) { s.Address = "fd00:70::4" },
	} {
		err := update("db-2", change)
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "never change") {
			t.Errorf("%s: %v, want Invalid saying it never changes", name, err)
		}
	}
	if r := get("db-2"); r.Spec.Address != "10.70.0.4" || !slices.Equal(r.Spec.Addresses, []string{"10.70.0.4", "fd00:70::4"}) {
		t.Errorf("db-2 after the refused changes: %+v", r.Spec)
	}

	// The leak audit's view: both families' addresses owned by their
	// pods' PodAddresses, and both reserved.
	reader, err := controller.NewClusterReader(fixture.Config, func(string) (string, bool) { return "", false })
	if err != nil {
		t.Fatal(err)
	}
	c, err := reader.Read(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for addr, pod := range map[string]string{"10.70.0.1": "old-0", "10.70.0.2": "v4-0", "fd00:70::3": "v6-0", "10.70.0.4": "dual-0",
		"fd00:70::4": "dual-0", "fd00:70::5": "dual-1", "10.70.0.5": "dual-1"} {
		if got := c.Addresses[netip.MustParseAddr(addr)]; got.Pod != dualNamespace+"/"+pod || got.Name != created[pod].Name {
			t.Errorf("leak audit: %s is %+v, want PodAddress %s of %s", addr, got, created[pod].Name, pod)
		}
	}
	for addr, r := range map[string]string{"10.70.0.1": "db-0", "fd00:70::1": "db-0", "fd00:70::3": "db-1",
		"10.70.0.4": "db-2", "fd00:70::4": "db-2", "fd00:70::8": "db-3", "10.70.0.8": "db-3"} {
		if got := c.Reservations[netip.MustParseAddr(addr)]; got != dualNamespace+"/"+r {
			t.Errorf("leak audit: %s reserved by %q, want %s", addr, got, r)
		}
	}
}

// vpcni-controller's StickyKeeper, with the controller's rights, records
// a dual-stack pod's addresses from its PodAddress through the real CRD's
// rules: a new reservation gets both families, and one recorded before
// dual-stack (address alone) gains the IPv6 address its pod now has,
// keeping its IPv4 one.
func TestStickyKeeperRecordsEveryFamily(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	installRBAC(t)
	cs := kubernetes.NewForConfigOrDie(fixture.Config)
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: dualNamespace}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	pas, err := k8s.NewPodAddresses(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	ars, err := k8s.NewAddressReservations(fixture.Config)
	if err != nil {
		t.Fatal(err)
	}
	// The reservation of pg-1 as a controller before dual-stack recorded it.
	old := &v1alpha1.AddressReservation{ObjectMeta: metav1.ObjectMeta{Namespace: dualNamespace, Name: "pg-1"},
		Spec: v1alpha1.AddressReservationSpec{StatefulSet: "pg", Ordinal: 1, Address: "10.71.0.1", Node: "dual-n1", Port: "port-a"}}
	if err := ars.Create(ctx, old); err != nil {
		t.Fatal(err)
	}
	two := int32(2)
	labels := map[string]string{"app": "pg"}
	sts, err := cs.AppsV1().StatefulSets(dualNamespace).Create(ctx, &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "pg", Namespace: dualNamespace, Annotations: map[string]string{v1alpha1.AnnotationStickyIP: "true"}},
		Spec: appsv1.StatefulSetSpec{Replicas: &two, Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "pause"}}}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		bg := context.Background()
		zero := int64(0)
		_ = cs.AppsV1().StatefulSets(dualNamespace).Delete(bg, "pg", metav1.DeleteOptions{})
		_ = cs.CoreV1().Pods(dualNamespace).DeleteCollection(bg, metav1.DeleteOptions{GracePeriodSeconds: &zero}, metav1.ListOptions{})
		for _, n := range []string{"pg-0", "pg-1"} {
			_ = ars.Delete(bg, dualNamespace, n, metav1.DeleteOptions{})
		}
	})
	yes := true
	want := map[string][]string{"pg-0": {"fd00:71::10", "10.71.0.10"}, "pg-1": {"10.71.0.1", "fd00:71::1"}}
	for name, addrs := range want {
		p, err := cs.CoreV1().Pods(dualNamespace).Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: dualNamespace,
			Labels: labels, OwnerReferences: []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: "pg", UID: sts.UID,
				Controller: &yes, BlockOwnerDeletion: &yes}}},
			Spec: corev1.PodSpec{NodeName: "dual-n2", Containers: sts.Spec.Template.Spec.Containers}}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		pa := k8s.NewPodAddress(v1alpha1.PodAddressSpec{Node: "dual-n2", PodNamespace: dualNamespace, PodName: name, PodUID: string(p.UID),
			ContainerID: "c-" + name, IfName: "eth0", Address: addrs[0], Addresses: addrs, ProviderPort: "port-b"})
		if err := pas.Create(ctx, pa); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = pas.Delete(context.Background(), pa.Name, metav1.DeleteOptions{}) })
	}

	keeper, err := controller.NewStickyKeeper(as("vpcni-controller"), controller.StickyOptions{Grace: deadGrace},
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	kctx, kstop := context.WithCancel(ctx)
	kdone := make(chan error, 1)
	go func() { kdone <- keeper.Run(kctx) }()
	defer func() {
		kstop()
		if err := <-kdone; err != nil && kctx.Err() == nil {
			t.Errorf("StickyKeeper: %v", err)
		}
	}()

	var last []v1alpha1.AddressReservation
	for ctx.Err() == nil {
		l, err := ars.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		last = last[:0]
		done := 0
		for _, r := range l.Items {
			if r.Namespace != dualNamespace {
				continue
			}
			last = append(last, r)
			w := want[r.Name]
			if w != nil && slices.Equal(r.Spec.Addresses, w) && r.Spec.Node == "dual-n2" && r.Spec.Port == "port-b" {
				done++
			}
		}
		if done == len(want) {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if ctx.Err() != nil {
		t.Fatalf("reservations never recorded both families on dual-n2/port-b: %+v", last)
	}
	for _, r := range last {
		t.Logf("vpcni-test: AddressReservation %s: address %s addresses %q node %s port %s", r.Name, r.Spec.Address, r.Spec.Addresses, r.Spec.Node, r.Spec.Port)
		switch r.Name {
		case "pg-0":
			if r.Spec.Address != "fd00:71::10" {
				t.Errorf("pg-0's address %q, want its first family's fd00:71::10", r.Spec.Address)
			}
		case "pg-1":
			if r.Spec.Address != "10.71.0.1" {
				t.Errorf("pg-1's address %q, want the IPv4 address it kept since before dual-stack", r.Spec.Address)
			}
		}
	}
}
