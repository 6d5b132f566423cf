#!/usr/bin/env bash
# Emulates the sites of a cluster file on one machine with network namespaces and tc.
#
#   scripts/sites.sh up CLUSTER [--tag TAG] [--subnet A.B.C]
#   scripts/sites.sh down [CLUSTER] [--tag TAG]
#   scripts/sites.sh check
#   scripts/sites.sh shape SITE_A SITE_B MBIT [--tag TAG]    (while up: change one link's rate)
#   scripts/sites.sh throttle NODE SHARE [--tag TAG]         (while a run-sites.sh run is going)
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
#
# A changing world, for the scheduler to react to: `shape` sets the rate of the link between two
# sites of a running emulation in both directions (shaping it if it was unshaped), and `throttle`
# caps a running node of a `scripts/run-sites.sh --tag TAG` run at SHARE cores (0: uncapped) by
# its cgroup fusion-TAG-NODE, creating the cgroup and moving the node into it if the node ran
# uncapped. Both act at once on the running processes.
set -Eeuo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
bin=${FUSION_CLUSTER_BIN:-$repo/build/apps/fusion-cluster}
state_dir=${FUSION_SITES_STATE:-/run/fusion-sites}

usage() {  # usage EXIT_CODE: the header comment, to stdout for --help, else to stderr
  if [[ $1 == 0 ]]; then sed -n '2,26p' "$0" | sed 's/^# \{0,1\}//'; else sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2; fi
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
cluster="" tag=fus subnet=10.77.0 positional=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --tag) tag=${2:?--tag needs a value}; shift 2 ;;
    --subnet) subnet=${2:?--subnet needs a value}; shift 2 ;;
    -h|--help) usage 0 ;;
    -*) echo "sites.sh: unknown option '$1'" >&2; exit 2 ;;
    *) positional+=("$1"); shift ;;
  esac
done
if [[ $cmd == shape || $cmd == throttle ]]; then
  want=3; [[ $cmd == throttle ]] && want=2
  ((${#positional[@]} == want)) || { usage 2; }
else
  ((${#positional[@]} <= 1)) || { echo "sites.sh: unexpected argument '${positional[1]}'" >&2; exit 2; }
  cluster=${positional[0]:-}
fi
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
      node | firewalled) ;;
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

# shape_link NS J KBIT NET: the egress of NS's eth0 towards NET.(10+J) at KBIT kbit/s; adds the
# htb root, the class, its FIFO and the filter when missing, else changes the class's rate.
shape_link() {
  local ns=$1 j=$2 kbit=$3 net=$4 burst limit verb=add
  # ~5 ms of data at the rate, at least 32 KiB: enough for full-size TSO segments at 1 Gbit/s.
  burst=$((kbit * 1000 / 8 / 200)); ((burst >= 32768)) || burst=32768
  # A bounded FIFO (~250 ms of data, 64 KiB to 4 MiB) so a slow link queues, not bloats.
  limit=$((kbit * 1000 / 8 / 4)); ((limit >= 65536)) || limit=65536; ((limit <= 4194304)) || limit=4194304
  # awk, not grep -q: an early exit would give tc a SIGPIPE, which pipefail reads as "missing".
  tc -n "$ns" qdisc show dev eth0 | awk '/^qdisc htb 1: root/ { found = 1 } END { exit !found }' ||
    tc -n "$ns" qdisc replace dev eth0 root handle 1: htb default 0
  tc -n "$ns" class show dev eth0 | awk -v id="1:$((10 + j))" '$3 == id { found = 1 } END { exit !found }' && verb=change
  # Classes never borrow from each other (rate = ceil), so the quantum only has to be valid;
  # htb's default (rate / r2q) is too big above ~100 Mbit/s and draws a warning.
  tc -n "$ns" class "$verb" dev eth0 parent 1: classid "1:$((10 + j))" htb rate "${kbit}kbit" ceil "${kbit}kbit" \
    burst "$burst" cburst "$burst" quantum 60000
  tc -n "$ns" qdisc replace dev eth0 parent "1:$((10 + j))" handle "$((10 + j)):" bfifo limit "$limit"
  [[ $verb == change ]] && return 0
  tc -n "$ns" filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst "$net.$((10 + j))/32" \
    flowid "1:$((10 + j))"
}

# htb on the site's eth0: one class per linked destination site at the link's rate, selected by
# destination address; unclassified packets (coordinator, unlinked sites, ARP) bypass htb.
shape_site() {
  local name=$2 ns="$tag-$2" i peer
  for i in "${!link_a[@]}"; do
    if [[ ${link_a[$i]} == "$name" ]]; then peer=${link_b[$i]}
    elif [[ ${link_b[$i]} == "$name" ]]; then peer=${link_a[$i]}
    else continue; fi
    shape_link "$ns" "$(index_of_site "$peer")" "$(mbit_to_kbit "${link_mbit[$i]}")" "$subnet"
  done
}

# site_address SITE: the eth0 address of a running site's namespace (the emulation's record of
# its index and subnet, so shape needs no cluster file).
site_address() {
  ns_exists "$tag-$1" || die "no running site '$1' with --tag $tag (namespace $tag-$1 does not exist; is the emulation up?)"
  ip -n "$tag-$1" -4 -o addr show dev eth0 | awk '{ split($4, a, "/"); print a[1]; exit }'
}

do_shape() {
  local a=${positional[0]} b=${positional[1]} mbit=${positional[2]} ip_a ip_b kbit
  # The cluster file's range for a link (core/cluster.cpp): 1 kbit/s to 10 Tbit/s.
  awk -v m="$mbit" 'BEGIN { exit !(m ~ /^[0-9]+(\.[0-9]+)?$/ && m + 0 >= 0.001 && m + 0 <= 10000000) }' ||
    { echo "sites.sh: shape: MBIT '$mbit' must be a rate in Mbit/s from 0.001 to 10000000" >&2; exit 2; }
  [[ $a != "$b" ]] || { echo "sites.sh: shape: a link joins two different sites" >&2; exit 2; }
  ip_a=$(site_address "$a") ip_b=$(site_address "$b")
  kbit=$(mbit_to_kbit "$mbit")
  shape_link "$tag-$a" "$((${ip_b##*.} - 10))" "$kbit" "${ip_b%.*}"
  shape_link "$tag-$b" "$((${ip_a##*.} - 10))" "$kbit" "${ip_a%.*}"
  say "link $a <-> $b now $mbit Mbit/s each way"
}

do_throttle() {
  local node=${positional[0]} share=${positional[1]} dir quota pids pid
  awk -v s="$share" 'BEGIN { exit !(s ~ /^[0-9]+(\.[0-9]+)?$/) }' ||
    { echo "sites.sh: throttle: SHARE '$share' must be a number of cores (0: uncapped)" >&2; exit 2; }
  [[ $node =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "sites.sh: throttle: '$node' is not a node name" >&2; exit 2; }
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then dir=/sys/fs/cgroup/fusion-$tag-$node
  elif [[ -f /sys/fs/cgroup/cpu/cpu.cfs_quota_us ]]; then dir=/sys/fs/cgroup/cpu/fusion-$tag-$node
  else die "throttle: no cgroup cpu controller here"; fi
  if [[ ! -d $dir ]]; then
    # The node ran uncapped: give it a cgroup and move it in (scripts/run-sites.sh removes it).
    # Only a node of this run: other runs on the machine may have a node of the same name, and
    # run-sites.sh marks its nodes with FUSION_SITES_TAG in their environment.
    pids=""
    for pid in $(pgrep -f -- "fusion-node .*--node.name=$node( |$)" || true); do
      tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | grep -qx "FUSION_SITES_TAG=$tag" && pids+="$pid "
    done
    [[ -n $pids ]] || die "throttle: no running fusion-node named '$node' in a run with --tag $tag (and no cgroup $dir)"
    mkdir "$dir"
    for pid in $pids; do echo "$pid" >"$dir/cgroup.procs"; done
  fi
  quota=$(awk -v s="$share" 'BEGIN { q = int(s * 100000 + 0.5); print (s + 0 == 0 ? -1 : (q < 1000 ? 1000 : q)) }')
  if [[ -f $dir/cpu.max ]]; then
    [[ $quota == -1 ]] && echo "max 100000" >"$dir/cpu.max" || echo "$quota 100000" >"$dir/cpu.max"
  else
    echo 100000 >"$dir/cpu.cfs_period_us"
    echo "$quota" >"$dir/cpu.cfs_quota_us"
  fi
  say "node $node $([[ $quota == -1 ]] && echo uncapped || echo "capped at $share core") (cgroup $dir)"
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
  shape) require_netns; do_shape ;;
  throttle) [[ $(id -u) -eq 0 ]] || { echo "sites.sh: throttle needs root (cgroups)" >&2; exit 3; }; do_throttle ;;
  *) echo "sites.sh: unknown command '$cmd' (up, down, check, shape or throttle)" >&2; exit 2 ;;
esac
