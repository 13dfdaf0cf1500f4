package ctl

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/vpcni/vpcni/internal/config"
)

// TestBenchPoolAWS runs `bench pool --provider aws` with every duration
// shortened (a 100 ms cooldown, churn at 200 pods a second) on an
// m5.xlarge, whose primary ENI holds 14 addresses: the churn counts EC2
// calls in both modes, the cold ADDs reach a new ENI, and the run ends
// with the summary line make bench quotes.
func TestBenchPoolAWS(t *testing.T) {
	b := awsPoolBench{Type: "m5.xlarge", Pods: 5, Rate: 200, Ramp: 300 * time.Millisecond, Ops: 100, Cold: 20,
		Pool: config.Pool{WarmTarget: 4, BatchSize: 4, MaxFree: 8, AddWait: config.Duration{Duration: 5 * time.Second}},
		Cool: 100 * time.Millisecond, Resync: time.Second, Seed: 1}
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	f, err := b.run(c, &out)
	t.Logf("\n%s", out.String())
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^aws-bench: calls_per_pod=(\d+\.\d{3}) prefix_calls_per_pod=(\d+\.\d{3}) cold_add_p99_ms=(\d+\.\d)$`).FindStringSubmatch(out.String())
	if m == nil {
		t.Fatalf("no summary line in the output")
	}
	for i, v := range f.perPod {
		if got, _ := strconv.ParseFloat(m[1+i], 64); got != float64(int(v*1000+0.5))/1000 {
			t.Errorf("summary says %s calls per pod, the run measured %.4f", m[1+i], v)
		}
	}
	sec, pfx := f.cold[0], f.cold[1]
	if sec.adds != b.Cold || len(sec.cold) < b.Cold/b.Pool.BatchSize {
		t.Errorf("secondary IPs: %d of %d ADDs called EC2; a batch of %d is one call, so at least %d should", len(sec.cold), sec.adds, b.Pool.BatchSize, b.Cold/b.Pool.BatchSize)
	}
	if len(sec.withENI) == 0 {
		t.Errorf("secondary IPs: %d ADDs and none made an ENI (the primary ENI holds 14)", sec.adds)
	}
	// A /28 serves 16 ADDs: fewer calls than batches.
	if len(pfx.cold) == 0 || len(pfx.cold) >= len(sec.cold) {
		t.Errorf("prefixes: %d cold ADDs, secondary IPs %d: a prefix should serve several batches", len(pfx.cold), len(sec.cold))
	}
}
