package ctl

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"
)

func TestRestartBenchMarksSpreadFromTheLast(t *testing.T) {
	pods := make([]*benchPod, 200)
	for i := range pods {
		pods[i] = &benchPod{}
	}
	for _, tc := range []struct {
		broken int
		want   []int
	}{
		{1, []int{199}},
		{3, []int{199, 100, 0}},
		{200, nil}, // every pod once
	} {
		b := &restartBed{pods: pods, broken: tc.broken}
		var got []int
		for _, p := range b.marked() {
			got = append(got, slices.Index(pods, p))
		}
		if tc.want == nil {
			slices.Sort(got)
			got = slices.Compact(got)
			if len(got) != len(pods) {
				t.Errorf("break %d marks %d distinct pods, want %d", tc.broken, len(got), len(pods))
			}
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("break %d marks pods %v, want %v", tc.broken, got, tc.want)
		}
	}
}

func TestRestartBenchReadsLogTimeAfterOffset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "vpcnid.log")
	old := "time=2026-01-02T03:04:05.000Z level=INFO msg=\"vpcnid ready\" version=old\n"
	lines := old + "time=2026-01-02T03:04:06.250Z level=INFO msg=\"prof\"\n" +
		"time=2026-01-02T03:04:06.789Z level=INFO msg=\"vpcnid ready\" version=new\n"
	if err := os.WriteFile(path, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	got, ok := logLineTime(path, int64(len(old)), `msg="vpcnid ready"`)
	want := time.Date(2026, 1, 2, 3, 4, 6, 789e6, time.UTC)
	if !ok || !got.Equal(want) {
		t.Errorf("logLineTime = %v, %v; want %v", got, ok, want)
	}
	if _, ok := logLineTime(path, int64(len(lines)), `msg="vpcnid ready"`); ok {
		t.Error("found a line past the end of the log")
	}
}
