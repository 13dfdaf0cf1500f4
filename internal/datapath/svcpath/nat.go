package svcpath

import (
	"bytes"
	"fmt"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"

	"github.com/vpcni/vpcni/internal/datapath/nlutil"
)

// NATTable is the nftables table (family ip, and ip6 of the same name
// for IPv6 pods) of the service path: one chain, one rule,
//
//	chain postrouting { type nat hook postrouting priority srcnat
//	  iifname "vsv*" ct status dnat masquerade }
//
// The input interface of a forwarded packet is known at postrouting in
// nftables (not in iptables' -i), so the rule needs no packet mark that
// could clash with kube-proxy's.
const NATTable = "vpcni_svcpath"

const natChain = "postrouting"

// ruleTag marks vpcni's rule, so a check finds it among others a person
// may have added.
var ruleTag = []byte("vpcni-svcpath-masq-v1")

// ipsDstNAT is the conntrack status bit of a DNATed connection
// (IPS_DST_NAT).
const ipsDstNAT = 1 << 5

func natRule(t *nftables.Table, c *nftables.Chain) *nftables.Rule {
	return &nftables.Rule{Table: t, Chain: c, UserData: ruleTag, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		// A prefix match, as nft's "vsv*": compare only the prefix's bytes.
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(HostPrefix)},
		&expr.Ct{Key: expr.CtKeySTATUS, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(ipsDstNAT), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Masq{},
	}}
}

// EnsureNAT puts the service path's NAT table in place in the caller's
// network namespace unless it is there as made — ip's, and ip6's too with
// v6 — and says whether it had to. Idempotent: a table is replaced whole
// in one transaction, so the rule is never there twice nor missing
// meanwhile.
func EnsureNAT(v6 bool) (changed bool, err error) {
	changed, err = ensureNAT(nftables.TableFamilyIPv4)
	if v6 && err == nil {
		var c6 bool
		c6, err = ensureNAT(nftables.TableFamilyIPv6)
		changed = changed || c6
	}
	return changed, err
}

// tableName is how nft names the table of family tf: "ip vpcni_svcpath".
func tableName(tf nftables.TableFamily) string {
	if tf == nftables.TableFamilyIPv6 {
		return "ip6 " + NATTable
	}
	return "ip " + NATTable
}

// ensureNAT is EnsureNAT for one family, with the connection's options (a
// test's netns).
func ensureNAT(tf nftables.TableFamily, opts ...nftables.ConnOption) (changed bool, err error) {
	conn, err := nftables.New(opts...)
	if err != nil {
		return false, fmt.Errorf("nftables: %w", err)
	}
	if ok, err := natInPlace(conn, tf); err != nil {
		return false, err
	} else if ok {
		return false, nil
	}
	t := &nftables.Table{Name: NATTable, Family: tf}
	conn.AddTable(t)
	conn.DelTable(t)
	conn.AddTable(t)
	c := conn.AddChain(&nftables.Chain{Name: natChain, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	conn.AddRule(natRule(t, c))
	if err := conn.Flush(); err != nil {
		return false, fmt.Errorf("program nftables table %s: %w", tableName(tf), err)
	}
	return true, nil
}

// natInPlace says whether the table holds the chain with vpcni's rule
// exactly once.
func natInPlace(conn *nftables.Conn, tf nftables.TableFamily) (bool, error) {
	t, err := conn.ListTableOfFamily(NATTable, tf)
	if err != nil {
		if nlutil.IsNotFound(err) {
			return false, nil
		}
		return false, fmt.Errorf("list nftables table %s: %w", tableName(tf), err)
	}
	c, err := conn.ListChain(t, natChain)
	if err != nil {
		return false, nil // the chain is gone: the table is rebuilt
	}
	if c.Hooknum == nil || *c.Hooknum != *nftables.ChainHookPostrouting || c.Type != nftables.ChainTypeNAT {
		return false, nil
	}
	rules, err := conn.GetRules(t, c)
	if err != nil {
		return false, fmt.Errorf("list rules of %s %s: %w", tableName(tf), natChain, err)
	}
	n := 0
	for _, r := range rules {
		if bytes.Equal(r.UserData, ruleTag) {
			n++
		}
	}
	return n == 1 && len(rules) == 1, nil
}

// RemoveNAT deletes the service path's NAT tables (ip and ip6): the
// Uninstall of every mode with a service path (vpcnictl uninstall-cni
// --agent-config), when the node leaves the mode. Idempotent.
func RemoveNAT() error { return removeNAT() }

func removeNAT(opts ...nftables.ConnOption) error {
	conn, err := nftables.New(opts...)
	if err != nil {
		return fmt.Errorf("nftables: %w", err)
	}
	for _, tf := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyIPv6} {
		if _, err := conn.ListTableOfFamily(NATTable, tf); err != nil {
			if nlutil.IsNotFound(err) {
				continue
			}
			return fmt.Errorf("list nftables table %s: %w", tableName(tf), err)
		}
		conn.DelTable(&nftables.Table{Name: NATTable, Family: tf})
		if err := conn.Flush(); err != nil && !nlutil.IsNotFound(err) {
			return fmt.Errorf("delete nftables table %s: %w", tableName(tf), err)
		}
	}
	return nil
}
