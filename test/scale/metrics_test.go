package scale

import (
	"bufio"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// sample is one line of the Prometheus text format: a name, its labels
// and a value.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics reads the text format; comments and lines it cannot read
// are skipped (the figures it needs are checked for by the caller).
func parseMetrics(text string) []sample {
	var out []sample
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<24)
	for sc.Scan() {
		l := sc.Text()
		if l == "" || l[0] == '#' {
			continue
		}
		s := sample{labels: map[string]string{}}
		rest := l
		if i := strings.IndexByte(l, '{'); i >= 0 {
			j := strings.LastIndexByte(l, '}')
			if j < i {
				continue
			}
			s.name = l[:i]
			for _, kv := range splitLabels(l[i+1 : j]) {
				k, v, ok := strings.Cut(kv, "=")
				if ok {
					s.labels[k] = strings.Trim(v, `"`)
				}
			}
			rest = strings.TrimSpace(l[j+1:])
		} else {
			f := strings.Fields(l)
			if len(f) < 2 {
				continue
			}
			s.name, rest = f[0], f[1]
		}
		f := strings.Fields(rest)
		if len(f) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			continue
		}
		s.value = v
		out = append(out, s)
	}
	return out
}

// splitLabels splits `a="x",b="y,z"` at the commas outside quotes.
func splitLabels(s string) []string {
	var out []string
	quoted, start := false, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			quoted = !quoted
		case ',':
			if !quoted {
				out = append(out, s[start:i])
				start = i + 1
			}
		}
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// match: every label in want has that value.
func (s sample) match(name string, want map[string]string) bool {
	if s.name != name {
		return false
	}
	for k, v := range want {
		if s.labels[k] != v {
			return false
		}
	}
	return true
}

// sum adds up the samples of name with the labels in want.
func sum(ss []sample, name string, want map[string]string) float64 {
	t := 0.0
	for _, s := range ss {
		if s.match(name, want) {
			t += s.value
		}
	}
	return t
}

// histogram is a cumulative Prometheus histogram: upper bounds and counts.
type histogram struct {
	le     []float64
	counts []float64
}

// histogramOf gathers the buckets of name_bucket with the labels in want
// (summed over the labels not named).
func histogramOf(ss []sample, name string, want map[string]string) histogram {
	by := map[float64]float64{}
	for _, s := range ss {
		if !s.match(name+"_bucket", want) {
			continue
		}
		le, err := strconv.ParseFloat(s.labels["le"], 64)
		if err != nil {
			continue
		}
		by[le] += s.value
	}
	var h histogram
	for le := range by {
		h.le = append(h.le, le)
	}
	sort.Float64s(h.le)
	for _, le := range h.le {
		h.counts = append(h.counts, by[le])
	}
	return h
}

// minus is the histogram of what was observed since before.
func (h histogram) minus(before histogram) histogram {
	out := histogram{le: h.le, counts: make([]float64, len(h.counts))}
	for i, le := range h.le {
		b := 0.0
		for j, ble := range before.le {
			if ble == le {
				b = before.counts[j]
			}
		}
		out.counts[i] = h.counts[i] - b
	}
	return out
}

func (h histogram) total() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// quantile interpolates linearly inside the bucket the rank falls in, as
// PromQL's histogram_quantile does; it also returns that bucket's bounds,
// for a reader to judge the resolution.
func (h histogram) quantile(q float64) (v, lo, hi float64) {
	n := h.total()
	if n == 0 {
		return math.NaN(), 0, 0
	}
	rank := q * n
	prevLe, prevCount := 0.0, 0.0
	for i, le := range h.le {
		if h.counts[i] >= rank {
			if math.IsInf(le, 1) {
				return prevLe, prevLe, le
			}
			in := h.counts[i] - prevCount
			if in == 0 {
				return le, prevLe, le
			}
			return prevLe + (le-prevLe)*(rank-prevCount)/in, prevLe, le
		}
		prevLe, prevCount = le, h.counts[i]
	}
	return prevLe, prevLe, math.Inf(1)
}

func (h histogram) String() string {
	var b strings.Builder
	prev := 0.0
	for i, le := range h.le {
		fmt.Fprintf(&b, " ≤%gs:%.0f", le, h.counts[i]-prev)
		prev = h.counts[i]
	}
	return strings.TrimSpace(b.String())
}

// percentile of sorted durations in ms.
func percentile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[max(0, min(i, len(sorted)-1))]
}
