// Package api holds the wire types spoken between the vpcni CNI plugin (and
// vpcnictl) and the vpcnid node agent over the agent's unix socket.
//
// It imports only the standard library (and internal/alloc, which does
// too): the plugin runs on every pod's critical path and must stay small.
package api

import (
	"encoding/json"

	"github.com/vpcni/vpcni/internal/alloc"
)

// Version is the path prefix of the current API. A future incompatible API
// gets a new prefix; the agent keeps serving the old one while plugins roll.
const Version = "v1"

// Paths served by the agent.
const (
	PathAdd    = "/v1/add"
	PathDel    = "/v1/del"
	PathCheck  = "/v1/check"
	PathGC     = "/v1/gc"
	PathStatus = "/v1/status"
	PathState  = "/v1/state"
	// PathTrace?pod=<namespace>/<name>: the pod's path (Trace).
	PathTrace = "/v1/trace"
)

// DefaultSocket is where the agent listens unless configured otherwise.
const DefaultSocket = "/run/vpcni/vpcnid.sock"

// MaxRequestBytes bounds a request body; a CNI config is a few KiB.
const MaxRequestBytes = 1 << 20

// CNIRequest carries one CNI invocation from the plugin to the agent.
type CNIRequest struct {
	ContainerID string `json:"containerID,omitempty"`
	Netns       string `json:"netns,omitempty"`
	IfName      string `json:"ifName,omitempty"`
	// Args is CNI_ARGS verbatim (K8S_POD_NAMESPACE=...;K8S_POD_NAME=...).
	Args string `json:"args,omitempty"`
	// Config is the network configuration the runtime gave the plugin on
	// stdin, verbatim (it holds name, cniVersion, prevResult, dns, ...).
	Config json.RawMessage `json:"config"`
}

// Error is a CNI error as the agent reports it; the plugin prints it as is.
type Error struct {
	Code    uint   `json:"code"`
	Msg     string `json:"msg"`
	Details string `json:"details,omitempty"`
}

func (e *Error) Error() string {
	if e.Details == "" {
		return e.Msg
	}
	return e.Msg + ": " + e.Details
}

// CNI error codes used by vpcni (CNI spec, "Error codes").
const (
	CodeIncompatibleVersion = 1
	CodeUnsupportedField    = 2
	CodeUnknownContainer    = 3
	CodeInvalidEnv          = 4
	CodeIOFailure           = 5
	CodeDecodingFailure     = 6
	CodeInvalidConfig       = 7
	CodeTryAgainLater       = 11
	CodeNotAvailable        = 50
	CodeLimitedConnectivity = 51
	CodeInternal            = 999
)

// Errorf builds an *Error.
func Errorf(code uint, msg, details string) *Error {
	return &Error{Code: code, Msg: msg, Details: details}
}

// State is the agent's view of itself, for vpcnictl status.
type State struct {
	Node   string `json:"node"`
	Ready  bool   `json:"ready"`
	Reason string `json:"reason,omitempty"`
	// Degraded: the provider fails; the agent serves from its pool only.
	Degraded bool   `json:"degraded,omitempty"`
	Provider string `json:"provider"`
	// ProviderPort is the cloud port the node's pod addresses live on.
	ProviderPort string `json:"providerPort,omitempty"`
	// ProviderSubnet is where the pod addresses come from and how that
	// was settled, e.g. a subnet configured or discovered from the VM port.
	ProviderSubnet string `json:"providerSubnet,omitempty"`
	Datapath       string `json:"datapath"`
	// FastPath is the datapath's kernel fast path, for a mode that has
	// one (ebpf): "on" (with what it leaves to the plain path, if any),
	// or "off: <why>".
	FastPath string    `json:"fastPath,omitempty"`
	Uplink   string    `json:"uplink"`
	MTU      int       `json:"mtu"`
	Pool     PoolState `json:"pool"`
	// Families are the default network's pools by address family, in
	// the configured order, on a node whose pods get more than one
	// (Pool is the first of them); empty on a single-family node.
	Families []PoolState `json:"families,omitempty"`
	// PodNetworks are the pools of the PodNetworks the node serves, by
	// name (the default network's is Pool).
	PodNetworks []PodNetworkState  `json:"podNetworks,omitempty"`
	Allocations []alloc.Allocation `json:"allocations"`
	// Health is the last probe of each allocation's datapath, by its key
	// (container/ifname); missing: not probed yet (or probes are off).
	Health    map[string]PodHealth `json:"health,omitempty"`
	StartedAt string               `json:"startedAt"`
	// StoreSchema is the layout of the agent's allocation store (the
	// upgrade e2e sees a previous release's file migrated).
	StoreSchema int `json:"storeSchema,omitempty"`
}

// PodNetworkState is the node's pool of one PodNetwork.
type PodNetworkState struct {
	Name   string `json:"name"`
	Ready  bool   `json:"ready"`
	Reason string `json:"reason,omitempty"`
	// Source says where the network's addresses come from: its cloud
	// network, subnets and security groups.
	Source string    `json:"source,omitempty"`
	Pool   PoolState `json:"pool"`
}

// PodHealth is the result of one probe of a pod's datapath.
type PodHealth struct {
	Healthy bool `json:"healthy"`
	// Problem says what the probe found wrong.
	Problem string `json:"problem,omitempty"`
	// PingMicros is the ICMP echo's round trip from the node (0: not pinged).
	PingMicros int64  `json:"pingMicros,omitempty"`
	CheckedAt  string `json:"checkedAt"`
}

// PoolState counts the addresses the node holds, by state.
type PoolState struct {
	// Family is the pool's address family ("ipv4", "ipv6"), on a node
	// whose pods get more than one.
	Family    string `json:"family,omitempty"`
	Free      int    `json:"free"`
	Cooling   int    `json:"cooling"`
	Allocated int    `json:"allocated"`
	// Aside: held but handed to nobody, their wiring kept failing (tried
	// again later). Leaving: requested addresses on their way back to the
	// cloud (another node gets them once they are back).
	Aside   int `json:"aside,omitempty"`
	Leaving int `json:"leaving,omitempty"`
	// Capacity is how many addresses the provider could hold for this node
	// at most (0: unknown).
	Capacity int `json:"capacity"`
	// CapacityReason says what bounds Capacity.
	CapacityReason string `json:"capacityReason,omitempty"`
	// WarmTarget is how many free addresses the pool keeps ready now
	// (pool.warmTarget, raised with the node's churn); Waiting counts the
	// ADDs in line for an address from the cloud.
	WarmTarget int `json:"warmTarget"`
	Waiting    int `json:"waiting,omitempty"`
	// Addresses lists every held address by state: free, cooling,
	// allocated, aside, leaving.
	Addresses map[string][]string `json:"addresses,omitempty"`
	// ProviderCalls counts the provider's cloud requests by method, if it
	// counts them.
	ProviderCalls map[string]int64 `json:"providerCalls,omitempty"`
}

// Trace is a pod's path as its node sees it, for vpcnictl trace: each of
// its attachments, every piece of the path, ok or not, and what to do.
type Trace struct {
	Pod  string `json:"pod"`
	Node string `json:"node"`
	// NodeIP is the node's address on the pods' network (a routed
	// block's next hop).
	NodeIP      string            `json:"nodeIP,omitempty"`
	Datapath    string            `json:"datapath"`
	Provider    string            `json:"provider"`
	Attachments []TraceAttachment `json:"attachments"`
}

// TraceAttachment is one of the pod's interfaces.
type TraceAttachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifName"`
	Address     string `json:"address"`
	// PodNetwork is the PodNetwork the address is of ("": the node's
	// default network).
	PodNetwork string `json:"podNetwork,omitempty"`
	Hops       []Hop  `json:"hops"`
}

// OK says whether every hop of every attachment is ok.
func (t *Trace) OK() bool {
	for _, a := range t.Attachments {
		for _, h := range a.Hops {
			if h.State != HopOK {
				return false
			}
		}
	}
	return true
}

// Hop is one piece of a pod's path.
type Hop struct {
	// Where: HopPod (inside its namespace), HopNode, HopCloud.
	Where string `json:"where"`
	// What names the piece, e.g. "route 10.0.0.5/32 dev vpc1a2b3c4d5e".
	What string `json:"what"`
	// State: HopOK, HopMissing or HopWrong.
	State string `json:"state"`
	// Detail says what is wrong; Fix what to do about it.
	Detail string `json:"detail,omitempty"`
	Fix    string `json:"fix,omitempty"`
}

// Where a hop is, and its states.
const (
	HopPod   = "pod"
	HopNode  = "node"
	HopCloud = "cloud"

	HopOK      = "ok"
	HopMissing = "missing"
	HopWrong   = "wrong"
)
