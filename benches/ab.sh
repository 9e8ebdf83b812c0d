#!/usr/bin/env bash
# benches/ab.sh: compare criterion benchmarks by interleaved runs and medians.
#
# A single criterion run on a shared or busy machine moves by several per cent from one run to
# the next, more than many changes are worth. This script builds the bench binary once per side,
# then alternates short runs (A B A B ...) so that both sides meet the same drift, and reports
# medians over the rounds instead of one run's figure.
#
# Two modes:
#
#   benches/ab.sh [options] A [B]
#       Builds the bench binary of A and of B (each a commit, anything `git rev-parse` accepts,
#       or `.` for the working tree as it is, uncommitted changes included; B defaults to `.`),
#       runs A, B, A, B, ... for --rounds rounds, and prints for each entry that matched the
#       filter: the median time of A, the median time of B, and the median of the per-round
#       ratios A/B (below 1: A is faster).
#
#   benches/ab.sh [options] --entries ENTRY1 ENTRY2 [COMMIT]
#       One binary (COMMIT, default `.`). Each round runs ENTRY1 and ENTRY2 (alternating which
#       goes first) and the script prints the median of each and the median of the per-round
#       ratios ENTRY1/ENTRY2. An entry is criterion's id (`overhead/stack/tower_retry_timeout`)
#       or its end after a `/` (`stack/tower_retry_timeout`); it must name exactly one entry.
#
# Options:
#   --bench NAME        the bench target (a file of benches/), default: overhead
#   --filter REGEX      criterion's filter (a regular expression on the entry id), A/B mode only;
#                       default: every entry of the bench
#   --rounds N          rounds, default: 5
#   --features LIST     cargo features for the build (e.g. `redis` for the dead_letter bench)
#   --criterion "ARGS"  criterion's options for each run,
#                       default: "--warm-up-time 1 --measurement-time 2"
#
# Examples:
#   benches/ab.sh --bench overhead --filter '^overhead/stack/' --rounds 5 main .
#   benches/ab.sh --bench overhead --rounds 7 \
#       --entries 'stack/backstop_five_layers' 'stack/tower_retry_timeout'
#
# Needs bash, git, cargo and python3. Each side is built from a copy in a temporary directory
# (`git archive` of the commit, or the working tree's files) into target/ab/cargo/, a target
# directory shared by every side, so that the dependencies are compiled once; the checkout's own
# target/release is not touched. Binaries are kept in target/ab/<commit>/ (a commit's is built
# once and reused; the working tree's is rebuilt every time), every run's figures in
# target/ab/runs/. Criterion keeps no baseline for these runs (`--discard-baseline`) and draws no
# plots.
# Run on a machine as quiet as you can make it; the medians damp noise, they do not remove it.
set -euo pipefail
shopt -s inherit_errexit  # `set -e` inside $(...) too

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }
die() { printf 'ab.sh: %s\n' "$*" >&2; exit 2; }

bench=overhead
filter=
rounds=5
features=
criterion_args="--warm-up-time 1 --measurement-time 2"
entries=()
sides=()

while (($#)); do
    case "$1" in
        --bench) bench=${2:?--bench needs a value}; shift 2 ;;
        --filter) filter=${2:?--filter needs a value}; shift 2 ;;
        --rounds) rounds=${2:?--rounds needs a value}; shift 2 ;;
        --features) features=${2:?--features needs a value}; shift 2 ;;
        --criterion) criterion_args=${2?--criterion needs a value}; shift 2 ;;
        --entries)
            (($# >= 3)) || die "--entries needs two entries"
            entries=("$2" "$3"); shift 3 ;;
        -h|--help) usage; exit 0 ;;
        --*) die "unknown option $1 (see --help)" ;;
        *) sides+=("$1"); shift ;;
    esac
done
[[ $rounds =~ ^[1-9][0-9]*$ ]] || die "--rounds must be a positive integer"

root=$(git rev-parse --show-toplevel)
cd "$root"
target_dir=${CARGO_TARGET_DIR:-$root/target}
case $target_dir in /*) ;; *) target_dir=$root/$target_dir ;; esac
out=$target_dir/ab
mkdir -p "$out/runs"
feature_args=()
[[ -n $features ]] && feature_args=(--features "$features")

# Prints the path of the bench executable from `cargo bench --no-run --message-format=json`.
find_executable() {
    python3 -c '
import json, sys
bench = sys.argv[1]
found = None
for line in sys.stdin:
    try:
        msg = json.loads(line)
    except ValueError:
        continue
    if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
        continue
    target = msg.get("target", {})
    if target.get("name") == bench and "bench" in target.get("kind", []):
        found = msg["executable"]
if not found:
    sys.exit("no executable for bench %r in cargo'"'"'s output" % bench)
print(found)
' "$bench"
}

# copy_worktree DIR: copies the working tree's files (tracked and untracked, not ignored) to DIR.
copy_worktree() {
    git ls-files -z --cached --others --exclude-standard | python3 -c '
import os, shutil, sys
dest = sys.argv[1]
for path in sys.stdin.buffer.read().decode().split("\0"):
    if path and os.path.isfile(path):
        os.makedirs(os.path.join(dest, os.path.dirname(path)), exist_ok=True)
        shutil.copy2(path, os.path.join(dest, path))
' "$1"
}

# build SIDE: builds SIDE's bench binary and prints its saved path.
build() {
    local side=$1 label dir tmp exe
    if [[ $side == . ]]; then
        label=worktree
    else
        label=$(git rev-parse --verify --quiet "$side^{commit}") || die "not a commit: $side"
    fi
    dir=$out/$label${features:+-${features//[^A-Za-z0-9_-]/_}}
    if [[ $side != . && -x $dir/$bench ]]; then
        echo "ab.sh: reusing $dir/$bench ($side)" >&2
        echo "$dir/$bench"
        return
    fi
    tmp=$(mktemp -d "${TMPDIR:-/tmp}/ab.XXXXXX")
    # build runs in a subshell ($(build ...)), so this removes the copy however it ends.
    # shellcheck disable=SC2064 # expanded now: $tmp is local to this function
    trap "rm -rf '$tmp'" EXIT
    if [[ $side == . ]]; then
        copy_worktree "$tmp"
    else
        git archive "$label" | tar -x -C "$tmp"
    fi
    # Every side is built from a copy in a temporary directory, into one target directory kept
    # for this script: cargo names the crate's artifacts the same wherever its sources are, and
    # judges them fresh by the sources' times, so the copy's files are touched to make cargo
    # rebuild the crate (never its dependencies), and the checkout's own target directory is
    # left alone.
    find "$tmp" -type f -exec touch {} +
    echo "ab.sh: building bench $bench of $side" >&2
    exe=$(cd "$tmp" && CARGO_TARGET_DIR=$out/cargo \
        cargo bench --no-run --bench "$bench" "${feature_args[@]}" --message-format=json \
        | find_executable)
    mkdir -p "$dir"
    cp "$exe" "$dir/$bench.tmp" && mv "$dir/$bench.tmp" "$dir/$bench"
    echo "$dir/$bench"
}

# run EXE FILTER [--exact]: one criterion run; prints "id<TAB>ns" per entry measured.
run() {
    local exe=$1 flt=$2; shift 2
    # Criterion's own files (none are kept with --discard-baseline) go out of the way, and its
    # progress lines (on stderr) to the run's log.
    # shellcheck disable=SC2086 # criterion_args is a list of words
    CARGO_TARGET_DIR=$out/criterion "$exe" --bench --noplot --discard-baseline --color never \
        $criterion_args "$@" ${flt:+"$flt"} 2>>"$log.stderr" \
    | python3 -c '
import re, sys
units = {"ps": 1e-3, "ns": 1.0, "µs": 1e3, "us": 1e3, "ms": 1e6, "s": 1e9}
time = re.compile(r"^(.*?)\s*time:\s+\[\S+ \S+ (\S+) (\S+) \S+ \S+\]")
previous = ""
for line in sys.stdin:
    line = line.rstrip("\n")
    m = time.match(line)
    if m:
        name = m.group(1).strip() or previous.strip()
        print("%s\t%r" % (name, float(m.group(2)) * units[m.group(3)]))
    elif line.strip():
        previous = line
'
}

# tag ROUND SIDE: prefixes each line of a run's figures with its round and side.
tag() { awk -v r="$1" -v s="$2" '{ print r "\t" s "\t" $0 }'; }

log=$out/runs/$(date +%Y%m%dT%H%M%S)-$bench.tsv

if ((${#entries[@]})); then
    ((${#sides[@]} <= 1)) || die "--entries takes at most one commit"
    side=${sides[0]:-.}
    exe=$(build "$side")
    # An entry is the whole id or its end after a '/'.
    patterns=()
    for e in "${entries[@]}"; do
        patterns+=("(^|/)$(python3 -c 'import re, sys; print(re.escape(sys.argv[1]))' "$e")\$")
    done
    : >"$log"
    trap 'echo "ab.sh: a run failed; see $log.stderr" >&2' ERR
    for ((r = 1; r <= rounds; r++)); do
        order=(0 1)
        ((r % 2 == 0)) && order=(1 0)
        for i in "${order[@]}"; do
            echo "ab.sh: round $r/$rounds: ${entries[$i]}" >&2
            run "$exe" "${patterns[$i]}" | tag "$r" "$i" >>"$log"
        done
    done
    python3 - "$log" "${entries[@]}" <<'EOF'
import collections, statistics, sys
log, names = sys.argv[1], sys.argv[2:]
ids = collections.defaultdict(set)
times = collections.defaultdict(dict)
for line in open(log):
    r, i, name, ns = line.rstrip("\n").split("\t")
    ids[int(i)].add(name)
    times[int(r)][int(i)] = float(ns)
for i, name in enumerate(names):
    if len(ids[i]) != 1:
        sys.exit("ab.sh: %r names %d entries (%s); give its whole id"
                 % (name, len(ids[i]), ", ".join(sorted(ids[i])) or "none"))
rounds = [t for t in times.values() if 0 in t and 1 in t]
first, second = (ids[i].pop() for i in (0, 1))
m0 = statistics.median(t[0] for t in rounds)
m1 = statistics.median(t[1] for t in rounds)
ratio = statistics.median(t[0] / t[1] for t in rounds)
print("%d rounds" % len(rounds))
print("%-52s %10.2f ns (median)" % (first, m0))
print("%-52s %10.2f ns (median)" % (second, m1))
print("median of the per-round ratios, first / second: %.3f" % ratio)
EOF
else
    ((${#sides[@]} >= 1 && ${#sides[@]} <= 2)) || die "give one or two commits (see --help)"
    a=${sides[0]} b=${sides[1]:-.}
    exe_a=$(build "$a")
    exe_b=$(build "$b")
    : >"$log"
    trap 'echo "ab.sh: a run failed; see $log.stderr" >&2' ERR
    for ((r = 1; r <= rounds; r++)); do
        echo "ab.sh: round $r/$rounds: A ($a)" >&2
        run "$exe_a" "$filter" | tag "$r" A >>"$log"
        echo "ab.sh: round $r/$rounds: B ($b)" >&2
        run "$exe_b" "$filter" | tag "$r" B >>"$log"
    done
    python3 - "$log" "$a" "$b" <<'EOF'
import collections, statistics, sys
log, a, b = sys.argv[1:4]
times = collections.defaultdict(lambda: collections.defaultdict(dict))
order = []
for line in open(log):
    r, side, name, ns = line.rstrip("\n").split("\t")
    if name not in times:
        order.append(name)
    times[name][int(r)][side] = float(ns)
if not order:
    sys.exit("ab.sh: no entry matched the filter")
width = max(len(n) for n in order)
head = "A = %s, B = %s; times in ns, medians over rounds" % (a, b)
print(head)
print("%-*s %10s %10s %8s %7s" % (width, "entry", "A", "B", "A/B", "rounds"))
for name in order:
    rounds = [t for t in times[name].values() if "A" in t and "B" in t]
    ma = statistics.median(t["A"] for t in rounds)
    mb = statistics.median(t["B"] for t in rounds)
    ratio = statistics.median(t["A"] / t["B"] for t in rounds)
    print("%-*s %10.2f %10.2f %8.3f %7d" % (width, name, ma, mb, ratio, len(rounds)))
EOF
fi
echo "ab.sh: every run's figures are in $log, criterion's progress in $log.stderr" >&2
