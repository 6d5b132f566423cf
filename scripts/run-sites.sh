#!/usr/bin/env bash
# Runs one training job over the sites of a cluster file, emulated on this machine: one network
# namespace per site with the cluster file's link rates (scripts/sites.sh), a fusion-node process
# inside each site's namespace, and the coordinator (fusion-train) outside, in the root
# namespace. Without root (no namespaces) it falls back to loopback with no shaping and says so.
# Namespaces and processes are cleaned up on exit and on Ctrl-C.
#
#   scripts/run-sites.sh [--cluster FILE] [--run FILE.ini] [--tag TAG] [--subnet A.B.C] [--loopback]
#                        [--node-arg ARG ...] [-- fusion-train args]
#
# --loopback skips the namespaces even as root; --node-arg passes an option to every fusion-node.
# Defaults: configs/clusters/sites-3.pbtxt, configs/runs/char-sites.ini, tag fus, subnet 10.77.0.
# Node logs go to runs/sites/<node>.log. Expects a build in build/ (scripts/build.sh).
set -Eeuo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
cd "$repo"
bin=${FUSION_BIN:-$repo/build/apps}
cluster=configs/clusters/sites-3.pbtxt run=configs/runs/char-sites.ini tag=fus subnet=10.77.0 loopback=0
node_extra=()
while [[ $# -gt 0 ]]; do
  case $1 in
    --cluster) cluster=$2; shift 2 ;;
    --run) run=$2; shift 2 ;;
    --tag) tag=$2; shift 2 ;;
    --subnet) subnet=$2; shift 2 ;;
    --loopback) loopback=1; shift ;;
    --node-arg) node_extra+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --) shift; break ;;
    *) echo "run-sites.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
for f in "$cluster" "$run" "$bin/fusion-train" "$bin/fusion-node" "$bin/fusion-cluster"; do
  [[ -e $f ]] || { echo "run-sites.sh: $f not found (build first: scripts/build.sh)" >&2; exit 2; }
done
plan=$("$bin/fusion-cluster" netns "$cluster") || exit 2
port=$(awk '$1 == "coordinator" { print $3 }' <<<"$plan")
[[ $port != 0 ]] || { echo "run-sites.sh: $cluster needs a fixed coordinator port" >&2; exit 2; }
logs=runs/sites
mkdir -p "$logs"

node_pids=() netns_up=0
cleanup() {
  local pid
  for pid in "${node_pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${node_pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if [[ $netns_up == 1 ]]; then scripts/sites.sh down --tag "$tag" >/dev/null || true; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

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

while read -r kind name site device; do
  [[ $kind == node ]] || continue
  ini=configs/nodes/site-$site.ini
  [[ -f $ini ]] || ini=configs/nodes/site-a.ini
  args=(--config "$ini" --node.name="$name" --node.site="$site" --node.device="$device"
        --node.coordinator="$coord:$port" ${node_extra[@]+"${node_extra[@]}"})
  if [[ $netns_up == 1 ]]; then
    ip netns exec "$tag-$site" "$bin/fusion-node" "${args[@]}" --node.host="${site_ip[$site]}" >"$logs/$name.log" 2>&1 &
  else
    "$bin/fusion-node" "${args[@]}" --node.host=127.0.0.1 >"$logs/$name.log" 2>&1 &
  fi
  node_pids+=($!)
  echo "run-sites: node $name (site $site, $device) started, log $logs/$name.log" >&2
done <<<"$plan"

status=0
"$bin/fusion-train" --config "$run" --cluster "$cluster" --cluster.listen="$coord:$port" "$@" || status=$?
exit "$status"
