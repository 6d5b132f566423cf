#!/usr/bin/env bash
# One benchmark's --smoke run (bench/NAME.sh --smoke: a few steps, one round), as ctest's
# bench_smoke_NAME runs it: the script must finish and its table must come out with a number in
# every column. Checked on stdout: every RESULT line's key=value pairs are numbers (or comma-
# separated lists of them; model= names the model), at least one RESULT line or markdown table row exists, every cell of a
# markdown table row after the first holds a number unless the row says "skipped:", and nothing
# reads nan or n/a. Exit 77 (ctest: skipped) passes on what the benchmark says when it cannot run
# here (no root, no GPU), with its reason.
#
#   tests/scripts/bench_smoke.sh SOURCE_DIR BUILD_DIR NAME [EXTRA ARGS]
set -uo pipefail
src=$1 build=$2 name=$3
shift 3
cd "$src" || exit 1
out=$(mktemp /tmp/fusion-bench-smoke.XXXXXX)
trap 'rm -f "$out" "$out.err"' EXIT
bench/"$name".sh --smoke --build "$build" "$@" >"$out" 2>"$out.err"
rc=$?
cat "$out"
if ((rc == 77)); then
  tail -n 3 "$out.err"
  exit 77
fi
if ((rc != 0)); then
  tail -n 30 "$out.err"
  echo "bench_smoke: bench/$name.sh --smoke exited $rc" >&2
  exit 1
fi
python3 - "$out" "$name" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
name = sys.argv[2]
problems = []
number = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?[x%*]?$")
found = 0
for line in text.splitlines():
    if re.search(r"\b(nan|n/a)\b", line, re.I):
        problems.append(f"{line!r} reads nan or n/a")
    if line.startswith("RESULT "):
        found += 1
        for pair in line.split()[1:]:
            key, _, value = pair.partition("=")
            if key == "model":
                continue  # the one text field: which model the line is about
            if not value or not all(number.match(v) for v in value.split(",")):
                problems.append(f"RESULT {key}={value!r} is not a number")
    elif line.startswith("|") and not re.match(r"^\|[-:| ]+\|$", line):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if "skipped:" in line or not any(re.search(r"\d", c) for c in cells[1:]):
            continue  # a header row, or a part skipped with its reason
        found += 1
        for c in cells[1:]:
            if not re.search(r"\d", c):
                problems.append(f"table row {line!r}: cell {c!r} has no number")
if not found:
    problems.append("no RESULT line and no table row with numbers")
for p in problems:
    print(f"bench_smoke: {name}: {p}", file=sys.stderr)
sys.exit(1 if problems else 0)
PY
