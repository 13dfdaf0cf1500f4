package ctl

import (
	"fmt"
	"math"
	"slices"
)

// spread is a figure measured over rounds: its median and quartiles, so
// that a reader can tell a difference from the scatter of the rounds.
type spread struct {
	med, q1, q3 float64
	n           int // rounds
}

// spreadOf is v's median and quartiles, interpolated linearly between the
// order statistics (numpy's default): with ten rounds a quartile is not
// one round's value.
func spreadOf(v []float64) spread {
	return spread{quantile(v, 0.5), quantile(v, 0.25), quantile(v, 0.75), len(v)}
}

func quantile(v []float64, q float64) float64 {
	if len(v) == 0 {
		return math.NaN()
	}
	s := slices.Clone(v)
	slices.Sort(s)
	pos := q * float64(len(s)-1)
	lo := int(math.Floor(pos))
	hi := min(lo+1, len(s)-1)
	return s[lo] + (pos-float64(lo))*(s[hi]-s[lo])
}

// format prints the median and the interquartile range with verb (e.g.
// "%.2f"): "1.02 [0.97–1.06]".
func (s spread) format(verb string) string {
	return fmt.Sprintf(verb+" ["+verb+"–"+verb+"]", s.med, s.q1, s.q3)
}

// contains says whether x lies within the interquartile range.
func (s spread) contains(x float64) bool { return s.q1 <= x && x <= s.q3 }

// ratios are a[i]/b[i], round by round.
func ratios(a, b []float64) []float64 {
	out := make([]float64, 0, min(len(a), len(b)))
	for i := range min(len(a), len(b)) {
		out = append(out, a[i]/b[i])
	}
	return out
}
