// Package docref reads the reference tables of vpcni's documents so that
// tests can hold the documents to the code: every configuration key, flag
// and Helm value documented exactly once, nothing documented that the code
// does not have, and the defaults the tables state equal to the code's.
//
// A reference table is a Markdown table whose first header cell names what
// its rows are ("vpcnid.yaml key", "vpcni-controller flag", "value", …);
// the first cell of each row starts with the key it documents, in
// backticks (more may follow: "`a`, `b`"), and the
// column headed "default" states the default. Only tests import this
// package.
package docref

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strings"
	"time"

	"sigs.k8s.io/yaml"
)

// Row is one key a reference table documents.
type Row struct {
	Kind    string // the table's first header cell, e.g. "vpcnid.yaml key"
	Key     string // as written, without backticks
	Default string // the default column, as written ("" if the table has none)
	File    string // relative to the repository root
	Line    int
}

// Where is a row's place, for messages.
func (r Row) Where() string { return fmt.Sprintf("%s:%d", r.File, r.Line) }

// ReferenceFiles are the documents that hold reference tables.
var ReferenceFiles = []string{
	"docs/configuration.md",
	"docs/development.md",
	"deploy/helm/vpcni/README.md",
}

// Main is where each kind of key is documented, for the message that says
// which row to add where.
func Main(kind string) string {
	switch {
	case kind == "value":
		return "deploy/helm/vpcni/README.md"
	case strings.HasPrefix(kind, "vpcnictl ") && isDevCommand(strings.TrimPrefix(kind, "vpcnictl ")):
		return "docs/development.md"
	}
	return "docs/configuration.md"
}

// isDevCommand: vpcnictl's subcommands for the lab and the benchmarks are
// documented in the developer guide, the operator's in the reference.
func isDevCommand(sub string) bool {
	for _, p := range []string{"lab", "demo", "bench"} {
		if sub == p+" flag" || strings.HasPrefix(sub, p+" ") {
			return true
		}
	}
	return false
}

var backticked = regexp.MustCompile("`([^`]+)`")

// Read returns the rows of every reference table in files (relative to
// root).
func Read(root string, files []string) ([]Row, error) {
	var rows []Row
	for _, f := range files {
		r, err := readFile(root, f)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

// Tables returns every table row of a file whose first cell holds a
// backticked word, with its table's first header cell as Kind: for
// finding keys described outside the reference.
func Tables(root, file string) ([]Row, error) { return readFile(root, file) }

func readFile(root, file string) ([]Row, error) {
	fh, err := os.Open(filepath.Join(root, file))
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	var (
		rows       []Row
		prev       string
		kind       string
		defaultCol = -1
		inTable    bool
		n          int
	)
	sc := bufio.NewScanner(fh)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		n++
		line := sc.Text()
		if !strings.HasPrefix(line, "|") {
			inTable, prev = false, line
			continue
		}
		if !inTable {
			if isSeparator(line) && strings.HasPrefix(prev, "|") {
				head := cells(prev)
				kind, defaultCol, inTable = head[0], -1, true
				for i, h := range head {
					if strings.EqualFold(h, "default") {
						defaultCol = i
					}
				}
			}
			prev = line
			continue
		}
		c := cells(line)
		def := ""
		if defaultCol >= 0 && defaultCol < len(c) {
			def = c[defaultCol]
		}
		if !strings.HasPrefix(c[0], "`") {
			continue // the row's subject is not a key: "floating IPs (`-floating-ips`)"
		}
		for _, key := range Keys(c[0]) {
			rows = append(rows, Row{Kind: kind, Key: key, Default: def, File: file, Line: n})
		}
	}
	return rows, sc.Err()
}

func isSeparator(line string) bool {
	for _, c := range cells(line) {
		if strings.Trim(c, "-: ") != "" {
			return false
		}
	}
	return true
}

// cells splits a table row on its unescaped pipes.
func cells(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "|")
	line = strings.TrimSuffix(line, "|")
	var out []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteByte('|')
			i++
		case line[i] == '|':
			out = append(out, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(out, strings.TrimSpace(cur.String()))
}

// Keys are the backticked names of a first cell. A name that starts with
// "." continues the one before it: "`cloudSecret.create`, `.name`" names
// cloudSecret.create and cloudSecret.name.
func Keys(cell string) []string {
	var out []string
	for _, m := range backticked.FindAllStringSubmatch(cell, -1) {
		k := m[1]
		if strings.HasPrefix(k, ".") && len(out) > 0 {
			last := out[len(out)-1]
			if i := strings.LastIndex(last, "."); i >= 0 {
				k = last[:i] + k
			}
		}
		out = append(out, k)
	}
	return out
}

// Check compares the keys the rows of one kind document with the keys the
// code has, by name: want maps each key to its default as the code has it
// ("" to leave the default unchecked). norm turns a documented key into
// the code's spelling (nil: as written). It returns one message per
// problem, each naming the row to add, remove or fix.
func Check(rows []Row, kind string, want map[string]string, norm func(string) string) []string {
	if norm == nil {
		norm = func(s string) string { return s }
	}
	var problems []string
	seen := map[string]Row{}
	for _, r := range rows {
		if r.Kind != kind {
			continue
		}
		key := norm(r.Key)
		if first, dup := seen[key]; dup {
			problems = append(problems, fmt.Sprintf("%s: %s %q is documented twice (also at %s): keep one row", r.Where(), kind, r.Key, first.Where()))
			continue
		}
		seen[key] = r
		def, ok := want[key]
		if !ok {
			problems = append(problems, fmt.Sprintf("%s: documents %s %q, which the code does not have: remove the row (or fix its name)", r.Where(), kind, r.Key))
			continue
		}
		if msg := checkDefault(r, def); msg != "" {
			problems = append(problems, msg)
		}
	}
	var missing []string
	for key := range want {
		if _, ok := seen[key]; !ok {
			missing = append(missing, key)
		}
	}
	sort.Strings(missing)
	for _, key := range missing {
		def := "—"
		if want[key] != "" {
			def = "`" + want[key] + "`"
		}
		problems = append(problems, fmt.Sprintf("%s %q is not documented: add the row \"| `%s` | %s | <what it does> |\" to a %q table of %s", kind, key, spell(kind, key), def, kind, Main(kind)))
	}
	return problems
}

// spell writes a key as its table does: vpcnictl's flags with two dashes,
// the daemons' with one.
func spell(kind, key string) string {
	switch {
	case strings.HasPrefix(kind, "vpcnictl ") && strings.HasSuffix(kind, " flag") && len(key) > 1:
		return "--" + key
	case strings.HasSuffix(kind, " flag"):
		return "-" + key
	}
	return key
}

// checkDefault compares a row's default with the code's, when the row
// states one literal (the whole cell one backticked value) and the code's
// is known.
func checkDefault(r Row, code string) string {
	if code == "" {
		return ""
	}
	m := backticked.FindAllStringSubmatch(r.Default, -1)
	if len(m) != 1 || strings.TrimSpace(r.Default) != m[0][0] {
		return ""
	}
	if SameValue(m[0][1], code) {
		return ""
	}
	return fmt.Sprintf("%s: %q's default is documented as %s, the code's is %q: fix the row", r.Where(), r.Key, r.Default, code)
}

// SameValue compares two spellings of one default: durations by value
// ("2m" and "2m0s"), lists and strings without quotes and spaces.
func SameValue(a, b string) bool {
	if a == b {
		return true
	}
	if da, err := time.ParseDuration(a); err == nil {
		if db, err := time.ParseDuration(b); err == nil {
			return da == db
		}
	}
	// Lists and maps: a row writes them in YAML's flow style.
	if strings.HasPrefix(a, "[") || strings.HasPrefix(a, "{") {
		var va, vb any
		if yaml.Unmarshal([]byte(a), &va) == nil && yaml.Unmarshal([]byte(b), &vb) == nil && va != nil {
			return reflect.DeepEqual(va, vb)
		}
	}
	clean := func(s string) string {
		return strings.NewReplacer(`"`, "", " ", "", "'", "").Replace(s)
	}
	return clean(a) == clean(b)
}

// Fields walks a configuration type by its json tags and returns every key
// path under prefix with the default v holds ("" when zero or not simply
// spelled). A struct the file spells as one value (it implements
// json.Unmarshaler or encoding.TextUnmarshaler), a map and a scalar are
// keys; a struct's fields are keys under it; a pointer to a struct is a key
// itself (its presence means something: provider.static.blocks) and its
// fields are keys under it; a slice of structs is "name[]" with its
// element's fields under it. Embedded structs without a tag are flattened.
func Fields(prefix string, v reflect.Value, out map[string]string) {
	walk(prefix, v.Type(), v, out)
}

var (
	jsonUnmarshaler = reflect.TypeFor[interface{ UnmarshalJSON([]byte) error }]()
	textUnmarshaler = reflect.TypeFor[interface{ UnmarshalText([]byte) error }]()
)

func isValue(t reflect.Type) bool {
	if t.Kind() != reflect.Struct {
		return true
	}
	p := reflect.PointerTo(t)
	return p.Implements(jsonUnmarshaler) || p.Implements(textUnmarshaler)
}

func walk(prefix string, t reflect.Type, v reflect.Value, out map[string]string) {
	for t.Kind() == reflect.Pointer || t.Kind() == reflect.Interface {
		if v.IsValid() && !v.IsNil() {
			v = v.Elem()
			t = v.Type()
			continue
		}
		if t.Kind() == reflect.Interface {
			return
		}
		t, v = t.Elem(), reflect.Value{}
	}
	for i := 0; i < t.NumField(); i++ {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		var fv reflect.Value
		if v.IsValid() {
			fv = v.Field(i)
		}
		if f.Anonymous && name == "" {
			walk(prefix, f.Type, fv, out)
			continue
		}
		if name == "" {
			name = f.Name
		}
		key := join(prefix, name)
		ft := f.Type
		switch {
		case ft.Kind() == reflect.Pointer && !isValue(ft.Elem()):
			out[key] = ""
			walk(key, ft.Elem(), deref(fv), out)
		case ft.Kind() == reflect.Slice && ft.Elem().Kind() == reflect.Struct && !isValue(ft.Elem()):
			walk(key+"[]", ft.Elem(), reflect.Value{}, out)
		case ft.Kind() == reflect.Struct && !isValue(ft):
			walk(key, ft, fv, out)
		default:
			out[key] = Spell(fv)
		}
	}
}

func deref(v reflect.Value) reflect.Value {
	if !v.IsValid() || v.IsNil() {
		return reflect.Value{}
	}
	return v.Elem()
}

func join(prefix, name string) string {
	if prefix == "" {
		return name
	}
	return prefix + "." + name
}

// Spell writes a default as the documents do: "" for a zero or absent
// value, a duration as time.Duration prints it, a list as [a, b].
func Spell(v reflect.Value) string {
	if !v.IsValid() || v.IsZero() {
		return ""
	}
	if s, ok := v.Interface().(fmt.Stringer); ok {
		return s.String()
	}
	switch v.Kind() {
	case reflect.Pointer:
		return Spell(v.Elem())
	case reflect.Slice:
		parts := make([]string, v.Len())
		for i := range parts {
			parts[i] = Spell(v.Index(i))
		}
		return "[" + strings.Join(parts, ", ") + "]"
	case reflect.Map, reflect.Struct:
		return ""
	}
	return fmt.Sprint(v.Interface())
}
