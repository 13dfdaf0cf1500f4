package aws_test

import (
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/config"
	vpcaws "github.com/vpcni/vpcni/internal/provider/aws"
)

// An empty section is valid: everything has a default.
func TestConfigDefaults(t *testing.T) {
	var c vpcaws.Config
	c.Defaults()
	if err := c.Validate(); err != nil {
		t.Fatalf("defaults do not validate: %v", err)
	}
	if c.ENIMinLifetime.Duration != 5*time.Minute || c.LeakedENIGrace.Duration != 10*time.Minute || c.APIRate != 5 || c.APIBurst != 10 || c.Retries != 5 {
		t.Errorf("defaults: %+v", c)
	}
}

// Validate names every bad field at once.
func TestConfigValidateNamesEveryField(t *testing.T) {
	var c vpcaws.Config
	bad := `
region: Europe
endpoint: ftp://x
imdsEndpoint: "not a url"
subnets: [subnet-1, sub-2]
securityGroups: [group]
maxENIs: -1
leakedENIGrace: 0s
apiRate: -3
apiBurst: 5000
retries: 99
timeout: 1ms
tags: {"aws:x": "y", "vpcni.io/owner": "me"}
`
	if err := yaml.UnmarshalStrict([]byte(bad), &c); err != nil {
		t.Fatal(err)
	}
	c.Defaults()
	c.LeakedENIGrace = config.Duration{Duration: 0}
	err := c.Validate()
	if err == nil {
		t.Fatal("a bad section validated")
	}
	for _, field := range []string{"region:", "endpoint:", "imdsEndpoint:", "subnets[1]:", "securityGroups[0]:", "maxENIs:", "leakedENIGrace:", "apiRate:", "apiBurst:", "retries:", "timeout:", `key "aws:x"`, `key "vpcni.io/owner"`} {
		if !strings.Contains(err.Error(), field) {
			t.Errorf("the error does not name %s: %v", field, err)
		}
	}
	if strings.Contains(err.Error(), "subnets[0]") {
		t.Errorf("subnet-1 is a valid subnet ID: %v", err)
	}
}
