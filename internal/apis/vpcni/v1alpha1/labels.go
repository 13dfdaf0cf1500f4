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

// AnnotationBlocksWanted, on a Node, is how many blocks its agent asks
// vpcni-controller for (a decimal count). The agent raises it by one when
// its blocks are full; the controller creates NodeBlocks until the node
// has that many.
//
// It counts IPv4 blocks, or where vpcni-controller's -block-ranges are
// IPv6 only, IPv6 ones (agents older than dual-stack blocks ask for IPv6
// blocks there). AnnotationBlocksWantedIPv6 counts IPv6 blocks.
const AnnotationBlocksWanted = "vpcni.io/blocks-wanted"

// AnnotationBlocksWantedIPv6, on a Node, is how many IPv6 blocks its
// agent asks for, as AnnotationBlocksWanted is for IPv4 ones.
const AnnotationBlocksWantedIPv6 = "vpcni.io/blocks-wanted-ipv6"

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
