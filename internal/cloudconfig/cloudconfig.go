// Package cloudconfig reads vpcni-controller's -cloud-config FILE: how the
// controller reaches the cloud for the cluster-wide work only it does
// (taking a sticky pod's address off a dead node's port, and other
// features of issue 13). The file is the agents' provider.openstack
// section on its own — the same keys, so one Secret can serve both; the
// node-only keys (nodeIP, portLookup, instanceID) are ignored.
package cloudconfig

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"

	"github.com/vpcni/vpcni/internal/provider/openstack"
)

// Load reads and checks the file ("" : no cloud, nil and no error).
func Load(path string) (*openstack.Config, error) {
	if path == "" {
		return nil, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cloud config: %w", err)
	}
	return Parse(data, path)
}

// Parse checks one file's content; name is for the errors.
func Parse(data []byte, name string) (*openstack.Config, error) {
	var c openstack.Config
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return nil, fmt.Errorf("cloud config %s: %w", name, err)
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, fmt.Errorf("cloud config %s: %w", name, err)
	}
	return &c, nil
}
