package k8s

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/record"
)

// events records Events: made with its reconciler (the recorder is there
// from the start, for tests that reconcile without running), sent to the
// API server while the reconciler runs (send).
type events struct {
	record.EventRecorder
	broadcaster record.EventBroadcaster
}

// controllerEvents are vpcni-controller's.
func controllerEvents() events { return newEvents(corev1.EventSource{Component: "vpcni-controller"}) }

func newEvents(source corev1.EventSource) events {
	b := record.NewBroadcaster()
	return events{EventRecorder: b.NewRecorder(scheme.Scheme, source), broadcaster: b}
}

// send sends what is recorded to cs until stop, which flushes.
func (e events) send(cs kubernetes.Interface) (stop func()) {
	e.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	return e.broadcaster.Shutdown
}

// clients are what vpcni-controller's reconcilers read and write the
// cluster with, under its user agent.
type clients struct {
	cfg *rest.Config
	cs  kubernetes.Interface
	md  metadata.Interface
	pas *podAddresses
}

func newClients(cfg *rest.Config) (*clients, error) {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "vpcni-controller"
	c := &clients{cfg: cfg}
	var err error
	if c.cs, err = kubernetes.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if c.md, err = metadata.NewForConfig(cfg); err != nil {
		return nil, err
	}
	if c.pas, err = newPodAddresses(cfg); err != nil {
		return nil, err
	}
	return c, nil
}
