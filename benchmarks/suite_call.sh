#!/usr/bin/env bash
# One call of the 4-GPU accuracy suite on a lent machine, as h100x4-run19 to -run22 ran it:
#
#   bash benchmarks/suite_call.sh ROUNDS BUDGET_S TIMEOUT_S [gpu_run.py flags...]
#
# call 1: `1 540 565` (probe, profiles, one round), calls 2 and 3: `5 545 570` and
# `5 520 545` (resumed on the same machine); from h200x4-run17 on, call 3 as
# `5 520 570 --late-profiles` (every model profiled again at its smallest size once the
# rounds are done, host-bound models first, each packed as it is saved). Keep TIMEOUT_S at least 25 s over BUDGET_S (a
# call ends a few seconds past its budget, then reads the machine for up to 15 s) and give
# the device call a limit some 25 s above TIMEOUT_S. The run lives in /tmp/r4 on that machine (so a later call resumes it); the
# script packs it into the device's $OUT as it goes (PACK_TO) and copies the last pack, the
# log and the machine readings there at the end, so a call cut off still hands back its
# profiles. Extract the last all.tgz into benchmarks/results/<run>/.
set -u
rounds=${1:?rounds} budget=${2:?budget seconds} limit=${3:?timeout seconds}
shift 3
here=$(cd "$(dirname "$0")" && pwd)
dest=${OUT:?the device sets OUT}
run=/tmp/r4
mkdir -p "$run"
resume=()
[ -f "$run/cluster.json" ] && resume=(--resume)
(
    cd "$here" &&
        PYTHONPATH="$here/../src" PACK_TO="$dest" OUT="$run" timeout "$limit" \
            "${PYTHON:-python3}" gpu_run.py --no-torch --accuracy-only --rounds "$rounds" \
            --budget "$budget" "${resume[@]}" "$@" >>"$run/stdout.txt" 2>&1
)
status=$?
for f in all.tgz log.txt machine_state.jsonl; do
    [ -f "$run/$f" ] && cp "$run/$f" "$dest/"
done
tail -4 "$run/stdout.txt"
exit $status
