#!/usr/bin/env bash
# ctest firewall_netns: a node behind a firewall trains (docs/transport.md, "Connection reversal").
# Three sites in network namespaces (scripts/run-sites.sh), node b1 marked `accept_inbound: false`
# in the cluster file, and every inbound TCP SYN to site b dropped by iptables (Debian's). The
# even policy puts a stage on every site, so b1 receives from a1 (activations) and from c1
# (gradients) over connections it opens itself. Checks: the firewall really drops connections to
# b, the run finishes its steps, b1 accepted no connection and dialed two, nothing is left.
# Without root, namespaces or iptables it says why and exits 77 (ctest: skipped).
#
#   tests/scripts/firewall_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=${1:?usage: firewall_test.sh SOURCE_DIR BUILD_DIR}
build=${2:?usage: firewall_test.sh SOURCE_DIR BUILD_DIR}
export FUSION_CLUSTER_BIN=$build/apps/fusion-cluster FUSION_BIN=$build/apps
sites="$src/scripts/sites.sh"
# Its own tag, subnet and coordinator port: it cannot meet another test's namespaces or ports.
tag=fusfw subnet=10.79.41 port=7741

if ! why=$("$sites" check 2>&1); then
  echo "SKIP: $why"
  exit 77
fi
command -v iptables >/dev/null || { echo "SKIP: iptables is not installed (scripts/setup.sh installs it)"; exit 77; }
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
work=$(mktemp -d)
cleanup() {
  "$sites" down --tag "$tag" >/dev/null 2>&1 || true
  rm -rf "$work"
}
trap cleanup EXIT

cat >"$work/fw.pbtxt" <<EOF
name: "firewall-3"
coordinator { host: "$subnet.1" port: $port }
site { name: "a" }
site { name: "b" }
site { name: "c" }
node { name: "a1" site: "a" device: "cpu" }
node { name: "b1" site: "b" device: "cpu" accept_inbound: false }
node { name: "c1" site: "c" device: "cpu" }
link { a: "a" b: "b" mbit: 1000 }
link { a: "b" b: "c" mbit: 1000 }
link { a: "a" b: "c" mbit: 1000 }
EOF
"$FUSION_CLUSTER_BIN" netns "$work/fw.pbtxt" | grep -qx "firewalled b1" || fail "fusion-cluster netns does not list b1"

# The firewall run-sites.sh sets up for b1 (iptables in site b's namespace) holds: a server in b
# is not reachable from a (the SYN is dropped: a timeout), while b reaches a.
"$sites" down --tag "$tag" >/dev/null 2>&1
out=$("$sites" up "$work/fw.pbtxt" --tag "$tag" --subnet "$subnet") || { echo "FAIL: sites.sh up"; exit 1; }
declare -A ip=()
while read -r kind name _ addr; do [[ $kind == site ]] && ip[$name]=$addr; done <<<"$out"
if ! ip netns exec "$tag-b" iptables -w -A INPUT -p tcp --syn -j DROP; then
  echo "SKIP: iptables cannot filter inside a network namespace here"
  exit 77
fi
serve() {  # serve SITE: a fusion-probe server in SITE on port 7798
  ip netns exec "$tag-$1" "$build/apps/fusion-probe" serve --host "${ip[$1]}" --port 7798 >"$work/probe.log" 2>&1 &
  probe=$!
  for _ in $(seq 50); do grep -q "port=" "$work/probe.log" && break; sleep 0.1; done
}
serve b
ip netns exec "$tag-a" timeout 3 bash -c "exec 3<>/dev/tcp/${ip[b]}/7798" 2>/dev/null &&
  fail "site a reached a server in site b through the firewall"
kill "$probe" 2>/dev/null; wait "$probe" 2>/dev/null
serve a
ip netns exec "$tag-b" timeout 3 bash -c "exec 3<>/dev/tcp/${ip[a]}/7798" 2>/dev/null ||
  fail "site b cannot reach site a: the firewall blocks more than inbound connections"
kill "$probe" 2>/dev/null; wait "$probe" 2>/dev/null
"$sites" down --tag "$tag" >/dev/null || fail "sites.sh down"

# train NAME CLUSTER [run-sites.sh options]: 4 steps over the sites, logs in $work/NAME*; checks
# that the run succeeded, that b1 was firewalled, that b1 accepted no connection and dialed both
# of its senders, and that no namespace is left.
train() {
  local name=$1 cluster=$2; shift 2
  (cd "$src" && scripts/run-sites.sh --cluster "$cluster" --tag "$tag" --subnet "$subnet" --no-caps "$@" \
      --logs "$work/$name.logs" -- --steps 4 --cluster.policy=even --train.eval-every=0 --train.eval-batches=0 \
      --output.metrics="$work/$name.jsonl" --output.checkpoint= --output.sample-chars=0 \
      --runtime.step-timeout=60.0) >"$work/$name.log" 2>&1
  local status=$?
  tail -n 5 "$work/$name.log"
  if [[ $status != 0 ]]; then
    cat "$work/$name.log" "$work/$name.logs"/*.log
    fail "$name: run-sites.sh exited $status"
  fi
  grep -q '"step": 4, "loss"' "$work/$name.jsonl" || fail "$name: no loss for step 4 in the metrics"
  grep -q "node b1 behind a firewall: inbound TCP connections to site b are dropped" "$work/$name.log" ||
    fail "$name: run-sites.sh did not firewall b1"
  b1=$work/$name.logs/b1.log
  for sender in a1 c1; do
    grep -q "opened the data channel connection from node '$sender'" "$b1" || fail "$name: b1 did not dial $sender"
  done
  grep -q "data channel: accepted 0 connection(s), dialed 2" "$b1" ||
    fail "$name: b1's data channel counts: $(grep 'data channel:' "$b1")"
  local leftover
  leftover=$(ip netns list | grep -c "^$tag-" || true)
  [[ $leftover == 0 ]] || fail "$name: $leftover namespaces left behind"
}

train declared "$work/fw.pbtxt"
grep -q "accepts no inbound connection" "$b1" || fail "b1 did not start without a listening data channel"

# The same firewall, declared nowhere (run-sites.sh --firewall): b1 listens as usual and nothing
# says it takes no inbound connection. Its senders find out when they cannot connect, ask it to
# dial them, and the run trains as before.
sed 's/ accept_inbound: false//' "$work/fw.pbtxt" >"$work/fw2.pbtxt"
train undeclared "$work/fw2.pbtxt" --firewall b1
grep -q "joined the coordinator .*data channel on port" "$b1" || fail "undeclared: b1 did not listen as usual"
for sender in a1 c1; do
  grep -q "node 'b1' takes no inbound connection (a firewall?); asking it to dial" "$work/undeclared.logs/$sender.log" ||
    fail "undeclared: $sender did not find b1 unreachable and ask it to dial"
done

if [[ $failures -gt 0 ]]; then echo "$failures failure(s)"; exit 1; fi
echo "firewall: all checks passed"
