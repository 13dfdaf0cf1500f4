package ebpf

import (
	"bytes"
	"encoding/binary"
	"strings"
	"testing"

	bpf "github.com/cilium/ebpf"
)

func TestSettingsDefaultsAndValidate(t *testing.T) {
	var s Settings
	s.Defaults()
	if s.GARP == nil || !*s.GARP || s.PinPath != DefaultPinPath || len(s.ServiceCIDRs) != 1 || s.ServiceCIDRs[0] != "10.96.0.0/12" {
		t.Fatalf("defaults: %+v", s)
	}
	if err := s.Validate(); err != nil {
		t.Fatalf("the defaults are refused: %v", err)
	}
	bad := Settings{FastCIDRs: []string{"10.0.0.0/8", "nope", "fd00::/64", "10.1.2.3/24", "0.0.0.0/0"}, PinPath: "relative/dir"}
	bad.Defaults()
	err := bad.Validate()
	for _, want := range []string{`fastCIDRs[1]: "nope" is not a CIDR`, `fastCIDRs[2]: "fd00::/64": only IPv4`, `fastCIDRs[3]: "10.1.2.3/24" has host bits set (did you mean 10.1.2.0/24?)`,
		`fastCIDRs[4]: "0.0.0.0/0" would take every destination past the node's stack`, `pinPath: "relative/dir" is not an absolute path`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Validate = %v, want it to say %q", err, want)
		}
	}
	if strings.Contains(err.Error(), "fastCIDRs[0]") {
		t.Errorf("a good CIDR is refused: %v", err)
	}
}

// TestNoBTFSaysSo: a kernel without BTF fails the load with an error
// that names what is missing (the fallback's log line and status).
func TestNoBTFSaysSo(t *testing.T) {
	_, err := load("/nonexistent/vmlinux", t.TempDir(), 1)
	if err == nil || !strings.Contains(err.Error(), "kernel BTF /nonexistent/vmlinux") {
		t.Fatalf("load without BTF = %v, want an error naming the BTF", err)
	}
}

// TestObjectMatchesGo: the committed object's programs and maps are what
// the Go side expects — the program types tc runs, and map keys and
// values of the sizes of the Go types written into them.
func TestObjectMatchesGo(t *testing.T) {
	spec, err := bpf.LoadCollectionSpecFromReader(bytes.NewReader(object))
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{progUplink, progPod} {
		p, ok := spec.Programs[name]
		if !ok || p.Type != bpf.SchedCLS {
			t.Errorf("program %s: %+v, want a SchedCLS (tc) program", name, p)
		}
	}
	maps := map[string][2]int{
		"pods":     {4, binary.Size(pod{})},
		"fast":     {binary.Size(prefix{}), 1},
		"services": {binary.Size(prefix{}), 1},
		"config":   {4, 4},
		"stats":    {4, 8},
	}
	for name, kv := range maps {
		m, ok := spec.Maps[name]
		if !ok {
			t.Errorf("no map %s", name)
			continue
		}
		if int(m.KeySize) != kv[0] || int(m.ValueSize) != kv[1] {
			t.Errorf("map %s: key %d value %d bytes, the Go side writes %d and %d", name, m.KeySize, m.ValueSize, kv[0], kv[1])
		}
	}
	if stats := spec.Maps["stats"]; stats != nil && int(stats.MaxEntries) != len(statNames) {
		t.Errorf("stats has %d counters, statNames names %d", stats.MaxEntries, len(statNames))
	}
}
