package snat

import (
	"errors"
	"fmt"
	"syscall"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/vpcni/vpcni/internal/datapath/nlutil"
)

// Mark is the firewall mark (bit) the prerouting chain puts on pod traffic that
// leaves the VPC. Kubernetes' kube-proxy uses 0x4000 and 0x8000; 0x80 is
// the bit aws-vpc-cni uses for the same purpose.
const Mark = 0x80

// rulePriority puts the mark's rule before the datapath's per-pod rules
// of pods on secondary NICs (1536: from <pod> lookup <the NIC's table>)
// and after its rule for local pods (512).
const rulePriority = 1024

// ruleProtocol tells vpcni's SNAT rule apart (iproute2 shows it by number;
// the datapath's own rules carry 0xa7 and priorities 512 and 1536).
const ruleProtocol = 0xa8

func markRuleOf() *netlink.Rule {
	r := netlink.NewRule()
	mask := uint32(Mark)
	r.Priority, r.Table, r.Mark, r.Mask, r.Protocol = rulePriority, unix.RT_TABLE_MAIN, Mark, &mask, ruleProtocol
	r.Family = netlink.FAMILY_V4
	return r
}

// ensureRule adds the policy rule that routes marked traffic by the main
// table, if it is missing, and says so.
func ensureRule() (fixed string, err error) {
	rules, err := listRules()
	if err != nil {
		return "", err
	}
	for _, r := range rules {
		if isOurs(r) {
			return "", nil
		}
	}
	if err := netlink.RuleAdd(markRuleOf()); err != nil && !errors.Is(err, syscall.EEXIST) {
		return "", fmt.Errorf("policy rule %d fwmark 0x%x lookup main: %w", rulePriority, Mark, err)
	}
	return fmt.Sprintf("policy rule %d: fwmark 0x%x lookup main", rulePriority, Mark), nil
}

// removeRule deletes the policy rule (gone already is fine).
func removeRule() error {
	rules, err := listRules()
	if err != nil {
		return err
	}
	for _, r := range rules {
		if isOurs(r) {
			if err := netlink.RuleDel(&r); err != nil && !errors.Is(err, syscall.ENOENT) {
				return fmt.Errorf("delete policy rule %d: %w", rulePriority, err)
			}
		}
	}
	return nil
}

func isOurs(r netlink.Rule) bool {
	return r.Priority == rulePriority && r.Mark == Mark && r.Mask != nil && *r.Mask == Mark && r.Table == unix.RT_TABLE_MAIN
}

// listRules lists the IPv4 policy rules.
func listRules() ([]netlink.Rule, error) {
	rules, err := nlutil.RetryDump(func() ([]netlink.Rule, error) { return netlink.RuleList(netlink.FAMILY_V4) })
	if err != nil {
		return nil, fmt.Errorf("list policy rules: %w", err)
	}
	return rules, nil
}
