#!/usr/bin/env bash
# A real OpenStack Neutron (Debian's neutron-server, Zed) for vpcni's tests,
# on loopback only: noauth or Keystone, schema from the models, a private
# MariaDB on a unix socket.
#
#   scripts/neutron.sh up      install (if missing) and start; idempotent
#   scripts/neutron.sh down    stop what `up` started, by recorded PID
#   scripts/neutron.sh status  say whether it answers
#   scripts/neutron.sh max-routes N
#                              (API mode) restart neutron-server alone with
#                              max_routes = N (the router's extra-route
#                              limit), its database kept; `up` writes
#                              $MAX_ROUTES (default 30, Neutron's default)
#
#   MODE=api         (default) neutron-server alone, in-process RPC, no agents
#   MODE=agents      also RabbitMQ, neutron-linuxbridge-agent and
#                    neutron-l3-agent: real brq bridges and taps, iptables and
#                    ebtables port security, qrouter- namespaces with floating
#                    IPs. Its own state, ports and names, so it runs beside an
#                    API-mode server; see scripts/neutron-agents.sh
#   KEYSTONE=1       (API mode) also run Keystone on 127.0.0.1:$KEYSTONE_PORT
#                    and make Neutron require tokens; writes $NQ/keystone.json
#                    with an application credential for a member user
#   NQ=dir           state directory (default /var/tmp/vpcni-neutron, with
#                    agents /var/tmp/vpcni-neutron-agents)
#   NEUTRON_PORT     default 19696 (agents 19697); KEYSTONE_PORT default 15000
#   MAX_ROUTES       max_routes written by `up` (default 30)
set -euo pipefail
cmd=${1:-up}
MODE=${MODE:-api}
case $MODE in
api)
  NQ=${NQ:-/var/tmp/vpcni-neutron}
  NEUTRON_PORT=${NEUTRON_PORT:-19696} ;;
agents)
  NQ=${NQ:-/var/tmp/vpcni-neutron-agents}
  NEUTRON_PORT=${NEUTRON_PORT:-19697} ;;
*) echo "MODE must be api or agents" >&2; exit 2 ;;
esac
KEYSTONE_PORT=${KEYSTONE_PORT:-15000}
KEYSTONE=${KEYSTONE:-0}
MAX_ROUTES=${MAX_ROUTES:-30}
PHYSNET=provider   # the flat physical network's name (agents: the external network)
PY=/usr/bin/python3
export DEBIAN_FRONTEND=noninteractive
C=$NQ/conf
SOCK=$NQ/mysql/mysql.sock
start=$(date +%s%N)
say() { local t=$(( ($(date +%s%N) - start) / 100000000 )); printf '[neutron %3d.%ds] %s\n' $((t / 10)) $((t % 10)) "$*"; }
waitfor() { local n=$(( $1 * 10 )); shift
  for _ in $(seq 1 $n); do "$@" >/dev/null 2>&1 && return 0; sleep 0.1; done
  echo "timed out waiting for: $*" >&2; return 1; }

# stop_pid stops the process whose PID `up` recorded in file $1, if it
# still runs what was recorded (a recycled PID is left alone).
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
# stop_recorded stops the named recorded processes, or all of them.
stop_recorded() {
  local f
  if [ $# -gt 0 ]; then for f in "$@"; do stop_pid "$NQ/pids/$f"; done; return 0; fi
  for f in "$NQ"/pids/*; do stop_pid "$f"; done
}
record() { echo "$1 $3" > "$NQ/pids/$2"; }
[ "$MODE" = agents ] && . "$(dirname "$0")/neutron-agents.sh"

answers() { c=$(curl -s -m 10 -o /dev/null -w '%{http_code}' "http://127.0.0.1:$NEUTRON_PORT/v2.0/networks" 2>/dev/null); [ "$c" = 200 ] || [ "$c" = 401 ]; }

case $cmd in
down)
  # Teardown is best effort: whatever is already gone is fine.
  if [ "$MODE" = agents ]; then agents_down || true; else stop_recorded; fi
  say "stopped"
  exit 0 ;;
status)
  if ! answers; then echo "neutron is not running"; exit 1; fi
  if [ "$MODE" = agents ] && ! agents_alive; then echo "neutron answers on 127.0.0.1:$NEUTRON_PORT, its agents do not"; exit 1; fi
  echo "neutron ($MODE) answers on 127.0.0.1:$NEUTRON_PORT"
  exit 0 ;;
max-routes)
  # The routed pod subnet's tests change the limit and put it back: only
  # neutron-server restarts (~10 s), the database and its objects stay.
  n=${2:-}
  case $n in ''|*[!0-9]*) echo "usage: $0 max-routes N" >&2; exit 2 ;; esac
  [ "$MODE" = api ] || { echo "max-routes is for MODE=api" >&2; exit 2; }
  answers || { echo "neutron is not running: run $0 up first" >&2; exit 1; }
  if [ "$(sed -n 's/^max_routes = //p' "$C/neutron.conf")" = "$n" ]; then say "max_routes is $n already"; exit 0; fi
  sed -i "s/^max_routes = .*/max_routes = $n/" "$C/neutron.conf"
  stop_recorded neutron-server
  args="--config-file $C/neutron.conf --config-file $C/ml2_conf.ini"
  [ "$(cat "$NQ/mode" 2>/dev/null)" = keystone ] && args="$args --config-file $C/auth-keystone.conf"
  neutron-server $args >> "$NQ/log/neutron-server.stdout" 2>&1 &
  record $! neutron-server "neutron-server --config-file $C/neutron.conf"
  waitfor 120 answers
  say "neutron-server restarted with max_routes = $n"
  exit 0 ;;
up) ;;
*) echo "usage: $0 up|down|status|max-routes N" >&2; exit 2 ;;
esac

mode=noauth; [ "$KEYSTONE" = 1 ] && mode=keystone
if [ "$MODE" = agents ]; then
  [ "$KEYSTONE" = 1 ] && { echo "KEYSTONE=1 is for MODE=api" >&2; exit 2; }
  mode=agents
fi
if answers && [ "$(cat "$NQ/mode" 2>/dev/null)" = "$mode" ] && { [ "$MODE" != agents ] || agents_alive; } &&
  [ "$(sed -n 's/^max_routes = //p' "$C/neutron.conf" 2>/dev/null)" = "$MAX_ROUTES" ]; then
  say "already up ($mode) on 127.0.0.1:$NEUTRON_PORT"
  exit 0
fi
mkdir -p "$NQ"/{conf,log,state,lock,pids}
# Leftovers of a crashed or differently configured run (with agents, also
# the kernel objects its database names).
if [ "$MODE" = agents ]; then agents_down keep || true; else stop_recorded; fi

pk="neutron-server mariadb-server curl"
[ "$KEYSTONE" = 1 ] && pk="$pk keystone"
[ "$MODE" = agents ] && pk="$pk $AGENT_PACKAGES"
missing=""; for p in $pk; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  say "installing$missing"
  # Keep the packaged services from starting: we run the binaries ourselves.
  created_policy=0
  if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; created_policy=1; fi
  apt-get -o DPkg::Lock::Timeout=900 update -qq
  apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends $missing >/dev/null
  [ $created_policy = 1 ] && rm -f /usr/sbin/policy-rc.d
fi

# ------------------------------------------------------------ MariaDB
if [ ! -d "$NQ/mysql/data/mysql" ]; then
  mkdir -p "$NQ/mysql"
  mariadb-install-db --no-defaults --datadir="$NQ/mysql/data" --user=root \
    --auth-root-authentication-method=normal --skip-test-db > "$NQ/log/mysql-install.log" 2>&1
fi
mariadbd --no-defaults --datadir="$NQ/mysql/data" --user=root --socket="$SOCK" --skip-networking \
  --pid-file="$NQ/mysql/mysqld.pid" --innodb-buffer-pool-size=128M --innodb-flush-log-at-trx-commit=0 \
  --skip-log-bin --log-error="$NQ/log/mysqld.err" >/dev/null 2>&1 &
record $! mysqld "mariadbd --no-defaults --datadir=$NQ/mysql/data"
waitfor 60 mariadb --no-defaults -S "$SOCK" -uroot -e 'select 1'
mariadb --no-defaults -S "$SOCK" -uroot -e "DROP DATABASE IF EXISTS neutron; CREATE DATABASE neutron CHARACTER SET utf8mb4; DROP DATABASE IF EXISTS keystone; CREATE DATABASE keystone CHARACTER SET utf8mb4;"
DBURL="mysql+pymysql://root@localhost/neutron?unix_socket=$SOCK&charset=utf8mb4"
say "mariadb up"

# ------------------------------------------------------------ Neutron config
TRANSPORT=fake:// MECH=linuxbridge VNI_RANGE=1:1000
if [ "$MODE" = agents ]; then
  TRANSPORT="rabbit://guest:guest@127.0.0.1:$RABBIT_PORT/" MECH=linuxbridge,l2population VNI_RANGE=$AGENT_VNIS
fi
cat > $C/neutron.conf <<EOF
[DEFAULT]
bind_host = 127.0.0.1
bind_port = $NEUTRON_PORT
auth_strategy = noauth
core_plugin = ml2
service_plugins = router
notify_nova_on_port_status_changes = false
notify_nova_on_port_data_changes = false
dhcp_agent_notification = false
transport_url = $TRANSPORT
api_workers = 0
rpc_workers = 0
rpc_state_report_workers = 0
state_path = $NQ/state
api_paste_config = $C/api-paste.ini
max_routes = $MAX_ROUTES
log_file = $NQ/log/neutron-server.log

[database]
connection = $DBURL

[oslo_concurrency]
lock_path = $NQ/lock

[experimental]
linuxbridge = true

[agent]
# root already: no sudo or rootwrap in front of the agents' commands
root_helper =
EOF
cat > $C/ml2_conf.ini <<EOF
[ml2]
type_drivers = flat,vxlan
tenant_network_types = vxlan
mechanism_drivers = $MECH
extension_drivers = port_security

[ml2_type_flat]
flat_networks = $PHYSNET

[ml2_type_vxlan]
vni_ranges = $VNI_RANGE

[securitygroup]
enable_security_group = true
enable_ipset = true
EOF
# Debian's generated api-paste.ini (no package owns the file).
cat > $C/api-paste.ini <<'EOF'
[composite:neutron]
use = egg:Paste#urlmap
/: neutronversions_composite
/v2.0: neutronapi_v2_0

[composite:neutronapi_v2_0]
use = call:neutron.auth:pipeline_factory
noauth = cors http_proxy_to_wsgi request_id fake_project_id catch_errors extensions neutronapiapp_v2_0
keystone = cors http_proxy_to_wsgi request_id catch_errors authtoken keystonecontext extensions neutronapiapp_v2_0

[composite:neutronversions_composite]
use = call:neutron.auth:pipeline_factory
noauth = cors http_proxy_to_wsgi neutronversions
keystone = cors http_proxy_to_wsgi neutronversions

[filter:request_id]
paste.filter_factory = oslo_middleware:RequestId.factory

[filter:catch_errors]
paste.filter_factory = oslo_middleware:CatchErrors.factory

[filter:cors]
paste.filter_factory = oslo_middleware.cors:filter_factory
oslo_config_project = neutron

[filter:fake_project_id]
paste.filter_factory = neutron.auth:NoauthFakeProjectId.factory

[filter:http_proxy_to_wsgi]
paste.filter_factory = oslo_middleware.http_proxy_to_wsgi:HTTPProxyToWSGI.factory

[filter:keystonecontext]
paste.filter_factory = neutron.auth:NeutronKeystoneContext.factory

[filter:authtoken]
paste.filter_factory = keystonemiddleware.auth_token:filter_factory

[filter:extensions]
paste.filter_factory = neutron.api.extensions:plugin_aware_extension_middleware_factory

[app:neutronversions]
paste.app_factory = neutron.pecan_wsgi.app:versions_factory

[app:neutronapiapp_v2_0]
paste.app_factory = neutron.api.v2.router:APIRouter.factory
EOF
SRVARGS="--config-file $C/neutron.conf --config-file $C/ml2_conf.ini"

# Schema from the models, then stamp the alembic heads (fast, and what
# Neutron's own unit tests do).
$PY - "$DBURL" > "$NQ/log/db-create.log" 2>&1 <<'EOF'
import sys, sqlalchemy as sa
from neutron.db.migration.models import head
head.get_metadata().create_all(sa.create_engine(sys.argv[1]))
EOF
neutron-db-manage $SRVARGS stamp heads > "$NQ/log/db-manage.log" 2>&1
say "schema ready"

# ------------------------------------------------------------ Keystone
if [ "$KEYSTONE" = 1 ]; then
  mkdir -p "$NQ/keystone/fernet-keys" "$NQ/keystone/credential-keys"
  cat > $C/keystone.conf <<EOF
[DEFAULT]
log_file = $NQ/log/keystone.log
[database]
connection = mysql+pymysql://root@localhost/keystone?unix_socket=$SOCK&charset=utf8mb4
[token]
provider = fernet
expiration = 86400
[fernet_tokens]
key_repository = $NQ/keystone/fernet-keys
[fernet_receipts]
key_repository = $NQ/keystone/fernet-keys
[credential]
key_repository = $NQ/keystone/credential-keys
[cache]
enabled = false
EOF
  export OS_KEYSTONE_CONFIG_FILES=$C/keystone.conf
  KM="keystone-manage --config-file $C/keystone.conf"
  KS=http://127.0.0.1:$KEYSTONE_PORT/v3
  { $KM db_sync; $KM fernet_setup --keystone-user root --keystone-group root
    $KM credential_setup --keystone-user root --keystone-group root
    $KM bootstrap --bootstrap-password adminpw --bootstrap-admin-url $KS/ \
      --bootstrap-public-url $KS/ --bootstrap-internal-url $KS/ --bootstrap-region-id RegionOne; } > "$NQ/log/keystone-setup.log" 2>&1
  keystone-wsgi-public --host 127.0.0.1 --port $KEYSTONE_PORT > "$NQ/log/keystone.stdout" 2>&1 &
  record $! keystone "keystone-wsgi-public --host 127.0.0.1 --port $KEYSTONE_PORT"
  waitfor 60 curl -sf $KS
  say "keystone up on 127.0.0.1:$KEYSTONE_PORT"
  # Neutron's service user, the network endpoint, a demo project with a
  # member user "cni" and an application credential for it.
  KS=$KS NEUTRON_URL=http://127.0.0.1:$NEUTRON_PORT $PY - > "$NQ/keystone.json" <<'EOF'
import json, os, urllib.request
KS, NURL = os.environ["KS"], os.environ["NEUTRON_URL"]
def req(method, path, body=None, token=None, want_token=False):
    r = urllib.request.Request(KS + path, method=method, data=json.dumps(body).encode() if body is not None else None,
                               headers={"Content-Type": "application/json", **({"X-Auth-Token": token} if token else {})})
    with urllib.request.urlopen(r) as resp:
        data = resp.read()
        return resp.headers["X-Subject-Token"] if want_token else (json.loads(data) if data else None)
def token(u, pw, proj):
    return req("POST", "/auth/tokens", {"auth": {"identity": {"methods": ["password"], "password": {"user": {"name": u, "domain": {"id": "default"}, "password": pw}}}, "scope": {"project": {"name": proj, "domain": {"id": "default"}}}}}, want_token=True)
T = token("admin", "adminpw", "admin")
def goc(coll, key, body, q):
    found = req("GET", "/%s?%s" % (coll, q), token=T)[coll]
    return found[0]["id"] if found else req("POST", "/" + coll, {key: body}, token=T)[key]["id"]
role = {n: goc("roles", "role", {"name": n}, "name=" + n) for n in ("admin", "member", "reader", "service")}
sp = goc("projects", "project", {"name": "service", "domain_id": "default"}, "name=service")
dp = goc("projects", "project", {"name": "demo", "domain_id": "default"}, "name=demo")
nu = goc("users", "user", {"name": "neutron", "domain_id": "default", "password": "neutronpw"}, "name=neutron")
cu = goc("users", "user", {"name": "cni", "domain_id": "default", "password": "cnipw"}, "name=cni")
for p, u, r in ((sp, nu, "admin"), (sp, nu, "service"), (dp, cu, "member")):
    req("PUT", "/projects/%s/users/%s/roles/%s" % (p, u, role[r]), token=T)
svc = goc("services", "service", {"name": "neutron", "type": "network"}, "type=network")
req("POST", "/endpoints", {"endpoint": {"service_id": svc, "interface": "public", "region_id": "RegionOne", "url": NURL}}, token=T)
ac = req("POST", "/users/%s/application_credentials" % cu, {"application_credential": {"name": "vpcni-test", "secret": "acsecret"}}, token=token("cni", "cnipw", "demo"))
print(json.dumps({"auth_url": KS, "project_id": dp, "application_credential_id": ac["application_credential"]["id"], "application_credential_secret": "acsecret"}))
EOF
  cat > $C/auth-keystone.conf <<EOF
[DEFAULT]
auth_strategy = keystone
[keystone_authtoken]
www_authenticate_uri = http://127.0.0.1:$KEYSTONE_PORT
auth_url = http://127.0.0.1:$KEYSTONE_PORT
auth_type = password
project_domain_name = Default
user_domain_name = Default
project_name = service
username = neutron
password = neutronpw
region_name = RegionOne
EOF
  SRVARGS="$SRVARGS --config-file $C/auth-keystone.conf"
  say "keystone seeded"
fi

if [ "$MODE" = agents ]; then rabbit_up; fi

# ------------------------------------------------------------ neutron-server
neutron-server $SRVARGS > "$NQ/log/neutron-server.stdout" 2>&1 &
record $! neutron-server "neutron-server --config-file $C/neutron.conf"
waitfor 120 answers
say "neutron-server up ($mode) on http://127.0.0.1:$NEUTRON_PORT"
if [ "$MODE" = agents ]; then agents_up; fi
echo "$mode" > "$NQ/mode"
