package k8s

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// syncBuffer is a log sink the runner's goroutine and the test share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// queueKey is a key that logs as a group, as the node side's attachment
// keys do.
type queueKey struct{ containerID, ifName string }

func (k queueKey) LogValue() slog.Value {
	return slog.GroupValue(slog.String("container", k.containerID), slog.String("ifName", k.ifName))
}

// RunQueue on a real work queue: a failing key is retried until it
// succeeds, and its back-off then starts afresh; a key that asks to be
// looked at again comes back no sooner than asked; a key done once is not
// seen again; the runner ends when its context does.
func TestRunQueue(t *testing.T) {
	const wait = 50 * time.Millisecond
	q := workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[queueKey](time.Millisecond, 10*time.Millisecond))
	defer q.ShutDown()
	flaky, later, once := queueKey{"flaky", "eth0"}, queueKey{"later", "eth0"}, queueKey{"once", "eth0"}

	var mu sync.Mutex
	calls := map[queueKey][]time.Time{}
	requeuesSeen := map[queueKey][]int{}
	finished := make(chan struct{})
	reconcile := func(_ context.Context, k queueKey) (time.Duration, error) {
		mu.Lock()
		defer mu.Unlock()
		calls[k] = append(calls[k], time.Now())
		requeuesSeen[k] = append(requeuesSeen[k], q.NumRequeues(k))
		n := len(calls[k])
		switch {
		case k == flaky && n <= 2:
			return 0, errors.New("API server said no")
		case k == later && n == 1:
			return wait, nil
		}
		if len(calls[flaky]) == 3 && len(calls[later]) == 2 && len(calls[once]) == 1 {
			close(finished)
		}
		return 0, nil
	}

	var logs syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		RunQueue(ctx, q, reconcile, slog.New(slog.NewTextHandler(&logs, nil)))
		close(done)
	}()
	start := time.Now()
	q.Add(flaky)
	q.Add(later)
	q.Add(once)

	select {
	case <-finished:
	case <-time.After(10 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("reconciled %v", calls)
	}
	cancel()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("RunQueue still running after its context ended")
	}

	mu.Lock()
	defer mu.Unlock()
	// Each failure counted once by the rate limiter, and the success
	// forgot them.
	if got := requeuesSeen[flaky]; len(got) != 3 || got[0] != 0 || got[1] != 1 || got[2] != 2 {
		t.Errorf("flaky key saw requeue counts %v, want [0 1 2]", got)
	}
	if n := q.NumRequeues(flaky); n != 0 {
		t.Errorf("flaky key still has %d requeues after its success", n)
	}
	if got := requeuesSeen[later]; len(got) != 2 || got[1] != 0 {
		t.Errorf("a requested wait counted as a failure: requeue counts %v", got)
	}
	if c := calls[later]; len(c) != 2 || c[1].Sub(c[0]) < wait {
		t.Errorf("key asking for %v came back after %v", wait, c[1].Sub(c[0]))
	}
	if len(calls[once]) != 1 {
		t.Errorf("key done at once was reconciled %d times", len(calls[once]))
	}
	if time.Since(start) > 5*time.Second {
		t.Errorf("took %v: the retries did not use the queue's 1ms back-off", time.Since(start))
	}
	out := logs.String()
	if strings.Count(out, "reconcile failed; retrying") != 2 || !strings.Contains(out, "key.container=flaky") || !strings.Contains(out, "API server said no") {
		t.Errorf("want the two failures of the flaky key logged, got:\n%s", out)
	}
}
