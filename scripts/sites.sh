#!/usr/bin/env bash
# Emulates the sites of a cluster file on one machine with network namespaces and tc.
#
#   scripts/sites.sh up CLUSTER [--tag TAG] [--subnet A.B.C]
#   scripts/sites.sh down [CLUSTER] [--tag TAG]
#   scripts/sites.sh check
#
# Topology (docs/cluster.md has the drawing): one namespace TAG-SITE per site with eth0 at
# SUBNET.(10+k) (k = site index from 1), a hub namespace TAG-hub whose bridge br0 joins a veth
# per site and one veth from the root namespace (TAG-root, SUBNET.1: where a coordinator in the
# root namespace listens). Each site shapes its egress per destination site with an htb class at
# the link's rate; traffic to the coordinator and between unlinked sites is not classified and
# leaves unshaped. `up` prints "site NAME NETNS IP" per site and "coordinator IP" on stdout.
#
# The cluster file is read through `fusion-cluster netns` (FUSION_CLUSTER_BIN, default
# build/apps/fusion-cluster); this script never parses pbtxt. It only touches the namespaces it
# creates and the root-side veth TAG-root. Exit codes: 0 ok, 1 failure, 2 usage or bad cluster
# file, 3 namespaces unusable here (not root, no ip/tc, no netns support): fall back to loopback.
set -Eeuo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${FUSION_CLUSTER_BIN:-$repo/build/apps/fusion-cluster}
state_dir=${FUSION_SITES_STATE:-/run/fusion-sites}

usage() {  # usage EXIT_CODE: the header comment, to stdout for --help, else to stderr
  if [[ $1 == 0 ]]; then sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; else sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2; fi
  exit "$1"
}
die() { echo "sites.sh: $*" >&2; exit 1; }
say() { echo "sites.sh: $*" >&2; }

# Whether namespaces work here; prints the reason when not.
netns_usable() {
  if [[ $(id -u) -ne 0 ]]; then
    echo "network namespaces need root (running as uid $(id -u)); use a loopback cluster instead"; return 1
  fi
  local t
  for t in ip tc; do
    command -v "$t" >/dev/null || { echo "'$t' not found (Debian: apt-get install iproute2)"; return 1; }
  done
  local probe="fusion-probe-$$"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "cannot create network namespaces here (ip netns add failed: no CAP_SYS_ADMIN?)"; return 1
  fi
  ip netns del "$probe"
}

require_netns() {
  local why
  if ! why=$(netns_usable); then echo "sites.sh: $why" >&2; exit 3; fi
}

# ---- arguments -------------------------------------------------------------------------------
cmd=${1:-}
[[ -n $cmd ]] || usage 2
[[ $cmd == -h || $cmd == --help || $cmd == help ]] && usage 0
shift
cluster="" tag=fus subnet=10.77.0
while [[ $# -gt 0 ]]; do
  case $1 in
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --subnet) subnet=${2:?--subnet needs a value}; shift 2 ;;
    -h|--help) usage 0 ;;
    -*) echo "sites.sh: unknown option '$1'" >&2; exit 2 ;;
    *) [[ -z $cluster ]] || { echo "sites.sh: unexpected argument '$1'" >&2; exit 2; }; cluster=$1; shift ;;
  esac
done
# The tag prefixes namespace names and the root-side interface TAG-root (15 characters at most).
[[ $tag =~ ^[a-z][a-z0-9]{0,9}$ ]] || { echo "sites.sh: --tag '$tag': use 1-10 lowercase letters and digits" >&2; exit 2; }
if [[ ! $subnet =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || ((BASH_REMATCH[1] > 255 || BASH_REMATCH[2] > 255 || BASH_REMATCH[3] > 255)); then
  echo "sites.sh: --subnet '$subnet': give three octets, e.g. 10.77.0 (a /24 is used)" >&2; exit 2
fi
hub="$tag-hub"
root_if="$tag-root"
state="$state_dir/$tag.namespaces"

# ---- the cluster file, through fusion-cluster --------------------------------------------------
site_names=() site_index=() link_a=() link_b=() link_mbit=() coord_host="" coord_port=""
read_cluster() {
  [[ -n $cluster ]] || { echo "sites.sh: $cmd needs a CLUSTER file" >&2; exit 2; }
  [[ -x $bin ]] || { echo "sites.sh: $bin not found or not executable (build it: ninja -C build fusion-cluster, or set FUSION_CLUSTER_BIN)" >&2; exit 2; }
  local out
  out=$("$bin" netns "$cluster") || exit 2
  local kind a b c
  while read -r kind a b c; do
    case $kind in
      site) site_names+=("$a"); site_index+=("$b") ;;
      link) link_a+=("$a"); link_b+=("$b"); link_mbit+=("$c") ;;
      coordinator) coord_host=$a; coord_port=$b ;;
      node) ;;
      *) echo "sites.sh: unexpected line from fusion-cluster: $kind $a $b $c" >&2; exit 2 ;;
    esac
  done <<<"$out"
  ((${#site_names[@]} <= 244)) || { echo "sites.sh: at most 244 sites fit in one /24" >&2; exit 2; }
}

index_of_site() {  # site name -> index (from 1)
  local i
  for i in "${!site_names[@]}"; do [[ ${site_names[$i]} == "$1" ]] && { echo "${site_index[$i]}"; return; }; done
  return 1
}

ns_exists() { [[ -e /run/netns/$1 ]]; }

# Ends processes left inside one of our namespaces (they would keep it alive after `ip netns del`).
kill_inside() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null | tr '\n' ' ') || true
  [[ -n ${pids// /} ]] || return 0
  say "stopping processes still running in $1: $pids"
  kill -TERM $pids 2>/dev/null || true
  sleep 1
  kill -KILL $pids 2>/dev/null || true
}

do_down() {
  local namespaces=() ns
  if [[ -n $cluster ]]; then
    read_cluster
    for ns in "${site_names[@]}"; do namespaces+=("$tag-$ns"); done
  fi
  # What an earlier `up` recorded: covers a cluster file edited since, or none given.
  if [[ -f $state ]]; then while read -r ns; do [[ -n $ns ]] && namespaces+=("$ns"); done <"$state"; fi
  namespaces+=("$hub")
  for ns in "${namespaces[@]}"; do
    if ns_exists "$ns"; then kill_inside "$ns"; ip netns del "$ns"; fi
  done
  # Deleting the hub namespace removes this veth's peer, and the kernel then removes this end
  # asynchronously: it may vanish between the check and the delete. Only its survival is an error.
  if ip link show "$root_if" >/dev/null 2>&1; then ip link del "$root_if" 2>/dev/null || true; fi
  for _ in 1 2 3 4 5 6 7 8 9 10; do ip link show "$root_if" >/dev/null 2>&1 || break; sleep 0.1; done
  if ip link show "$root_if" >/dev/null 2>&1; then echo "sites.sh: cannot remove $root_if" >&2; return 1; fi
  rm -f "$state"
}

mbit_to_kbit() { awk -v m="$1" 'BEGIN { k = int(m * 1000 + 0.5); print (k < 1 ? 1 : k) }'; }

# htb on the site's eth0: one class per linked destination site at the link's rate, selected by
# destination address; unclassified packets (coordinator, unlinked sites, ARP) bypass htb.
shape_site() {
  local k=$1 name=$2 ns="$tag-$2" i peer j kbit burst added=0
  for i in "${!link_a[@]}"; do
    if [[ ${link_a[$i]} == "$name" ]]; then peer=${link_b[$i]}
    elif [[ ${link_b[$i]} == "$name" ]]; then peer=${link_a[$i]}
    else continue; fi
    j=$(index_of_site "$peer")
    kbit=$(mbit_to_kbit "${link_mbit[$i]}")
    # ~5 ms of data at the rate, at least 32 KiB: enough for full-size TSO segments at 1 Gbit/s.
    burst=$((kbit * 1000 / 8 / 200)); ((burst >= 32768)) || burst=32768
    if ((added == 0)); then
      tc -n "$ns" qdisc add dev eth0 root handle 1: htb default 0
      added=1
    fi
    # Classes never borrow from each other (rate = ceil), so the quantum only has to be valid;
    # htb's default (rate / r2q) is too big above ~100 Mbit/s and draws a warning.
    tc -n "$ns" class add dev eth0 parent 1: classid "1:$((10 + j))" htb rate "${kbit}kbit" ceil "${kbit}kbit" \
      burst "$burst" cburst "$burst" quantum 60000
    # A bounded FIFO (~250 ms of data, 64 KiB to 4 MiB) so a slow link queues, not bloats.
    local limit=$((kbit * 1000 / 8 / 4)); ((limit >= 65536)) || limit=65536; ((limit <= 4194304)) || limit=4194304
    tc -n "$ns" qdisc add dev eth0 parent "1:$((10 + j))" handle "$((10 + j)):" bfifo limit "$limit"
    tc -n "$ns" filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst "$subnet.$((10 + j))/32" \
      flowid "1:$((10 + j))"
  done
}

do_up() {
  read_cluster
  if ns_exists "$hub" || ip link show "$root_if" >/dev/null 2>&1; then
    die "emulation '$tag' is already up (scripts/sites.sh down $cluster --tag $tag)"
  fi
  local ns
  for ns in "${site_names[@]}"; do ns_exists "$tag-$ns" && die "namespace $tag-$ns already exists (scripts/sites.sh down $cluster --tag $tag)"; done
  # Never shadow a network this machine already uses.
  if ip -4 -o addr show | awk '{print $4}' | grep -q "^${subnet//./\\.}\."; then
    die "subnet $subnet.0/24 is already used by an interface here; pick another with --subnet"
  fi
  if [[ -n $(ip -4 route show exact "$subnet.0/24") ]]; then die "a route to $subnet.0/24 exists already; pick another --subnet"; fi

  mkdir -p "$state_dir"
  : >"$state"
  trap 'say "up failed; removing what was created"; do_down >/dev/null 2>&1 || true' ERR
  ip netns add "$hub"
  ip -n "$hub" link set lo up
  ip -n "$hub" link add br0 type bridge
  ip -n "$hub" link set br0 up
  ip link add "$root_if" type veth peer name up0 netns "$hub"
  ip -n "$hub" link set up0 master br0 up
  ip addr add "$subnet.1/24" dev "$root_if"
  ip link set "$root_if" up
  local i k name
  for i in "${!site_names[@]}"; do
    name=${site_names[$i]} k=${site_index[$i]} ns="$tag-${site_names[$i]}"
    ip netns add "$ns"
    echo "$ns" >>"$state"
    ip -n "$ns" link set lo up
    ip -n "$hub" link add "s$k" type veth peer name eth0 netns "$ns"
    ip -n "$hub" link set "s$k" master br0 up
    ip -n "$ns" addr add "$subnet.$((10 + k))/24" dev eth0
    ip -n "$ns" link set eth0 up
    shape_site "$k" "$name"
  done
  trap - ERR
  if [[ $coord_host != "$subnet.1" && $coord_host != 0.0.0.0 ]]; then
    say "note: the cluster's coordinator host is $coord_host; in this emulation the coordinator is reachable at $subnet.1"
  fi
  for i in "${!site_names[@]}"; do
    echo "site ${site_names[$i]} $tag-${site_names[$i]} $subnet.$((10 + site_index[i]))"
  done
  echo "coordinator $subnet.1"
}

case $cmd in
  check)
    if why=$(netns_usable); then echo "sites.sh: network namespaces usable (root, ip and tc present)"; exit 0; fi
    echo "sites.sh: $why" >&2; exit 3 ;;
  up) require_netns; do_up ;;
  down) require_netns; do_down ;;
  *) echo "sites.sh: unknown command '$cmd' (up, down or check)" >&2; exit 2 ;;
esac
