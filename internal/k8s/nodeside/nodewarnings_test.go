package nodeside

import (
	"strings"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/k8s"
	"k8s.io/client-go/tools/record"
)

// A storm of one reason of node warnings costs one Event per warnEvery:
// the first at once, then the last held back with the count; another
// reason is told at once meanwhile, and a reason quiet for an interval is
// told at once again.
func TestNodeWarningsFold(t *testing.T) {
	rec := record.NewFakeRecorder(100)
	n := &Node{name: "n1", recorder: k8s.Events{EventRecorder: rec}}
	next := func() string {
		select {
		case e := <-rec.Events:
			return e
		default:
			return ""
		}
	}
	n.NodeWarning("VpcniCloudWriteRace", "first")
	if e := next(); e != "Warning VpcniCloudWriteRace vpcni on node n1: first" {
		t.Fatalf("first warning: event %q", e)
	}
	for i := range 50 {
		n.NodeWarning("VpcniCloudWriteRace", "storm "+string(rune('a'+i%26)))
	}
	n.NodeWarning("VpcniOther", "another reason")
	if e := next(); e != "Warning VpcniOther vpcni on node n1: another reason" {
		t.Fatalf("another reason during the storm: event %q", e)
	}
	if e := next(); e != "" {
		t.Fatalf("the storm was not held back: %q", e)
	}
	t0 := n.warnings.byReason["VpcniCloudWriteRace"].told
	n.flushWarnings(t0.Add(warnEvery - time.Second))
	if e := next(); e != "" {
		t.Fatalf("told before the interval was over: %q", e)
	}
	n.flushWarnings(t0.Add(warnEvery))
	e := next()
	if !strings.HasPrefix(e, "Warning VpcniCloudWriteRace vpcni on node n1: 50 more warnings of this kind since ") || !strings.HasSuffix(e, "the last: storm x") {
		t.Fatalf("after the interval: event %q, want the count and the last message", e)
	}
	if e := next(); e != "" {
		t.Fatalf("more than one event for the held-back storm: %q", e)
	}
	// Quiet for an interval after that: the next is told at once again.
	n.flushWarnings(t0.Add(2 * warnEvery))
	n.flushWarnings(t0.Add(3 * warnEvery))
	if e := next(); e != "" {
		t.Fatalf("nothing was held back, yet: %q", e)
	}
	n.NodeWarning("VpcniCloudWriteRace", "later")
	if e := next(); e != "Warning VpcniCloudWriteRace vpcni on node n1: later" {
		t.Fatalf("after a quiet interval: event %q", e)
	}
}
