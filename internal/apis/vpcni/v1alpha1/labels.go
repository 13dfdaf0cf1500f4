package v1alpha1

import (
	"crypto/sha256"
	"encoding/hex"
	"net/netip"
	"regexp"
	"strings"
)

// LabelNode selects a node's objects (PodAddresses, NodeBlocks).
const LabelNode = "vpcni.io/node"

// AnnotationBlocksWantedIPv4 and AnnotationBlocksWantedIPv6, on a Node,
// are how many blocks of each family its agent asks vpcni-controller for
// (a decimal count). The agent raises one by one when its blocks of that
// family are full; the controller creates NodeBlocks until the node has
// that many.
const (
	AnnotationBlocksWantedIPv4 = "vpcni.io/blocks-wanted-ipv4"
	AnnotationBlocksWantedIPv6 = "vpcni.io/blocks-wanted-ipv6"
)

// AnnotationBlocksWanted is the count of a node whose blocks are of one
// family, whichever: agents of one family write it beside their family's
// count, and controllers whose -block-ranges are of one family read it
// (agents and controllers from before per-family counts know only it). A
// dual-stack controller never reads it: left from before, on a node that
// was IPv6 only, it would be taken for an IPv4 request.
const AnnotationBlocksWanted = "vpcni.io/blocks-wanted"

// NodeLabel is the LabelNode value of a node: its name, or a hash of it
// where the name is no valid label value (longer than 63 characters).
func NodeLabel(node string) string {
	if len(node) <= 63 && labelValue.MatchString(node) {
		return node
	}
	sum := sha256.Sum256([]byte(node))
	return "h-" + hex.EncodeToString(sum[:16])
}

var labelValue = regexp.MustCompile(`^([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?$`)

// BlockName is the NodeBlock name of a block: its CIDR as a valid object
// name ("10.20.0.64/26" -> "10.20.0.64-26"), one name per block.
func BlockName(block netip.Prefix) string {
	return strings.NewReplacer("/", "-", ":", "-").Replace(block.Masked().String())
}
