package metrics_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// A small PromQL scanner, enough to say which series a dashboard query
// reads and which labels it names. It does not evaluate anything: it
// finds the metric names (every identifier that is not a function, an
// aggregation or a keyword), the label names of their matchers, and the
// label names of by/without/on/ignoring/group_left/group_right lists.

// selector is one metric reference, e.g. foo_bucket{a="x", b!="y"}.
type selector struct {
	name   string
	labels []string // label names of its matchers
}

// query is what one expression names.
type query struct {
	selectors []selector
	grouping  []string // labels of by/without/on/ignoring/group_* lists
}

// keywords are PromQL words that are not metric names even without a
// parenthesis after them (aggregations may put by (...) first).
var keywords = map[string]bool{
	"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true,
	"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true,
	"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true,
	"limitk": true, "limit_ratio": true, "inf": true, "nan": true,
}

// groupingWords take a parenthesised list of label names.
var groupingWords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z'
}

func isIdent(c byte) bool { return isIdentStart(c) || c >= '0' && c <= '9' }

// parsePromQL scans expr; an expression it cannot follow (an unclosed
// brace, a matcher without a value) is an error, never a guess.
func parsePromQL(expr string) (query, error) {
	var q query
	s := expr
	i, depth := 0, 0
	skipSpace := func() {
		for i < len(s) && strings.ContainsRune(" \t\r\n", rune(s[i])) {
			i++
		}
	}
	ident := func() string {
		start := i
		for i < len(s) && isIdent(s[i]) {
			i++
		}
		return s[start:i]
	}
	str := func() error {
		quote := s[i]
		for i++; i < len(s); i++ {
			switch {
			case s[i] == '\\' && quote != '`':
				i++
			case s[i] == quote:
				i++
				return nil
			}
		}
		return fmt.Errorf("unterminated string in %q", expr)
	}
	// labelList reads "(a, b)" after a grouping word.
	labelList := func() ([]string, error) {
		i++ // (
		var out []string
		for {
			skipSpace()
			switch {
			case i >= len(s):
				return nil, fmt.Errorf("unclosed label list in %q", expr)
			case s[i] == ')':
				i++
				return out, nil
			case s[i] == ',':
				i++
			case isIdentStart(s[i]):
				out = append(out, ident())
			default:
				return nil, fmt.Errorf("unexpected %q in a label list of %q", s[i], expr)
			}
		}
	}
	// matchers reads "{a="x", b=~"y"}" and returns the label names.
	matchers := func() ([]string, error) {
		i++ // {
		var out []string
		for {
			skipSpace()
			switch {
			case i >= len(s):
				return nil, fmt.Errorf("unclosed matchers in %q", expr)
			case s[i] == '}':
				i++
				return out, nil
			case s[i] == ',':
				i++
				continue
			case !isIdentStart(s[i]):
				return nil, fmt.Errorf("unexpected %q in the matchers of %q", s[i], expr)
			}
			out = append(out, ident())
			skipSpace()
			for i < len(s) && strings.ContainsRune("=!~", rune(s[i])) {
				i++
			}
			skipSpace()
			if i >= len(s) || !strings.ContainsRune("\"'`", rune(s[i])) {
				return nil, fmt.Errorf("matcher %s without a quoted value in %q", out[len(out)-1], expr)
			}
			if err := str(); err != nil {
				return nil, err
			}
		}
	}
	for i < len(s) {
		c := s[i]
		switch {
		case strings.ContainsRune(" \t\r\n", rune(c)):
			i++
		case c == '"' || c == '\'' || c == '`':
			if err := str(); err != nil {
				return q, err
			}
		case c == '[': // a range or subquery: durations and variables only
			end := strings.IndexByte(s[i:], ']')
			if end < 0 {
				return q, fmt.Errorf("unclosed range in %q", expr)
			}
			i += end + 1
		case c >= '0' && c <= '9' || c == '.':
			for i < len(s) && (isIdent(s[i]) || s[i] == '.') {
				i++
			}
		case c == '$': // a dashboard variable outside a string
			i++
			if i < len(s) && s[i] == '{' {
				end := strings.IndexByte(s[i:], '}')
				if end < 0 {
					return q, fmt.Errorf("unclosed variable in %q", expr)
				}
				i += end + 1
			} else {
				ident()
			}
		case c == '{':
			return q, fmt.Errorf("a selector without a metric name in %q: name the metric", expr)
		case isIdentStart(c):
			word := ident()
			skipSpace()
			next := byte(0)
			if i < len(s) {
				next = s[i]
			}
			lower := strings.ToLower(word)
			switch {
			case groupingWords[lower] && next == '(':
				labels, err := labelList()
				if err != nil {
					return q, err
				}
				q.grouping = append(q.grouping, labels...)
			case keywords[lower], next == '(':
				// an operator, an aggregation or a function
			default:
				sel := selector{name: word}
				if next == '{' {
					labels, err := matchers()
					if err != nil {
						return q, err
					}
					sel.labels = labels
				}
				q.selectors = append(q.selectors, sel)
			}
		case c == '(':
			depth++
			i++
		case c == ')':
			if depth--; depth < 0 {
				return q, fmt.Errorf("unbalanced ')' in %q", expr)
			}
			i++
		default:
			i++ // an operator or a comma
		}
	}
	if depth != 0 {
		return q, fmt.Errorf("unclosed '(' in %q", expr)
	}
	return q, nil
}

func TestParsePromQL(t *testing.T) {
	for _, c := range []struct {
		expr string
		want query
	}{
		{`vpcni_allocations`, query{selectors: []selector{{name: "vpcni_allocations"}}}},
		{`histogram_quantile(0.99, sum by (le, op) (rate(x_bucket{op="assign", instance=~"$instance"}[$__rate_interval])))`,
			query{selectors: []selector{{name: "x_bucket", labels: []string{"op", "instance"}}}, grouping: []string{"le", "op"}}},
		{`sum without(a)(rate(b_total{c!="}"}[5m])) / on (d) group_left(e) f > 0`,
			query{selectors: []selector{{name: "b_total", labels: []string{"c"}}, {name: "f"}}, grouping: []string{"a", "d", "e"}}},
		{`max by (kind) (g{verdict="held"}) and on(instance) h{i='x'} offset 1h`,
			query{selectors: []selector{{name: "g", labels: []string{"verdict"}}, {name: "h", labels: []string{"i"}}}, grouping: []string{"kind", "instance"}}},
		{`label_replace(up, "dst", "$1", "src", "(.*)")`, query{selectors: []selector{{name: "up"}}}},
	} {
		got, err := parsePromQL(c.expr)
		if err != nil {
			t.Errorf("%s: %v", c.expr, err)
			continue
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s:\n got %+v\nwant %+v", c.expr, got, c.want)
		}
	}
	for _, bad := range []string{`x{a="b"`, `x{a}`, `{__name__="x"}`, `sum by (a (x)`, `x{a="b}`, `sum(rate(x[5m])`, `x)`} {
		if _, err := parsePromQL(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
