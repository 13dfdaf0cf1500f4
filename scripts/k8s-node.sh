#!/bin/bash
# k8s-node.sh — a real single-node Kubernetes for vpcni's end-to-end tests.
#
#   scripts/k8s-node.sh build               build Kubernetes + test images (cached)
#   NETNS=vpcni-k8s-n1 scripts/k8s-node.sh up   run the node inside that netns
#   scripts/k8s-node.sh status | down | env
#   scripts/k8s-node.sh kubectl get nodes   kubectl inside the netns, admin kubeconfig
#
# Everything of the node (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd, kubelet, kube-proxy) runs inside ONE network
# namespace that the caller owns; nothing is added to the root namespace's
# network. See the end of this file's usage() for every knob.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-1.36.3}
CACHE_ROOT=${VPCNI_K8S_CACHE:-/var/cache/vpcni-k8s}
CACHE=$CACHE_ROOT/$K8S_VERSION
STATE=${VPCNI_K8S_STATE:-/var/tmp/vpcni-k8s}
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
GO=${GO:-$(command -v go || echo /usr/local/go/bin/go)}
APT_PKGS=(containerd runc etcd-server containernetworking-plugins openssl iptables curl bc iperf3)
CRICTL_VERSION=${CRICTL_VERSION:-1.36.0}

log() { printf '[k8s-node %6.2fs] %s\n' "$(elapsed)" "$*" >&2; }
die() { echo "k8s-node: $*" >&2; exit 1; }
T0=$(date +%s%N)
elapsed() { echo "scale=2; ($(date +%s%N) - $T0) / 1000000000" | bc; }

# ---------------------------------------------------------------- build

# ensure_apt PKG…: installs those of the Debian packages that are missing
# (scripts/conformance.sh uses it too, for its own list).
ensure_apt() {
	local missing=() p
	for p in "$@"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing+=("$p")
	done
	if ((${#missing[@]})); then
		log "apt-get install ${missing[*]}"
		apt-get update -qq >/dev/null
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
	fi
}

# The throwaway module: k8s.io/kubernetes at $K8S_VERSION, every staging
# module (k8s.io/api, k8s.io/kubectl, …) replaced by its published v0.x.y.
write_k8s_module() {
	local mod=$CACHE/mod upstream sv=0.${K8S_VERSION#1.}
	mkdir -p "$mod"
	upstream=$(cd "$mod" && GOFLAGS=-mod=mod "$GO" mod download -json "k8s.io/kubernetes@v$K8S_VERSION" | sed -n 's/^\t"GoMod": "\(.*\)",$/\1/p')
	[ -f "$upstream" ] || die "cannot download k8s.io/kubernetes@v$K8S_VERSION"
	{
		echo "module vpcni.local/k8sall"
		echo
		grep -m1 '^go ' "$upstream"
		grep -m1 '^godebug ' "$upstream" || true
		echo
		echo "require k8s.io/kubernetes v$K8S_VERSION"
		echo
		echo "replace ("
		awk -v v="v$sv" '$2 == "=>" && $3 ~ /^\.\/staging\// { printf "\t%s => %s %s\n", $1, $1, v }' "$upstream"
		echo ")"
	} >"$mod/go.mod"
	cp "$REPO/scripts/k8s-all/main.go" "$mod/main.go"
}

build_k8s() {
	local out=$CACHE/bin minor ldf p c
	write_k8s_module
	mkdir -p "$out"
	(cd "$CACHE/mod" && "$GO" mod tidy >/dev/null)
	minor=$(echo "$K8S_VERSION" | cut -d. -f2)
	ldf="-s -w"
	for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
		ldf+=" -X $p.gitVersion=v$K8S_VERSION -X $p.gitMajor=1 -X $p.gitMinor=$minor -X $p.gitTreeState=clean -X $p.buildDate=1970-01-01T00:00:00Z"
	done
	log "go build k8s-all (Kubernetes v$K8S_VERSION; cold ~6-8 min)"
	(cd "$CACHE/mod" && CGO_ENABLED=0 "$GO" build -tags vpcni_k8sall -trimpath -ldflags "$ldf" -o "$out/k8s-all.tmp" .)
	mv "$out/k8s-all.tmp" "$out/k8s-all"
	for c in kube-apiserver kubelet kube-controller-manager kube-scheduler kube-proxy kubectl; do
		ln -sfn k8s-all "$out/$c"
	done
}

# crictl is not in Debian bookworm. Its own throwaway module: `go install
# …@version` would ask the proxy for the module's version list (to look for
# a deprecation), which the proxy here refuses.
build_crictl() {
	local mod=$CACHE/crictl-mod
	log "go build crictl v$CRICTL_VERSION"
	mkdir -p "$mod"
	printf 'module vpcni.local/crictl\n\ngo 1.24\n\nrequire sigs.k8s.io/cri-tools v%s\n' "$CRICTL_VERSION" >"$mod/go.mod"
	printf '//go:build tools\n\npackage tools\n\nimport _ "sigs.k8s.io/cri-tools/cmd/crictl"\n' >"$mod/tools.go"
	(cd "$mod" && "$GO" mod tidy >/dev/null 2>&1 && CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" -o "$CACHE/bin/crictl" sigs.k8s.io/cri-tools/cmd/crictl)
}

PAUSE_IMAGE=registry.k8s.io/pause:3.10
NODE_REGISTRY=${NODE_REGISTRY:-127.0.0.1:5100}
BUSYBOX_IMAGE=vpcni.local/busybox:test

# The pause and busybox images, from this repo's tools/pause and Debian's
# static busybox, written by tools/mkimage (no registry anywhere).
build_images() {
	local img=$CACHE/images tmp applet
	mkdir -p "$img" "$CACHE/bin"
	(cd "$REPO" && CGO_ENABLED=0 "$GO" build -trimpath -ldflags "-s -w" -o "$CACHE/bin/" ./tools/pause ./tools/mkimage)
	"$CACHE/bin/mkimage" -name "$PAUSE_IMAGE" -out "$img/pause.tar" -entrypoint /pause -file "$CACHE/bin/pause:/pause:0755" >/dev/null
	tmp=$(mktemp -d)
	# A machine whose package lists were never fetched has nothing to
	# download from: fetch them once and retry.
	(cd "$tmp" && apt-get download -qq busybox-static >/dev/null 2>&1) ||
		{ apt-get update -qq >/dev/null && (cd "$tmp" && apt-get download -qq busybox-static >/dev/null 2>&1); } ||
		{ rm -rf "$tmp"; die "apt-get download busybox-static failed"; }
	dpkg-deb -x "$tmp"/busybox-static_*.deb "$tmp/root"
	local args=(-name "$BUSYBOX_IMAGE" -out "$img/busybox.tar" -cmd sh -file "$tmp/root/bin/busybox:/bin/busybox:0755" -dir /tmp:1777 -dir /etc -dir /root -dir /var)
	for applet in $("$tmp/root/bin/busybox" --list); do
		[ "$applet" = busybox ] || args+=(-symlink "/bin/$applet:busybox")
	done
	"$CACHE/bin/mkimage" "${args[@]}" >/dev/null
	rm -rf "$tmp"
	echo "$PAUSE_IMAGE" >"$img/pause.name"
	echo "$BUSYBOX_IMAGE" >"$img/busybox.name"
}

IPERF3_IMAGE=vpcni.local/iperf3:test

# The iperf3 image (the bandwidth e2e's server pod): Debian's iperf3 and the
# shared libraries it loads, at the paths the loader looks for them. Cheap,
# so it has its own stamp and does not touch the cached Kubernetes build.
build_iperf3_image() {
	local img=$CACHE/images bin key lib args
	bin=$(command -v iperf3) || die "iperf3 is not installed (apt-get install iperf3)"
	key="$(dpkg-query -W -f='${Version}' iperf3) $(cat "$REPO"/tools/mkimage/*.go "$REPO"/internal/ociimage/*.go | sha256sum | cut -c1-16)"
	[ "$(cat "$img/iperf3.stamp" 2>/dev/null)" != "$key" ] || return 0
	mkdir -p "$img"
	args=(-name "$IPERF3_IMAGE" -out "$img/iperf3.tar" -entrypoint /usr/bin/iperf3 -cmd -s -dir /tmp:1777
		-file "$(readlink -f "$bin"):/usr/bin/iperf3:0755")
	# ldd prints "name => /path (addr)" for libraries and "/path (addr)"
	# for the loader.
	for lib in $(ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3} $1 ~ /^\// {print $1}'); do
		args+=(-file "$(readlink -f "$lib"):$lib:0755")
	done
	"$CACHE/bin/mkimage" "${args[@]}" >/dev/null
	echo "$IPERF3_IMAGE" >"$img/iperf3.name"
	echo "$key" >"$img/iperf3.stamp"
	log "build: iperf3 image $IPERF3_IMAGE ($img/iperf3.tar)"
}

# What the cached build depends on; `build` is a no-op while it is unchanged.
build_key() {
	echo "k8s=$K8S_VERSION crictl=${CRICTL:-1}:$CRICTL_VERSION $("$GO" env GOVERSION)"
	cat "$REPO/scripts/k8s-all/main.go" "$REPO"/tools/pause/*.go "$REPO"/tools/mkimage/*.go "$REPO"/internal/ociimage/*.go | sha256sum | cut -c1-16
}

cmd_build() {
	local key
	ensure_apt "${APT_PKGS[@]}"
	key=$(build_key)
	if [ "$(cat "$CACHE/stamp" 2>/dev/null)" = "$key" ]; then
		build_iperf3_image
		log "build: up to date ($CACHE)"
		return
	fi
	rm -f "$CACHE/stamp"
	build_k8s
	[ "${CRICTL:-1}" = 0 ] || build_crictl
	build_images
	build_iperf3_image
	echo "$key" >"$CACHE/stamp"
	log "build: done ($CACHE/bin, $CACHE/images)"
}

# ---------------------------------------------------------------- node

# Fixed layout under $STATE (removed again by `down`, except logs/). The
# first node (`up`: the control plane and a kubelet) lives at $STATE
# itself; a node added by `join` under $STATE/nodes/<name> (node_layout).
PKI=$STATE/pki
ADMIN_KUBECONFIG=$STATE/admin.kubeconfig
NODES_DIR=$STATE/nodes

# node_layout [name]: the paths of the first node (no name) or of the
# joined node <name>. A joined node runs in a mount namespace of its own in
# which its own CNI dirs are bound over $STATE/cni, so that every node sees
# its CNI dirs at the same path, as every host has /etc/cni/net.d: one
# DaemonSet's hostPaths then serve all nodes. CNI_HOST_DIR is where the
# node's CNI dirs are as seen from the host.
node_layout() {
	JOINED_NAME=${1:-}
	if [ -z "$JOINED_NAME" ]; then
		NODE_DIR=$STATE
		LOGS=$STATE/logs
		CNI_HOST_DIR=$STATE/cni
		CGROUP_TOP=kubepods # the kubelet's default cgroupRoot "/" + kubepods
	else
		NODE_DIR=$NODES_DIR/$JOINED_NAME
		LOGS=$STATE/logs/$JOINED_NAME
		CNI_HOST_DIR=$NODE_DIR/cni
		# Two kubelets on one host must not share the kubepods cgroups:
		# the joined one's cgroupRoot is this.
		CGROUP_TOP=vpcni-node-$JOINED_NAME
	fi
	RUN=$NODE_DIR/run # <component>.pid, netns, node
	CNI_CONF_DIR=$STATE/cni/net.d # as the node sees it
	CNI_BIN_DIR=$STATE/cni/bin
	CTRD=$NODE_DIR/containerd
	CTRD_SOCK=$CTRD/containerd.sock
	KUBELET_DIR=$NODE_DIR/kubelet
	KUBELET_ROOT=$KUBELET_DIR/root
	KUBE_PROXY_DIR=$NODE_DIR/kube-proxy
	CRICTL_YAML=$NODE_DIR/crictl.yaml
}
node_layout

joined_nodes() { [ -d "$NODES_DIR" ] && find "$NODES_DIR" -mindepth 1 -maxdepth 1 -type d -printf '%f\n' | sort; return 0; }

# DUAL_STACK=1: the cluster runs IPv4 and IPv6 (Services and node
# addresses of both families; the node's netns needs a global IPv6
# address, or NODE_IP6).
if [ "${DUAL_STACK:-}" = 1 ]; then
	SERVICE_CIDR=${SERVICE_CIDR:-10.96.0.0/16,fd00:96::/112}
	CLUSTER_CIDR=${CLUSTER_CIDR:-10.244.0.0/16,fd00:244::/56}
fi
SERVICE_CIDR=${SERVICE_CIDR:-10.96.0.0/16}
CLUSTER_CIDR=${CLUSTER_CIDR:-10.244.0.0/16}
BRIDGE_SUBNET=${BRIDGE_SUBNET:-10.244.0.0/24}
BRIDGE_NAME=vpcni-br0
APISERVER_PORT=6443
# utsns holds the node's UTS namespace (new_uts_ns).
COMPONENTS=(utsns etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy)
# CRI_ONLY=1 up runs containerd alone (same config, CNI dirs and images):
# for CRI clients such as critest, whose sandboxes a kubelet would kill as
# orphans it never admitted (HandlePodCleanups, "Clean up containers for
# orphaned pod we had not seen before").
CRI_ONLY_COMPONENTS=(utsns containerd)
# A joined node: mntns is the process that holds its mount namespace.
JOIN_COMPONENTS=(utsns mntns containerd kubelet kube-proxy)
# The kubelet sets these host-wide sysctls (protectKernelDefaults: false);
# `up` records them and `down` puts them back.
KUBELET_SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

# in_ns runs a command in the node's network namespace only. Not `ip netns
# exec`: that also unshares the mount namespace and remounts /sys, which
# hides /sys/fs/cgroup from the kubelet and keeps the kubelet's volume
# mounts out of containerd's sight.
in_ns() { nsenter $(ns_args) -- "$@"; }

# ns_args: nsenter's arguments for the current node: its network namespace,
# its UTS namespace (while its holder runs) and, for a joined node whose
# mount namespace still exists, that too.
ns_args() {
	local h
	echo "--net=/run/netns/$NETNS"
	h=$(pid_of utsns)
	[ -z "$h" ] || echo "--uts=/proc/$h/ns/uts"
	if [ -n "$JOINED_NAME" ]; then
		h=$(pid_of mntns)
		[ -z "$h" ] || echo "--mount=/proc/$h/ns/mnt"
	fi
}

# The control plane's namespace (the first node's): kubectl runs there.
cp_netns() { cat "$STATE/run/netns" 2>/dev/null || true; }

recorded_netns() { cat "$RUN/netns" 2>/dev/null || true; }

need_netns() {
	NETNS=${NETNS:-$(recorded_netns)}
	[ -n "$NETNS" ] || die "NETNS is not set (the network namespace the node runs in, e.g. NETNS=vpcni-k8s-n1)"
	[ -e "/run/netns/$NETNS" ] || die "network namespace $NETNS does not exist"
}

netns_id() { stat -L -c %i "/run/netns/$1" 2>/dev/null || echo gone; }

pid_of() { # component -> live pid (that still runs what we started) or nothing
	local f=$RUN/$1.pid pid exe
	[ -f "$f" ] || return 0
	read -r pid exe <"$f"
	[ -n "$pid" ] && [ -d "/proc/$pid" ] || return 0
	[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ] && echo "$pid"
	return 0
}

start() { # component binary args...
	local name=$1 bin pid
	shift
	bin=$(readlink -f "$(command -v "$1")")
	# shellcheck disable=SC2046 # ns_args prints one argument a line
	setsid nsenter $(ns_args) -- "$@" >>"$LOGS/$name.log" 2>&1 </dev/null &
	pid=$!
	echo "$pid $bin" >"$RUN/$name.pid"
}

stop_pid() { # pid [grace seconds]
	local pid=$1 i
	kill "$pid" 2>/dev/null || return 0
	for ((i = 0; i < ${2:-10} * 10; i++)); do
		[ -d "/proc/$pid" ] || return 0
		sleep 0.1
	done
	kill -9 "$pid" 2>/dev/null || true
	for ((i = 0; i < 50; i++)); do [ -d "/proc/$pid" ] || return 0; sleep 0.1; done
}

# stop_components sends SIGTERM to every named component at once, then waits
# for each (SIGKILL after 10 s).
stop_components() {
	local c pid pids=()
	for c in "$@"; do
		pid=$(pid_of "$c")
		[ -z "$pid" ] || { kill "$pid" 2>/dev/null || true; pids+=("$pid"); }
	done
	for pid in "${pids[@]}"; do stop_pid "$pid" 10; done
	for c in "$@"; do rm -f "$RUN/$c.pid"; done
}

wait_for() { # seconds description command...
	local secs=$1 what=$2 i
	shift 2
	for ((i = 0; i < secs * 10; i++)); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.1
	done
	die "$what: not within ${secs}s (logs: $LOGS)"
}

kubectl_() { nsenter --net="/run/netns/$(cp_netns)" -- "$CACHE/bin/kubectl" --kubeconfig "$ADMIN_KUBECONFIG" "$@"; }
crictl_() { "$CACHE/bin/crictl" --config "$CRICTL_YAML" "$@"; }
ctr_() { ctr -a "$CTRD_SOCK" -n k8s.io "$@"; }

node_ip() {
	local ip
	ip=$(ip -n "$NETNS" -4 route get 192.0.2.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')
	[ -n "$ip" ] || ip=$(ip -n "$NETNS" -4 -o addr show scope global | awk '{sub("/.*", "", $4); print $4; exit}')
	echo "$ip"
}

# node_ip6: the node's global IPv6 address (DUAL_STACK).
node_ip6() {
	ip -n "$NETNS" -6 -o addr show scope global | awk '{sub("/.*", "", $4); print $4; exit}'
}

# node_ips: what the kubelet's --node-ip says: the IPv4 address, and the
# IPv6 one after it on a dual-stack node.
node_ips() { echo "$NODE_IP${NODE_IP6:+,$NODE_IP6}"; }

# dual_stack_ips reads the node's IPv6 address on a dual-stack cluster.
dual_stack_ips() {
	[ "${DUAL_STACK:-}" = 1 ] || return 0
	NODE_IP6=${NODE_IP6:-$(node_ip6)}
	[ -n "$NODE_IP6" ] || die "DUAL_STACK=1 but no global IPv6 address in $NETNS: give it one or set NODE_IP6"
}

# cidr_mask_flags: kube-controller-manager's node CIDR sizes (the one flag
# is refused on a dual-stack cluster).
cidr_mask_flags() {
	if [ "${DUAL_STACK:-}" = 1 ]; then
		echo "--node-cidr-mask-size-ipv4=24 --node-cidr-mask-size-ipv6=64"
	else
		echo "--node-cidr-mask-size=24"
	fi
}

# ---- PKI: one CA; every component's client certificate; kubeconfigs.

sign() { # name subject extension-lines
	openssl req -new -newkey rsa:2048 -nodes -keyout "$PKI/$1.key" -out "$PKI/$1.csr" -subj "$2" 2>/dev/null
	printf '%b\n' "$3" >"$PKI/$1.ext"
	openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
		-out "$PKI/$1.crt" -days 365 -extfile "$PKI/$1.ext" 2>/dev/null
	rm -f "$PKI/$1.csr"
}

kubeconfig() { # name user-cert [server] -> $PKI/name.kubeconfig (default server: the namespace's loopback)
	cat >"${KUBECONFIG_OUT:-$PKI/$1.kubeconfig}" <<EOK
apiVersion: v1
kind: Config
clusters:
- name: vpcni-k8s
  cluster:
    server: ${3:-https://127.0.0.1:$APISERVER_PORT}
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $1
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$2.crt")
    client-key-data: $(base64 -w0 "$PKI/$2.key")
contexts:
- name: vpcni-k8s
  context: {cluster: vpcni-k8s, user: $1}
current-context: vpcni-k8s
EOK
}

gen_pki() {
	local svc_ip client='extendedKeyUsage=clientAuth'
	svc_ip=$(first_service_ip)
	mkdir -p "$PKI"
	openssl req -x509 -newkey rsa:2048 -nodes -keyout "$PKI/ca.key" -out "$PKI/ca.crt" -days 365 -subj "/CN=vpcni-k8s-ca" 2>/dev/null
	sign apiserver "/CN=kube-apiserver" "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:$NODE_IP,${NODE_IP6:+IP:$NODE_IP6,}IP:$svc_ip,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
	sign admin "/O=system:masters/CN=vpcni-k8s-admin" "$client"
	sign kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" "$client"
	sign apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "$client"
	sign controller-manager "/CN=system:kube-controller-manager" "$client"
	sign scheduler "/CN=system:kube-scheduler" "$client"
	sign kube-proxy "/CN=system:kube-proxy" "$client"
	openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
	openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
	for u in admin kubelet controller-manager scheduler kube-proxy; do kubeconfig "$u" "$u"; done
	cp "$PKI/admin.kubeconfig" "$ADMIN_KUBECONFIG"
}

first_service_ip() { # 10.96.0.0/16 -> 10.96.0.1 (of the first family)
	local net=${SERVICE_CIDR%%,*}
	net=${net%/*}
	echo "${net%.*}.$((${net##*.} + 1))"
}

# ---- configuration files

write_configs() {
	local kubeconfig_dir=${JOINED_NAME:+$NODE_DIR}
	kubeconfig_dir=${kubeconfig_dir:-$PKI}
	mkdir -p "$CTRD" "$KUBELET_DIR" "$KUBE_PROXY_DIR" "$CNI_HOST_DIR/net.d" "$CNI_HOST_DIR/bin" "$CNI_HOST_DIR/state"
	cp /usr/lib/cni/* "$CNI_HOST_DIR/bin/"
	printf 'runtime-endpoint: unix://%s\nimage-endpoint: unix://%s\ntimeout: 10\n' "$CTRD_SOCK" "$CTRD_SOCK" >"$CRICTL_YAML"
	cat >"$CTRD/config.toml" <<EOC
version = 2
root = "$CTRD/root"
state = "$CTRD/state"

[grpc]
  address = "$CTRD_SOCK"

[plugins."io.containerd.internal.v1.opt"]
  path = "$CTRD/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  # without CAP_SYS_RESOURCE here runc fails ("can't get final child's PID from pipe: EOF")
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "$CTRD/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "$CNI_BIN_DIR"
    conf_dir = "$CNI_CONF_DIR"
    max_conf_num = 1
  # Registry hosts, one certs.d/HOST/hosts.toml each (containerd's
  # registry host configuration).
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "$CTRD/certs.d"
EOC
	# NODE_REGISTRY: a registry that serves plain HTTP on the node's own
	# loopback. The real-node e2e runs one there (scripts/registry.sh with
	# VPCNI_REGISTRY_NETNS, in this node's namespace: the node reaches it
	# as a node reaches its cluster's registry, and nothing of it is
	# reachable from the machine's own namespaces) and installs vpcni by
	# pulling from it. Without it running, nothing pulls from it.
	mkdir -p "$CTRD/certs.d/$NODE_REGISTRY"
	cat >"$CTRD/certs.d/$NODE_REGISTRY/hosts.toml" <<EOC
server = "http://$NODE_REGISTRY"

[host."http://$NODE_REGISTRY"]
  capabilities = ["pull", "resolve"]
EOC
	cat >"$KUBELET_DIR/config.yaml" <<EOC
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
containerRuntimeEndpoint: unix://$CTRD_SOCK
imageServiceEndpoint: unix://$CTRD_SOCK
cgroupDriver: cgroupfs
failSwapOn: false
failCgroupV1: false
podLogsDir: $KUBELET_DIR/pod-logs
${JOINED_NAME:+cgroupRoot: /$CGROUP_TOP}
clusterDomain: cluster.local
# CLUSTER_DNS: the cluster DNS Service's address, for a caller that runs
# one (the conformance run's CoreDNS); without it pods get the node's.
${CLUSTER_DNS:+clusterDNS: [$CLUSTER_DNS]}
resolvConf: /etc/resolv.conf
rotateCertificates: false
serverTLSBootstrap: false
registerNode: true
# As deploy/ advises: no pods on the pod network until vpcnid's pool is
# warm; vpcnid removes the taint then.
registerWithTaints:
  - {key: vpcni.io/not-ready, effect: NoSchedule}
evictionHard:
  memory.available: "100Mi"
  nodefs.available: "1%"
  imagefs.available: "1%"
  nodefs.inodesFree: "1%"
# no registry to pull them back from: never collect images
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
syncFrequency: 10s
fileCheckFrequency: 10s
nodeStatusUpdateFrequency: 5s
EOC
	cat >"$KUBE_PROXY_DIR/config.yaml" <<EOC
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection:
  kubeconfig: $kubeconfig_dir/kube-proxy.kubeconfig
mode: iptables
hostnameOverride: $NODE_NAME
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# nf_conntrack_max is read-only outside the initial network namespace;
# zero leaves every conntrack sysctl alone.
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
  udpTimeout: 0s
  udpStreamTimeout: 0s
EOC
}

# ---- CNI: none by default (the node stays NotReady until a CNI installs a
# conflist); `CNI=bridge up` or `cni bridge` writes Debian's bridge plugin.

cni_bridge() {
	local d=$CNI_HOST_DIR/net.d subnet=$BRIDGE_SUBNET
	# BRIDGE_CONF names the file: the default sorts after vpcni's
	# 00-vpcni.conflist (a CNI being replaced), 00-bridge.conflist before it.
	local f=$d/${BRIDGE_CONF:-10-vpcni-k8s-bridge.conflist}
	# A joined node's pods get its own podCIDR (the first node's is the
	# first /24, BRIDGE_SUBNET's default).
	if [ -n "$JOINED_NAME" ]; then
		subnet=$(kubectl_ get node "$JOINED_NAME" -o 'jsonpath={.spec.podCIDR}')
		[ -n "$subnet" ] || die "node $JOINED_NAME has no podCIDR yet"
	fi
	# containerd 1.6 ignores a conflist mv-ed in from another directory:
	# write it inside net.d under a name it skips, then rename it there.
	cat >"$d/.bridge.tmp" <<EOC
{
  "cniVersion": "1.0.0",
  "name": "vpcni-k8s-bridge",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE_NAME",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$subnet"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$STATE/cni/state/host-local"
      }
    },
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOC
	mv "$d/.bridge.tmp" "$f"
	echo "$f"
}

node_ready() { [ "$(kubectl_ get node "$NODE_NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" = True ]; }

apiserver_ready() {
	in_ns curl -fsS --max-time 2 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" \
		"https://127.0.0.1:$APISERVER_PORT/readyz" | grep -qx ok
}

# wanted_components: what `up` starts in this mode; running_mode: the mode
# the running node was started in.
wanted_components() { if [ "${CRI_ONLY:-}" = 1 ]; then echo "${CRI_ONLY_COMPONENTS[@]}"; else echo "${COMPONENTS[@]}"; fi; }
running_mode() { cat "$RUN/mode" 2>/dev/null || echo full; }

all_running() {
	local c
	for c in $(wanted_components); do [ -n "$(pid_of "$c")" ] || return 1; done
}

cmd_up() {
	need_netns
	[ -f "$CACHE/stamp" ] || die "nothing built for Kubernetes $K8S_VERSION: run $0 build first"
	local id
	id=$(netns_id "$NETNS")
	local mode=full
	[ "${CRI_ONLY:-}" != 1 ] || mode=cri-only
	if all_running && [ "$(running_mode)" = "$mode" ] && [ "$(cat "$RUN/netns-id" 2>/dev/null)" = "$id" ] && [ "$(recorded_netns)" = "$NETNS" ]; then
		load_node
		[ "${CNI:-}" != bridge ] || cni_bridge >/dev/null
		log "already up in $NETNS"
		print_env
		return
	fi
	if [ -d "$RUN" ]; then
		log "stopping the leftovers of an earlier run"
		NETNS_SAVED=$NETNS
		NETNS=$(recorded_netns) cmd_down >/dev/null
		NETNS=$NETNS_SAVED
	fi
	NODE_NAME=${NODE_NAME:-$NETNS}
	ip -n "$NETNS" link set lo up
	NODE_IP=${NODE_IP:-$(node_ip)}
	[ -n "$NODE_IP" ] || die "no IPv4 address in $NETNS to advertise: give it one or set NODE_IP"
	dual_stack_ips
	mkdir -p "$RUN" "$LOGS"
	for f in "$LOGS"/*.log; do [ -e "$f" ] && mv "$f" "$f.prev"; done
	echo "$NETNS" >"$RUN/netns"
	echo "$id" >"$RUN/netns-id"
	echo "$mode" >"$RUN/mode"
	printf 'NODE_NAME=%s\nNODE_IP=%s\nNODE_IP6=%s\n' "$NODE_NAME" "$NODE_IP" "${NODE_IP6:-}" >"$RUN/node"
	for s in "${KUBELET_SYSCTLS[@]}"; do echo "$s=$(sysctl -n "$s")"; done >"$RUN/sysctls"
	for p in /var/log/containers /var/lib/cni; do [ ! -e "$p" ] || echo "$p"; done >"$RUN/preexisting"

	gen_pki
	write_configs
	new_uts_ns
	log "pki and configs written ($NETNS, node $NODE_NAME at $NODE_IP)"

	if [ "$mode" = cri-only ]; then
		start containerd containerd -c "$CTRD/config.toml"
		wait_for 30 "containerd socket" ctr_ version
		import_images
		log "containerd up (CRI_ONLY: no control plane, no kubelet), images imported"
		print_env
		return
	fi
	mkdir -p "$STATE/etcd"
	start etcd etcd --name vpcni-k8s --data-dir "$STATE/etcd/data" \
		--listen-client-urls http://127.0.0.1:2379 --advertise-client-urls http://127.0.0.1:2379 \
		--listen-peer-urls http://127.0.0.1:2380 --initial-advertise-peer-urls http://127.0.0.1:2380 \
		--initial-cluster vpcni-k8s=http://127.0.0.1:2380 --unsafe-no-fsync
	start containerd containerd -c "$CTRD/config.toml"
	wait_for 30 "etcd healthy" sh -c "nsenter --net=/run/netns/$NETNS curl -fsS http://127.0.0.1:2379/health | grep -q true"
	log "etcd healthy"

	start kube-apiserver "$CACHE/bin/kube-apiserver" \
		--etcd-servers=http://127.0.0.1:2379 \
		--bind-address=0.0.0.0 --secure-port=$APISERVER_PORT --advertise-address="$NODE_IP" \
		--cert-dir="$STATE/apiserver" --tls-cert-file="$PKI/apiserver.crt" --tls-private-key-file="$PKI/apiserver.key" \
		--client-ca-file="$PKI/ca.crt" \
		--service-account-key-file="$PKI/sa.pub" --service-account-signing-key-file="$PKI/sa.key" \
		--service-account-issuer=https://kubernetes.default.svc.cluster.local \
		--service-cluster-ip-range="$SERVICE_CIDR" \
		--authorization-mode=Node,RBAC --enable-admission-plugins=NodeRestriction \
		--kubelet-client-certificate="$PKI/apiserver-kubelet-client.crt" --kubelet-client-key="$PKI/apiserver-kubelet-client.key" \
		--kubelet-preferred-address-types=InternalIP,Hostname \
		--allow-privileged=true --profiling=false

	wait_for 30 "containerd socket" ctr_ version
	import_images
	log "containerd up, pause, busybox and iperf3 imported"
	wait_for 90 "kube-apiserver ready" apiserver_ready
	log "kube-apiserver ready"

	start kube-controller-manager "$CACHE/bin/kube-controller-manager" \
		--kubeconfig="$PKI/controller-manager.kubeconfig" \
		--authentication-kubeconfig="$PKI/controller-manager.kubeconfig" --authorization-kubeconfig="$PKI/controller-manager.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port=10257 --leader-elect=false \
		--service-account-private-key-file="$PKI/sa.key" --root-ca-file="$PKI/ca.crt" --use-service-account-credentials=true \
		--cluster-cidr="$CLUSTER_CIDR" --allocate-node-cidrs=true $(cidr_mask_flags) \
		--service-cluster-ip-range="$SERVICE_CIDR" \
		--cluster-signing-cert-file="$PKI/ca.crt" --cluster-signing-key-file="$PKI/ca.key"
	start kube-scheduler "$CACHE/bin/kube-scheduler" --kubeconfig="$PKI/scheduler.kubeconfig" \
		--authentication-kubeconfig="$PKI/scheduler.kubeconfig" --authorization-kubeconfig="$PKI/scheduler.kubeconfig" \
		--bind-address=127.0.0.1 --secure-port=10259 --leader-elect=false
	mkdir -p "$KUBELET_ROOT" "$KUBELET_DIR/pod-logs" "$KUBELET_DIR/certs"
	start kubelet "$CACHE/bin/kubelet" --config="$KUBELET_DIR/config.yaml" --kubeconfig="$PKI/kubelet.kubeconfig" \
		--root-dir="$KUBELET_ROOT" --cert-dir="$KUBELET_DIR/certs" \
		--hostname-override="$NODE_NAME" --node-ip="$(node_ips)" -v=2
	start kube-proxy "$CACHE/bin/kube-proxy" --config="$KUBE_PROXY_DIR/config.yaml" -v=2
	wait_for 60 "node $NODE_NAME registered" kubectl_ get node "$NODE_NAME"
	log "node $NODE_NAME registered"
	wait_for 60 "default service account" kubectl_ get serviceaccount default
	[ "${CNI:-}" != bridge ] || { cni_bridge >/dev/null; log "bridge conflist written"; }
	if [ "${CNI:-}" = bridge ] || [ "${WAIT_READY:-}" = 1 ]; then
		wait_for 120 "node $NODE_NAME Ready" node_ready
		log "node $NODE_NAME Ready"
	fi
	print_env
}

import_images() {
	local f
	ctr_ images import "$CACHE/images/pause.tar" >/dev/null
	ctr_ images import "$CACHE/images/busybox.tar" >/dev/null
	[ ! -f "$CACHE/images/iperf3.tar" ] || ctr_ images import "$CACHE/images/iperf3.tar" >/dev/null
	for f in ${IMAGES:-}; do ctr_ images import "$f" >/dev/null; done
}

load_node() {
	# shellcheck disable=SC1091
	[ -f "$RUN/node" ] && . "$RUN/node"
	return 0
}

# print_env prints the node's interface as shell assignments (`eval`-able,
# and what tests read); also kept in $STATE/env.
print_env() {
	load_node
	cat <<EOE | tee "$NODE_DIR/env"
VPCNI_K8S_NETNS=$NETNS
VPCNI_K8S_NODE=$NODE_NAME
VPCNI_K8S_NODE_IP=$NODE_IP
VPCNI_K8S_NODE_IP6=${NODE_IP6:-}
VPCNI_K8S_KUBECONFIG=$ADMIN_KUBECONFIG
VPCNI_K8S_KUBECTL=$CACHE/bin/kubectl
VPCNI_K8S_APISERVER=https://127.0.0.1:$APISERVER_PORT
VPCNI_K8S_CNI_CONF_DIR=$CNI_CONF_DIR
VPCNI_K8S_CNI_BIN_DIR=$CNI_BIN_DIR
VPCNI_K8S_CONTAINERD_SOCK=$CTRD_SOCK
VPCNI_K8S_KUBELET_ROOT=$KUBELET_ROOT
VPCNI_K8S_SERVICE_CIDR=$SERVICE_CIDR
VPCNI_K8S_PAUSE_IMAGE=$PAUSE_IMAGE
VPCNI_K8S_BUSYBOX_IMAGE=$BUSYBOX_IMAGE
VPCNI_K8S_IPERF3_IMAGE=$IPERF3_IMAGE
VPCNI_K8S_CNI_CONF_HOST_DIR=$CNI_HOST_DIR/net.d
VPCNI_K8S_CNI_BIN_HOST_DIR=$CNI_HOST_DIR/bin
VPCNI_K8S_JOINED=${JOINED_NAME:+1}
EOE
}

# ---- down

# The pods' network namespaces containerd created (/var/run/netns/cni-…),
# read before the sandboxes go: from a live containerd, and from its
# metadata store, which also names those of a containerd that crashed.
pod_netns_paths() {
	local id db=$CTRD/root/io.containerd.metadata.v1.bolt/meta.db
	{
		if [ -x "$CACHE/bin/crictl" ] && [ -n "$(pid_of containerd)" ]; then
			for id in $(crictl_ pods -q 2>/dev/null); do
				crictl_ inspectp "$id" 2>/dev/null | sed -n 's|.*"path": "\(/var/run/netns/cni-[^"]*\)".*|\1|p'
			done
		fi
		[ ! -f "$db" ] || grep -aoE '/var/run/netns/cni-[0-9a-f-]{36}' "$db" || true
	} | sort -u
}

# kube_iptables_cleanup removes the KUBE-* chains that remain in the node's
# namespace after `kube-proxy --cleanup` (the kubelet's KUBE-FIREWALL,
# canaries, hints) and the jumps to them.
kube_iptables_cleanup() {
	local ipt t rule c chains
	for ipt in iptables ip6tables; do
		for t in filter nat mangle raw; do
			in_ns "$ipt" -t "$t" -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | grep -vE '^-A KUBE-' | sed 's/^-A/-D/' |
				while read -r rule; do eval "in_ns $ipt -t $t $rule" 2>/dev/null || true; done || true
			chains=$(in_ns "$ipt" -t "$t" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[^ ]*\)$/\1/p')
			for c in $chains; do in_ns "$ipt" -t "$t" -F "$c" 2>/dev/null || true; done
			for c in $chains; do in_ns "$ipt" -t "$t" -X "$c" 2>/dev/null || true; done
		done
	done
}

cmd_down() {
	local name
	node_layout
	NETNS=${NETNS:-$(recorded_netns)}
	load_node
	stop_components kube-controller-manager kube-scheduler
	# Pods with a network go first, on every node, while the kubelets, the
	# API and a CNI agent running as a pod are still there to tear them down.
	if [ -n "$(cp_netns)" ] && [ -e "/run/netns/$(cp_netns)" ] && [ -n "$(pid_of kubelet)" ] && [ -n "$(pid_of kube-apiserver)" ]; then
		kubectl_ delete pods --all-namespaces --field-selector spec.hostNetwork!=true --grace-period=1 --wait=true --timeout=60s >/dev/null 2>&1 || log "down: pods did not all go through the API; removing them through the runtime"
		log "down: pods with a network deleted"
	fi
	for name in $(joined_nodes); do
		node_layout "$name"
		NETNS=$(recorded_netns)
		node_teardown || return 1
		rm -rf "${NODES_DIR:?}/$name"
		log "down: joined node $name removed"
	done
	node_layout
	NETNS=$(recorded_netns)
	node_teardown || return 1
	find "$STATE" -mindepth 1 -maxdepth 1 ! -name logs -exec rm -rf {} +
	log "down: stopped; logs kept in $LOGS"
}

# node_teardown stops the current node (node_layout): its kubelet,
# kube-proxy, containers and containerd — and for the first node the
# control plane — and removes what they left on the host.
node_teardown() {
	local have_ns=0 pid nspaths p h
	[ -n "$NETNS" ] && [ -e "/run/netns/$NETNS" ] && [ "$(netns_id "$NETNS")" = "$(cat "$RUN/netns-id" 2>/dev/null)" ] && have_ns=1
	stop_components kubelet kube-proxy
	log "down${JOINED_NAME:+ $JOINED_NAME}: kubelet and kube-proxy stopped"
	nspaths=$(pod_netns_paths)
	if [ -n "$(pid_of containerd)" ]; then
		if [ -x "$CACHE/bin/crictl" ]; then
			crictl_ stop --timeout 5 $(crictl_ ps -q 2>/dev/null) >/dev/null 2>&1 || true
			for p in $(crictl_ pods -q 2>/dev/null); do crictl_ stopp "$p" >/dev/null 2>&1 || true; done
			crictl_ rmp -af >/dev/null 2>&1 || true
		fi
		for p in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s SIGKILL "$p" >/dev/null 2>&1 || true; done
		sleep 0.5
		for p in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks rm -f "$p" >/dev/null 2>&1 || true; done
		for p in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers rm "$p" >/dev/null 2>&1 || true; done
	fi
	# Shims started by this node's containerd (they outlive it) and anything
	# left in its kubelet's cgroups: all of it ours, stopped by PID.
	# A shim listens on /run/containerd/s/<sha256 of address/namespace/id>
	# and leaves it behind when killed.
	local shim_exe id
	shim_exe=$(readlink -f "$(command -v containerd-shim-runc-v2)")
	for pid in $(grep -lsF -- "$CTRD_SOCK" /proc/[0-9]*/cmdline | cut -d/ -f3); do
		[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$shim_exe" ] || continue
		id=$(tr '\0' '\n' <"/proc/$pid/cmdline" | sed -n '/^-id$/{n;p}')
		stop_pid "$pid" 5
		[ -z "$id" ] || rm -f "/run/containerd/s/$(printf '%s' "$CTRD_SOCK/k8s.io/$id" | sha256sum | cut -c1-64)"
	done
	for pid in $(find "/sys/fs/cgroup/pids/$CGROUP_TOP" -name cgroup.procs -exec cat {} + 2>/dev/null); do
		kill -9 "$pid" 2>/dev/null || true
	done
	log "down${JOINED_NAME:+ $JOINED_NAME}: containers removed"
	if [ -n "$JOINED_NAME" ]; then
		stop_components containerd
	else
		stop_components containerd kube-apiserver etcd
		log "down: containerd, kube-apiserver, etcd stopped"
	fi
	if ((have_ns)); then
		[ -x "$CACHE/bin/kube-proxy" ] && in_ns "$CACHE/bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
		kube_iptables_cleanup
		ip -n "$NETNS" link del "$BRIDGE_NAME" 2>/dev/null || true
	fi
	# A joined node's mount namespace ends with its last process: its
	# mounts (the CNI dirs, the pods' network namespaces, the kubelet's
	# volumes) go with it.
	stop_components mntns utsns
	# Mounts: the pods' network namespaces, then every mount under $STATE
	# (of the first node: a joined node's were in its own mount namespace).
	for p in $nspaths; do
		umount "$p" 2>/dev/null || umount -l "$p" 2>/dev/null || true
		rm -f "$p"
	done
	if [ -z "$JOINED_NAME" ]; then
		{ grep -oE " $STATE/[^ ]+" /proc/self/mounts || true; } | sort -r | while read -r p; do
			umount "$p" 2>/dev/null || umount -l "$p" 2>/dev/null || true
		done
	fi
	# cgroups the kubelet created (kubepods, or a joined node's cgroupRoot
	# with its kubepods), deepest first
	for h in /sys/fs/cgroup/*/; do
		[ ! -d "$h$CGROUP_TOP" ] || find "$h$CGROUP_TOP" -depth -type d -exec rmdir {} + 2>/dev/null || true
	done
	[ -z "$JOINED_NAME" ] || return 0
	# the kubelets' log links, and the dirs they and libcni made if they were not there
	find /var/log/containers -maxdepth 1 -lname "$STATE/*" -delete 2>/dev/null || true
	for p in /var/log/containers /var/lib/cni; do
		grep -qxF "$p" "$RUN/preexisting" 2>/dev/null || find "$p" -depth -type d -empty -delete 2>/dev/null || true
	done
	rmdir /run/containerd/s /run/containerd 2>/dev/null || true
	if [ -f "$RUN/sysctls" ]; then
		while IFS='=' read -r k v; do sysctl -qw "$k=$v" 2>/dev/null || true; done <"$RUN/sysctls"
	fi
	if grep -qF " $STATE/" /proc/self/mounts; then
		log "down: mounts remain under $STATE; left the state in place"
		return 1
	fi
}

# ---- join: another node (containerd, kubelet, kube-proxy) in another
# network namespace, registered with the first node's API server at its
# lab address.

# The host paths a joined node gets its own copy of, in its mount namespace:
# its CNI dirs at the first node's path, libcni's cache, and PRIVATE (the
# caller's per-node hostPaths, e.g. a CNI agent's socket and state dirs).
join_private_dirs() { echo "$STATE/cni" /var/lib/cni ${PRIVATE:-}; }

# new_uts_ns starts the process that holds the node's UTS namespace and
# names it after the node: every component starts in it (ns_args), so a
# hostNetwork pod, which shares containerd's, has the node's name as its
# hostname, as on a host of its own (the nodes here are namespaces of one
# machine, whose own host name they would all share otherwise).
new_uts_ns() {
	local pid exe i
	exe=$(readlink -f "$(command -v sleep)")
	setsid unshare --uts -- sleep infinity >/dev/null 2>&1 </dev/null &
	pid=$!
	echo "$pid $exe" >"$RUN/utsns.pid"
	for ((i = 0; i < 50; i++)); do
		[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ] && break
		sleep 0.1
	done
	[ -n "$(pid_of utsns)" ] || die "the UTS namespace holder did not start"
	nsenter --uts="/proc/$pid/ns/uts" -- hostname "$NODE_NAME" || die "cannot name the UTS namespace of $NODE_NAME"
}

# new_mount_ns starts the process that holds the joined node's mount
# namespace (a slave of the host's, so new network namespaces and mounts
# of the host still show), binds the node's private dirs in it, and makes
# its mounts shared within it (the kubelet's Bidirectional and
# HostToContainer volumes need shared mounts; nothing goes back to the host).
new_mount_ns() {
	local pid exe i d src script=""
	exe=$(readlink -f "$(command -v sleep)")
	setsid unshare --mount --propagation slave -- sleep infinity >/dev/null 2>&1 </dev/null &
	pid=$!
	echo "$pid $exe" >"$RUN/mntns.pid"
	for ((i = 0; i < 50; i++)); do
		[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" = "$exe" ] && break
		sleep 0.1
	done
	[ -n "$(pid_of mntns)" ] || die "the mount namespace holder did not start"
	for d in $(join_private_dirs); do
		case $d in
		"$STATE/cni") src=$CNI_HOST_DIR ;;
		*) src=$NODE_DIR/private/$(echo "${d#/}" | tr / _) ;;
		esac
		mkdir -p "$src" "$d"
		script+="mount --bind '$src' '$d' && "
	done
	nsenter --mount="/proc/$pid/ns/mnt" -- sh -c "${script}mount --make-rshared /" ||
		die "cannot set up the mount namespace of $JOINED_NAME"
}

# prepare_cgroup_root creates the joined kubelet's cgroupRoot in every
# cgroup v1 hierarchy (the kubelet refuses one that does not exist);
# cpuset needs its cpus and mems before anything can join a child.
prepare_cgroup_root() {
	local h
	for h in /sys/fs/cgroup/*/; do
		[ -d "$h" ] && [ ! -L "${h%/}" ] || continue
		[ -f "${h}cgroup.procs" ] || continue
		mkdir -p "$h$CGROUP_TOP"
	done
	if [ -d /sys/fs/cgroup/cpuset/"$CGROUP_TOP" ]; then
		cat /sys/fs/cgroup/cpuset/cpuset.cpus >/sys/fs/cgroup/cpuset/"$CGROUP_TOP"/cpuset.cpus
		cat /sys/fs/cgroup/cpuset/cpuset.mems >/sys/fs/cgroup/cpuset/"$CGROUP_TOP"/cpuset.mems
	fi
}

joined_running() {
	local c
	for c in "${JOIN_COMPONENTS[@]}"; do [ -n "$(pid_of "$c")" ] || return 1; done
}

cmd_join() {
	[ -n "${NETNS:-}" ] || die "NETNS is not set (the network namespace of the node to join, e.g. NETNS=vpcni-k8s-n2)"
	[ -e "/run/netns/$NETNS" ] || die "network namespace $NETNS does not exist"
	node_layout
	local cp_ip id name=${NODE_NAME:-$NETNS}
	[ -n "$(pid_of kube-apiserver)" ] || die "no control plane runs: NETNS=… $0 up first"
	[ "$name" != "$(. "$RUN/node" && echo "$NODE_NAME")" ] || die "$name is the first node"
	cp_ip=$(. "$RUN/node" && echo "$NODE_IP")
	node_layout "$name"
	id=$(netns_id "$NETNS")
	if joined_running && [ "$(cat "$RUN/netns-id" 2>/dev/null)" = "$id" ] && [ "$(recorded_netns)" = "$NETNS" ]; then
		load_node
		[ "${CNI:-}" != bridge ] || cni_bridge >/dev/null
		log "already joined: $name in $NETNS"
		print_env
		return
	fi
	if [ -d "$NODE_DIR" ]; then
		log "stopping the leftovers of an earlier $name"
		local saved=$NETNS
		NETNS=$(recorded_netns) node_teardown >/dev/null
		NETNS=$saved
		rm -rf "$NODE_DIR"
	fi
	NODE_NAME=$name
	ip -n "$NETNS" link set lo up
	NODE_IP=${NODE_IP:-$(node_ip)}
	[ -n "$NODE_IP" ] || die "no IPv4 address in $NETNS to advertise: give it one or set NODE_IP"
	dual_stack_ips
	mkdir -p "$RUN" "$LOGS"
	for f in "$LOGS"/*.log; do [ -e "$f" ] && mv "$f" "$f.prev"; done
	echo "$NETNS" >"$RUN/netns"
	echo "$id" >"$RUN/netns-id"
	printf 'NODE_NAME=%s\nNODE_IP=%s\nNODE_IP6=%s\nCP_IP=%s\n' "$NODE_NAME" "$NODE_IP" "${NODE_IP6:-}" "$cp_ip" >"$RUN/node"

	# Its own kubelet identity (the Node authorizer and NodeRestriction
	# check the name); kube-proxy's certificate is the cluster's.
	sign "kubelet-$NODE_NAME" "/O=system:nodes/CN=system:node:$NODE_NAME" 'extendedKeyUsage=clientAuth'
	KUBECONFIG_OUT=$NODE_DIR/kubelet.kubeconfig kubeconfig "kubelet-$NODE_NAME" "kubelet-$NODE_NAME" "https://$cp_ip:$APISERVER_PORT"
	KUBECONFIG_OUT=$NODE_DIR/kube-proxy.kubeconfig kubeconfig kube-proxy kube-proxy "https://$cp_ip:$APISERVER_PORT"
	write_configs
	prepare_cgroup_root
	new_uts_ns
	new_mount_ns
	log "join: configs and mount namespace ready ($NETNS, node $NODE_NAME at $NODE_IP, API at $cp_ip:$APISERVER_PORT)"

	start containerd containerd -c "$CTRD/config.toml"
	wait_for 30 "containerd socket" ctr_ version
	ctr_ images import "$CACHE/images/pause.tar" >/dev/null
	ctr_ images import "$CACHE/images/busybox.tar" >/dev/null
	[ ! -f "$CACHE/images/iperf3.tar" ] || ctr_ images import "$CACHE/images/iperf3.tar" >/dev/null
	for f in ${IMAGES:-}; do ctr_ images import "$f" >/dev/null; done
	mkdir -p "$KUBELET_ROOT" "$KUBELET_DIR/pod-logs" "$KUBELET_DIR/certs"
	start kubelet "$CACHE/bin/kubelet" --config="$KUBELET_DIR/config.yaml" --kubeconfig="$NODE_DIR/kubelet.kubeconfig" \
		--root-dir="$KUBELET_ROOT" --cert-dir="$KUBELET_DIR/certs" \
		--hostname-override="$NODE_NAME" --node-ip="$(node_ips)" -v=2
	start kube-proxy "$CACHE/bin/kube-proxy" --config="$KUBE_PROXY_DIR/config.yaml" -v=2
	wait_for 60 "node $NODE_NAME registered" kubectl_ get node "$NODE_NAME"
	log "node $NODE_NAME registered"
	if [ "${CNI:-}" = bridge ]; then
		wait_for 30 "podCIDR of $NODE_NAME" sh -c "[ -n \"\$(nsenter --net=/run/netns/$(cp_netns) $CACHE/bin/kubectl --kubeconfig $ADMIN_KUBECONFIG get node $NODE_NAME -o jsonpath={.spec.podCIDR})\" ]"
		cni_bridge >/dev/null
		log "bridge conflist written"
	fi
	if [ "${CNI:-}" = bridge ] || [ "${WAIT_READY:-}" = 1 ]; then
		wait_for 120 "node $NODE_NAME Ready" node_ready
		log "node $NODE_NAME Ready"
	fi
	print_env
}

cmd_status() {
	local c pid rc=0 name
	node_layout
	NETNS=${NETNS:-$(recorded_netns)}
	load_node
	echo "netns      ${NETNS:-none}"
	echo "node       ${NODE_NAME:-?} ${NODE_IP:-}"
	echo "kubeconfig $ADMIN_KUBECONFIG (kubectl: $0 kubectl …)"
	[ "$(running_mode)" != cri-only ] || CRI_ONLY=1
	echo "mode       $(running_mode)"
	for c in $(wanted_components); do
		pid=$(pid_of "$c")
		if [ -n "$pid" ]; then printf '%-24s pid %s\n' "$c" "$pid"; else printf '%-24s not running\n' "$c"; rc=1; fi
	done
	for name in $(joined_nodes); do
		node_layout "$name"
		echo "joined     $name in $(recorded_netns)"
		for c in "${JOIN_COMPONENTS[@]}"; do
			pid=$(pid_of "$c")
			if [ -n "$pid" ]; then printf '  %-22s pid %s\n' "$c" "$pid"; else printf '  %-22s not running\n' "$c"; rc=1; fi
		done
	done
	if ((rc == 0)) && [ "${CRI_ONLY:-}" != 1 ]; then
		kubectl_ get nodes -o wide 2>&1 || true
		kubectl_ get pods -A -o wide 2>&1 || true
	fi
	return $rc
}

# select_node: NODE=<name> picks a joined node for env, cni, on, import,
# crictl and ctr; without it they act on the first node.
select_node() {
	node_layout
	if [ -n "${NODE:-}" ] && [ "$NODE" != "$(load_node && echo "${NODE_NAME:-}")" ]; then
		[ -d "$NODES_DIR/$NODE" ] || die "no joined node $NODE"
		node_layout "$NODE"
	fi
	NETNS=$(recorded_netns)
	[ -n "$NETNS" ] || die "no node is up (NETNS=… $0 up)"
}

usage() {
	cat <<'EOU'
usage: scripts/k8s-node.sh build|up|down|status|env|cni bridge|import …|kubectl …|crictl …|ctr …

  build    install Debian packages if missing; build Kubernetes (one binary: kube-apiserver,
           kubelet, kube-controller-manager, kube-scheduler, kube-proxy, kubectl), crictl,
           the pause, busybox and iperf3 images. Cached in /var/cache/vpcni-k8s/<version>.
  up       NETNS=<existing netns> [CNI=bridge] [IMAGES="a.tar b.tar"] [NODE_NAME=…] [NODE_IP=…] [WAIT_READY=1] [CRI_ONLY=1] [CLUSTER_DNS=IP]
           run etcd, the control plane, containerd, kubelet and kube-proxy (iptables) in
           that network namespace; state in /var/tmp/vpcni-k8s. No CNI conflist unless
           CNI=bridge: the node stays NotReady until a CNI installs one. CRI_ONLY=1: containerd
           alone (for CRI clients such as critest; a kubelet would kill their sandboxes).
  join     NETNS=<another netns> [CNI=bridge] [IMAGES=…] [NODE_NAME=…] [NODE_IP=…] [WAIT_READY=1] [PRIVATE="dir…"]
           another node: containerd, kubelet and kube-proxy in that network namespace and a
           mount namespace of its own (its CNI dirs at the first node's paths, and a private
           copy of each PRIVATE host dir), registered at the first node's API (its IP:6443)
  down     stop everything (joined nodes too) by recorded PID, remove pods, mounts, cgroups
           and state (logs kept)
  status   what runs; exits 1 unless all of it does
  env      the interface as shell assignments (kubeconfig, kubectl, CNI dirs, images)
  cni bridge   write Debian's bridge conflist (the node's podCIDR, in the node's namespace) as
               10-vpcni-k8s-bridge.conflist, or BRIDGE_CONF=<name>
  on CMD…      run CMD in the node's network (and, joined, mount) namespace
  kubectl …    kubectl in the node's namespace with the admin kubeconfig
  import FILE.tar…   import docker-save tarballs (make image: bin/vpcni-image.tar) into the node
  crictl … / ctr …   against the node's containerd
  NODE=<joined node> picks that node for env, cni, on, import, crictl and ctr

env: K8S_VERSION (1.36.3) VPCNI_K8S_CACHE (/var/cache/vpcni-k8s) VPCNI_K8S_STATE (/var/tmp/vpcni-k8s)
     SERVICE_CIDR (10.96.0.0/16) CLUSTER_CIDR (10.244.0.0/16) BRIDGE_SUBNET (10.244.0.0/24) CRICTL=0
     DUAL_STACK=1: IPv4 and IPv6 (SERVICE_CIDR 10.96.0.0/16,fd00:96::/112, CLUSTER_CIDR 10.244.0.0/16,fd00:244::/56,
       the kubelet's --node-ip both; the node netns needs a global IPv6 address, or NODE_IP6)
EOU
}

main() {
	local cmd=${1:-}
	[ $# -gt 0 ] && shift
	case $cmd in
	build) cmd_build ;;
	up) cmd_up ;;
	down) cmd_down ;;
	status) cmd_status ;;
	join) cmd_join ;;
	env)
		[ -f "$RUN/node" ] || die "no node is up (NETNS=… $0 up)"
		select_node
		print_env ;;
	cni)
		[ "${1:-}" = bridge ] || die "usage: $0 cni bridge"
		select_node
		cni_bridge ;;
	on) select_node; in_ns "$@" ;;
	kubectl) need_netns; kubectl_ "$@" ;;
	crictl) select_node; crictl_ "$@" ;;
	ctr) select_node; ctr_ "$@" ;;
	import)
		[ $# -gt 0 ] || die "usage: $0 import IMAGE.tar…"
		select_node
		for f in "$@"; do ctr_ images import "$f"; done ;;
	*) usage; [ -z "$cmd" ] || [ "$cmd" = help ] || exit 2 ;;
	esac
}

# Sourcing the file (for its functions) runs nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	main "$@"
fi
