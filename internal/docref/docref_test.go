package docref

import (
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCheckNamesEveryProblem: a reference with a missing key, a stale
// one, one listed twice and a wrong default gives one message for each,
// saying which row to add, remove or fix; the right rows give none.
func TestCheckNamesEveryProblem(t *testing.T) {
	dir := t.TempDir()
	doc := "# x\n\n| thing key | default | meaning |\n| --- | --- | --- |\n" +
		"| `a.ok` | `30s` | fine (the code spells it 30s) |\n" +
		"| `a.wrong` | `8` | the code says 9 |\n" +
		"| `a.stale` | — | gone from the code |\n" +
		"| `a.twice` | — | once |\n" +
		"| `a.twice` | — | and again |\n" +
		"| `a.prose` | the host name | not a literal: unchecked |\n\n" +
		"| other key | default |\n| --- | --- |\n| `a.missing` | — |\n"
	if err := os.WriteFile(filepath.Join(dir, "ref.md"), []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	rows, err := Read(dir, []string{"ref.md"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a.ok": "30s", "a.wrong": "9", "a.twice": "", "a.prose": "node-a", "a.missing": "2m0s"}
	got := Check(rows, "thing key", want, nil)
	for _, w := range []string{
		`ref.md:6: "a.wrong"'s default is documented as ` + "`8`" + `, the code's is "9"`,
		`ref.md:7: documents thing key "a.stale", which the code does not have`,
		`ref.md:9: thing key "a.twice" is documented twice (also at ref.md:8)`,
		"thing key \"a.missing\" is not documented: add the row \"| `a.missing` | `2m0s` | <what it does> |\" to a \"thing key\" table of docs/configuration.md",
	} {
		if !slices.ContainsFunc(got, func(p string) bool { return strings.Contains(p, w) }) {
			t.Errorf("no problem says %q; got:\n%s", w, strings.Join(got, "\n"))
		}
	}
	if len(got) != 4 {
		t.Errorf("want 4 problems, got %d:\n%s", len(got), strings.Join(got, "\n"))
	}
}

func TestKeysContinueTheOneBefore(t *testing.T) {
	got := Keys("`cloudSecret.create`, `.name`, `image.tag`")
	if !slices.Equal(got, []string{"cloudSecret.create", "cloudSecret.name", "image.tag"}) {
		t.Fatalf("Keys = %v", got)
	}
	if c := cells(`| a \| b | c |`); !slices.Equal(c, []string{"a | b", "c"}) {
		t.Fatalf("cells = %q", c)
	}
}

type dur struct{ time.Duration }

func (d *dur) UnmarshalJSON([]byte) error { return nil }

type section struct {
	Name    string            `json:"name"`
	Wait    dur               `json:"wait"`
	On      *bool             `json:"on,omitempty"`
	Tags    map[string]string `json:"tags"`
	Sub     sub               `json:"sub"`
	Opt     *sub              `json:"opt,omitempty"`
	List    []sub             `json:"list"`
	Skipped string            `json:"-"`
	Embedded
}

type sub struct {
	X int `json:"x"`
}

type Embedded struct {
	Flat []string `json:"flat"`
}

// TestFieldsWalksByJSONTag: the walk's rules, on a section of every shape.
func TestFieldsWalksByJSONTag(t *testing.T) {
	on := true
	got := map[string]string{}
	Fields("s", reflect.ValueOf(section{Name: "n", Wait: dur{2 * time.Minute}, On: &on, Sub: sub{X: 3}, Embedded: Embedded{Flat: []string{"a", "b"}}}), got)
	want := map[string]string{
		"s.name": "n", "s.wait": "2m0s", "s.on": "true", "s.tags": "", "s.sub.x": "3",
		"s.opt": "", "s.opt.x": "", "s.list[].x": "", "s.flat": "[a, b]",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Fields =\n%v\nwant\n%v", got, want)
	}
}
