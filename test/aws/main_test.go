// Package aws runs vpcnid with the aws provider end to end on an AWS-style
// lab (the lab's EC2 endpoint in process, instance metadata per node, ENIs
// hot-plugged into the node) under faults.
package aws

import (
	"fmt"
	"os"
	"testing"

	"github.com/vpcni/vpcni/internal/testbed"
)

var binDir string

func TestMain(m *testing.M) {
	testbed.RequireRoot("the aws lab tests")
	var err error
	if binDir, err = testbed.Binaries(); err != nil {
		fmt.Println("vpcni-test:", err)
		os.Exit(1)
	}
	os.Exit(m.Run())
}
