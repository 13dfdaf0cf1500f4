package metrics_test

import (
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vpcni/vpcni/internal/controller"
	"github.com/vpcni/vpcni/internal/leaks"
	"github.com/vpcni/vpcni/internal/metrics"
)

const dashboardPath = "../../deploy/grafana/vpcni.json"

// targetLabels are the labels Prometheus adds to every scraped series.
var targetLabels = []string{"instance", "job"}

// served is every metric vpcnid and vpcni-controller register, with its
// label names, read from the collectors' descriptors: built as the
// binaries build them (the agent: metrics.New and Watch, as agent.New
// does; the controller: controller.Collectors with the leak collector
// on, as vpcni-controller does with -cloud-config).
func served(t *testing.T) map[string][]string {
	t.Helper()
	agent := metrics.New()
	agent.Watch(func() metrics.Snapshot { return metrics.Snapshot{} })
	controller := controller.Collectors(&controller.BlockMetrics{}, &controller.RouteMetrics{}, &leaks.Collector{})
	ch := make(chan *prometheus.Desc)
	go func() {
		agent.Describe(ch)
		for _, c := range controller {
			c.Describe(ch)
		}
		close(ch)
	}()
	out := map[string][]string{}
	for d := range ch {
		name, labels, err := parseDesc(d)
		if err != nil {
			t.Fatal(err)
		}
		out[name] = labels
	}
	// The instruments the agent's code uses: if Describe missed them, the
	// descriptors would be read wrongly, and every check below with them.
	for _, want := range []string{"vpcni_pool_addresses", "vpcni_cni_request_duration_seconds", "vpcni_controller_blocks", "vpcni_leak_holdings", "go_goroutines"} {
		if _, ok := out[want]; !ok {
			t.Fatalf("%s is not among the %d described metrics: the descriptors were not read", want, len(out))
		}
	}
	return out
}

var (
	descName      = regexp.MustCompile(`^Desc\{fqName: "([^"]+)"`)
	descConst     = regexp.MustCompile(`constLabels: \{(.*?)\}, variableLabels:`)
	descConstName = regexp.MustCompile(`(?:^|,)([A-Za-z_][A-Za-z0-9_]*)=`)
	descVariable  = regexp.MustCompile(`variableLabels: \{([^}]*)\}\}$`)
)

// parseDesc reads a descriptor's name and label names from its String():
// client_golang has no accessors for them.
func parseDesc(d *prometheus.Desc) (string, []string, error) {
	if err := d.Err(); err != nil {
		return "", nil, err
	}
	s := d.String()
	m := descName.FindStringSubmatch(s)
	v := descVariable.FindStringSubmatch(s)
	if m == nil || v == nil {
		return "", nil, fmt.Errorf("cannot read the descriptor %s (has client_golang's Desc.String changed?)", s)
	}
	var labels []string
	if c := descConst.FindStringSubmatch(s); c != nil {
		for _, l := range descConstName.FindAllStringSubmatch(c[1], -1) {
			labels = append(labels, l[1])
		}
	}
	for _, l := range strings.Split(v[1], ",") {
		if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
			labels = append(labels, l)
		}
	}
	return m[1], labels, nil
}

// resolve finds the metric a series name belongs to: itself, or the
// histogram (or summary) whose _bucket, _sum or _count series it is. A
// descriptor does not say its metric's type, so a counter (named _total,
// as client_golang's linter insists) is the one kind told apart: it has
// no such series.
func resolve(metricsByName map[string][]string, series string) (labels []string, ok bool) {
	if l, ok := metricsByName[series]; ok {
		return append(slices.Clone(l), targetLabels...), true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, found := strings.CutSuffix(series, suffix)
		if l, ok := metricsByName[base]; found && ok && !strings.HasSuffix(base, "_total") {
			l = append(slices.Clone(l), targetLabels...)
			if suffix == "_bucket" {
				l = append(l, "le")
			}
			return l, true
		}
	}
	return nil, false
}

// checkQuery says what in one expression (and its legend) names a metric
// or a label the binaries do not serve.
func checkQuery(metricsByName map[string][]string, expr, legend string) []error {
	q, err := parsePromQL(expr)
	if err != nil {
		return []error{err}
	}
	if len(q.selectors) == 0 {
		return []error{fmt.Errorf("%q reads no metric", expr)}
	}
	var errs []error
	var all [][]string
	for _, sel := range q.selectors {
		labels, ok := resolve(metricsByName, sel.name)
		if !ok {
			errs = append(errs, fmt.Errorf("%q: no binary serves metric %s", expr, sel.name))
			continue
		}
		all = append(all, labels)
		for _, l := range sel.labels {
			if !slices.Contains(labels, l) {
				errs = append(errs, fmt.Errorf("%q: metric %s has no label %s (it has %v)", expr, sel.name, l, labels))
			}
		}
	}
	// A grouping label must be on every series the expression reads.
	for _, l := range q.grouping {
		for i, labels := range all {
			if !slices.Contains(labels, l) {
				errs = append(errs, fmt.Errorf("%q: groups by %s, which %s does not have", expr, l, q.selectors[i].name))
			}
		}
	}
	for _, m := range legendLabel.FindAllStringSubmatch(legend, -1) {
		if !slices.ContainsFunc(all, func(labels []string) bool { return slices.Contains(labels, m[1]) }) {
			errs = append(errs, fmt.Errorf("%q: legend %q names %s, which no series of it has", expr, legend, m[1]))
		}
	}
	return errs
}

var (
	legendLabel = regexp.MustCompile(`\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}`)
	labelValues = regexp.MustCompile(`^label_values\(\s*(.+?)\s*,\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)$`)
)

// dashboard is the part of Grafana's JSON model the test reads.
type dashboard struct {
	Panels     []panel `json:"panels"`
	Templating struct {
		List []struct {
			Name       string `json:"name"`
			Type       string `json:"type"`
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

type panel struct {
	Type    string  `json:"type"`
	Title   string  `json:"title"`
	Panels  []panel `json:"panels"` // a collapsed row's
	Targets []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
}

func TestDashboardQueriesServedMetrics(t *testing.T) {
	data, err := os.ReadFile(dashboardPath)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(data, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	byName := served(t)
	used := map[string]bool{}
	var rows, graphs int
	var walk func(ps []panel, row string)
	walk = func(ps []panel, row string) {
		for _, p := range ps {
			if p.Type == "row" {
				rows++
				walk(p.Panels, p.Title)
				row = p.Title
				continue
			}
			graphs++
			if row == "" {
				t.Errorf("panel %q is in no row", p.Title)
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q queries nothing", p.Title)
			}
			for _, tg := range p.Targets {
				for _, err := range checkQuery(byName, tg.Expr, tg.LegendFormat) {
					t.Errorf("panel %q (row %q): %v", p.Title, row, err)
				}
				if q, err := parsePromQL(tg.Expr); err == nil {
					for _, s := range q.selectors {
						used[s.name] = true
					}
				}
			}
		}
	}
	walk(d.Panels, "")
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		m := labelValues.FindStringSubmatch(v.Definition)
		if m == nil {
			t.Errorf("variable %s: %q is not label_values(metric, label)", v.Name, v.Definition)
			continue
		}
		for _, err := range checkQuery(byName, m[1], "{{"+m[2]+"}}") {
			t.Errorf("variable %s: %v", v.Name, err)
		}
	}
	// Every vpcni metric has a panel: one added to the code and not to the
	// dashboard fails here too.
	for name := range byName {
		if !strings.HasPrefix(name, "vpcni_") {
			continue
		}
		if !used[name] && !used[name+"_bucket"] && !used[name+"_sum"] && !used[name+"_count"] {
			t.Errorf("no panel shows %s", name)
		}
	}
	if !t.Failed() {
		t.Logf("%d rows, %d panels, %d vpcni metrics served, all on the dashboard", rows, graphs, countPrefix(byName, "vpcni_"))
	}
}

func countPrefix(m map[string][]string, prefix string) int {
	n := 0
	for k := range m {
		if strings.HasPrefix(k, prefix) {
			n++
		}
	}
	return n
}

// TestDashboardCheckCatchesRenames: the check refuses what a rename in the
// code would leave behind, so the dashboard test cannot pass vacuously.
func TestDashboardCheckCatchesRenames(t *testing.T) {
	byName := served(t)
	for _, c := range []struct{ expr, legend, want string }{
		{`vpcni_pool_address{state="free"}`, "", "no binary serves metric vpcni_pool_address"},
		{`vpcni_pool_addresses{status="free"}`, "", "has no label status"},
		{`sum by (node) (vpcni_allocations)`, "", "groups by node"},
		{`rate(vpcni_cloud_calls_total[5m])`, "{{operation}}", "names operation"},
		{`vpcni_cloud_calls_total_bucket`, "", "no binary serves metric vpcni_cloud_calls_total_bucket"},
		{`vpcni_degraded{le="1"}`, "", "has no label le"},
		{`sum(rate(vpcni_controller_route_syncs_totals[5m]))`, "", "no binary serves"},
	} {
		errs := checkQuery(byName, c.expr, c.legend)
		if len(errs) == 0 || !strings.Contains(fmt.Sprint(errs), c.want) {
			t.Errorf("%s %s: got %v, want an error with %q", c.expr, c.legend, errs, c.want)
		}
	}
	good := `histogram_quantile(0.99, sum by (le, verb) (rate(vpcni_cni_request_duration_seconds_bucket{verb="ADD", instance=~"$instance"}[5m])))`
	if errs := checkQuery(byName, good, "{{verb}}"); len(errs) > 0 {
		t.Errorf("%s: %v", good, errs)
	}
}
