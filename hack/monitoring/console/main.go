// Command console turns the chart's Grafana dashboard into a Prometheus
// console template, so that hack/monitoring/screenshot.sh can show the
// dashboard's own queries, on real data, in Prometheus' UI where Grafana
// cannot run. Every panel keeps its title, description, queries and
// legends; the dashboard's variables select everything ($node, $namespace
// and $pvc become .*) and $__rate_interval becomes -rate. Time series and
// state panels become console graphs, stat and table panels tables of the
// instant results.
//
//	go run ./hack/monitoring/console [-rate 30s] [-duration 600] DASHBOARD.json >consoles/csi-fastblk.html
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"html"
	"io"
	"os"
	"regexp"
	"strconv"
	"strings"
)

type panel struct {
	Type        string `json:"type"`
	Title       string `json:"title"`
	Description string `json:"description"`
	Targets     []struct {
		Expr         string `json:"expr"`
		LegendFormat string `json:"legendFormat"`
	} `json:"targets"`
	FieldConfig struct {
		Defaults struct {
			Unit string `json:"unit"`
		} `json:"defaults"`
	} `json:"fieldConfig"`
	Panels []panel `json:"panels"`
}

func main() {
	rate := flag.String("rate", "30s", "what $__rate_interval becomes")
	duration := flag.Int("duration", 600, "seconds each graph covers")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: console [-rate D] [-duration S] DASHBOARD.json")
		os.Exit(2)
	}
	if err := run(os.Stdout, flag.Arg(0), *rate, *duration); err != nil {
		fmt.Fprintln(os.Stderr, "console:", err)
		os.Exit(1)
	}
}

func run(w io.Writer, file, rate string, duration int) error {
	b, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var d struct {
		Title  string  `json:"title"`
		Panels []panel `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return fmt.Errorf("decode %s: %w", file, err)
	}
	vars := strings.NewReplacer("$__rate_interval", rate, "$node", ".*", "$namespace", ".*", "$pvc", ".*")
	fmt.Fprintf(w, `{{ template "head" . }}
{{ template "prom_content_head" . }}
<style>.fb-grid{display:grid;grid-template-columns:1fr 1fr;gap:12px 24px}.fb-grid h2{grid-column:1/3;margin:12px 0 0}
.fb-panel h4{margin:0;font-size:1rem}.fb-panel p{margin:0 0 4px;color:#666;font-size:.8rem}.fb-panel td{font-size:.8rem}</style>
<h1>%s <small>(the Grafana dashboard's queries, rendered by Prometheus)</small></h1>
<div class="fb-grid">
`, html.EscapeString(d.Title))
	n := 0
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			if p.Type == "row" {
				fmt.Fprintf(w, "<h2>%s</h2>\n", html.EscapeString(p.Title))
				walk(p.Panels)
				continue
			}
			n++
			fmt.Fprintf(w, "<div class=\"fb-panel\"><h4>%s</h4><p>%s</p>\n", html.EscapeString(p.Title), html.EscapeString(p.Description))
			switch p.Type {
			case "timeseries", "state-timeline":
				graph(w, n, p, vars, duration)
			default:
				table(w, p, vars)
			}
			fmt.Fprintln(w, "</div>")
		}
	}
	walk(d.Panels)
	fmt.Fprint(w, "</div>\n{{ template \"prom_content_tail\" . }}\n{{ template \"tail\" }}\n")
	return nil
}

var legendVar = regexp.MustCompile(`\{\{\s*(\w+)\s*\}\}`)

func graph(w io.Writer, n int, p panel, vars *strings.Replacer, duration int) {
	var exprs, names []string
	for _, t := range p.Targets {
		exprs = append(exprs, vars.Replace(t.Expr))
		names = append(names, legendVar.ReplaceAllString(t.LegendFormat, "[[$1]]"))
	}
	format := "humanize"
	switch p.FieldConfig.Defaults.Unit {
	case "bytes", "Bps":
		format = "humanize1024"
	case "s":
		format = "humanizeNoSmallPrefix"
	}
	ej, _ := json.Marshal(exprs)
	nj, _ := json.Marshal(names)
	// The JSON goes into a Go template: its {{ and }} must not be actions.
	esc := strings.NewReplacer("{{", `{{"{{"}}`, "}}", `{{"}}"}}`)
	fmt.Fprintf(w, `<div id="g%d"></div>
<script>new PromConsole.Graph({node: document.querySelector("#g%d"), expr: %s, name: %s, duration: %d,
  height: 180, yUnits: %q, yAxisFormatter: PromConsole.NumberFormatter.%s, yHoverFormatter: PromConsole.NumberFormatter.%s});</script>
`, n, n, esc.Replace(string(ej)), esc.Replace(string(nj)), duration, p.FieldConfig.Defaults.Unit, format, format)
}

func table(w io.Writer, p panel, vars *strings.Replacer) {
	fmt.Fprintln(w, `<table class="table table-sm table-bordered">`)
	for _, t := range p.Targets {
		if len(p.Targets) > 1 {
			fmt.Fprintf(w, "<tr><th colspan=\"2\">%s</th></tr>\n", html.EscapeString(strings.ReplaceAll(vars.Replace(t.Expr), "{{", "{{\"{{\"}}")))
		}
		fmt.Fprintf(w, `{{ range query %s }}<tr><td>{{ range $k, $v := .Labels }}{{ if ne $k "__name__" }}{{ $k }}=<b>{{ $v }}</b> {{ end }}{{ end }}</td><td>{{ .Value | humanize }}</td></tr>{{ end }}
`, strconv.Quote(vars.Replace(t.Expr)))
	}
	fmt.Fprintln(w, "</table>")
}
