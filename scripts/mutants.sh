#!/usr/bin/env bash
# Mutation testing of one core module: runs `cargo mutants` on the module's files with only the
# tests that cover it, then prints the score (caught ÷ viable mutants).
#
#   scripts/mutants.sh MODULE [extra cargo-mutants options]
#   scripts/mutants.sh --list
#
# Needs cargo-mutants (`cargo install cargo-mutants --locked`). Dependencies are built once into
# target/mutants and reused by every later run, so a run costs one build of this crate per
# mutant. Results are in target/mutants-out/MODULE/mutants.out (missed.txt lists the survivors).
# Run it on every module a change touches; see CONTRIBUTING.md and docs/mutants.md.
set -euo pipefail
cd "$(dirname "$0")/.."

# module: files (comma-separated) | cargo test arguments
declare -A FILES TESTS FEATURES
# FEATURES[module] (cargo-mutants feature options) is --all-features unless set; empty means the
# default features: a module whose code and tests need no optional one builds faster without.
FILES[backoff]="src/retry/backoff.rs"
TESTS[backoff]="--lib --test proptest_backoff --test retry --test config"
FILES[policy]="src/retry/policy.rs"
TESTS[policy]="--lib --test retry --test config --test reconcile --test hedge --test config_files --test events --test deadlines"
# The policy's edits for `config` need the serde feature; tests/deadlines.rs (the time left
# written into each attempt) runs over tonic.
FEATURES[policy]="--features serde,tonic"
FILES[retry_future]="src/retry/future.rs,src/retry/retrying.rs,src/retry/hedge.rs,src/retry/trace.rs,src/retry/unsent.rs"
TESTS[retry_future]="--lib --test retry --test reconcile --test bodies --test hedge --test spans --test events --test retry_tracing --test deadlines"
FILES[breaker]="src/breaker/state.rs,src/breaker/window.rs,src/breaker/open.rs"
TESTS[breaker]="--lib --test breaker --test breaker_tracing --test config"
FEATURES[breaker]=""
FILES[classify]="src/classify/mod.rs,src/classify/http.rs,src/classify/grpc.rs,src/classify/smtp.rs"
TESTS[classify]="--lib --test classify"
FILES[timeout]="src/timeout/mod.rs,src/timeout/future.rs,src/timeout/layer.rs"
TESTS[timeout]="--lib --test timeout"
FILES[failure]="src/failure.rs"
TESTS[failure]="--lib --test retry --test classify"
FEATURES[failure]=""
FILES[scheduler]="src/resend/scheduler.rs"
TESTS[scheduler]="--lib --test scheduler --test long_outage --test scheduler_tracing"
# The Redis tests of these files run when a server answers at BACKSTOP_REDIS_URL.
FEATURES[scheduler]="--features redis"

if [[ $# -lt 1 || $1 == -h || $1 == --help ]]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
if [[ $1 == --list ]]; then
    for m in "${!FILES[@]}"; do printf '%-13s %s\n' "$m" "${FILES[$m]}"; done | sort
    exit 0
fi
module=$1
shift
if [[ -z ${FILES[$module]:-} ]]; then
    echo "unknown module '$module'; one of: $(printf '%s ' "${!FILES[@]}")" >&2
    exit 2
fi
command -v cargo-mutants >/dev/null || {
    echo "cargo-mutants is not installed: cargo install cargo-mutants --locked" >&2
    exit 2
}

args=()
IFS=, read -ra files <<<"${FILES[$module]}"
for f in "${files[@]}"; do
    [[ -f $f ]] || { echo "no file $f for module $module" >&2; exit 2; }
    args+=(--file "$f")
done
out="target/mutants-out/$module"
mkdir -p "$out"
export CARGO_TARGET_DIR="$PWD/target/mutants"
# The test targets go to every cargo invocation (-C), the build (`cargo test --no-run`)
# included: each mutant then builds only the targets that run, not every test of the crate.
read -ra words <<<"${TESTS[$module]}"
targets=()
for ((i = 0; i < ${#words[@]}; i++)); do
    if [[ ${words[i]} == --test ]]; then
        targets+=(-C "--test=${words[i + 1]}")
        i=$((i + 1))
    else
        targets+=(-C "${words[i]}")
    fi
done
# shellcheck disable=SC2086 # the feature arguments are words
# A mutant whose tests run longer than MUTANTS_TIMEOUT seconds (default 120) is caught by the
# timeout; a module whose tests take a few seconds can set it lower to save time.
cargo mutants "${args[@]}" ${FEATURES[$module]---all-features} --profile mutants --jobs 1 \
    --timeout "${MUTANTS_TIMEOUT:-120}" --output "$out" "${targets[@]}" "$@" || true

dir="$out/mutants.out"
count() {
    if [[ -s $dir/$1.txt ]]; then grep -c . "$dir/$1.txt"; else echo 0; fi
}
caught=$(count caught)
missed=$(count missed)
timeout=$(count timeout)
unviable=$(count unviable)
viable=$((caught + missed + timeout))
if ((viable == 0)); then
    echo "$module: no viable mutant (unviable $unviable)"
    exit 1
fi
# A mutant that makes a test hang is caught: the timeout is a failure of the test run.
score=$(((caught + timeout) * 1000 / viable))
printf '%s: %d mutants, %d unviable, %d caught, %d timed out (caught), %d missed: %d.%d %%\n' \
    "$module" $((viable + unviable)) "$unviable" "$caught" "$timeout" "$missed" \
    $((score / 10)) $((score % 10))
if ((missed > 0)); then
    echo "missed:"
    sed 's/^/  /' "$dir/missed.txt"
fi
