package registry

import (
	"slices"
	"strings"
	"testing"
)

func TestRegistry(t *testing.T) {
	r := New[int]("widget")
	r.Register("b", 2)
	r.Register("a", 1)
	if v, err := r.Lookup("b"); err != nil || v != 2 {
		t.Fatalf("Lookup(b) = %d, %v", v, err)
	}
	_, err := r.Lookup("c")
	if err == nil || !strings.Contains(err.Error(), `"c" is not a widget`) || !strings.Contains(err.Error(), "[a b]") {
		t.Fatalf("Lookup(c) error = %v, want the unknown name and the known ones", err)
	}
	if got := r.Names(); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("Names = %v", got)
	}
	defer func() {
		if recover() == nil {
			t.Fatal("a second registration of a name did not panic")
		}
	}()
	r.Register("a", 3)
}
