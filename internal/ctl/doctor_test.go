package ctl

import (
	"bytes"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/doctor"
)

// A format doctor does not know is a usage error, refused before any
// check runs.
func TestDoctorUnknownFormat(t *testing.T) {
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"doctor", "-o", "yaml"}, &stdout, &stderr); code != 2 {
		t.Fatalf("exit %d, want 2; stderr: %s", code, stderr.String())
	}
	if stdout.Len() != 0 || !strings.Contains(stderr.String(), `doctor: unknown output format "yaml"`) {
		t.Errorf("stdout %q, stderr %q", stdout.String(), stderr.String())
	}
}

// The table: a line per check, the fix under one that is not ok.
func TestPrintDoctor(t *testing.T) {
	var out bytes.Buffer
	printDoctor(&out, doctor.Report{Results: []doctor.Result{
		{Name: "agent", Status: doctor.OK, Detail: "ready"},
		{Name: "cni conf", Status: doctor.Fail, Detail: "shadowed by 05-x.conflist", Fix: "remove it"},
	}})
	want := "CHECK     STATUS  DETAIL\nagent     ok      ready\ncni conf  fail    shadowed by 05-x.conflist\n                  -> remove it\n"
	if out.String() != want {
		t.Errorf("table:\n%s\nwant:\n%s", out.String(), want)
	}
}
