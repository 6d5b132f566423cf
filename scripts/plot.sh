#!/usr/bin/env bash
# Draws a run's metrics file (fusion-train --output.metrics, JSON lines; docs/training.md) as one
# PNG of three panels against the step, for the last run in the file (fusion-train appends each
# run after a "run" record): training and validation loss; tokens/s (images/s for an
# image model); measured and predicted step time. Changes of an edge's compression ("compression"
# records) and operator migrations ("migration" records) are marked as vertical lines.
#
#   scripts/plot.sh METRICS.jsonl [OUT.png]
#
# OUT defaults to METRICS with .png for .jsonl. Needs gnuplot (scripts/setup.sh installs
# gnuplot-nox); the records are read with awk, so nothing else is needed. Exit codes: 0 drawn,
# 1 gnuplot failed, 2 usage, a missing file or a file without step records.
set -euo pipefail
usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
[[ $# -ge 1 && $# -le 2 ]] || { usage >&2; exit 2; }
metrics=$1
out=${2:-${metrics%.jsonl}.png}
[[ -f $metrics ]] || { echo "plot.sh: $metrics: no such file" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "plot.sh: gnuplot not found (scripts/setup.sh installs gnuplot-nox)" >&2; exit 2; }
work=$(mktemp -d /tmp/fusion-plot.XXXX)
trap 'rm -rf "$work"' EXIT

first=$( (grep -n '"type": *"run"' "$metrics" || true) | tail -n 1 | cut -d: -f1)
first=${first:-1}
# field NAME: the number after "NAME": on the current line ("nan" when absent)
awk -v dir="$work" '
  function field(name,   s) {
    if (!match($0, "\"" name "\": *-?[0-9.eE+-]+")) return "nan"
    s = substr($0, RSTART, RLENGTH); sub(/^[^:]*: */, "", s); return s
  }
  /"type": *"step"/ {
    # Older files have no step_s: the step time is then the growth of elapsed_s.
    t = field("step_s"); e = field("elapsed_s")
    if (t == "nan" && e != "nan" && have_e) t = e - last_e
    if (e != "nan") { last_e = e; have_e = 1 }
    print field("step"), field("loss"), field("tokens_per_s"), t, field("predicted_step_s") > (dir "/steps.dat")
  }
  /"type": *"eval"/ { print field("step"), field("val_loss") > (dir "/eval.dat") }
  /"type": *"compression"/ { print field("step") > (dir "/compression.dat") }
  /"type": *"migration"/ && !/"ok": *false/ { print field("step") > (dir "/migration.dat") }
' < <(tail -n "+$first" "$metrics")
[[ -s $work/steps.dat ]] || { echo "plot.sh: $metrics holds no step records (is it a fusion-train metrics file?)" >&2; exit 2; }
# The run record says what tokens_per_s counts (files without the field: image runs alone
# reported accuracy then).
unit=tokens/s
if tail -n "+$first" "$metrics" | grep -m1 '"type": *"run"' | grep -q '"items": *"images"'; then
  unit=images/s
elif ! tail -n "+$first" "$metrics" | grep -m1 '"type": *"run"' | grep -q '"items"'; then
  grep -q '"val_accuracy"' "$metrics" && unit=images/s
fi

marks=""
for kind in compression migration; do
  [[ -s $work/$kind.dat ]] || continue
  color=$([[ $kind == compression ]] && echo "#2a9d8f" || echo "#e76f51")
  while read -r step; do
    marks+="set arrow from $step, graph 0 to $step, graph 1 nohead lc rgb '$color' dt 2"$'\n'
  done <"$work/$kind.dat"
done
eval_plot=""
[[ -s $work/eval.dat ]] && eval_plot=", '$work/eval.dat' using 1:2 with linespoints lw 2 pt 7 title 'validation loss'"
predicted=""  # one-process runs predict nothing (nan): plot the curve only where there is one
awk '$5 != "nan" { found = 1 } END { exit !found }' "$work/steps.dat" &&
  predicted=", '' using 1:5 with lines lw 2 title 'predicted step'"
terminal="pngcairo size 1000,900 font ',10'"
gnuplot -e 'set terminal pngcairo' 2>/dev/null </dev/null || terminal="png size 1000,900"

gnuplot <<EOF || { echo "plot.sh: gnuplot failed" >&2; exit 1; }
set terminal $terminal
set output '$out'
set multiplot layout 3,1 title '$(basename "$metrics")'
set grid
set key top right
set xlabel 'step'
$marks
set ylabel 'loss'
plot '$work/steps.dat' using 1:2 with lines lw 1 title 'training loss'$eval_plot
set ylabel '$unit'
plot '$work/steps.dat' using 1:3 with lines lw 1 title '$unit'
set ylabel 'seconds'
plot '$work/steps.dat' using 1:4 with lines lw 1 title 'measured step'$predicted
unset multiplot
EOF
echo "plot.sh: wrote $out ($(wc -l <"$work/steps.dat") steps$([[ -s $work/compression.dat ]] && echo ", $(wc -l <"$work/compression.dat") compression changes")$([[ -s $work/migration.dat ]] && echo ", $(wc -l <"$work/migration.dat") migrations"))"
