// Package monitoring lets the tests check the chart's monitoring pieces (the
// Grafana dashboard and the PrometheusRule) against the metric families a
// running plugin serves: it reads every query of the dashboard and every
// alert expression, names the metrics each one reads, and matches them
// with the families parsed from /metrics.
//
// Extracting names needs no PromQL parser: queries are plain PromQL (or
// Grafana's label_values(metric, label)), so removing strings, label
// matchers, ranges, grouping clauses and function names leaves the metric
// names.
package monitoring

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Conditional are the families a plugin serves only in some conditions,
// with the condition: a plugin on loop devices without a pids limit, as
// on the host, never shows them, so the host's check accepts them unseen,
// and test/e2e (TestConditionalFamilies) sees every one of them on a ublk
// plugin under a pids limit in the VM.
var Conditional = map[string]string{
	"fastblk_volume_io_latency_seconds":      "ublk devices (measured by the plugin's server)",
	"fastblk_volume_errors_total":            "ublk devices",
	"fastblk_volume_recoveries_total":        "ublk devices",
	"fastblk_volume_max_io_bytes":            "ublk devices",
	"fastblk_volume_throttled_ios_total":     "ublk devices (rate limits)",
	"fastblk_volume_throttled_seconds_total": "ublk devices (rate limits)",
	"fastblk_volume_limit_iops":              "volumes with maxIOPS (ublk)",
	"fastblk_volume_limit_bytes_per_second":  "volumes with maxBandwidth (ublk)",
	"fastblk_node_pids_headroom":             "a pids limit on the plugin's cgroup",
	"fastblk_ublk_devices_failing_io":        "the ublk backend",
}

// Query is one expression of the dashboard or the rules, and where it is.
type Query struct {
	Where, Expr string
}

// Families parses a /metrics answer in the text format into its family
// names and types.
func Families(r io.Reader) (map[string]dto.MetricType, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parse metrics: %w", err)
	}
	m := make(map[string]dto.MetricType, len(fams))
	for name, f := range fams {
		m[name] = f.GetType()
	}
	return m, nil
}

// DashboardQueries returns every query of a Grafana dashboard file: panel
// targets (rows' nested panels too) and template variables.
func DashboardQueries(path string) ([]Query, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var d struct {
		Panels     []panel `json:"panels"`
		Templating struct {
			List []struct {
				Name  string          `json:"name"`
				Type  string          `json:"type"`
				Query json.RawMessage `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("decode %s: %w", path, err)
	}
	var qs []Query
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			for _, t := range p.Targets {
				qs = append(qs, Query{fmt.Sprintf("panel %q target %s", p.Title, t.RefID), t.Expr})
			}
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	for _, v := range d.Templating.List {
		if v.Type != "query" {
			continue
		}
		var q struct {
			Query string `json:"query"`
		}
		if err := json.Unmarshal(v.Query, &q); err != nil {
			if err := json.Unmarshal(v.Query, &q.Query); err != nil {
				return nil, fmt.Errorf("variable %s: %w", v.Name, err)
			}
		}
		qs = append(qs, Query{fmt.Sprintf("variable %s", v.Name), q.Query})
	}
	return qs, nil
}

type panel struct {
	Title   string `json:"title"`
	Targets []struct {
		RefID string `json:"refId"`
		Expr  string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"`
}

var (
	alertLine = regexp.MustCompile(`^\s*- alert:\s*(\S+)`)
	exprLine  = regexp.MustCompile(`^\s*expr:\s*(.+)$`)
)

// RuleExprs returns the alert expressions of the chart's PrometheusRule
// template, read from its `- alert:` and `expr:` lines (Helm actions in
// them, such as thresholds, are left in: MetricNames ignores them).
func RuleExprs(path string) ([]Query, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var qs []Query
	alert := ""
	for _, line := range strings.Split(string(data), "\n") {
		if m := alertLine.FindStringSubmatch(line); m != nil {
			alert = m[1]
		} else if m := exprLine.FindStringSubmatch(line); m != nil && alert != "" {
			qs = append(qs, Query{"alert " + alert, m[1]})
			alert = ""
		} else if alert != "" && strings.HasPrefix(strings.TrimSpace(line), "- alert:") {
			return nil, fmt.Errorf("alert %s has no expr line", alert)
		}
	}
	return qs, nil
}

var (
	labelValues = regexp.MustCompile(`^\s*label_values\(\s*(.*?)\s*(,\s*[A-Za-z_]\w*\s*)?\)\s*$`)
	strLit      = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	braces      = regexp.MustCompile(`\{[^{}]*\}`)
	ranges      = regexp.MustCompile(`\[[^\[\]]*\]`)
	numbers     = regexp.MustCompile(`\b[0-9][0-9A-Za-z_.]*`) // 0.99, 1e3, 5m
	grouping    = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	ident       = regexp.MustCompile(`[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?`)
	keywords    = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan"}
)

// MetricNames returns the metric names a PromQL expression (or a Grafana
// label_values query) reads.
func MetricNames(expr string) []string {
	if m := labelValues.FindStringSubmatch(expr); m != nil {
		if m[2] == "" { // label_values(label): no metric
			return nil
		}
		expr = m[1]
	}
	e := strLit.ReplaceAllString(expr, " ")
	for _, re := range []*regexp.Regexp{braces, ranges} {
		for prev := ""; prev != e; {
			prev, e = e, re.ReplaceAllString(e, " ")
		}
	}
	e = grouping.ReplaceAllString(e, " ")
	e = numbers.ReplaceAllString(e, " ")
	var names []string
	for _, tok := range ident.FindAllString(e, -1) {
		if strings.HasSuffix(tok, "(") || slices.Contains(keywords, strings.ToLower(tok)) {
			continue
		}
		if !slices.Contains(names, tok) {
			names = append(names, tok)
		}
	}
	return names
}

// Family returns the family a sample name belongs to among fams: itself,
// or for _bucket, _sum and _count the histogram or summary it is part of.
// Names of Conditional families (their samples too) are theirs without
// being in fams.
func Family(name string, fams map[string]dto.MetricType) (string, bool) {
	if _, ok := fams[name]; ok {
		return name, true
	}
	if _, ok := Conditional[name]; ok {
		return name, true
	}
	if base, ok := strings.CutSuffix(name, "_bucket"); ok && Conditional[base] != "" {
		return base, true
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		if t, ok := fams[base]; ok && (t == dto.MetricType_HISTOGRAM || (t == dto.MetricType_SUMMARY && suffix != "_bucket")) {
			return base, true
		}
	}
	return "", false
}
