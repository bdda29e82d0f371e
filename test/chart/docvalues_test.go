package chart

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"gopkg.in/yaml.v3"
)

// notValues are names in the docs that read like value paths but are not
// values.
var notValues = map[string]string{
	"peer.fastblk.csi.io":                   "the DNS name in the peer certificates (docs/peer.md)",
	"updateStrategy.rollingUpdate.maxSurge": "named as what the schema refuses",
}

// TestDocsNameOnlyRealValues fails when a doc names a chart value that
// values.yaml does not have: the chart README (its prose; the values
// table is generated from values.yaml, and TestReadmeIsFresh holds it to
// it), NOTES.txt, the comments of values.yaml, the repository's README and
// docs/. A value path is a top-level key of values.yaml followed by one or
// more ".key" or "[N]" steps, as in `peer.serveData` or
// `--set storageClasses[0].maxIOPS=1000`. Below a list or a map of free
// keys (labels, nodeSelector), where values.yaml has no keys to check
// against, the steps must be what values.schema.json allows there.
func TestDocsNameOnlyRealValues(t *testing.T) {
	root := repoRoot(t)
	chart := filepath.Join(root, "charts", "csi-fastblk")
	vals := readValues(t, filepath.Join(chart, "values.yaml"), filepath.Join(chart, "values.schema.json"))
	docs := []string{
		filepath.Join(chart, "README.md"),
		filepath.Join(chart, "values.yaml"),
		filepath.Join(chart, "templates", "NOTES.txt"),
		filepath.Join(root, "README.md"),
	}
	more, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, more...)
	seen := 0
	for _, doc := range docs {
		for _, ref := range vals.references(t, doc) {
			seen++
			if _, ok := notValues[ref.path]; ok {
				continue
			}
			if err := vals.check(ref.path); err != "" {
				rel, _ := filepath.Rel(root, doc)
				t.Errorf("%s:%d names the chart value %s, %s", rel, ref.line, ref.path, err)
			}
		}
	}
	if seen < 50 {
		t.Errorf("found only %d value paths in the docs: is the pattern still right?", seen)
	}
}

// values is what values.yaml holds and what values.schema.json allows.
type values struct {
	paths  map[string]bool // every key path of values.yaml, lists as "[]"
	schema map[string]any
	refs   *regexp.Regexp // a value path that starts with a top-level key
}

func readValues(t *testing.T, valuesFile, schemaFile string) *values {
	t.Helper()
	raw, err := os.ReadFile(valuesFile)
	if err != nil {
		t.Fatal(err)
	}
	var tree map[string]any
	if err := yaml.Unmarshal(raw, &tree); err != nil {
		t.Fatal(err)
	}
	v := &values{paths: map[string]bool{}}
	v.add("", tree)
	if raw, err = os.ReadFile(schemaFile); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(raw, &v.schema); err != nil {
		t.Fatal(err)
	}
	var tops []string
	for k := range tree {
		tops = append(tops, regexp.QuoteMeta(k))
	}
	// Longest first, so that "snapshotController" is not read as
	// "snapshot" and more. Steps start with a lower-case letter, as the
	// chart's keys do: "peer.EnsureCA" is Go.
	slices.SortFunc(tops, func(a, b string) int { return len(b) - len(a) })
	v.refs = regexp.MustCompile(`(?:^|[^\w./$-])((?:` + strings.Join(tops, "|") + `)(?:\[\d*\])?(?:\.[a-z][A-Za-z0-9_]*(?:\[\d*\])?)+)`)
	return v
}

func (v *values) add(prefix string, node any) {
	switch n := node.(type) {
	case map[string]any:
		for k, c := range n {
			p := k
			if prefix != "" {
				p = prefix + "." + k
			}
			v.paths[p] = true
			v.add(p, c)
		}
	case []any:
		for _, c := range n {
			v.add(prefix+"[]", c)
		}
	}
}

// reference is a value path named on a line of a doc.
type reference struct {
	path string
	line int
}

var (
	listIndex = regexp.MustCompile(`\[\d*\]`)
	fileName  = regexp.MustCompile(`^[a-z-]+\.(md|go|yaml|json|txt|sh|png)$`)
)

// references finds the value paths a doc names, lists' indexes as "[]".
func (v *values) references(t *testing.T, doc string) []reference {
	t.Helper()
	raw, err := os.ReadFile(doc)
	if err != nil {
		t.Fatal(err)
	}
	var refs []reference
	for i, line := range strings.Split(string(raw), "\n") {
		for _, m := range v.refs.FindAllStringSubmatch(line, -1) {
			if fileName.MatchString(m[1]) {
				continue // a link to metrics.md, not a value
			}
			refs = append(refs, reference{path: listIndex.ReplaceAllString(m[1], "[]"), line: i + 1})
		}
	}
	return refs
}

// check says what is wrong with a value path, or "". A path values.yaml
// has is right. Otherwise its longest prefix that values.yaml has must be
// a list or a map of free keys, and the schema must allow the rest.
func (v *values) check(path string) string {
	if v.paths[path] {
		return ""
	}
	steps := splitSteps(path)
	known := 0
	for i := range steps {
		if v.paths[strings.Join(steps[:i+1], "")] {
			known = i + 1
		}
	}
	node := v.resolve(v.schemaAt(steps[:known]))
	if node == nil {
		return "which values.yaml does not have"
	}
	if known == len(steps) || (steps[known] != "[]" && !free(node)) {
		return "which values.yaml does not have"
	}
	for _, s := range steps[known:] {
		if node = v.schemaStep(node, s); node == nil {
			return "which neither values.yaml nor values.schema.json has"
		}
	}
	return ""
}

// splitSteps splits "a.b[].c" into "a", ".b", "[]", ".c".
func splitSteps(path string) []string {
	var steps []string
	for path != "" {
		i := strings.IndexAny(path[1:], ".[")
		if i < 0 {
			return append(steps, path)
		}
		steps = append(steps, path[:i+1])
		path = path[i+1:]
	}
	return steps
}

// schemaAt follows steps from the schema's root.
func (v *values) schemaAt(steps []string) map[string]any {
	node := v.schema
	for _, s := range steps {
		if node = v.schemaStep(node, s); node == nil {
			return nil
		}
	}
	return node
}

// schemaStep is the schema of step s ("key", ".key" or "[]") below node:
// a property, the items of an array, or a free key's schema.
func (v *values) schemaStep(node map[string]any, s string) map[string]any {
	node = v.resolve(node)
	if s == "[]" {
		items, _ := node["items"].(map[string]any)
		return items
	}
	key := strings.TrimPrefix(s, ".")
	if props, ok := node["properties"].(map[string]any); ok {
		if p, ok := props[key].(map[string]any); ok {
			return p
		}
	}
	if free(node) {
		if extra, ok := v.resolve(node)["additionalProperties"].(map[string]any); ok {
			return extra
		}
		return map[string]any{}
	}
	return nil
}

// resolve follows a "$ref" to the schema's definitions.
func (v *values) resolve(node map[string]any) map[string]any {
	ref, ok := node["$ref"].(string) // a nil node has none
	if !ok {
		return node
	}
	defs, _ := v.schema["definitions"].(map[string]any)
	def, _ := defs[strings.TrimPrefix(ref, "#/definitions/")].(map[string]any)
	return def
}

// free reports whether an object's keys are the user's own: it names no
// properties, or admits others beside them.
func free(node map[string]any) bool {
	if _, ok := node["additionalProperties"].(map[string]any); ok {
		return true
	}
	_, props := node["properties"]
	return !props && node["additionalProperties"] != false && node["type"] == "object"
}
