// Command valuesdoc writes the values table of a Helm chart's README from
// the chart's values.yaml: one row per value, with its default and the
// comment above it. The table replaces what lies between the markers
// "<!-- values:begin -->" and "<!-- values:end -->" in README.md.
//
// A key's comment documents it and everything below it; a mapping whose keys
// carry no comments of their own (resources, updateStrategy) is one row.
// Comment lines indented by two or more spaces after the '#' are examples
// and are shown as code. Every value must be documented, by its own comment
// or an enclosing key's.
//
//	go run ./hack/chart/valuesdoc [-check] CHART_DIR
//
// With -check nothing is written: the command fails when README.md is not
// what it would write (make chart-readme regenerates it).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"gopkg.in/yaml.v3"
)

const (
	beginMarker = "<!-- values:begin -->"
	endMarker   = "<!-- values:end -->"
)

func main() {
	check := flag.Bool("check", false, "fail when README.md is stale instead of writing it")
	flag.Parse()
	if flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: valuesdoc [-check] CHART_DIR")
		os.Exit(2)
	}
	if err := run(flag.Arg(0), *check); err != nil {
		fmt.Fprintln(os.Stderr, "valuesdoc:", err)
		os.Exit(1)
	}
}

func run(dir string, check bool) error {
	values, err := os.ReadFile(filepath.Join(dir, "values.yaml"))
	if err != nil {
		return err
	}
	table, err := Table(values)
	if err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(dir, "values.yaml"), err)
	}
	readme := filepath.Join(dir, "README.md")
	old, err := os.ReadFile(readme)
	if err != nil {
		return err
	}
	updated, err := splice(old, table)
	if err != nil {
		return fmt.Errorf("%s: %w", readme, err)
	}
	if bytes.Equal(old, updated) {
		return nil
	}
	if check {
		return fmt.Errorf("%s is stale: its values table differs from values.yaml; run make chart-readme", readme)
	}
	return os.WriteFile(readme, updated, 0o644)
}

// splice replaces the text between the markers with table.
func splice(doc, table []byte) ([]byte, error) {
	b := bytes.Index(doc, []byte(beginMarker))
	e := bytes.Index(doc, []byte(endMarker))
	if b < 0 || e < b {
		return nil, fmt.Errorf("no %s ... %s section", beginMarker, endMarker)
	}
	var out bytes.Buffer
	out.Write(doc[:b+len(beginMarker)])
	out.WriteString("\n")
	out.Write(table)
	out.Write(doc[e:])
	return out.Bytes(), nil
}

// row is one line of the table.
type row struct {
	key, def, doc string
}

// Table renders the markdown table of the values in a values.yaml.
func Table(values []byte) ([]byte, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(values, &root); err != nil {
		return nil, fmt.Errorf("parse: %w", err)
	}
	if len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return nil, errors.New("not a mapping")
	}
	var rows []row
	var undocumented []string
	walk(root.Content[0], "", false, &rows, &undocumented)
	if len(undocumented) > 0 {
		return nil, fmt.Errorf("values without a comment on them or an enclosing key: %s", strings.Join(undocumented, ", "))
	}
	var b bytes.Buffer
	b.WriteString("| Key | Default | Meaning |\n|---|---|---|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| `%s` | %s | %s |\n", r.key, r.def, cell(r.doc))
	}
	return b.Bytes(), nil
}

// walk adds the rows of mapping m, whose keys are below prefix; documented
// says an enclosing key has a comment.
func walk(m *yaml.Node, prefix string, documented bool, rows *[]row, undocumented *[]string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		k, v := m.Content[i], m.Content[i+1]
		key := k.Value
		if prefix != "" {
			key = prefix + "." + k.Value
		}
		doc := comment(k.HeadComment)
		if v.Kind == yaml.MappingNode && len(v.Content) > 0 && hasComments(v) {
			if doc != "" {
				*rows = append(*rows, row{key: key, def: "", doc: doc})
			}
			walk(v, key, documented || doc != "", rows, undocumented)
			continue
		}
		if doc == "" && !documented {
			*undocumented = append(*undocumented, key)
		}
		*rows = append(*rows, row{key: key, def: "`" + strings.ReplaceAll(flow(v), "|", `\|`) + "`", doc: doc})
	}
}

// hasComments reports whether any key below mapping m has a head comment.
func hasComments(m *yaml.Node) bool {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].HeadComment != "" {
			return true
		}
		if v := m.Content[i+1]; v.Kind == yaml.MappingNode && hasComments(v) {
			return true
		}
	}
	return false
}

// flow renders a value on one line, as YAML flow style.
func flow(v *yaml.Node) string {
	if v.Kind == yaml.ScalarNode {
		if v.Value == "" || v.Style&(yaml.DoubleQuotedStyle|yaml.SingleQuotedStyle) != 0 {
			return fmt.Sprintf("%q", v.Value)
		}
		return v.Value
	}
	c := *v
	setFlow(&c)
	out, err := yaml.Marshal(&c)
	if err != nil {
		return "?"
	}
	return strings.TrimSpace(string(out))
}

func setFlow(n *yaml.Node) {
	if n.Kind == yaml.MappingNode || n.Kind == yaml.SequenceNode {
		n.Style = yaml.FlowStyle
		content := make([]*yaml.Node, len(n.Content))
		for i, c := range n.Content {
			cc := *c
			cc.HeadComment, cc.LineComment, cc.FootComment = "", "", ""
			setFlow(&cc)
			content[i] = &cc
		}
		n.Content = content
	}
}

// comment turns a head comment into one paragraph: prose lines are joined,
// example lines (indented two or more spaces after '#') become code.
func comment(c string) string {
	if c == "" {
		return ""
	}
	var parts []string
	for _, line := range strings.Split(c, "\n") {
		line = strings.TrimPrefix(line, "#")
		if strings.HasPrefix(line, "   ") || strings.HasPrefix(line, "  -") {
			parts = append(parts, "`"+strings.TrimSpace(line)+"`")
			continue
		}
		if line = strings.TrimSpace(line); line != "" {
			parts = append(parts, line)
		}
	}
	return strings.Join(parts, " ")
}

// cell escapes text for a table cell: pipes, and angle brackets, which
// markdown would take for HTML.
func cell(s string) string {
	return strings.NewReplacer("|", `\|`, "<", "&lt;", ">", "&gt;").Replace(s)
}
