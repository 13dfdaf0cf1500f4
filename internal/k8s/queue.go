package k8s

import (
	"context"
	"log/slog"
	"time"

	"k8s.io/client-go/util/workqueue"
)

// ReconcileFunc brings one key's state in line. An error retries the key
// with the queue's rate limiter; again > 0 (and no error) looks at it
// once more after that long, for a state that can only settle with time.
type ReconcileFunc[K comparable] func(ctx context.Context, key K) (again time.Duration, err error)

// RunQueue reconciles the queue's keys one at a time until the queue shuts
// down, which it does when ctx ends. The failure of a key is logged here,
// once, and the key retried; reconcile itself returns its errors.
func RunQueue[K comparable](ctx context.Context, q workqueue.TypedRateLimitingInterface[K], reconcile ReconcileFunc[K], log *slog.Logger) {
	stop := context.AfterFunc(ctx, q.ShutDown)
	defer stop()
	for {
		key, quit := q.Get()
		if quit {
			return
		}
		again, err := reconcile(ctx, key)
		switch {
		case err != nil && ctx.Err() != nil:
			// Stopping: the error is most likely the cancellation, and
			// the queue, shutting down, would drop a retry anyway.
		case err != nil:
			log.Warn("reconcile failed; retrying", "key", key, "retries", q.NumRequeues(key), "err", err)
			q.AddRateLimited(key)
		case again > 0:
			// A wait the reconciler asked for is no failure: the rate
			// limiter's back-off starts afresh.
			q.Forget(key)
			q.AddAfter(key, again)
		default:
			q.Forget(key)
		}
		q.Done(key)
	}
}
