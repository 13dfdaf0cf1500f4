package k8s

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// Events records Events: made with its reconciler (the recorder is there
// from the start, for tests that reconcile without running), sent to the
// API server while the reconciler runs (Send).
type Events struct {
	record.EventRecorder
	broadcaster record.EventBroadcaster
}

// NewEvents records Events from source.
func NewEvents(source corev1.EventSource) Events {
	b := record.NewBroadcaster()
	return Events{EventRecorder: b.NewRecorder(scheme.Scheme, source), broadcaster: b}
}

// Send sends what is recorded to cs until stop, which flushes.
func (e Events) Send(cs kubernetes.Interface) (stop func()) {
	e.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: cs.CoreV1().Events("")})
	return e.broadcaster.Shutdown
}
