package ctl

import (
	"strings"
	"testing"
)

func TestSpreadAndVerdict(t *testing.T) {
	if s := spreadOf([]float64{4, 1, 3, 2}); s.med != 2.5 || s.q1 != 1.75 || s.q3 != 3.25 || s.n != 4 {
		t.Errorf("spread of 1..4: %+v, want median 2.5, quartiles 1.75 and 3.25", s)
	}
	if s := spreadOf([]float64{7}); s.med != 7 || s.q1 != 7 || s.q3 != 7 {
		t.Errorf("spread of one round: %+v", s)
	}
	if got := spreadOf([]float64{0.9, 1, 1.1}).format("%.2fx"); got != "1.00x [0.95x–1.05x]" {
		t.Errorf("format: %q", got)
	}
	// Throughput: higher is better; latency: lower is better. A range
	// that holds 1 decides nothing.
	for _, c := range []struct {
		v            []float64
		higherBetter bool
		want         string
	}{
		{[]float64{1.1, 1.2, 1.3, 1.2}, true, "faster"},
		{[]float64{1.1, 1.2, 1.3, 1.2}, false, "slower"},
		{[]float64{0.8, 0.9, 0.95, 0.9}, false, "faster"},
		{[]float64{0.8, 0.9, 0.95, 0.9}, true, "slower"},
		{[]float64{0.8, 1.0, 1.2, 1.0}, true, "no difference"},
		{[]float64{1.1, 1.2, 1.3}, true, "too few rounds"},
		{nil, true, "too few rounds"},
	} {
		if got := verdict(spreadOf(c.v), c.higherBetter); !strings.HasPrefix(got, c.want) {
			t.Errorf("verdict(%v, higher better %v) = %q, want %q…", c.v, c.higherBetter, got, c.want)
		}
	}
	if r := ratios([]float64{2, 3, 4}, []float64{1, 3}); len(r) != 2 || r[0] != 2 || r[1] != 1 {
		t.Errorf("ratios: %v", r)
	}
	m := measures{tput: map[string][]float64{"pod": {2}, "node": {1}}, rtt: map[string][]float64{"pod": {10}, "node": {20}}, crr: map[string][]float64{"pod": {3}, "node": {3}}}
	both := m.plus(m)
	if len(both.tput["pod"]) != 2 || len(both.rtt["node"]) != 2 {
		t.Fatalf("plus: %+v", both)
	}
	if r := both.ratio("pod", both, "node"); r.tput.med != 2 || r.rr.med != 0.5 || r.crr.med != 1 {
		t.Errorf("ratio pod/node: %+v", r)
	}
}
