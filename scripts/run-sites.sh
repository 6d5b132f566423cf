#!/usr/bin/env bash
# Runs one training job over the sites of a cluster file, emulated on this machine: one network
# namespace per site with the cluster file's link rates (scripts/sites.sh), a fusion-node process
# inside each site's namespace, and the coordinator (fusion-train) outside, in the root
# namespace. Without root (no namespaces) it falls back to loopback with no shaping and says so.
# Nodes with a `cpu_share` in the cluster file run in a cgroup with that CPU quota (below).
# A node with `accept_inbound: false` starts with --node.accept-inbound=false, and in namespaces
# its site drops every inbound TCP SYN (iptables): a node behind a firewall (docs/transport.md).
# Namespaces, cgroups and processes are cleaned up on exit and on Ctrl-C.
# Every connection is mutual TLS (docs/security.md): the run's certificates are made first.
#
#   scripts/run-sites.sh [--cluster FILE] [--run FILE.ini] [--tag TAG] [--subnet A.B.C] [--loopback]
#                        [--no-caps] [--logs DIR] [--certs DIR] [--plaintext] [--node-arg ARG ...]
#                        [--firewall NODE ...] [-- fusion-train args]
#
# --loopback skips the namespaces even as root; --no-caps ignores the cpu_share of the nodes;
# --firewall NODE drops inbound connections to NODE's site as for `accept_inbound: false`, but
# tells nobody: the node listens as usual and its senders find out when they cannot reach it;
# --node-arg passes an option to every fusion-node. Defaults: configs/clusters/sites-3.pbtxt,
# configs/runs/char-sites.ini, tag fus, subnet 10.77.0. Node logs go to DIR/<node>.log (default
# runs/sites). Expects a build in build/ (scripts/build.sh); FUSION_BIN=DIR/apps picks another
# (fusion-cluster from there too, unless FUSION_CLUSTER_BIN names one).
#
# Certificates: without --certs, a fresh CA and one certificate per holder are made in DIR/certs
# of the logs (fusion-cluster certs --force) for this run; --certs DIR uses the ones in DIR, making
# them there first if DIR holds no ca.pem. --plaintext runs everything with security.mode=off
# (unauthenticated; warned), e.g. to measure what TLS costs.
# The admin shell opens on a free loopback port (unless the fusion-train args give --admin.port)
# and fusion-train prints the fusion-admin command that attaches to it, certificates included.
#
# CPU caps: a node with cpu_share S runs in the cgroup fusion-TAG-NODE with a CFS quota of S cores
# (S x 100 ms per 100 ms period, at least 1 ms): cgroup v1 /sys/fs/cgroup/cpu/fusion-TAG-NODE
# (cpu.cfs_period_us, cpu.cfs_quota_us), cgroup v2 /sys/fs/cgroup/fusion-TAG-NODE (cpu.max). The
# node joins its cgroup before it execs, so the cap holds from its first instruction; caps work
# with --loopback too. Without root or a cpu controller it warns once and runs the nodes uncapped.
# A node capped at one core or less runs one actor worker thread (--runtime.threads=1).
set -Eeuo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
bin=${FUSION_BIN:-$repo/build/apps}
# scripts/sites.sh reads the cluster through the same fusion-cluster as this script.
export FUSION_CLUSTER_BIN=${FUSION_CLUSTER_BIN:-$bin/fusion-cluster}
cluster=configs/clusters/sites-3.pbtxt run=configs/runs/char-sites.ini tag=fus subnet=10.77.0 loopback=0
caps=1 logs=runs/sites certs="" plaintext=0
node_extra=() undeclared=" "
while [[ $# -gt 0 ]]; do
  case $1 in
    --cluster) cluster=$2; shift 2 ;;
    --run) run=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --loopback) loopback=1; shift ;;
    --no-caps) caps=0; shift ;;
    --logs) logs=$2; shift 2 ;;
    --certs) certs=$2; shift 2 ;;
    --plaintext) plaintext=1; shift ;;
    --node-arg) node_extra+=("$2"); shift 2 ;;
    --firewall) undeclared+="$2 "; shift 2 ;;
    -h|--help) sed -n '2,36p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "run-sites.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for f in "$cluster" "$run" "$bin/fusion-train" "$bin/fusion-node" "$FUSION_CLUSTER_BIN"; do
  [[ -e $f ]] || { echo "run-sites.sh: $f not found (build first: scripts/build.sh)" >&2; exit 2; }
done
# The tag names the namespaces (scripts/sites.sh checks it again) and the cgroups.
[[ $tag =~ ^[a-z][a-z0-9]{0,9}$ ]] || { echo "run-sites.sh: --tag '$tag': use 1-10 lowercase letters and digits" >&2; exit 2; }
plan=$("$FUSION_CLUSTER_BIN" netns "$cluster") || exit 2
port=$(awk '$1 == "coordinator" { print $3 }' <<<"$plan")
[[ $port != 0 ]] || { echo "run-sites.sh: $cluster needs a fixed coordinator port" >&2; exit 2; }
mkdir -p "$logs"

# ---- certificates ------------------------------------------------------------------------------
security=()
if [[ $plaintext == 1 ]]; then
  security=(--security.mode=off)
  echo "run-sites: WARNING: --plaintext: every connection is unauthenticated plaintext (security.mode=off)" >&2
else
  if [[ -z $certs ]]; then
    certs=$logs/certs
    "$FUSION_CLUSTER_BIN" certs "$cluster" --out "$certs" --force >/dev/null || exit 2
  elif [[ ! -f $certs/ca.pem ]]; then
    "$FUSION_CLUSTER_BIN" certs "$cluster" --out "$certs" >/dev/null || exit 2
  fi
  security=(--security.certs="$certs")
  echo "run-sites: mutual TLS with the certificates in $certs (fusion-cluster certs)" >&2
fi

node_pids=() netns_up=0 cgroups=()
cleanup() {
  local pid dir
  for pid in "${node_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${node_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ $netns_up == 1 ]]; then scripts/sites.sh down --tag "$tag" >/dev/null || true; fi
  # `scripts/sites.sh throttle` may have given an uncapped node a cgroup during the run.
  for dir in /sys/fs/cgroup/fusion-"$tag"-* /sys/fs/cgroup/cpu/fusion-"$tag"-*; do
    [[ -d $dir ]] && [[ " ${cgroups[*]} " != *" $dir "* ]] && cgroups+=("$dir")
  done
  # A cgroup can only be removed once it is empty: the nodes are gone (waited for) by now.
  for dir in "${cgroups[@]}"; do
    for _ in 1 2 3 4 5 6 7 8 9 10; do rmdir "$dir" 2>/dev/null && break; [[ -d $dir ]] || break; sleep 0.2; done
    [[ ! -d $dir ]] || echo "run-sites: cannot remove cgroup $dir (still holds: $(tr '\n' ' ' <"$dir/cgroup.procs"))" >&2
  done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- CPU caps (cgroups) ------------------------------------------------------------------------
cg_mode="" cg_base="" cg_why=""
find_cpu_controller() {  # sets cg_mode (v1|v2) and cg_base, or cg_why and returns 1
  if [[ $(id -u) -ne 0 ]]; then cg_why="not root (uid $(id -u))"; return 1; fi
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    if ! grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
      cg_why="cgroup v2 without the cpu controller (/sys/fs/cgroup/cgroup.controllers)"; return 1
    fi
    if ! grep -qw cpu /sys/fs/cgroup/cgroup.subtree_control &&
       ! echo +cpu 2>/dev/null >/sys/fs/cgroup/cgroup.subtree_control; then
      cg_why="cannot enable the cpu controller in /sys/fs/cgroup/cgroup.subtree_control"; return 1
    fi
    cg_mode=v2 cg_base=/sys/fs/cgroup; return 0
  fi
  if [[ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then cg_mode=v1 cg_base=/sys/fs/cgroup/cpu; return 0; fi
  cg_why="no cgroup cpu controller (no /sys/fs/cgroup/cpu/cpu.cfs_quota_us, no cgroup v2 with cpu)"; return 1
}

capped_nodes=$(awk '$1 == "node" && $5 + 0 > 0 { n++ } END { print n + 0 }' <<<"$plan")
if ((capped_nodes > 0)); then
  if [[ $caps == 0 ]]; then
    echo "run-sites: --no-caps: the cpu_share of $capped_nodes node(s) is ignored, nodes run uncapped" >&2
  elif ! find_cpu_controller; then
    caps=0
    echo "run-sites: WARNING: CPU caps NOT enforced ($cg_why): the $capped_nodes node(s) with a cpu_share run uncapped" >&2
  fi
fi

# make_cgroup NODE SHARE: creates the node's cgroup with its quota, its path in $cg. Returns 1 when
# cgroups cannot be made here, 2 when the cgroup is in use.
cg=""
make_cgroup() {
  local dir="$cg_base/fusion-$tag-$1" quota
  quota=$(awk -v s="$2" 'BEGIN { q = int(s * 100000 + 0.5); print (q < 1000 ? 1000 : q) }')
  if [[ -d $dir ]]; then  # left by a crashed run: reuse only when empty
    if [[ -n $(cat "$dir/cgroup.procs") ]]; then
      echo "run-sites.sh: cgroup $dir is in use (another run with --tag $tag?)" >&2; return 2
    fi
    rmdir "$dir" || return 1
  fi
  mkdir "$dir" 2>/dev/null || return 1
  cgroups+=("$dir")
  if [[ $cg_mode == v1 ]]; then
    echo 100000 >"$dir/cpu.cfs_period_us" && echo "$quota" >"$dir/cpu.cfs_quota_us" || return 1
  else
    echo "$quota 100000" >"$dir/cpu.max" || return 1
  fi
  cg=$dir
}

# ---- sites: namespaces or loopback -------------------------------------------------------------
declare -A site_ip=()
if [[ $loopback == 1 ]]; then
  coord=127.0.0.1
  echo "run-sites: loopback as asked (--loopback): no link shaping" >&2
elif why=$(scripts/sites.sh check 2>&1); then
  netns_up=1
  sites=$(scripts/sites.sh up "$cluster" --tag "$tag" --subnet "$subnet")
  while read -r kind name _ ip; do [[ $kind == site ]] && site_ip[$name]=$ip; done <<<"$sites"
  coord=$(awk '$1 == "coordinator" { print $2 }' <<<"$sites")
  echo "run-sites: sites of $cluster in network namespaces, links shaped; coordinator on $coord:$port" >&2
else
  coord=127.0.0.1
  echo "run-sites: no network namespaces here ($why)" >&2
  echo "run-sites: falling back to loopback WITHOUT link shaping: every node on 127.0.0.1" >&2
fi

# ---- nodes -------------------------------------------------------------------------------------
# `scripts/sites.sh throttle NODE` finds this run's nodes by this mark, not by name alone.
export FUSION_SITES_TAG=$tag
# A node behind a firewall (accept_inbound: false) listens nowhere: it dials its senders. In
# namespaces its site drops every inbound TCP SYN (iptables), unless other nodes share the site.
firewalled=" $(awk '$1 == "firewalled" { printf "%s ", $2 }' <<<"$plan")"
for n in $undeclared; do
  awk -v n="$n" '$1 == "node" && $2 == n { found = 1 } END { exit !found }' <<<"$plan" ||
    { echo "run-sites.sh: --firewall $n: no node of that name in $cluster" >&2; exit 2; }
done
firewall_site() {  # firewall_site NODE SITE
  [[ $netns_up == 1 ]] || return 0
  local others
  others=$(awk -v s="$2" -v n="$1" '$1 == "node" && $3 == s && $2 != n { printf "%s ", $2 }' <<<"$plan")
  for o in $others; do
    if [[ $firewalled != *" $o "* && $undeclared != *" $o "* ]]; then
      echo "run-sites: WARNING: node $1 is NOT firewalled: site $2 also holds node $o, which accepts connections" >&2
      return 0
    fi
  done
  local ok=0
  if command -v iptables >/dev/null; then
    ip netns exec "$tag-$2" iptables -w -C INPUT -p tcp --syn -j DROP 2>/dev/null ||
      ip netns exec "$tag-$2" iptables -w -A INPUT -p tcp --syn -j DROP && ok=1
  fi
  if [[ $ok == 0 ]]; then
    echo "run-sites: WARNING: node $1 is NOT firewalled: iptables is missing or fails (scripts/setup.sh installs it)" >&2
    return 0
  fi
  echo "run-sites: node $1 behind a firewall: inbound TCP connections to site $2 are dropped (iptables)" >&2
}
while read -r kind name site device share; do
  [[ $kind == node ]] || continue
  share=${share:-0}
  ini=configs/nodes/site-$site.ini
  [[ -f $ini ]] || ini=configs/nodes/site-a.ini  # name, site and device come from the command line
  args=(--config "$ini" --node.name="$name" --node.site="$site" --node.device="$device"
        --node.coordinator="$coord:$port" "${security[@]}" ${node_extra[@]+"${node_extra[@]}"})
  if [[ $firewalled == *" $name "* ]]; then
    args+=(--node.accept-inbound=false)
    firewall_site "$name" "$site"
  elif [[ $undeclared == *" $name "* ]]; then
    firewall_site "$name" "$site"  # the node itself listens as usual
  fi
  launch=()
  cap_note=""
  if [[ $caps == 1 ]] && awk -v s="$share" 'BEGIN { exit !(s + 0 > 0) }'; then
    rc=0; make_cgroup "$name" "$share" || rc=$?
    if ((rc == 2)); then exit 2; fi
    if ((rc != 0)); then
      caps=0
      echo "run-sites: WARNING: CPU caps NOT enforced (cannot set up a cgroup under $cg_base): node $name" \
           "and the nodes after it run uncapped" >&2
    else
      # The shell joins the cgroup, then execs (into nsenter, which execs the node): the node's
      # pid is the one started here, and it never runs outside its cgroup.
      launch=(sh -c 'echo $$ >"$1/cgroup.procs" || exit 126; shift; exec "$@"' run-sites-cap "$cg")
      cap_note=", capped"
      # A node capped at one core or less gains nothing from a second worker thread, and with
      # one its ops run one at a time, as the workload estimator models a node
      # (docs/scheduler.md); an explicit --node-arg --runtime.threads=N comes later and wins.
      if awk -v s="$share" 'BEGIN { exit !(s + 0 <= 1) }'; then
        args=(--config "$ini" --runtime.threads=1 "${args[@]:2}")
      fi
      echo "run-sites: node $name capped at $share core (cgroup $cg)" >&2
    fi
  fi
  if [[ $netns_up == 1 ]]; then
    # nsenter joins the site's network namespace only. `ip netns exec` would also mount a fresh
    # /sys, without the cgroup hierarchies under /sys/fs/cgroup: the node could not read its CPU
    # quota there (ops/cpu_quota.hpp) and would time its ops by wall time, throttling pauses
    # included, while the estimator modelled a node at full speed within a budget.
    launch+=(nsenter --net=/run/netns/"$tag-$site")
    args+=(--node.host="${site_ip[$site]}")
  else
    args+=(--node.host=127.0.0.1)
  fi
  ${launch[@]+"${launch[@]}"} "$bin/fusion-node" "${args[@]}" >"$logs/$name.log" 2>&1 &
  node_pids+=($!)
  echo "run-sites: node $name (site $site, $device$cap_note) started, log $logs/$name.log" >&2
done <<<"$plan"

# The admin shell (docs/admin.md) on a free loopback port, unless the command line names one;
# fusion-train prints the exact fusion-admin command to attach with once it listens.
admin=()
if [[ " $* " != *" --admin.port"* ]]; then
  admin=(--admin.port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')")
fi
status=0
"$bin/fusion-train" --config "$run" --cluster "$cluster" --cluster.listen="$coord:$port" "${security[@]}" "${admin[@]}" "$@" ||
  status=$?
exit "$status"
