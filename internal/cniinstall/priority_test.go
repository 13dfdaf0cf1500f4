package cniinstall

import (
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"testing"
)

const (
	vpcniList   = `{"cniVersion":"1.0.0","name":"vpcni","plugins":[{"type":"vpcni","socket":"/run/vpcni/vpcnid.sock"},{"type":"portmap","capabilities":{"portMappings":true}}]}`
	bridgeList  = `{"cniVersion":"1.0.0","name":"k8s-pod-network","plugins":[{"type":"bridge","bridge":"cni0","ipam":{"type":"host-local","subnet":"10.244.0.0/24"}}]}`
	flannelConf = `{"cniVersion":"0.3.1","name":"cbr0","type":"flannel"}`
	vpcniConf   = `{"cniVersion":"1.0.0","name":"vpcni","type":"vpcni"}`
)

// TestTidy: on a node that had Calico and Cilium, and an earlier vpcni
// release's 10-vpcni.conflist, installing 00-vpcni.conflist leaves exactly
// one vpcni list, deletes no other network's file, and names the files on
// each side of it in the runtime's order.
func TestTidy(t *testing.T) {
	dir := t.TempDir()
	files := map[string]string{
		"00-multus.conf":         `{"cniVersion":"0.3.1","name":"multus-cni-network","type":"multus"}`,
		DefaultName:              vpcniList,
		"05-cilium.conflist":     `{"cniVersion":"0.3.1","name":"cilium","plugins":[{"type":"cilium-cni"}]}`,
		"10-calico.conflist":     `{"cniVersion":"0.3.1","name":"k8s-pod-network","plugins":[{"type":"calico"}]}`,
		"10-flannel.conf":        flannelConf,
		"10-vpcni.conflist":      vpcniList,
		"20-vpcni-old.conf":      vpcniConf,
		"99-broken.conflist":     `{`,
		"README":                 "not a network",
		".00-vpcni.conflist.tmp": vpcniList, // another write in progress
	}
	for name, body := range files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	d, err := Tidy(dir, DefaultName)
	if err != nil {
		t.Fatal(err)
	}
	want := ConfDir{
		Removed: []string{"10-vpcni.conflist", "20-vpcni-old.conf"},
		Before:  []string{"00-multus.conf"},
		After:   []string{"05-cilium.conflist", "10-calico.conflist", "10-flannel.conf", "99-broken.conflist"},
	}
	if !reflect.DeepEqual(d, want) {
		t.Fatalf("Tidy:\n got %+v\nwant %+v", d, want)
	}
	left, _ := os.ReadDir(dir)
	var names []string
	for _, e := range left {
		names = append(names, e.Name())
	}
	sort.Strings(names)
	wantLeft := []string{".00-vpcni.conflist.tmp", DefaultName, "00-multus.conf", "05-cilium.conflist", "10-calico.conflist", "10-flannel.conf", "99-broken.conflist", "README"}
	sort.Strings(wantLeft)
	if !reflect.DeepEqual(names, wantLeft) {
		t.Fatalf("left in the conf dir:\n got %v\nwant %v", names, wantLeft)
	}
}

// TestTidyShadowed: Debian's bridge list under a name that sorts first is
// reported as the one the runtime uses, and kept.
func TestTidyShadowed(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "10-vpcni-k8s-bridge.conflist"), []byte(bridgeList), 0o644)
	os.WriteFile(filepath.Join(dir, "10-vpcni.conflist"), []byte(vpcniList), 0o644)
	d, err := Tidy(dir, "10-vpcni.conflist")
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d.Before, []string{"10-vpcni-k8s-bridge.conflist"}) || len(d.After) != 0 || len(d.Removed) != 0 {
		t.Fatalf("Tidy: %+v, want the bridge list before vpcni's, nothing removed", d)
	}
}

// TestTidyWithoutOurs: Tidy run before vpcni's list is there says so, and
// removes nothing it cannot replace.
func TestTidyWithoutOurs(t *testing.T) {
	dir := t.TempDir()
	os.WriteFile(filepath.Join(dir, "10-calico.conflist"), []byte(bridgeList), 0o644)
	os.WriteFile(filepath.Join(dir, "10-vpcni.conflist"), []byte(vpcniList), 0o644)
	if _, err := Tidy(dir, DefaultName); err == nil {
		t.Fatal("Tidy without vpcni's list: no error")
	}
	if _, err := os.Stat(filepath.Join(dir, "10-vpcni.conflist")); err != nil {
		t.Fatalf("Tidy without the current list removed vpcni's earlier one, the only one the node has: %v", err)
	}
	if _, err := Tidy(filepath.Join(dir, "nope"), DefaultName); err == nil {
		t.Fatal("Tidy of a missing dir: no error")
	}
}
