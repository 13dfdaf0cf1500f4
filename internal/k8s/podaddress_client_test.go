package k8s

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/vpcni/vpcni/internal/apis/vpcni/v1alpha1"
)

// fakeAPI serves the PodAddress resource as the API server does for a
// custom resource: JSON objects kept as the server stores them (untyped),
// list and watch with a label selector, create, get, delete with a UID
// precondition, and Status errors. A watch that asks for the initial
// events (the streaming list informers use by default) gets them and the
// bookmark that ends them, then stays open with nothing more.
type fakeAPI struct {
	t    *testing.T
	mu   sync.Mutex
	objs map[string]map[string]any
	next int
	// selectors are the label selectors the lists and watches asked for.
	selectors []string
}

const podAddressPath = "/apis/vpcni.io/v1alpha1/podaddresses"

func (f *fakeAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	name, one := strings.CutPrefix(r.URL.Path, podAddressPath+"/")
	if !one && r.URL.Path != podAddressPath {
		f.status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "no such path "+r.URL.Path)
		return
	}
	q := r.URL.Query()
	switch {
	case r.Method == http.MethodGet && !one:
		items, rv, err := f.list(q.Get("labelSelector"))
		if err != nil {
			f.status(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
			return
		}
		if q.Get("watch") != "true" {
			f.json(w, http.StatusOK, map[string]any{"apiVersion": "vpcni.io/v1alpha1", "kind": "PodAddressList",
				"metadata": map[string]any{"resourceVersion": rv}, "items": items})
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		if q.Get("sendInitialEvents") == "true" {
			enc := json.NewEncoder(w)
			for _, o := range items {
				_ = enc.Encode(map[string]any{"type": "ADDED", "object": o})
			}
			_ = enc.Encode(map[string]any{"type": "BOOKMARK", "object": map[string]any{"apiVersion": "vpcni.io/v1alpha1", "kind": "PodAddress",
				"metadata": map[string]any{"resourceVersion": rv, "annotations": map[string]any{metav1.InitialEventsAnnotationKey: "true"}}}})
		}
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	case r.Method == http.MethodGet:
		f.mu.Lock()
		o, ok := f.objs[name]
		f.mu.Unlock()
		if !ok {
			f.status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "podaddresses.vpcni.io "+name+" not found")
			return
		}
		f.json(w, http.StatusOK, o)
	case r.Method == http.MethodPost && !one:
		var o map[string]any
		if err := json.NewDecoder(r.Body).Decode(&o); err != nil {
			f.status(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
			return
		}
		md, _ := o["metadata"].(map[string]any)
		name, _ := md["name"].(string)
		f.mu.Lock()
		defer f.mu.Unlock()
		if _, exists := f.objs[name]; exists {
			f.status(w, http.StatusConflict, metav1.StatusReasonAlreadyExists, "podaddresses.vpcni.io "+name+" already exists")
			return
		}
		f.next++
		md["uid"] = fmt.Sprintf("uid-%d", f.next)
		md["resourceVersion"] = fmt.Sprint(f.next)
		f.objs[name] = o
		f.json(w, http.StatusCreated, o)
	case r.Method == http.MethodDelete && one:
		var opts metav1.DeleteOptions
		if err := json.NewDecoder(r.Body).Decode(&opts); err != nil {
			f.status(w, http.StatusBadRequest, metav1.StatusReasonBadRequest, err.Error())
			return
		}
		f.mu.Lock()
		defer f.mu.Unlock()
		o, ok := f.objs[name]
		if !ok {
			f.status(w, http.StatusNotFound, metav1.StatusReasonNotFound, "podaddresses.vpcni.io "+name+" not found")
			return
		}
		if uid := o["metadata"].(map[string]any)["uid"]; opts.Preconditions != nil && opts.Preconditions.UID != nil && string(*opts.Preconditions.UID) != uid {
			f.status(w, http.StatusConflict, metav1.StatusReasonConflict, "Precondition failed: UID in precondition: "+string(*opts.Preconditions.UID)+", UID in object meta: "+uid.(string))
			return
		}
		delete(f.objs, name)
		f.json(w, http.StatusOK, map[string]any{"apiVersion": "v1", "kind": "Status", "status": metav1.StatusSuccess})
	default:
		f.status(w, http.StatusMethodNotAllowed, metav1.StatusReasonMethodNotAllowed, r.Method+" "+r.URL.Path)
	}
}

// list is the objects the selector matches, and the resource version.
func (f *fakeAPI) list(selector string) ([]any, string, error) {
	sel, err := labels.Parse(selector)
	if err != nil {
		return nil, "", err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.selectors = append(f.selectors, selector)
	items := []any{}
	for _, o := range f.objs {
		if sel.Matches(labels.Set(labelsOf(o))) {
			items = append(items, o)
		}
	}
	return items, fmt.Sprint(f.next), nil
}

func labelsOf(o map[string]any) map[string]string {
	md, _ := o["metadata"].(map[string]any)
	ls, _ := md["labels"].(map[string]any)
	out := map[string]string{}
	for k, v := range ls {
		out[k], _ = v.(string)
	}
	return out
}

func (f *fakeAPI) json(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	if err := json.NewEncoder(w).Encode(v); err != nil {
		f.t.Errorf("fake API server: %v", err)
	}
}

func (f *fakeAPI) status(w http.ResponseWriter, code int, reason metav1.StatusReason, msg string) {
	f.json(w, code, map[string]any{"apiVersion": "v1", "kind": "Status", "status": metav1.StatusFailure,
		"code": code, "reason": reason, "message": msg})
}

// stored is a PodAddress as the API server keeps one that vpcni wrote
// before it had Go types.
func stored(name, node, pod string) map[string]any {
	return map[string]any{"apiVersion": "vpcni.io/v1alpha1", "kind": "PodAddress",
		"metadata": map[string]any{"name": name, "uid": "uid-" + name, "resourceVersion": "1", "labels": map[string]any{LabelNode: node}},
		"spec": map[string]any{"node": node, "podNamespace": "default", "podName": pod, "containerID": "c-" + pod,
			"ifName": "eth0", "address": "10.0.0.9"}}
}

// The typed client speaks the API server's protocol for the resource:
// what it creates is the old object, what it reads decodes, the API's
// errors keep their reason, and the informer lists by the node's label.
func TestPodAddressClient(t *testing.T) {
	f := &fakeAPI{t: t, objs: map[string]map[string]any{
		"pa-other": stored("pa-other", "n2", "db-0"),
		"pa-old":   stored("pa-old", "n1", "web-1"),
	}}
	srv := httptest.NewServer(f)
	defer srv.Close()
	// A config that prefers protobuf, as kube clients often do: the
	// PodAddress client must speak JSON all the same.
	c, err := NewPodAddresses(&rest.Config{Host: srv.URL, ContentConfig: rest.ContentConfig{ContentType: "application/vnd.kubernetes.protobuf"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	spec := v1alpha1.PodAddressSpec{Node: "n1", PodNamespace: "default", PodName: "web-0", ContainerID: "abc", IfName: "eth0", Address: "10.0.0.5"}
	name := PodAddressName("n1", "abc", "eth0")
	if err := c.Create(ctx, NewPodAddress(spec)); err != nil {
		t.Fatalf("create: %v", err)
	}
	f.mu.Lock()
	created := f.objs[name]
	f.mu.Unlock()
	wantCreated := map[string]any{"apiVersion": "vpcni.io/v1alpha1", "kind": "PodAddress",
		"metadata": map[string]any{"name": name, "uid": "uid-1", "resourceVersion": "1", "labels": map[string]any{LabelNode: "n1"}},
		"spec":     map[string]any{"node": "n1", "podNamespace": "default", "podName": "web-0", "containerID": "abc", "ifName": "eth0", "address": "10.0.0.5"}}
	if !reflect.DeepEqual(created, wantCreated) {
		t.Fatalf("created %v\nwant %v", created, wantCreated)
	}
	if err := c.Create(ctx, NewPodAddress(spec)); !apierrors.IsAlreadyExists(err) {
		t.Fatalf("second create: %v, want AlreadyExists", err)
	}

	pa, err := c.Get(ctx, "pa-old")
	if err != nil {
		t.Fatalf("get: %v", err)
	}
	if want := (v1alpha1.PodAddressSpec{Node: "n1", PodNamespace: "default", PodName: "web-1", ContainerID: "c-web-1", IfName: "eth0", Address: "10.0.0.9"}); !reflect.DeepEqual(pa.Spec, want) || pa.UID != "uid-pa-old" {
		t.Fatalf("get: %+v", pa)
	}
	if _, err := c.Get(ctx, "pa-none"); !apierrors.IsNotFound(err) {
		t.Fatalf("get of a missing object: %v, want NotFound", err)
	}

	// The list informers fall back to where the server streams no list.
	l, err := c.List(ctx, metav1.ListOptions{LabelSelector: LabelNode + "=n2"})
	if err != nil || len(l.Items) != 1 || l.Items[0].Name != "pa-other" || l.Items[0].Spec.PodName != "db-0" {
		t.Fatalf("list of n2: %+v, %v", l, err)
	}
	f.mu.Lock()
	f.selectors = nil
	f.mu.Unlock()

	inf := c.Informer(LabelNode+"="+NodeLabel("n1"), 0, cache.Indexers{IndexPod: PodIndex})
	ictx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { inf.RunWithContext(ictx); close(done) }()
	defer func() { stop(); <-done }()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("informer did not sync")
	}
	var names []string
	for _, o := range inf.GetStore().List() {
		pa, ok := o.(*v1alpha1.PodAddress)
		if !ok {
			t.Fatalf("informer holds a %T", o)
		}
		names = append(names, pa.Name+"="+pa.Spec.Node)
	}
	if len(names) != 2 || !strings.Contains(strings.Join(names, " "), "pa-old=n1") || !strings.Contains(strings.Join(names, " "), name+"=n1") {
		t.Fatalf("informer of n1 holds %v", names)
	}
	if l, _ := inf.GetIndexer().ByIndex(IndexPod, "default/web-1"); len(l) != 1 {
		t.Fatalf("pod index: %v", l)
	}
	f.mu.Lock()
	sels := f.selectors
	f.mu.Unlock()
	if len(sels) == 0 || sels[0] != "vpcni.io/node=n1" {
		t.Fatalf("lists and watches asked for %q", sels)
	}

	wrong := metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions("uid-other")}
	if err := c.Delete(ctx, "pa-old", wrong); !apierrors.IsConflict(err) {
		t.Fatalf("delete with another UID: %v, want Conflict", err)
	}
	if err := c.Delete(ctx, "pa-old", metav1.DeleteOptions{Preconditions: metav1.NewUIDPreconditions("uid-pa-old")}); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if _, err := c.Get(ctx, "pa-old"); !apierrors.IsNotFound(err) {
		t.Fatalf("get after delete: %v, want NotFound", err)
	}
}
