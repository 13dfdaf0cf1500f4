package ec2api

import (
	"maps"
	"sync"
	"time"
)

// faults are what tests and the chaos harness switch on: throttling,
// denied actions and lost replies; and the per-action call counts.
type faults struct {
	mu         sync.Mutex
	throttling bool
	buckets    map[string]*bucket
	denied     map[string]bool
	lose       map[string]int // action ("" for any) → replies still to lose
	calls      map[string]int
	keys       map[string]int // access key ID → calls
	now        func() time.Time
}

// bucket is one of EC2's per-action token buckets: a request takes a
// token; tokens come back at refill per second up to size.
type bucket struct {
	size, refill, tokens float64
	last                 time.Time
}

// unfiltered names the smaller bucket some Describe calls use when they
// are neither filtered nor paginated.
const unfiltered = "/unfiltered"

// ec2Buckets is EC2's documented table ("Request throttling for the Amazon
// EC2 API", per account and Region): bucket size and refill per second.
// Actions not in it take the generic mutating bucket.
var ec2Buckets = map[string][2]float64{
	"DescribeInstances":                      {100, 20},
	"DescribeNetworkInterfaces":              {100, 20},
	"DescribeSecurityGroups":                 {100, 20},
	"DescribeInstances" + unfiltered:         {50, 10},
	"DescribeNetworkInterfaces" + unfiltered: {50, 10},
	"DescribeSecurityGroups" + unfiltered:    {50, 10},
	"DescribeSubnets":                        {100, 20},
	"DescribeVpcs":                           {100, 20},
	"DescribeInstanceTypes":                  {100, 20},
	"DescribeTags":                           {100, 20},
	"AssignPrivateIpAddresses":               {100, 5},
	"UnassignPrivateIpAddresses":             {100, 5},
	"AssignIpv6Addresses":                    {100, 5}, // UnassignIpv6Addresses is not listed: generic
	"CreateNetworkInterface":                 {100, 5},
	"DeleteNetworkInterface":                 {100, 5},
	"ModifyNetworkInterfaceAttribute":        {100, 5},
	"CreateTags":                             {100, 10},
	"DeleteTags":                             {100, 10},
}

var genericMutating = [2]float64{50, 5}

func (f *faults) init() {
	f.buckets, f.denied, f.lose, f.calls, f.keys, f.now = map[string]*bucket{}, map[string]bool{}, map[string]int{}, map[string]int{}, map[string]int{}, time.Now
}

// bucketFor is the bucket a request of action takes from.
func (f *faults) bucketFor(key string) *bucket {
	b, ok := f.buckets[key]
	if !ok {
		limits, known := ec2Buckets[key]
		if !known {
			limits = genericMutating
		}
		b = &bucket{size: limits[0], refill: limits[1], tokens: limits[0], last: f.now()}
		f.buckets[key] = b
	}
	return b
}

func (b *bucket) take(now time.Time) bool {
	b.tokens = min(b.size, b.tokens+now.Sub(b.last).Seconds()*b.refill)
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

// admit counts the call and applies the faults in EC2's order as far as it
// is known: throttling, then authorization.
func (f *faults) admit(action, key string, smallBucket bool) *apiError {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls[action]++
	if key != "" {
		f.keys[key]++
	}
	if f.throttling {
		name := action
		if _, two := ec2Buckets[action+unfiltered]; two && smallBucket {
			name += unfiltered
		}
		if !f.bucketFor(name).take(f.now()) {
			return errThrottled()
		}
	}
	if f.denied[action] {
		return errDenied(action)
	}
	return nil
}

// loseReply: this call's reply is to be lost.
func (f *faults) loseReply(action string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, k := range []string{action, ""} {
		if f.lose[k] > 0 {
			f.lose[k]--
			return true
		}
	}
	return false
}

// Throttle turns EC2's request throttling on or off; it is off until
// asked for. Turning it on starts every bucket full.
func (s *Server) Throttle(on bool) {
	f := &s.faults
	f.mu.Lock()
	defer f.mu.Unlock()
	f.throttling = on
	for _, b := range f.buckets {
		b.tokens, b.last = b.size, f.now()
	}
}

// SetBucket sizes action's token bucket (both buckets of a Describe call
// that has two): size requests at once, refilled at perSecond. It starts
// full. Small buckets let a test see RequestLimitExceeded quickly.
func (s *Server) SetBucket(action string, size int, perSecond float64) {
	f := &s.faults
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, name := range []string{action, action + unfiltered} {
		if _, known := ec2Buckets[name]; known || name == action {
			f.buckets[name] = &bucket{size: float64(size), refill: perSecond, tokens: float64(size), last: f.now()}
		}
	}
}

// Deny makes the actions answer 403 UnauthorizedOperation, as EC2 does
// when the caller's IAM policy lacks them.
func (s *Server) Deny(actions ...string) {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	for _, a := range actions {
		s.faults.denied[a] = true
	}
}

// Allow undoes Deny.
func (s *Server) Allow(actions ...string) {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	for _, a := range actions {
		delete(s.faults.denied, a)
	}
}

// LoseReplies makes the next n calls of the actions (of any action if none
// is named) take effect while their reply is lost: the connection closes
// without an answer, as when a reply is lost on the way.
func (s *Server) LoseReplies(n int, actions ...string) {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	if len(actions) == 0 {
		actions = []string{""}
	}
	for _, a := range actions {
		s.faults.lose[a] = n
	}
}

// Calls counts the requests received per action, throttled and denied
// ones included.
func (s *Server) Calls() map[string]int {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	return maps.Clone(s.faults.calls)
}

// CallsBy counts the requests signed with the access key ID.
func (s *Server) CallsBy(accessKeyID string) int {
	s.faults.mu.Lock()
	defer s.faults.mu.Unlock()
	return s.faults.keys[accessKeyID]
}
