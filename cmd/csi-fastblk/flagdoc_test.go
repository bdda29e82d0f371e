package main

import (
	"bufio"
	"flag"
	"os"
	"reflect"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/fastblk/csi-fastblk/pkg/blockdev/ublk"
)

// flagReference is the operators' reference of every command's flags.
const flagReference = "../../docs/configuration.md"

// flagDeclarations declares the flags of each command line that takes
// flags, as the command itself does before it parses them.
var flagDeclarations = map[string]func(*flag.FlagSet){
	"serve":           func(fs *flag.FlagSet) { serveFlags(fs) },
	"status":          func(fs *flag.FlagSet) { statusFlags(fs) },
	"bench engine":    func(fs *flag.FlagSet) { benchEngineFlags(fs) },
	"bench scale":     func(fs *flag.FlagSet) { scaleFlags(fs) },
	"ublk serve":      func(fs *flag.FlagSet) { ublkServeFlags(fs) },
	"ublk list":       func(fs *flag.FlagSet) { ublkListFlags(fs) },
	"uninstall-check": func(fs *flag.FlagSet) { uninstallCheckFlags(fs) },
	"peer-ca":         func(fs *flag.FlagSet) { peerCAFlags(fs) },
}

// commandsWithoutFlags are the commands of usageText that take no flags.
var commandsWithoutFlags = []string{"version"}

// machineDefaults are defaults the code computes on the machine it runs
// on: the reference says what from (words), and value computes it here.
var machineDefaults = map[string]struct {
	words string
	value func() string
}{
	"serve --node-id":          {"the hostname", func() string { h, _ := os.Hostname(); return h }},
	"bench scale --ref-queues": {"as the plugin chooses", func() string { return strconv.Itoa(ublk.DefaultQueues(runtime.NumCPU())) }},
}

// TestFlagReferenceMatchesCode holds docs/configuration.md to the code:
// every flag of every command has a row in its command's table, every row
// names flags the command has, and a default the row shows as code is
// the flag's default. Flags the row marks as those of builds with
// `-tags ablation` are expected only in such builds.
func TestFlagReferenceMatchesCode(t *testing.T) {
	doc := readFlagReference(t, flagReference)
	for _, cmd := range usageCommands() {
		if slices.Contains(commandsWithoutFlags, cmd) {
			continue
		}
		found := false
		for line := range flagDeclarations {
			found = found || strings.Fields(line)[0] == cmd
		}
		if !found {
			t.Errorf("command %q of the usage has no flag declaration in this test (flagDeclarations) nor a place in commandsWithoutFlags", cmd)
		}
	}
	for line, declare := range flagDeclarations {
		rows, ok := doc[line]
		if !ok {
			t.Errorf("%s has no section \"`csi-fastblk %s`\" with a flag table", flagReference, line)
			continue
		}
		fs := flag.NewFlagSet(line, flag.ContinueOnError)
		declare(fs)
		documented := map[string]bool{}
		for _, r := range rows {
			for _, name := range r.flags {
				documented[name] = true
				f := fs.Lookup(name)
				switch {
				case f == nil && r.buildTagged && !ablationBuild:
				case f == nil:
					t.Errorf("%s documents %s --%s, which the code does not have", flagReference, line, name)
				default:
					checkDefault(t, line, f, r.def)
				}
			}
		}
		fs.VisitAll(func(f *flag.Flag) {
			if !documented[f.Name] {
				t.Errorf("csi-fastblk %s --%s (%q) is not in %s: add a row to the table of `csi-fastblk %s`",
					line, f.Name, f.Usage, flagReference, line)
			}
		})
	}
	for line := range doc {
		if _, ok := flagDeclarations[line]; !ok {
			t.Errorf("%s has a flag table for `csi-fastblk %s`, a command line this test does not know (flagDeclarations)", flagReference, line)
		}
	}
}

// checkDefault compares the default column of f's row with f's default.
func checkDefault(t *testing.T, line string, f *flag.Flag, cell string) {
	t.Helper()
	if m, ok := machineDefaults[line+" --"+f.Name]; ok {
		if !strings.HasPrefix(cell, m.words) {
			t.Errorf("%s: the default of %s --%s is computed on the machine; the row should say %q, not %q", flagReference, line, f.Name, m.words, cell)
		}
		if want := m.value(); f.DefValue != want {
			t.Errorf("%s --%s: default %q, want %q as computed on this machine (machineDefaults)", line, f.Name, f.DefValue, want)
		}
		return
	}
	if reflect.TypeOf(f.Value).String() == "flag.funcValue" {
		// fs.Func flags have no default of their own (DefValue is
		// empty): their rows give the one the code applies when the
		// flag is absent, which this test cannot see.
		return
	}
	code, isCode := leadingCode(cell)
	switch {
	case isCode && code != f.DefValue:
		t.Errorf("%s: %s --%s: default %q in the table, %q in the code", flagReference, line, f.Name, code, f.DefValue)
	case !isCode && f.DefValue != "":
		t.Errorf("%s: %s --%s: the default column %q should start with the code's default `%s`", flagReference, line, f.Name, cell, f.DefValue)
	}
}

// leadingCode returns the code span a table cell starts with.
func leadingCode(cell string) (string, bool) {
	rest, ok := strings.CutPrefix(cell, "`")
	if !ok {
		return "", false
	}
	code, _, ok := strings.Cut(rest, "`")
	return code, ok
}

// flagRow is one row of a flag table: its flags, default column, and
// whether it is marked as a flag of `-tags ablation` builds only.
type flagRow struct {
	flags       []string
	def         string
	buildTagged bool
}

var (
	commandHeading = regexp.MustCompile("^#+ `csi-fastblk ([a-z -]+)`")
	flagName       = regexp.MustCompile("`--?([A-Za-z0-9][A-Za-z0-9_-]*)`")
)

// readFlagReference reads the flag tables of path: under each heading
// "`csi-fastblk CMD`", the rows of its table, whose first column names
// flags as code (`--name`, `-v`) and whose second is the default.
func readFlagReference(t *testing.T, path string) map[string][]flagRow {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	doc := map[string][]flagRow{}
	cmd := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") {
			cmd = ""
			if m := commandHeading.FindStringSubmatch(line); m != nil {
				cmd = m[1]
			}
			continue
		}
		if cmd == "" || !strings.HasPrefix(line, "|") {
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) < 3 {
			continue
		}
		var names []string
		for _, m := range flagName.FindAllStringSubmatch(cells[0], -1) {
			names = append(names, m[1])
		}
		if len(names) == 0 {
			continue // the header and separator rows
		}
		doc[cmd] = append(doc[cmd], flagRow{flags: names, def: strings.TrimSpace(cells[1]),
			buildTagged: strings.Contains(cells[len(cells)-1], "`-tags ablation`")})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return doc
}

// usageCommands returns the commands usageText lists.
func usageCommands() []string {
	_, list, _ := strings.Cut(usageText, "commands:\n")
	var cmds []string
	for _, line := range strings.Split(list, "\n") {
		if fields := strings.Fields(line); len(fields) > 0 {
			cmds = append(cmds, fields[0])
		}
	}
	return cmds
}
