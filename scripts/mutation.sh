#!/usr/bin/env bash
# mutation.sh runs mutation testing (gremlins v0.5.0) on one package: each
# mutant changes one operator of the package's code (a < to <=, a + to -,
# a == to !=, ...) and the package's own tests run against it. A mutant the
# tests fail on is KILLED; one they pass on LIVED (no test checks what that
# operator decides); one on code no test runs is NOT COVERED, and gremlins
# does not run it.
#
# Gremlins v0.5.0 also counts every condition of a tagless switch
# (`switch { case a < b: ... }`) NOT COVERED, however often the tests run
# it: Go's coverage profile has no block for a case's expression
# (go-gremlins/gremlins#298). So, second, the script applies each NOT
# COVERED mutant itself, in a copy of the module, and runs the package's
# tests against it: KILLED or LIVED as above (a mutant of code that no
# test runs lives).
#
# It prints gremlins' figures (efficacy: killed / (killed + lived);
# mutator coverage: (killed + lived) / (killed + lived + not covered)),
# then the figures with the NOT COVERED mutants run, and every mutant that
# lived or timed out, as file:line:column and mutator.
#
# The tests are built with the tag mutation (gremlins' --tags), so that a
# package can cut its long runs, which every mutant runs again
# (algorithms/mutation_on_test.go); packages that do not use the tag run
# as always.
#
# Usage: scripts/mutation.sh <package> [timeout coefficient, default 10]
#   e.g. scripts/mutation.sh ./internal/bodyscan
#
# With MUTATION_FILES set to some of the package's files (names, space
# separated: MUTATION_FILES="window.go limit.go"), only their mutants
# run: gremlins lists the mutants (--dry-run) and the script runs each
# as in the second pass, so a package too slow to run whole in one go
# can be run a few files at a time, and a file again after its tests
# change. The figures are then the script's alone.
# Run from anywhere; it works from the module root. The JSON report (with
# the second pass's results) is kept in $MUTATION_OUT if set.
#
# Gremlins times each mutant's tests out at the unmutated run's time times
# the coefficient; on a loaded machine a low coefficient (gremlins'
# default is 3) turns slow runs into TIMED OUT, counted neither killed nor
# lived, hence 10. Too slow for CI: minutes per package (docs/testing.md).
# Needs gremlins v0.5.0 (go install
# github.com/go-gremlins/gremlins/cmd/gremlins@v0.5.0), git, jq and python3.
set -euo pipefail
if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 <package> [timeout coefficient]" >&2
	exit 2
fi
pkg=$1
coef=${2:-10}
case $coef in
'' | *[!0-9]* | 0) echo "timeout coefficient: want a positive whole number, got $coef" >&2; exit 2 ;;
esac
gremlins=$(command -v gremlins || echo "$(go env GOPATH)/bin/gremlins")
if [ ! -x "$gremlins" ]; then
	echo "gremlins not found: go install github.com/go-gremlins/gremlins/cmd/gremlins@v0.5.0" >&2
	exit 2
fi
for tool in git jq python3; do
	command -v $tool >/dev/null || { echo "$tool not found" >&2; exit 2; }
done
cd "$(dirname "$0")/.."
pkg=${pkg#./}
pkg=${pkg%/}
if [ ! -d "$pkg" ] || [ "$pkg" = . ] || [ "$pkg" != "${pkg#../}" ]; then
	echo "$pkg: not a package directory under the module root (give it as ./internal/bodyscan)" >&2
	exit 2
fi
out=${MUTATION_OUT:-}
if [ -z "$out" ]; then
	out=$(mktemp)
	trap 'rm -f "$out"' EXIT
fi
start=$(date +%s)
# Gremlins' own progress, a line a mutant, goes to stderr; the figures
# to stdout.
files=${MUTATION_FILES:-}
if [ -n "$files" ]; then
	for f in $files; do
		[ -f "$pkg/$f" ] || { echo "MUTATION_FILES: $pkg/$f: no such file" >&2; exit 2; }
	done
	"$gremlins" unleash --dry-run --tags mutation --output "$out" "./$pkg" >/dev/null
	# Only the files asked for; each of their mutants runs below.
	jq --arg files "$files" '($files | split(" ") | map(select(. != ""))) as $f
		| .files |= map(select(.file_name as $n | $f | index($n)))
		| .files[].mutations[] |= (if .status == "RUNNABLE" then .status = "NOT COVERED" else . end)' "$out" >"$out.files"
	mv "$out.files" "$out"
else
	"$gremlins" unleash --tags mutation --timeout-coefficient "$coef" --output "$out" "./$pkg" >&2
fi
figures() {
	jq -r --arg what "$1" '
		def pct(a; b): if b == 0 then "n/a" else "\((a * 10000 / b | round) / 100)%" end;
		[.files[]?.mutations[].status] as $s
		| ($s | map(select(. == "KILLED")) | length) as $k
		| ($s | map(select(. == "LIVED")) | length) as $l
		| ($s | map(select(. == "NOT COVERED")) | length) as $n
		| "\($what): efficacy \(pct($k; $k + $l)), mutator coverage \(pct($k + $l; $k + $l + $n))",
		  "  killed \($k), lived \($l), not covered \($n), timed out \($s | map(select(. == "TIMED OUT")) | length), not viable \($s | map(select(. == "NOT VIABLE")) | length), of \($s | length)"
	' "$out"
}
echo "package ./$pkg${files:+ (files: $files)}, timeout coefficient $coef"
[ -n "$files" ] || figures "gremlins"
# The second pass: each NOT COVERED mutant applied and tested, in a copy
# of the module a worker, a worker a CPU. Its tests time out at gremlins'
# per-mutant bound: the unmutated run, times coef. A mutant that does not
# compile is NOT VIABLE (gremlins counts it killed).
secs=$(($(date +%s) - start))
python3 - "$out" "$pkg" "$coef" <<'PY'
import json, os, shutil, signal, subprocess, sys, tempfile, threading, time
report, pkg, coef = sys.argv[1], sys.argv[2], int(sys.argv[3])
# gremlins' mutations (internal/engine/mappings.go), by the operator found
# at the mutant's position.
MUT = {
    "CONDITIONALS_BOUNDARY": {">=": ">", ">": ">=", "<=": "<", "<": "<="},
    "CONDITIONALS_NEGATION": {"==": "!=", "!=": "==", ">=": "<", ">": "<=", "<=": ">", "<": ">="},
    "ARITHMETIC_BASE": {"+": "-", "-": "+", "*": "/", "/": "*", "%": "*"},
    "INCREMENT_DECREMENT": {"++": "--", "--": "++"},
    "INVERT_NEGATIVES": {"-": "+"},
}
rep = json.load(open(report))
todo = [(f["file_name"], m) for f in rep.get("files") or [] for m in f["mutations"] if m["status"] == "NOT COVERED"]
if not todo:
    sys.exit(0)
# A copy of the module for each worker (one a CPU, as gremlins runs).
workers = os.cpu_count() or 1
works = [tempfile.mkdtemp(prefix="mutation-") for _ in range(workers)]
try:
    files = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], capture_output=True, text=True, check=True).stdout.split("\0")
    for work in works:
        for f in files:
            if f and os.path.isfile(f):
                os.makedirs(os.path.join(work, os.path.dirname(f)), exist_ok=True)
                shutil.copy2(f, os.path.join(work, f))
    t0 = time.monotonic()
    subprocess.run(["go", "test", "-tags", "mutation", "-count=1", "./" + pkg], cwd=works[0], capture_output=True, check=True)
    timeout = coef * (time.monotonic() - t0)
    queue = list(todo)
    lock = threading.Lock()

    def run(work):
        while True:
            with lock:
                if not queue:
                    return
                name, m = queue.pop(0)
            path = os.path.join(work, pkg, name)
            src = open(path, "rb").read()
            lines = src.split(b"\n")
            line = lines[m["line"] - 1]
            col = m["column"] - 1  # in bytes, as gremlins counts
            ops = MUT.get(m["type"], {})
            op = next((o for o in sorted(ops, key=len, reverse=True) if line.startswith(o.encode(), col)), None)
            if op is None:
                m["status"] = "NOT VIABLE"  # no operator of the mutator there: not applied
                continue
            lines[m["line"] - 1] = line[:col] + ops[op].encode() + line[col + len(op):]
            open(path, "wb").write(b"\n".join(lines))
            # In a session of its own, so that a timeout ends the test
            # binary too, not only the go command.
            p = subprocess.Popen(["go", "test", "-tags", "mutation", "-count=1", "-failfast", "./" + pkg], cwd=work,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                out, _ = p.communicate(timeout=timeout)
                if p.returncode == 0:
                    m["status"] = "LIVED"
                elif b"[build failed]" in out or b"[setup failed]" in out:
                    m["status"] = "NOT VIABLE"  # a mutant that does not compile
                else:
                    m["status"] = "KILLED"
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
                m["status"] = "TIMED OUT"
            open(path, "wb").write(src)
            print(f'{m["status"]}\t{name}:{m["line"]}:{m["column"]}\t{m["type"]}', file=sys.stderr, flush=True)

    threads = [threading.Thread(target=run, args=(w,)) for w in works]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
finally:
    for work in works:
        shutil.rmtree(work)
json.dump(rep, open(report, "w"))
PY
if [ -n "$files" ]; then
	figures "every mutant of the files run"
else
	figures "with the NOT COVERED mutants run"
fi
echo "  $(($(date +%s) - start)) s (gremlins $secs s)"
jq -r '.files[]? | .file_name as $f | .mutations | sort_by(.line, .column)[]
	| select(.status != "KILLED")
	| "\(.status)\t\($f):\(.line):\(.column)\t\(.type)"' "$out"
