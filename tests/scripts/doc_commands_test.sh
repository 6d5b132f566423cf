#!/usr/bin/env bash
# Copied commands: every command line of the ```sh blocks of README.md and docs/*.md that needs
# no root, no second machine and no running coordinator is run as a user would paste it, from a
# fresh directory that looks like the repository (configs, data, scripts, bench and build linked
# in, runs/ empty), block by block in order, each for at most FUSION_DOC_SECONDS (4) seconds. A
# command passes when it exits 0 or is still running when cut off (a training run, a node waiting
# for its coordinator); any other exit fails the test with the command and its output: a usage
# error such as a missing certificate is exactly what a user would meet. Lines with placeholders
# (FILE, [--opt ...]) and lines that need root, other machines or minutes are skipped (listed).
#
#   tests/scripts/doc_commands_test.sh SOURCE_DIR BUILD_DIR
set -uo pipefail
src=$1 build=$2
seconds=${FUSION_DOC_SECONDS:-4}
cd "$src" || exit 1
python3 - "$src" "$build" "$seconds" <<'PY'
import glob, os, re, shutil, signal, subprocess, sys, tempfile
src, build, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
# Why a command is not run (first match wins).
skips = [
    (r"^(\./)?scripts/(run-main|test|setup|run-sites|sites|fuzz|sanitize)\.sh", "needs root, installs, or runs for many minutes"),
    (r"^FUSION_SETUP_BENCH", "installs packages"),
    (r"^bench/", "benchmarks: each has a --smoke ctest (bench_smoke_*)"),
    (r"^(ssh|scp) |192\.168\.", "needs a second machine"),
    (r"fusion-admin", "needs a running coordinator: tests/apps/fusion_admin_test.cpp, admin_watch_test.cpp"),
    (r"two-machines\.pbtxt", "the cluster file the real-machines guide writes"),
    (r"^(cmake|ctest) ", "the build itself"),
    (r"fusion-cluster netns", "prints namespace commands for scripts/sites.sh (root)"),
    (r"/path/to/|encoder\.json|gpt2-tokenizer", "needs GPT-2's own tokenizer files (docs/data.md): tests/tokenizer/bpe_test.cpp"),
    (r"^curl .*/metrics", "needs a running run with metrics.port: tests/apps/prometheus_test.cpp"),
    (r"\[|(?<![\w.=/\"-])[A-Z][A-Z_]+(?![\w.])", "a placeholder to fill in"),
]
# Exits that are expected of a command whose prerequisite the test cut short.
allowed = [("holds no checkpoint yet", "needs a finished training run, which the test cut short")]
failures, ran, skipped = [], 0, []
for doc in ["README.md"] + sorted(glob.glob("docs/*.md")):
    text = open(doc).read()
    for block in re.finditer(r"```(?:sh|bash)\n(.*?)```", text, re.S):
        work = tempfile.mkdtemp(prefix="fusion-doc-")
        for name in ("configs", "data", "scripts", "bench", "proto"):
            os.symlink(os.path.join(src, name), os.path.join(work, name))
        os.symlink(build, os.path.join(work, "build"))
        for raw in block.group(1).replace("\\\n", " ").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            line = re.sub(r"\s+#\s.*$", "", line)  # a trailing comment
            why = next((w for pat, w in skips if re.search(pat, line)), None)
            if why:
                skipped.append(f"{doc}: {line[:100]} ({why})")
                continue
            ran += 1
            # Its own process group: a command cut off is killed with everything it started.
            p = subprocess.Popen(["bash", "-c", line], cwd=work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, text=True, start_new_session=True)
            try:
                out, _ = p.communicate(timeout=seconds)
                rc = p.returncode
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
                rc = 124
            if rc in (0, 124):
                print(f"ok   {doc}: {line[:110]}" + (" (still running after %gs)" % seconds if rc == 124 else ""))
                continue
            reason = next((w for msg, w in allowed if msg in out), None)
            if reason:
                print(f"ok   {doc}: {line[:110]} (exit {rc}: {reason})")
                continue
            failures.append(f"{doc}: {line}\n    exit {rc}: " + "\n    ".join(out.strip().splitlines()[-6:]))
        shutil.rmtree(work, ignore_errors=True)
print(f"\n{ran} commands run, {len(skipped)} skipped:")
for s in skipped:
    print("skip " + s)
for f in failures:
    print("FAIL " + f, file=sys.stderr)
sys.exit(1 if failures else 0)
PY
