package metrics_test

import (
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"
)

const alertsPath = "../../deploy/prometheus/vpcni-alerts.yaml"

// ruleFile is Prometheus's rule file format, the part vpcni's alerts use.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

type rule struct {
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	For         string            `json:"for"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// prometheusOwn are series Prometheus itself writes for every target, with
// their labels beyond instance and job.
var prometheusOwn = map[string][]string{"up": nil}

var annotationLabel = regexp.MustCompile(`\$labels\.([A-Za-z_][A-Za-z0-9_]*)`)

func readAlerts(t *testing.T) []rule {
	t.Helper()
	data, err := os.ReadFile(alertsPath)
	if err != nil {
		t.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		t.Fatalf("%s: %v", alertsPath, err)
	}
	var rules []rule
	for _, g := range f.Groups {
		rules = append(rules, g.Rules...)
	}
	if len(rules) == 0 {
		t.Fatalf("%s: no rules", alertsPath)
	}
	return rules
}

// checkAlert says what is wrong with one rule: an expression that reads a
// metric or label no binary serves (the scanner of promql_test.go, as for
// the dashboard), a bad for, a severity other than critical or warning,
// no summary, or an annotation naming a label the alert's series lack.
func checkAlert(byName map[string][]string, r rule) []error {
	var errs []error
	if !strings.HasPrefix(r.Alert, "Vpcni") {
		errs = append(errs, fmt.Errorf("alert %q: names start with Vpcni", r.Alert))
	}
	if strings.Contains(r.Expr, "\n") {
		errs = append(errs, fmt.Errorf("%s: the expression spans lines; the docs quote it on one", r.Alert))
	}
	errs = append(errs, checkQuery(byName, r.Expr, "")...)
	if d, err := time.ParseDuration(r.For); err != nil || d <= 0 {
		errs = append(errs, fmt.Errorf("%s: for %q, want a duration above 0 (an alert on one scrape flaps)", r.Alert, r.For))
	}
	if s := r.Labels["severity"]; s != "critical" && s != "warning" {
		errs = append(errs, fmt.Errorf("%s: severity %q, want critical or warning", r.Alert, s))
	}
	if r.Annotations["summary"] == "" {
		errs = append(errs, fmt.Errorf("%s: no summary", r.Alert))
	}
	q, err := parsePromQL(r.Expr)
	if err != nil {
		return errs // checkQuery said so
	}
	// An aggregation keeps only its by labels; else the first series'
	// labels (and the target's) reach the alert.
	have := q.grouping
	if len(have) == 0 && len(q.selectors) > 0 {
		have, _ = resolve(byName, q.selectors[0].name)
	}
	for _, m := range annotationLabel.FindAllStringSubmatch(strings.Join(slices.Collect(mapValues(r.Annotations)), " "), -1) {
		if !slices.Contains(have, m[1]) {
			errs = append(errs, fmt.Errorf("%s: an annotation names $labels.%s, which the alert's series lack (they have %v)", r.Alert, m[1], have))
		}
	}
	return errs
}

func mapValues(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}

// TestAlertsReadServedMetrics: every alert of deploy/prometheus reads
// metrics and labels vpcnid and vpcni-controller serve, and is well formed.
func TestAlertsReadServedMetrics(t *testing.T) {
	byName := served(t)
	for n, l := range prometheusOwn {
		byName[n] = l
	}
	rules := readAlerts(t)
	seen := map[string]bool{}
	for _, r := range rules {
		if seen[r.Alert] {
			t.Errorf("alert %s twice", r.Alert)
		}
		seen[r.Alert] = true
		for _, err := range checkAlert(byName, r) {
			t.Error(err)
		}
	}
	// The alerts the docs promise an operator.
	for _, want := range []string{"VpcniPoolExhausted", "VpcniPoolNearCapacity", "VpcniAgentDegraded", "VpcniLeaksFound", "VpcniRouteShortfall", "VpcniAgentDown", "VpcniControllerDown"} {
		if !seen[want] {
			t.Errorf("no alert %s", want)
		}
	}
	t.Logf("vpcni-test: %d alerts read served metrics and labels", len(rules))
}

// TestAlertCheckCatchesMistakes: the check above fails on a renamed
// metric, a label the metric has not, an annotation naming a label the
// aggregation dropped, and a missing for.
func TestAlertCheckCatchesMistakes(t *testing.T) {
	byName := served(t)
	good := rule{Alert: "VpcniX", Expr: `sum by (instance) (vpcni_pool_addresses{state="free"}) == 0`, For: "5m",
		Labels: map[string]string{"severity": "warning"}, Annotations: map[string]string{"summary": "{{ $labels.instance }}"}}
	if errs := checkAlert(byName, good); len(errs) > 0 {
		t.Fatalf("a good rule refused: %v", errs)
	}
	for what, change := range map[string]func(*rule){
		"renamed metric":   func(r *rule) { r.Expr = strings.Replace(r.Expr, "vpcni_pool_addresses", "vpcni_pool_address", 1) },
		"unknown label":    func(r *rule) { r.Expr = strings.Replace(r.Expr, "state=", "status=", 1) },
		"dropped label":    func(r *rule) { r.Annotations["summary"] = "{{ $labels.state }}" },
		"no for":           func(r *rule) { r.For = "" },
		"unknown grouping": func(r *rule) { r.Expr = strings.Replace(r.Expr, "by (instance)", "by (node_name)", 1) },
	} {
		r := good
		r.Annotations = map[string]string{"summary": good.Annotations["summary"]}
		change(&r)
		if errs := checkAlert(byName, r); len(errs) == 0 {
			t.Errorf("%s: %q passes the check", what, r.Expr)
		}
	}
}

// TestDocsQuoteAlerts: docs/observability.md names every alert with its
// expression as the rule file has it, so what an operator reads is what
// fires.
func TestDocsQuoteAlerts(t *testing.T) {
	data, err := os.ReadFile("../../docs/observability.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	for _, r := range readAlerts(t) {
		if !strings.Contains(doc, r.Alert) || !strings.Contains(doc, r.Expr) {
			t.Errorf("docs/observability.md lacks alert %s with its expression `%s`", r.Alert, r.Expr)
		}
	}
}
