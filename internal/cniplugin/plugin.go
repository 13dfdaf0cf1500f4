// Package cniplugin is the vpcni CNI plugin: it checks what the runtime
// handed it, forwards the verb to the vpcnid agent on this node and prints
// the agent's CNI result or CNI error.
//
// It must stay small (it runs once per pod, on the critical path): it imports
// the CNI library and the standard library, nothing that talks to the kernel
// or a cloud. deps_test.go keeps it that way.
package cniplugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	types100 "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/vpcni/vpcni/internal/api"
)

// SupportedVersions are the CNI spec versions vpcni speaks.
var SupportedVersions = []string{"0.4.0", "1.0.0", "1.1.0"}

// NetConf is vpcni's network configuration: the CNI fields plus ours.
type NetConf struct {
	types.NetConf
	// Socket is the agent's unix socket (default /run/vpcni/vpcnid.sock).
	Socket string `json:"socket,omitempty"`
	// TimeoutSeconds bounds one call to the agent (default 30).
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
}

const defaultTimeout = 30 * time.Second

// ParseConfig decodes and validates the plugin's stdin, naming every bad
// field at once.
func ParseConfig(data []byte) (*NetConf, error) {
	conf := &NetConf{}
	if err := json.Unmarshal(data, conf); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "network configuration is not valid JSON", err.Error())
	}
	var errs []error
	if conf.Name == "" {
		errs = append(errs, errors.New(`"name" is required`))
	}
	if conf.CNIVersion == "" {
		errs = append(errs, errors.New(`"cniVersion" is required`))
	}
	if conf.Type == "" {
		errs = append(errs, errors.New(`"type" is required`))
	}
	if conf.IPAM.Type != "" {
		errs = append(errs, fmt.Errorf(`"ipam": vpcni allocates pod addresses itself through vpcnid; remove the ipam section (type %q)`, conf.IPAM.Type))
	}
	if conf.Socket != "" && !filepath.IsAbs(conf.Socket) {
		errs = append(errs, fmt.Errorf(`"socket": %q must be an absolute path`, conf.Socket))
	}
	if conf.TimeoutSeconds < 0 || conf.TimeoutSeconds > 600 {
		errs = append(errs, fmt.Errorf(`"timeoutSeconds": %d is outside 0..600`, conf.TimeoutSeconds))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "invalid vpcni network configuration", err.Error())
	}
	if conf.Socket == "" {
		conf.Socket = api.DefaultSocket
	}
	return conf, nil
}

func (c *NetConf) timeout() time.Duration {
	if c.TimeoutSeconds > 0 {
		return time.Duration(c.TimeoutSeconds) * time.Second
	}
	return defaultTimeout
}

// Funcs are the verbs handed to skel.
func Funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: cmdAdd, Del: cmdDel, Check: cmdCheck, GC: cmdGC, Status: cmdStatus}
}

// Main runs the plugin.
func Main(about string) {
	skel.PluginMainFuncs(Funcs(), version.PluginSupports(SupportedVersions...), about)
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if err := checkNetns(args.Netns); err != nil {
		return err
	}
	var raw json.RawMessage
	if err := call(conf, api.PathAdd, request(args), &raw); err != nil {
		return err
	}
	result, err := types100.NewResult(raw)
	if err != nil {
		return types.NewError(types.ErrDecodingFailure, "vpcnid returned a result the plugin cannot read", err.Error())
	}
	return types.PrintResult(result, conf.CNIVersion)
}

func cmdDel(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	return call(conf, api.PathDel, request(args), nil)
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if err := checkNetns(args.Netns); err != nil {
		return err
	}
	return call(conf, api.PathCheck, request(args), nil)
}

func cmdGC(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	return call(conf, api.PathGC, request(args), nil)
}

func cmdStatus(args *skel.CmdArgs) error {
	conf, err := ParseConfig(args.StdinData)
	if err != nil {
		return err
	}
	return call(conf, api.PathStatus, request(args), nil)
}

func request(args *skel.CmdArgs) *api.CNIRequest {
	return &api.CNIRequest{
		ContainerID: args.ContainerID,
		Netns:       args.Netns,
		IfName:      args.IfName,
		Args:        args.Args,
		Config:      args.StdinData,
	}
}

// checkNetns refuses a namespace path that is not there before the agent
// does any work for it.
func checkNetns(path string) error {
	if path == "" {
		return types.NewError(types.ErrInvalidEnvironmentVariables, "CNI_NETNS is required", "")
	}
	if _, err := os.Stat(path); err != nil {
		return types.NewError(types.ErrInvalidEnvironmentVariables,
			fmt.Sprintf("CNI_NETNS: network namespace %s does not exist", path), err.Error())
	}
	return nil
}

// call forwards one verb and turns every failure into a CNI error. What a
// retry can cure — no agent on the socket, the agent going away while it
// answered, no answer in time — is 11, "try again later": the runtime
// retries, and every verb is idempotent in the agent, so a retry is safe
// even when the agent acted before the connection broke.
func call(conf *NetConf, path string, req *api.CNIRequest, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), conf.timeout())
	defer cancel()
	err := api.NewClient(conf.Socket).Do(ctx, path, req, out)
	if err == nil {
		return nil
	}
	var cniErr *api.Error
	if errors.As(err, &cniErr) {
		return types.NewError(cniErr.Code, cniErr.Msg, cniErr.Details)
	}
	var unreachable *api.UnreachableError
	if errors.As(err, &unreachable) {
		return types.NewError(types.ErrTryAgainLater, unreachableMsg(conf.Socket, unreachable.Err),
			unreachable.Err.Error()+"; check the vpcnid DaemonSet pod on this node")
	}
	var hangup *api.HangupError
	if errors.As(err, &hangup) {
		return types.NewError(types.ErrTryAgainLater,
			"vpcnid closed the connection before answering (it is stopping, restarting or crashed); try again later",
			hangup.Error()+"; if it keeps happening, see the vpcnid log on this node")
	}
	var tooLarge *api.TooLargeError
	if errors.As(err, &tooLarge) {
		// 7, not 4: the bulk of the request is the network configuration
		// from stdin, not the CNI_* variables; no retry makes it fit.
		return types.NewError(types.ErrInvalidNetworkConfig,
			fmt.Sprintf("network configuration too large: the request to vpcnid would be %d bytes, over its limit of %d bytes", tooLarge.Size, tooLarge.Limit),
			"the agent reads at most 1 MiB per request; shorten the network configuration (nothing was sent)")
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return types.NewError(types.ErrTryAgainLater,
			fmt.Sprintf("vpcnid did not answer %s within %s; try again later", path, conf.timeout()), err.Error())
	}
	return types.NewError(types.ErrInternal, "vpcnid call failed", err.Error())
}

// unreachableMsg says why no agent took the connection.
func unreachableMsg(socket string, err error) string {
	switch {
	case errors.Is(err, syscall.ENOENT):
		// Also an agent that is stopping: it unlinks its socket first.
		return fmt.Sprintf("vpcnid is not running on this node (no socket at %s: it is stopping, restarting or not started); try again later", socket)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Sprintf("vpcnid is not running on this node (nothing listens on %s: it died or is restarting); try again later", socket)
	case errors.Is(err, syscall.EAGAIN):
		// A non-blocking connect to a unix socket whose backlog is full.
		return fmt.Sprintf("vpcnid is running but too busy to take the connection (the backlog of %s is full); try again later", socket)
	}
	return fmt.Sprintf("vpcnid is not reachable at %s; try again later", socket)
}
