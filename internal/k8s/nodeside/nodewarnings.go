package nodeside

import (
	"fmt"
	"sort"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// warnEvery is how often the agent tells one reason of NodeWarning as an
// Event at most. client-go's recorder lets 25 Warning Events through per
// object and then one per 5 minutes, shared by every reason: a storm of
// one reason would silence VpcniNotReady and VpcniDegraded on the Node
// for as long as it lasts.
const warnEvery = 5 * time.Minute

// nodeWarnings folds the agent's warnings on its Node, per reason: the
// first goes out at once; later ones within warnEvery are counted, and
// the last of them is told with the count when the interval is over
// (flush, from poolLoop), so nothing is lost but the repeats.
type nodeWarnings struct {
	mu       sync.Mutex
	byReason map[string]*heldWarning
}

type heldWarning struct {
	told time.Time // when this reason was last told
	held int       // warnings held back since
	last string    // the last one held back
}

// add takes a warning; it returns the message to tell now, if any.
func (w *nodeWarnings) add(reason, message string, now time.Time) (tell string, ok bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.byReason == nil {
		w.byReason = map[string]*heldWarning{}
	}
	h := w.byReason[reason]
	if h == nil || now.Sub(h.told) >= warnEvery && h.held == 0 {
		w.byReason[reason] = &heldWarning{told: now}
		return message, true
	}
	h.held++
	h.last = message
	return "", false
}

// due returns, by reason, what was held back and may be told now, and
// restarts those reasons' intervals.
func (w *nodeWarnings) due(now time.Time) map[string]string {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := map[string]string{}
	for reason, h := range w.byReason {
		switch {
		case h.held > 0 && now.Sub(h.told) >= warnEvery:
			out[reason] = fmt.Sprintf("%d more warnings of this kind since %s, the last: %s", h.held, h.told.UTC().Format(time.RFC3339), h.last)
			*h = heldWarning{told: now}
		case h.held == 0 && now.Sub(h.told) >= warnEvery:
			delete(w.byReason, reason) // quiet for an interval: the next goes out at once
		}
	}
	return out
}

// NodeWarning implements agent.Cluster: a Warning Event on the Node,
// folded per reason (nodeWarnings).
func (n *Node) NodeWarning(reason, message string) {
	if msg, ok := n.warnings.add(reason, message, time.Now()); ok {
		n.nodeWarning(reason, msg)
	}
}

// flushWarnings tells what NodeWarning held back and may be told now.
func (n *Node) flushWarnings(now time.Time) {
	due := n.warnings.due(now)
	reasons := make([]string, 0, len(due))
	for r := range due {
		reasons = append(reasons, r)
	}
	sort.Strings(reasons)
	for _, r := range reasons {
		n.nodeWarning(r, due[r])
	}
}

func (n *Node) nodeWarning(reason, message string) {
	n.recorder.Eventf(n.nodeRef(), corev1.EventTypeWarning, reason, "vpcni on node %s: %s", n.name, message)
}
