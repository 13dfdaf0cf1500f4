package testbed

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/vpcni/vpcni/internal/netnsutil"
)

// DebianCNIDir is where Debian's containernetworking-plugins live.
const DebianCNIDir = "/usr/lib/cni"

// CNI drives a network configuration list through libcni the way a
// container runtime does, from inside the node's namespace (so chained
// plugins such as portmap act on the node, never on the machine).
type CNI struct {
	Config *libcni.CNIConfig
	List   *libcni.NetworkConfigList
	nodeNS string
}

// NewCNI loads a conflist; plugins are looked up in binDirs.
func (t *Topology) NewCNI(binDirs []string, cacheDir string, conflist []byte) (*CNI, error) {
	return NewCNIIn(t.NodeNS(), binDirs, cacheDir, conflist)
}

// NewCNIIn loads a conflist to run from inside node namespace ns.
func NewCNIIn(ns string, binDirs []string, cacheDir string, conflist []byte) (*CNI, error) {
	list, err := libcni.ConfListFromBytes(conflist)
	if err != nil {
		return nil, fmt.Errorf("conflist: %w", err)
	}
	return &CNI{Config: libcni.NewCNIConfigWithCacheDir(binDirs, cacheDir, nil), List: list, nodeNS: netnsutil.Path(ns)}, nil
}

// Runtime describes one attachment.
func Runtime(containerID, netnsPath, ifName string, capArgs map[string]any) *libcni.RuntimeConf {
	return &libcni.RuntimeConf{
		ContainerID: containerID, NetNS: netnsPath, IfName: ifName, CapabilityArgs: capArgs,
		Args: [][2]string{{"IgnoreUnknown", "1"}, {"K8S_POD_NAMESPACE", "default"}, {"K8S_POD_NAME", containerID}},
	}
}

// Add runs ADD.
func (c *CNI) Add(ctx context.Context, rt *libcni.RuntimeConf) (res types.Result, err error) {
	err = netnsutil.Do(c.nodeNS, func() error {
		res, err = c.Config.AddNetworkList(ctx, c.List, rt)
		return err
	})
	return res, err
}

// Del runs DEL.
func (c *CNI) Del(ctx context.Context, rt *libcni.RuntimeConf) error {
	return netnsutil.Do(c.nodeNS, func() error { return c.Config.DelNetworkList(ctx, c.List, rt) })
}

// Check runs CHECK.
func (c *CNI) Check(ctx context.Context, rt *libcni.RuntimeConf) error {
	return netnsutil.Do(c.nodeNS, func() error { return c.Config.CheckNetworkList(ctx, c.List, rt) })
}

// GC runs GC with the attachments still valid.
func (c *CNI) GC(ctx context.Context, valid []types.GCAttachment) error {
	return netnsutil.Do(c.nodeNS, func() error {
		return c.Config.GCNetworkList(ctx, c.List, &libcni.GCArgs{ValidAttachments: valid})
	})
}

// Status runs STATUS.
func (c *CNI) Status(ctx context.Context) error {
	return netnsutil.Do(c.nodeNS, func() error { return c.Config.GetStatusNetworkList(ctx, c.List) })
}

// VpcniConfList is a conflist with vpcni first, then the extra plugins.
func VpcniConfList(cniVersion, name, socket string, extra ...map[string]any) []byte {
	plugins := []map[string]any{{"type": "vpcni", "socket": socket}}
	plugins = append(plugins, extra...)
	b, _ := json.Marshal(map[string]any{"cniVersion": cniVersion, "name": name, "plugins": plugins})
	return b
}
