# Sourced by scripts/neutron.sh for MODE=agents: RabbitMQ and the
# linuxbridge and L3 agents beside neutron-server, and the teardown of what
# they put in the kernel.
#
# Everything here has its own name, port and state, so it runs beside the
# API-mode server (/var/tmp/vpcni-neutron, port 19696) without touching it:
#
#   RabbitMQ   node vpcni-nagt@localhost, AMQP 127.0.0.1:$RABBIT_PORT,
#              distribution 127.0.0.1:$RABBIT_DIST_PORT, its own epmd on
#              127.0.0.1:$EPMD_PORT (started and recorded here, never the
#              machine's shared one)
#   agents     host $AGENT_HOST; VXLAN tenant networks over 127.0.0.1
#              (unicast, l2population: one host); the flat physical network
#              "$PHYSNET" is veth $PROV_IF (machine's namespace, no address;
#              the agent enslaves it to the external network's bridge) whose
#              peer sits in namespace $EXT_NS with $EXT_GW: the upstream
#              router of the external network, for floating IPs
#
# What the agents create in the machine's namespace — brq bridges, tap and
# vxlan links (none of them with an address), neutron-linuxbri-* iptables
# chains, neutronMAC-/neutronARP- ebtables chains, NIPv4/NIPv6 ipsets — and
# the qrouter- namespaces are removed by `down`, which finds the routers,
# networks and ports in this server's own database.

RABBIT_PORT=${RABBIT_PORT:-25682}
RABBIT_DIST_PORT=${RABBIT_DIST_PORT:-25683}
EPMD_PORT=${EPMD_PORT:-14379}
AGENT_HOST=vpcni-nagt-host
PROV_IF=vpcni-nagtx0
EXT_NS=vpcni-nagt-ext
EXT_GW=203.0.113.1/24
RABBIT_NODE=vpcni-nagt@localhost
# Tenant networks' VNIs: a range of their own, so `down` knows the vxlan-N
# links (and their brq bridges) as ours even once Neutron forgot them — a
# network deleted just before `down` whose bridge the agent had not yet
# removed.
AGENT_VNIS=4001:4999
AGENT_PACKAGES="rabbitmq-server neutron-linuxbridge-agent neutron-l3-agent ebtables ipset iptables conntrack"
R=$NQ/rabbit

rabbit_env() {
  export HOME=$R RABBITMQ_NODENAME=$RABBIT_NODE RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT=$RABBIT_PORT RABBITMQ_DIST_PORT=$RABBIT_DIST_PORT \
    ERL_EPMD_PORT=$EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_MNESIA_BASE=$R/mnesia RABBITMQ_LOG_BASE=$R/log RABBITMQ_PID_FILE=$R/beam.pid \
    RABBITMQ_CONFIG_FILE=$R/rabbitmq RABBITMQ_ENABLED_PLUGINS_FILE=$R/enabled_plugins \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}" \
    RABBITMQ_CTL_ERL_ARGS="-start_epmd false"
}
# Erlang starts a daemon epmd of its own when none answers; -start_epmd
# false keeps every node here on the one epmd rabbit_up starts and records.

rabbit_up() {
  rm -rf "$R"; mkdir -p "$R/mnesia" "$R/log"
  echo '[].' > "$R/enabled_plugins"
  printf 'loopback_users = none\nlisteners.tcp.default = 127.0.0.1:%s\n' "$RABBIT_PORT" > "$R/rabbitmq.conf"
  # Our own epmd in the foreground, so its PID is ours to record.
  epmd -port "$EPMD_PORT" -address 127.0.0.1 > "$NQ/log/epmd.log" 2>&1 &
  record $! epmd "epmd -port $EPMD_PORT"
  waitfor 10 epmd -port "$EPMD_PORT" -names
  ( rabbit_env; exec /usr/lib/rabbitmq/bin/rabbitmq-server ) > "$R/log/stdout" 2>&1 &
  record $! rabbitmq "rabbitmq-server"
  ( rabbit_env; /usr/lib/rabbitmq/bin/rabbitmqctl -n $RABBIT_NODE wait --timeout 120 "$R/beam.pid" ) > "$NQ/log/rabbit-wait.log" 2>&1
  record "$(cat "$R/beam.pid")" beam "-sname $RABBIT_NODE"
  say "rabbitmq up on 127.0.0.1:$RABBIT_PORT"
}

rabbit_down() {
  local pid
  pid=$(cut -d' ' -f1 "$NQ/pids/beam" 2>/dev/null)
  if [ -n "$pid" ] && [ -e "/proc/$pid" ]; then
    ( rabbit_env; timeout 30 /usr/lib/rabbitmq/bin/rabbitmqctl -n $RABBIT_NODE stop ) > /dev/null 2>&1 || true
  fi
  stop_recorded rabbitmq beam epmd
}

agents_alive() {
  local a
  a=$(curl -s -m 10 "http://127.0.0.1:$NEUTRON_PORT/v2.0/agents?host=$AGENT_HOST&alive=true&fields=agent_type" 2>/dev/null) || return 1
  [[ $a == *"Linux bridge agent"* && $a == *"L3 agent"* ]]
}

agents_up() {
  # The external network's wire: the agent refuses to start without it.
  ip netns add $EXT_NS
  ip link add $PROV_IF type veth peer name eth0 netns $EXT_NS
  ip link set $PROV_IF up
  ip -n $EXT_NS link set lo up
  ip -n $EXT_NS link set eth0 up
  ip -n $EXT_NS addr add $EXT_GW dev eth0

  mkdir -p "$NQ/bin"
  # ebtables-nft cannot delete the agent's --among-src rules by their text:
  # the privileged helpers find scripts/neutron-ebtables first on their PATH.
  cp "$(dirname "$0")/neutron-ebtables" "$NQ/bin/ebtables"
  chmod +x "$NQ/bin/ebtables"
  cat > $C/linuxbridge_agent.ini <<EOF
[DEFAULT]
host = $AGENT_HOST
log_file = $NQ/log/linuxbridge-agent.log

[agent]
polling_interval = 1

[linux_bridge]
physical_interface_mappings = $PHYSNET:$PROV_IF

[vxlan]
enable_vxlan = true
local_ip = 127.0.0.1
l2_population = true

[securitygroup]
enable_security_group = true
firewall_driver = iptables
enable_ipset = true

[privsep]
helper_command = env PATH=$NQ/bin:/usr/sbin:/usr/bin:/sbin:/bin privsep-helper --config-file $C/neutron.conf --config-file $C/linuxbridge_agent.ini
EOF
  cat > $C/l3_agent.ini <<EOF
[DEFAULT]
host = $AGENT_HOST
interface_driver = linuxbridge
log_file = $NQ/log/l3-agent.log
enable_metadata_proxy = false
EOF
  neutron-linuxbridge-agent --config-file $C/neutron.conf --config-file $C/linuxbridge_agent.ini \
    > "$NQ/log/linuxbridge-agent.stdout" 2>&1 &
  record $! linuxbridge-agent "neutron-linuxbridge-agent --config-file $C/neutron.conf"
  neutron-l3-agent --config-file $C/neutron.conf --config-file $C/l3_agent.ini \
    > "$NQ/log/l3-agent.stdout" 2>&1 &
  record $! l3-agent "neutron-l3-agent --config-file $C/neutron.conf"
  waitfor 120 agents_alive
  say "linuxbridge and L3 agents alive (host $AGENT_HOST)"
}

# db_list prints one column of a query on this server's database (nothing
# when there is none). It starts this state dir's MariaDB if a crash left it
# stopped; agents_down stops it again.
db_list() {
  [ -d "$NQ/mysql/data/neutron" ] || return 0
  if ! mariadb --no-defaults -S "$SOCK" -uroot -e 'select 1' >/dev/null 2>&1; then
    mariadbd --no-defaults --datadir="$NQ/mysql/data" --user=root --socket="$SOCK" --skip-networking \
      --pid-file="$NQ/mysql/mysqld.pid" --skip-log-bin --log-error="$NQ/log/mysqld.err" >/dev/null 2>&1 &
    record $! mysqld "mariadbd --no-defaults --datadir=$NQ/mysql/data"
    waitfor 60 mariadb --no-defaults -S "$SOCK" -uroot -e 'select 1' || return 0
  fi
  mariadb --no-defaults -S "$SOCK" -uroot -N -B neutron -e "$1" 2>/dev/null || true
}

# ours lists the processes that run with this state directory's config
# files: neutron-server's RPC workers and the agents' privileged helpers
# (which outlive a killed parent), found by that private path.
ours() {
  local p
  for p in /proc/[0-9]*; do
    tr '\0' ' ' 2>/dev/null < "$p/cmdline" | grep -q -- "--config-file $C/" && echo "${p#/proc/}"
  done
}

# stop_strays gives them 5 s to end by themselves (a helper ends when its
# agent's socket closes), then TERM, then KILL.
stop_strays() {
  local left sig
  for _ in $(seq 1 50); do left=$(ours); [ -z "$left" ] && return 0; sleep 0.1; done
  for sig in TERM KILL; do
    kill -s $sig $left 2>/dev/null
    for _ in $(seq 1 30); do left=$(ours); [ -z "$left" ] && return 0; sleep 0.1; done
  done
}

# master_brq deletes the brq bridge link $1 is enslaved to, if any.
master_brq() {
  local m
  m=$(ip -o link show "$1" 2>/dev/null | grep -o 'master brq[^ ]*' | cut -d' ' -f2)
  [ -n "$m" ] && ip link delete "$m" 2>/dev/null
}

# agents_down stops everything MODE=agents started and removes what the
# agents put in the kernel. With "keep" it leaves the state directory (up
# calls it to clear a crashed run before starting again).
agents_down() {
  local t ch rule id n f
  # Together: each may take its full grace period to go.
  for f in l3-agent linuxbridge-agent neutron-server; do stop_pid "$NQ/pids/$f" & done
  wait
  stop_strays
  say "agents and neutron-server stopped"
  rabbit_down
  say "rabbitmq stopped"

  local routers ports nets vnis
  routers=$(db_list 'SELECT id FROM routers')
  ports=$(db_list 'SELECT id FROM ports')
  nets=$(db_list 'SELECT id FROM networks')
  vnis=$(db_list "SELECT segmentation_id FROM networksegments WHERE network_type='vxlan'")
  say "its database names $(echo $routers | wc -w) routers, $(echo $nets | wc -w) networks, $(echo $ports | wc -w) ports"
  for id in $routers; do ip netns delete "qrouter-$id" 2>/dev/null; done
  for id in $ports; do ip link delete "tap${id:0:11}" 2>/dev/null; done
  for id in $nets; do ip link delete "brq${id:0:11}" 2>/dev/null; done
  for n in $vnis; do ip link delete "vxlan-$n" 2>/dev/null; done
  stop_recorded mysqld
  for n in $(ip -o link show type vxlan 2>/dev/null | awk -F': ' '{sub("@.*", "", $2); print $2}'); do
    [[ $n =~ ^vxlan-([0-9]+)$ ]] || continue
    ((BASH_REMATCH[1] >= ${AGENT_VNIS%:*} && BASH_REMATCH[1] <= ${AGENT_VNIS#*:})) || continue
    ip -d link show "$n" | grep -q 'local 127.0.0.1 ' || continue
    master_brq "$n"
    ip link delete "$n" 2>/dev/null
  done
  master_brq $PROV_IF
  ip link delete $PROV_IF 2>/dev/null
  ip netns delete $EXT_NS 2>/dev/null

  # The linuxbridge agent's firewall (its chains are named after the binary:
  # neutron-linuxbri-*, plus neutron-filter-top), then its ebtables chains
  # and ipsets. The L3 agent's rules live in the qrouter- namespaces.
  for t in filter nat mangle raw; do
    iptables -t $t -S 2>/dev/null | grep -E '^-A [A-Z]+ .*-j neutron-(linuxbri-|filter-top)' | sed 's/^-A/-D/' |
      while read -r rule; do eval "iptables -t $t $rule"; done
    for ch in $(iptables -t $t -S 2>/dev/null | awk '/^-N neutron-(linuxbri-|filter-top)/{print $2}'); do iptables -t $t -F "$ch"; done
    for ch in $(iptables -t $t -S 2>/dev/null | awk '/^-N neutron-(linuxbri-|filter-top)/{print $2}'); do iptables -t $t -X "$ch"; done
  done
  for n in $(ebtables-nft -t nat -L PREROUTING --Ln 2>/dev/null | awk '/-j neutron(MAC|ARP)-/{sub("\\.", "", $1); print $1}' | sort -rn); do
    ebtables-nft -t nat -D PREROUTING "$n"
  done
  for ch in $(ebtables-nft -t nat -L 2>/dev/null | awk '/^Bridge chain: neutron(MAC|ARP)-/{sub(",", "", $3); print $3}'); do
    ebtables-nft -t nat -X "$ch" 2>/dev/null
  done
  for n in $(ipset list -n 2>/dev/null | grep -E '^NIPv[46]'); do ipset destroy "$n" 2>/dev/null; done
  [ "${1:-}" = keep ] || rm -rf "$NQ"
  return 0
}
