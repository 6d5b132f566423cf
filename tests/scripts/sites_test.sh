#!/usr/bin/env bash
# ctest sites_netns: brings up configs/clusters/sites-3.pbtxt with scripts/sites.sh under its own
# tag and subnet, checks every namespace exists, reaches the coordinator address and the other
# sites, and carries the link rates in its tc classes (also after `shape` changes one), then brings it down and checks nothing is
# left. Without root or namespace support it says why and exits 77 (ctest: skipped).
#
#   tests/scripts/sites_test.sh SOURCE_DIR FUSION_CLUSTER_BIN
set -uo pipefail

src=${1:?usage: sites_test.sh SOURCE_DIR FUSION_CLUSTER_BIN}
export FUSION_CLUSTER_BIN=${2:?usage: sites_test.sh SOURCE_DIR FUSION_CLUSTER_BIN}
sites="$src/scripts/sites.sh"
cluster="$src/configs/clusters/sites-3.pbtxt"
tag=fustest
subnet=10.79.7

if ! why=$("$sites" check 2>&1); then
  echo "SKIP: $why"
  exit 77
fi

failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
cleanup() { "$sites" down "$cluster" --tag "$tag" >/dev/null 2>&1 || true; }
trap cleanup EXIT

# A crashed earlier run may have left its emulation behind; down is idempotent.
"$sites" down "$cluster" --tag "$tag" || fail "initial down"
out=$("$sites" up "$cluster" --tag "$tag" --subnet "$subnet") || { echo "FAIL: up"; exit 1; }
echo "$out"

declare -A ip_of
coord=""
while read -r kind a b c; do
  case $kind in
    site) [[ $b == "$tag-$a" ]] || fail "namespace of site $a is '$b', expected '$tag-$a'"; ip_of[$a]=$c ;;
    coordinator) coord=$a ;;
  esac
done <<<"$out"
[[ $coord == "$subnet.1" ]] || fail "coordinator address '$coord', expected $subnet.1"
[[ ${ip_of[a]:-} == "$subnet.11" && ${ip_of[b]:-} == "$subnet.12" && ${ip_of[c]:-} == "$subnet.13" ]] ||
  fail "site addresses a=${ip_of[a]:-} b=${ip_of[b]:-} c=${ip_of[c]:-}"

# Reachability: ping when installed, else a TCP connection to a perl listener in the target.
reach() {  # reach FROM_NS TO_NS_OR_ROOT TO_IP
  local from=$1 to=$2 ip=$3
  if command -v ping >/dev/null; then
    ip netns exec "$from" ping -c 1 -W 2 "$ip" >/dev/null
    return
  fi
  local run=() port=$((20000 + RANDOM % 20000))
  [[ $to == root ]] || run=(ip netns exec "$to")
  "${run[@]}" perl -MIO::Socket::INET -e '$s = IO::Socket::INET->new(LocalAddr => $ARGV[0], LocalPort => $ARGV[1],
      Listen => 1, ReuseAddr => 1) or die; alarm 5; $s->accept;' "$ip" "$port" &
  local listener=$!
  sleep 0.3
  ip netns exec "$from" perl -MIO::Socket::INET -e 'IO::Socket::INET->new(PeerAddr => $ARGV[0], PeerPort => $ARGV[1],
      Timeout => 3) or exit 1;' "$ip" "$port"
  local rc=$?
  wait "$listener" 2>/dev/null
  return $rc
}

for s in a b c; do
  ns="$tag-$s"
  [[ -e /run/netns/$ns ]] || { fail "namespace $ns missing"; continue; }
  ip -n "$ns" link show lo | grep -q 'UP' || fail "loopback down in $ns"
  reach "$ns" root "$subnet.1" || fail "$ns cannot reach the coordinator $subnet.1"
  for t in a b c; do
    [[ $t == "$s" ]] && continue
    reach "$ns" "$tag-$t" "${ip_of[$t]}" || fail "$ns cannot reach site $t (${ip_of[$t]})"
  done
done

# Shaping: each site has one htb class per linked site, at the link's rate (sites-3: a-b 1000,
# b-c 100, a-c 8 Mbit/s); the coordinator has none (unclassified traffic bypasses htb).
rate_to() {  # rate_to SITE PEER_INDEX -> the class rate as tc prints it
  tc -n "$tag-$1" class show dev eth0 | awk -v id="1:$2" '$3 == id { for (i = 1; i < NF; ++i) if ($i == "rate") print $(i + 1) }'
}
[[ $(rate_to a 12) == 1Gbit ]] || fail "a->b class rate '$(rate_to a 12)', expected 1Gbit"
[[ $(rate_to a 13) == 8Mbit ]] || fail "a->c class rate '$(rate_to a 13)', expected 8Mbit"
[[ $(rate_to b 13) == 100Mbit ]] || fail "b->c class rate '$(rate_to b 13)', expected 100Mbit"
[[ $(rate_to c 11) == 8Mbit ]] || fail "c->a class rate '$(rate_to c 11)', expected 8Mbit"
[[ $(tc -n "$tag-a" class show dev eth0 | wc -l) -eq 2 ]] || fail "site a should have exactly 2 htb classes"

# A changing world: shape changes a link's rate both ways while up, and shapes an unshaped pair.
"$sites" shape a c 20 --tag "$tag" 2>/dev/null || fail "shape a c 20"
[[ $(rate_to a 13) == 20Mbit && $(rate_to c 11) == 20Mbit ]] || fail "a<->c after shape: $(rate_to a 13) / $(rate_to c 11)"
[[ $(tc -n "$tag-a" class show dev eth0 | wc -l) -eq 2 ]] || fail "shape must change the class, not add one"
"$sites" shape a b 0 --tag "$tag" >/dev/null 2>&1 && fail "shape to 0 Mbit/s accepted"
"$sites" shape a b 0.0001 --tag "$tag" >/dev/null 2>&1 && fail "shape to 0.1 kbit/s accepted (below the cluster file's 1 kbit/s)"
"$sites" shape a zz 5 --tag "$tag" >/dev/null 2>&1 && fail "shape to an unknown site accepted"

"$sites" up "$cluster" --tag "$tag" --subnet "$subnet" >/dev/null 2>&1 && fail "a second up with the same tag succeeded"

"$sites" down "$cluster" --tag "$tag" || fail "down"
"$sites" down "$cluster" --tag "$tag" || fail "second down (must be idempotent)"
for ns in "$tag-a" "$tag-b" "$tag-c" "$tag-hub"; do
  [[ ! -e /run/netns/$ns ]] || fail "namespace $ns left after down"
done
ip link show "$tag-root" >/dev/null 2>&1 && fail "interface $tag-root left after down"
ip -4 -o addr show | grep -q " ${subnet//./\\.}\." && fail "an address in $subnet.0/24 left after down"

if ((failures > 0)); then echo "$failures check(s) failed"; exit 1; fi
echo "sites_netns: all checks passed"
