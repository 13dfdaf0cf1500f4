// SPDX-License-Identifier: GPL-2.0
//
// vpcni's tc fast path for routed veth pods (datapath mode ebpf). Two
// programs, both at tc ingress in direct-action mode:
//
//   vpcni_uplink on the node's uplink: a TCP/UDP packet for a pod of this
//                node goes straight into the pod's namespace with
//                bpf_redirect_peer, skipping the node's IP stack.
//   vpcni_pod    on each pod's host veth: a TCP/UDP packet for another
//                local pod goes the same way; one for a destination the
//                agent marked fast (the uplink's own subnets by default),
//                and not a Service, leaves by the uplink through
//                bpf_fib_lookup + bpf_redirect_neigh.
//
// Everything else returns TC_ACT_OK and takes the routed path exactly as
// in mode veth, which stays fully wired underneath: a packet the programs
// do not know what to do with is not dropped, only slower. (A redirect to
// an ifindex that is gone would drop: the agent keeps the pods map to live
// veths, pruning it before the uplink's program goes on.) What must see
// netfilter does: Service CIDRs (kube-proxy DNATs them), and any packet of
// a connection conntrack NATed (replies of a DNATed ClusterIP, NodePort or
// hostPort connection), found with the bpf_skb_ct_lookup kfunc.
//
// GPL: the conntrack kfuncs are only offered to GPL-compatible programs.

#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/pkt_cls.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

// A pod of this node, by its IPv4 address (network byte order).
struct pod {
	__u32 ifindex;     // its host veth
	__u8 pod_mac[6];   // its eth0
	__u8 host_mac[6];  // its host veth's
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 16384);
	__type(key, __u32);
	__type(value, struct pod);
} pods SEC(".maps");

struct prefix {
	__u32 prefixlen;
	__u32 addr;
};

// Destinations a pod's packet may leave by the uplink for without the
// stack (fast) and the Service CIDRs, which never may (services).
struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct prefix);
	__type(value, __u8);
} fast SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LPM_TRIE);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct prefix);
	__type(value, __u8);
} services SEC(".maps");

// config[0]: the uplink's ifindex, the only device vpcni_pod sends out of.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} config SEC(".maps");

// What the programs did, per CPU; the agent sums and exports them.
enum stat {
	STAT_PEER_FROM_UPLINK, // into a pod from the uplink
	STAT_PEER_LOCAL,       // into a pod from another pod of this node
	STAT_NEIGH_OUT,        // out of the uplink from a pod
	STAT_PASS_NAT,         // to the stack: conntrack NATed the connection
	STAT_PASS_SERVICE,     // to the stack: a Service CIDR
	STAT_PASS_OTHER,       // to the stack: not fast (route, TTL, fragment, ...)
	STAT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

// The kernel's struct bpf_ct_opts (net/netfilter/nf_conntrack_bpf.c),
// which no uapi header carries, in its first, 12-byte form: every kernel
// with the kfunc (5.18+) takes it; the zone fields added later are not
// needed here.
struct bpf_ct_opts {
	__s32 netns_id;
	__s32 error;
	__u8 l4proto;
	__u8 dir;
	__u8 reserved[2];
};

// Only status is read, relocated against the running kernel's BTF.
struct nf_conn {
	unsigned long status;
} __attribute__((preserve_access_index));

extern struct nf_conn *bpf_skb_ct_lookup(struct __sk_buff *skb, struct bpf_sock_tuple *tuple, __u32 tuple__sz,
					 struct bpf_ct_opts *opts, __u32 opts__sz) __ksym;
extern void bpf_ct_release(struct nf_conn *ct) __ksym;

#define IPS_SRC_NAT (1 << 4)
#define IPS_DST_NAT (1 << 5)
#define IP_MF 0x2000
#define IP_OFFSET 0x1fff
#define BPF_F_CURRENT_NETNS (-1)
#define AF_INET 2
#define ENOENT 2
#define PACKET_HOST 0

static __always_inline int count(enum stat s, int verdict)
{
	__u32 key = s;
	__u64 *n = bpf_map_lookup_elem(&stats, &key);

	if (n)
		*n += 1;
	return verdict;
}

// parse finds the IPv4 header of a TCP or UDP packet the fast path may
// take (no options, no fragment, TTL left) and fills the conntrack tuple.
static __always_inline struct iphdr *parse(struct __sk_buff *skb, struct bpf_sock_tuple *t)
{
	void *data = (void *)(long)skb->data;
	void *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	struct iphdr *ip = data + sizeof(*eth);
	__be16 *ports = data + sizeof(*eth) + sizeof(*ip);

	if ((void *)(ports + 2) > end)
		return 0;
	if (eth->h_proto != bpf_htons(ETH_P_IP) || ip->ihl != 5 || ip->ttl <= 1)
		return 0;
	if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return 0;
	if (ip->protocol != IPPROTO_TCP && ip->protocol != IPPROTO_UDP)
		return 0;
	t->ipv4.saddr = ip->saddr;
	t->ipv4.daddr = ip->daddr;
	t->ipv4.sport = ports[0];
	t->ipv4.dport = ports[1];
	return ip;
}

// natted says whether the packet must go through the stack for NAT:
// conntrack holds its connection with NAT on it (only the stack can
// rewrite it, e.g. un-DNAT a reply), or the lookup itself failed for
// another reason than "no such connection", when the stack is the safe
// way.
static __always_inline int natted(struct __sk_buff *skb, struct bpf_sock_tuple *t, __u8 proto)
{
	struct bpf_ct_opts opts = {.netns_id = BPF_F_CURRENT_NETNS, .l4proto = proto};
	struct nf_conn *ct = bpf_skb_ct_lookup(skb, t, sizeof(t->ipv4), &opts, sizeof(opts));
	int nat;

	if (!ct)
		return opts.error != -ENOENT;
	nat = (ct->status & (IPS_SRC_NAT | IPS_DST_NAT)) != 0;
	bpf_ct_release(ct);
	return nat;
}

// forwarded does what the stack does to a packet it routes: TTL down by
// one, the header checksum mended.
static __always_inline int forwarded(struct __sk_buff *skb)
{
	const int off = sizeof(struct ethhdr);
	__u8 ttl;

	if (bpf_skb_load_bytes(skb, off + offsetof(struct iphdr, ttl), &ttl, 1))
		return -1;
	// ttl and protocol share a 16-bit word of the checksum.
	if (bpf_l3_csum_replace(skb, off + offsetof(struct iphdr, check), bpf_htons(ttl << 8), bpf_htons((ttl - 1) << 8), 2))
		return -1;
	ttl--;
	return bpf_skb_store_bytes(skb, off + offsetof(struct iphdr, ttl), &ttl, 1, 0);
}

// to_pod hands the packet to a local pod's eth0, addressed as its host
// veth would have.
static __always_inline int to_pod(struct __sk_buff *skb, struct pod *p, enum stat s)
{
	struct ethhdr eth = {.h_proto = bpf_htons(ETH_P_IP)};

	__builtin_memcpy(eth.h_dest, p->pod_mac, ETH_ALEN);
	__builtin_memcpy(eth.h_source, p->host_mac, ETH_ALEN);
	if (forwarded(skb) || bpf_skb_store_bytes(skb, 0, &eth, sizeof(eth), 0))
		return count(STAT_PASS_OTHER, TC_ACT_OK);
	return count(s, bpf_redirect_peer(p->ifindex, 0));
}

SEC("tc")
int vpcni_uplink(struct __sk_buff *skb)
{
	struct bpf_sock_tuple t = {};
	struct iphdr *ip = parse(skb, &t);
	struct pod *p;
	__u8 proto;

	// A frame not addressed to the node (promiscuous mode, broadcast) or
	// VLAN-tagged is the stack's to judge.
	if (!ip || skb->pkt_type != PACKET_HOST || skb->vlan_present)
		return TC_ACT_OK;
	p = bpf_map_lookup_elem(&pods, &t.ipv4.daddr);
	if (!p)
		return TC_ACT_OK; // not for a pod: the node's own traffic
	proto = ip->protocol;
	if (natted(skb, &t, proto))
		return count(STAT_PASS_NAT, TC_ACT_OK);
	return to_pod(skb, p, STAT_PEER_FROM_UPLINK);
}

SEC("tc")
int vpcni_pod(struct __sk_buff *skb)
{
	struct bpf_sock_tuple t = {};
	struct iphdr *ip = parse(skb, &t);
	struct bpf_fib_lookup fib = {};
	struct bpf_redir_neigh nh = {.nh_family = AF_INET};
	struct prefix dst;
	struct pod *p;
	__u32 zero = 0, *uplink;
	long rc;

	if (!ip)
		return count(STAT_PASS_OTHER, TC_ACT_OK);
	if (natted(skb, &t, ip->protocol))
		return count(STAT_PASS_NAT, TC_ACT_OK);
	dst.prefixlen = 32;
	dst.addr = t.ipv4.daddr;
	if (bpf_map_lookup_elem(&services, &dst))
		return count(STAT_PASS_SERVICE, TC_ACT_OK);
	p = bpf_map_lookup_elem(&pods, &t.ipv4.daddr);
	if (p)
		return to_pod(skb, p, STAT_PEER_LOCAL);
	if (!bpf_map_lookup_elem(&fast, &dst))
		return count(STAT_PASS_OTHER, TC_ACT_OK);
	uplink = bpf_map_lookup_elem(&config, &zero);
	if (!uplink)
		return count(STAT_PASS_OTHER, TC_ACT_OK);

	fib.family = AF_INET;
	fib.tos = ip->tos;
	fib.l4_protocol = ip->protocol;
	fib.sport = t.ipv4.sport;
	fib.dport = t.ipv4.dport;
	fib.ipv4_src = t.ipv4.saddr;
	fib.ipv4_dst = t.ipv4.daddr;
	fib.ifindex = skb->ingress_ifindex;
	// tot_len 0: on success the kernel checks the MTU against the skb
	// itself, GSO included.
	// Only a complete answer: without a neighbour entry the kernel skips
	// its MTU check too, and the stack, given the packet, resolves the
	// next hop for the packets after it.
	rc = bpf_fib_lookup(skb, &fib, sizeof(fib), 0);
	if (rc != BPF_FIB_LKUP_RET_SUCCESS || fib.ifindex != *uplink)
		return count(STAT_PASS_OTHER, TC_ACT_OK);
	if (forwarded(skb))
		return count(STAT_PASS_OTHER, TC_ACT_OK);
	nh.ipv4_nh = fib.ipv4_dst; // the next hop the lookup chose
	return count(STAT_NEIGH_OUT, bpf_redirect_neigh(fib.ifindex, &nh, sizeof(nh), 0));
}

char _license[] SEC("license") = "GPL";
