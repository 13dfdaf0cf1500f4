#!/usr/bin/env bash
# A real Nova (Debian 12's Zed packages, fake virt driver) with Placement,
# RabbitMQ and a Glance stub, beside scripts/neutron.sh with Keystone, on
# loopback only, so os-interface attach/detach runs for real (docs/nova.md
# is the measured recipe this follows).
#
#   scripts/nova.sh up     neutron.sh up (KEYSTONE=1, its own state and
#                          ports), then Nova; idempotent
#   scripts/nova.sh down   stop both, by recorded PID
#
# Ports: Keystone 25000, Neutron 29696, nova-api 28774, Placement 28778,
# Glance stub 29292, AMQP 26672/26673, epmd 14380 — none of the shared
# neutron.sh fixture's (19696/15000).
set -euo pipefail
cmd=${1:-up}
HERE=$(cd "$(dirname "$0")" && pwd)
NQ=${NQ:-/var/tmp/vpcni-nova/neutron}      # neutron.sh's state dir (MariaDB socket, keystone.json)
NV=${NV:-/var/tmp/vpcni-nova/nova}
NEUTRON_PORT=${NEUTRON_PORT:-29696} KEYSTONE_PORT=${KEYSTONE_PORT:-25000}
NOVA_PORT=${NOVA_PORT:-28774} PLACEMENT_PORT=${PLACEMENT_PORT:-28778}
RABBIT_PORT=${RABBIT_PORT:-26672} RABBIT_DIST_PORT=${RABBIT_DIST_PORT:-26673} EPMD_PORT=${EPMD_PORT:-14380}
RABBIT_NODE=vpcninova@localhost
COMPUTE_HOST=${COMPUTE_HOST:-novalab-compute}
PY=/usr/bin/python3
export NQ NEUTRON_PORT KEYSTONE_PORT
stop_pid() {
  local f=$1 pid what
  [ -e "$f" ] || return 0
  pid=$(cut -d' ' -f1 "$f"); what=$(cut -d' ' -f2- "$f")
  if [ -n "$pid" ] && [ -r /proc/$pid/cmdline ] && tr '\0' ' ' < /proc/$pid/cmdline | grep -q -- "$what"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 100); do [ -e /proc/$pid ] || break; sleep 0.1; done
    [ -e /proc/$pid ] && kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}
case $cmd in
down)
  for f in api compute scheduler conductor placement glance beam rabbitmq epmd; do stop_pid "$NV/pids/$f"; done
  KEYSTONE=1 bash "$HERE/neutron.sh" down
  exit 0 ;;
status)
  # Says, never starts: without the exit, a stopped Nova was started here.
  curl -sf -o /dev/null "http://127.0.0.1:$NOVA_PORT/" && echo "nova answers on 127.0.0.1:$NOVA_PORT"
  exit ;;
up) ;;
*) echo "usage: $0 up|down|status" >&2; exit 2 ;;
esac
if curl -sf -o /dev/null "http://127.0.0.1:$NOVA_PORT/" && [ -e "$NV/up" ]; then echo "nova already up"; exit 0; fi
for f in api compute scheduler conductor placement glance beam rabbitmq epmd; do stop_pid "$NV/pids/$f"; done
rm -f "$NV/up"
# Debian's Nova and Placement (not nova-compute: it pulls in libvirt and
# qemu; the fake driver needs python3-nova only). Their services are kept
# from starting: the binaries run below, on loopback ports of their own.
pk="python3-nova nova-common nova-api nova-conductor nova-scheduler placement-api python3-placement rabbitmq-server"
missing=""; for p in $pk; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  echo "[nova] installing$missing"
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; created_policy=1; fi
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 update -qq
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends $missing >/dev/null
  [ $created_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
fi
KEYSTONE=1 bash "$HERE/neutron.sh" up
SOCK=$NQ/mysql/mysql.sock
C=$NV/conf R=$NV/rabbit
start=$(date +%s%N)
say() { local t=$(( ($(date +%s%N) - start) / 100000000 )); printf '[nova %3d.%ds] %s\n' $((t / 10)) $((t % 10)) "$*"; }
waitfor() { local n=$(( $1 * 10 )); shift
  for _ in $(seq 1 $n); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "timed out waiting for: $*" >&2; return 1; }
record() { echo "$1 $3" > "$NV/pids/$2"; }
mkdir -p $NV/{conf,log,state,lock,pids,instances}
DB() { echo "mysql+pymysql://root@localhost/$1?unix_socket=$SOCK&charset=utf8mb4"; }
mariadb --no-defaults -S "$SOCK" -uroot -e "
 DROP DATABASE IF EXISTS nova_api; CREATE DATABASE nova_api;
 DROP DATABASE IF EXISTS nova_cell0; CREATE DATABASE nova_cell0;
 DROP DATABASE IF EXISTS nova; CREATE DATABASE nova;
 DROP DATABASE IF EXISTS placement; CREATE DATABASE placement;"
say "databases created"

# ---------------- RabbitMQ (own node, own epmd, loopback)
rabbit_env() {
  export HOME=$R RABBITMQ_NODENAME=$RABBIT_NODE RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT=$RABBIT_PORT RABBITMQ_DIST_PORT=$RABBIT_DIST_PORT \
    ERL_EPMD_PORT=$EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_MNESIA_BASE=$R/mnesia RABBITMQ_LOG_BASE=$R/log RABBITMQ_PID_FILE=$R/beam.pid \
    RABBITMQ_CONFIG_FILE=$R/rabbitmq RABBITMQ_ENABLED_PLUGINS_FILE=$R/enabled_plugins \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-start_epmd false -kernel inet_dist_use_interface {127,0,0,1}" \
    RABBITMQ_CTL_ERL_ARGS="-start_epmd false"
}
rm -rf "$R"; mkdir -p "$R/mnesia" "$R/log"
echo '[].' > "$R/enabled_plugins"
printf 'loopback_users = none\nlisteners.tcp.default = 127.0.0.1:%s\n' "$RABBIT_PORT" > "$R/rabbitmq.conf"
epmd -port "$EPMD_PORT" -address 127.0.0.1 > "$NV/log/epmd.log" 2>&1 &
record $! epmd "epmd -port $EPMD_PORT"
waitfor 10 epmd -port "$EPMD_PORT" -names
( rabbit_env; exec /usr/lib/rabbitmq/bin/rabbitmq-server ) > "$R/log/stdout" 2>&1 &
record $! rabbitmq "rabbitmq-server"
( rabbit_env; /usr/lib/rabbitmq/bin/rabbitmqctl -n $RABBIT_NODE wait --timeout 120 "$R/beam.pid" ) > "$NV/log/rabbit-wait.log" 2>&1
record "$(cat "$R/beam.pid")" beam "-sname $RABBIT_NODE"
say "rabbitmq up on 127.0.0.1:$RABBIT_PORT"

# ---------------- Keystone: nova + placement service users and endpoints
KS=http://127.0.0.1:$KEYSTONE_PORT/v3 NOVA_URL=http://127.0.0.1:$NOVA_PORT/v2.1 PLACEMENT_URL=http://127.0.0.1:$PLACEMENT_PORT \
$PY - > "$NV/log/keystone-seed.log" <<'EOF'
import json, os, urllib.request
KS = os.environ["KS"]
def req(method, path, body=None, token=None, want_token=False):
    r = urllib.request.Request(KS + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                               headers={"Content-Type": "application/json", **({"X-Auth-Token": token} if token else {})})
    with urllib.request.urlopen(r) as resp:
        data = resp.read()
        return resp.headers["X-Subject-Token"] if want_token else (json.loads(data) if data else None)
T = req("POST", "/auth/tokens", {"auth": {"identity": {"methods": ["password"], "password": {"user": {"name": "admin", "domain": {"id": "default"}, "password": "adminpw"}}}, "scope": {"project": {"name": "admin", "domain": {"id": "default"}}}}}, want_token=True)
def goc(coll, key, body, q):
    found = req("GET", "/%s?%s" % (coll, q), token=T)[coll]
    return found[0]["id"] if found else req("POST", "/" + coll, {key: body}, token=T)[key]["id"]
role = {n: goc("roles", "role", {"name": n}, "name=" + n) for n in ("admin", "service")}
sp = goc("projects", "project", {"name": "service", "domain_id": "default"}, "name=service")
for name, typ, url in (("nova", "compute", os.environ["NOVA_URL"]), ("placement", "placement", os.environ["PLACEMENT_URL"])):
    u = goc("users", "user", {"name": name, "domain_id": "default", "password": name + "pw"}, "name=" + name)
    for r in ("admin", "service"):
        req("PUT", "/projects/%s/users/%s/roles/%s" % (sp, u, role[r]), token=T)
    svc = goc("services", "service", {"name": name, "type": typ}, "type=" + typ)
    if not req("GET", "/endpoints?service_id=" + svc, token=T)["endpoints"]:
        for i in ("public", "internal", "admin"):
            req("POST", "/endpoints", {"endpoint": {"service_id": svc, "interface": i, "region_id": "RegionOne", "url": url}}, token=T)
print("ok")
EOF
say "keystone seeded"

ksauth() { cat <<EOF
auth_url = http://127.0.0.1:$KEYSTONE_PORT/v3
auth_type = password
project_domain_name = Default
user_domain_name = Default
project_name = service
username = $1
password = $1pw
region_name = RegionOne
EOF
}
# ---------------- Placement
cat > $C/placement.conf <<EOF
[DEFAULT]
log_file = $NV/log/placement.log
[api]
auth_strategy = keystone
[keystone_authtoken]
www_authenticate_uri = http://127.0.0.1:$KEYSTONE_PORT
$(ksauth placement)
[placement_database]
connection = $(DB placement)
EOF
OS_PLACEMENT_CONFIG_DIR=$C placement-manage --config-file $C/placement.conf db sync > $NV/log/placement-dbsync.log 2>&1
say "placement db synced"
cat > $C/placement-uwsgi.ini <<EOF
[uwsgi]
plugins = python3
http-socket = 127.0.0.1:$PLACEMENT_PORT
wsgi-file = /usr/bin/placement-api
processes = 1
threads = 4
master = true
die-on-term = true
lazy-apps = true
env = OS_PLACEMENT_CONFIG_DIR=$C
logto = $NV/log/placement-uwsgi.log
EOF
uwsgi --ini $C/placement-uwsgi.ini > /dev/null 2>&1 &
record $! placement "uwsgi --ini $C/placement-uwsgi.ini"

# ---------------- Glance stub
/usr/bin/python3 "$HERE/nova/glance-stub.py" 29292 > $NV/log/glance-stub.log 2>&1 &
record $! glance "glance-stub.py 29292"
# ---------------- Nova
cat > $C/nova.conf <<EOF
[DEFAULT]
host = $COMPUTE_HOST
state_path = $NV/state
instances_path = $NV/instances
log_dir = $NV/log
transport_url = rabbit://guest:guest@127.0.0.1:$RABBIT_PORT/
compute_driver = fake.SmallFakeDriver
my_ip = 127.0.0.1
use_neutron = true
vif_plugging_is_fatal = false
vif_plugging_timeout = 0
osapi_compute_listen = 127.0.0.1
osapi_compute_listen_port = $NOVA_PORT
osapi_compute_workers = 1
metadata_workers = 1
enabled_apis = osapi_compute
[api]
auth_strategy = keystone
[wsgi]
api_paste_config = /usr/share/nova-common/api-paste.ini
[api_database]
connection = $(DB nova_api)
[database]
connection = $(DB nova)
[keystone_authtoken]
www_authenticate_uri = http://127.0.0.1:$KEYSTONE_PORT
$(ksauth nova)
[placement]
$(ksauth placement)
[neutron]
$(ksauth neutron)
[service_user]
send_service_user_token = false
[conductor]
workers = 1
[scheduler]
workers = 1
discover_hosts_in_cells_interval = 5
[oslo_concurrency]
lock_path = $NV/lock
[notifications]
notification_format = unversioned
[oslo_messaging_notifications]
driver = noop
[glance]
api_servers = http://127.0.0.1:29292
[cinder]
os_region_name = RegionOne
[vnc]
enabled = false
[spice]
enabled = false
[os_vif_linux_bridge]
[workarounds]
disable_group_policy_check_upcall = true
EOF
NM="nova-manage --config-file $C/nova.conf"
{ $NM api_db sync; $NM cell_v2 map_cell0 --database_connection "$(DB nova_cell0)"
  $NM cell_v2 create_cell --name cell1 --verbose; $NM db sync; $NM cell_v2 list_cells; } > $NV/log/nova-manage.log 2>&1
say "nova dbs synced"
waitfor 60 curl -s -o /dev/null http://127.0.0.1:$PLACEMENT_PORT/
say "placement up on 127.0.0.1:$PLACEMENT_PORT"
for s in conductor scheduler; do
  nova-$s --config-file $C/nova.conf > $NV/log/$s.stdout 2>&1 &
  record $! $s "nova-$s --config-file $C/nova.conf"
done
$PY -c 'import sys; from nova.cmd.compute import main; sys.argv[0]="nova-compute"; main()' --config-file $C/nova.conf > $NV/log/compute.stdout 2>&1 &
record $! compute "from nova.cmd.compute import main"
nova-api --config-file $C/nova.conf > $NV/log/api.stdout 2>&1 &
record $! api "nova-api --config-file $C/nova.conf"
waitfor 120 curl -sf http://127.0.0.1:$NOVA_PORT/
say "nova-api up on 127.0.0.1:$NOVA_PORT"

# Neutron binds a port only to a host with a live L2 agent: a fake Linux
# bridge agent row for the compute host, its heartbeat in the future.
mariadb --no-defaults -S "$SOCK" -uroot neutron -e "
INSERT INTO agents (id, agent_type, \`binary\`, topic, host, availability_zone, admin_state_up, created_at,
  started_at, heartbeat_timestamp, description, configurations, resource_versions, \`load\`, resources_synced)
VALUES (UUID(), 'Linux bridge agent', 'neutron-linuxbridge-agent', 'N/A', '$COMPUTE_HOST', 'nova', 1, NOW(),
  NOW(), '2099-01-01 00:00:00', 'fake', '{\"interface_mappings\": {\"provider\": \"lo\"}, \"bridge_mappings\": {},
  \"tunnel_types\": [\"vxlan\"], \"devices\": 0}', NULL, 0, 1);"
# Wait for the compute host to be mapped to the cell (discover interval 5 s).
waitfor 120 bash -c "nova-manage --config-file $C/nova.conf cell_v2 list_hosts 2>/dev/null | grep -q $COMPUTE_HOST"
touch "$NV/up"
say "nova ready (compute host $COMPUTE_HOST mapped)"
