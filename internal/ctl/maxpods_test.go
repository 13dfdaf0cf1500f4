package ctl

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/vpcni/vpcni/internal/lab/ec2api"
)

// max-pods reads the instance type from EC2 (here the lab's endpoint, which
// serves EC2's own numbers) and prints AWS's documented figure — the EKS
// table's 29 for m5.large, 110 with prefixes — next to vpcni's.
func TestMaxPods(t *testing.T) {
	s := ec2api.New(ec2api.Options{})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	defer s.Close()
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIDTEST")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "secret")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	for _, c := range []struct {
		args       []string
		aws, vpcni int
	}{
		{[]string{"--instance-type", "m5.large"}, 29, 27},
		{[]string{"--instance-type", "m5.large", "--prefix"}, 110, 432},
		{[]string{"--instance-type", "t3.medium"}, 17, 15},
		{[]string{"--instance-type", "c5n.18xlarge", "--prefix"}, 250, 15 * 49 * 16},
	} {
		var stdout, stderr bytes.Buffer
		if code := Main(append([]string{"max-pods", "--endpoint", srv.URL, "-o", "json"}, c.args...), &stdout, &stderr); code != 0 {
			t.Fatalf("%v: exit %d: %s", c.args, code, stderr.String())
		}
		var r maxPodsReport
		if err := json.Unmarshal(stdout.Bytes(), &r); err != nil {
			t.Fatal(err)
		}
		if r.AWSMaxPods != c.aws || r.VpcniAddresses != c.vpcni {
			t.Errorf("%v: aws %d, vpcni %d; want %d and %d", c.args, r.AWSMaxPods, r.VpcniAddresses, c.aws, c.vpcni)
		}
	}
	var stdout, stderr bytes.Buffer
	if code := Main([]string{"max-pods", "--endpoint", srv.URL, "--instance-type", "m5.large"}, &stdout, &stderr); code != 0 || !strings.Contains(stdout.String(), "aws max-pods   29  = ENIs × (IPs − 1) + 2") {
		t.Errorf("table: exit %d\n%s%s", code, stdout.String(), stderr.String())
	}
	if code := Main([]string{"max-pods", "--endpoint", srv.URL, "--instance-type", "m9.nope"}, &stdout, &stderr); code != 1 || !strings.Contains(stderr.String(), "InvalidInstanceType") {
		t.Errorf("an unknown type: exit %d, %s", code, stderr.String())
	}
}
