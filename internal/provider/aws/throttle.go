package aws

import (
	"context"
	"maps"
	"sync"
	"sync/atomic"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/smithy-go/middleware"
	"golang.org/x/time/rate"
)

// meter paces and counts the provider's EC2 requests: a token bucket per
// action on the client side, and a count per action that Info reports.
//
// EC2 throttles per account and region, by action (a bucket of 100 that
// refills at 5/s for AssignPrivateIpAddresses and the other mutating ENI
// calls, 20/s for filtered describes), and every node of every cluster in
// the account draws from the same buckets: a node that bursts beyond its
// share gets RequestLimitExceeded and so do its neighbours. The client
// bucket keeps one node to its share; the SDK's standard retryer backs off
// (exponentially, with jitter) on RequestLimitExceeded that comes anyway.
//
// It sits after the retryer in the SDK's middleware stack: every attempt,
// a retry too, waits for a token and is counted — what EC2 sees.
//
// The buckets are the node's, shared by its providers (the node's own
// pods' and each PodNetwork's, see shareWith): a node serving PodNetworks
// keeps to the same share. The counts are each provider's own.
type meter struct {
	rate  rate.Limit
	burst int
	b     *buckets

	mu    sync.Mutex
	calls map[string]int64
}

// buckets are the token buckets of one node, by action.
type buckets struct {
	mu sync.Mutex
	m  map[string]*rate.Limiter
}

func newMeter(perSecond float64, burst int) *meter {
	return &meter{rate: rate.Limit(perSecond), burst: burst, b: &buckets{m: map[string]*rate.Limiter{}}, calls: map[string]int64{}}
}

// nodeBuckets: instance ID → the *buckets its providers share.
var nodeBuckets sync.Map

// shareWith makes m draw from the buckets of instance, which every
// provider of the instance in this process shares (the first one's rate
// and burst: they come from one config). Call it before the first
// request.
func (m *meter) shareWith(instance string) {
	v, _ := nodeBuckets.LoadOrStore(instance, m.b)
	m.b = v.(*buckets)
}

// wait takes a token from op's bucket, waiting for one as long as ctx
// lets it, and counts the request.
func (m *meter) wait(ctx context.Context, op string) error {
	m.b.mu.Lock()
	b := m.b.m[op]
	if b == nil {
		b = rate.NewLimiter(m.rate, m.burst)
		m.b.m[op] = b
	}
	m.b.mu.Unlock()
	if err := b.Wait(ctx); err != nil {
		return err
	}
	m.mu.Lock()
	m.calls[op]++
	m.mu.Unlock()
	return nil
}

// snapshot is the requests made so far, by action.
func (m *meter) snapshot() map[string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.calls)
}

// middleware puts the meter into a client's stack, after the retry step.
func (m *meter) middleware(st *middleware.Stack) error {
	return st.Finalize.Add(middleware.FinalizeMiddlewareFunc("vpcniMeter",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			if err := m.wait(ctx, awsmiddleware.GetOperationName(ctx)); err != nil {
				return middleware.FinalizeOutput{}, middleware.Metadata{}, err
			}
			if n, ok := ctx.Value(attemptsKey{}).(*atomic.Int32); ok {
				n.Add(1)
			}
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
}

type attemptsKey struct{}

// countAttempts makes the calls made with the returned context count
// their attempts: a call retried after its reply was lost (a connection
// closed, a timeout) may have taken effect more than once.
func countAttempts(ctx context.Context) (context.Context, *atomic.Int32) {
	n := new(atomic.Int32)
	return context.WithValue(ctx, attemptsKey{}, n), n
}
