#!/usr/bin/env bash
# The console's cost: broker-agg's CPU and memory with 100 sites and the
# console open, against the same run with nobody reading it.
#
#   scripts/bench-console.sh [OUTDIR]        (default bench-results; writes OUTDIR/console)
#
# Environment: CLIENTS (100), K (10), ROUNDS (40), EPOCHS (25), REPS (3),
# MODES ("none poll chromium"; chromium is skipped without CHROMIUM),
# CHROMIUM (/usr/bin/chromium), SEED (1).
#
# The federation is the one of scripts/bench-e2e.sh (e2e/cmd/loadtest run:
# Mosquitto, broker-agg as its own process, CLIENTS agents in one process;
# 784 x 10 logistic regression, FedProx-split, SGD), kept short: K sites a
# round, ROUNDS rounds of up to EPOCHS local epochs (about 0.8 s a round and
# some 35 s of polling a run here: about 1 min a run, 10 min in all). Each run uses fresh
# state. Modes:
#   none      nobody reads the console (the metrics address is not touched
#             after the start: the end is read from broker-agg's log);
#   poll      a client does what node/aggregator/console/console.js does in a
#             shown tab: GET /, console.css, console.js, then GET
#             /status?compact=1&rounds_after=R&evals_after=E 1.5 s after each
#             answer, R and E the last rounds it holds;
#   chromium  the page open in headless Chromium for the whole run (through
#             a counting proxy on loopback; Chromium shares the 2 cores).
# The modes alternate, REPS times. Reported per mode: broker-agg's CPU
# seconds (utime + stime, /proc/PID/stat, at "federation finished"), its
# VmHWM, the mean seconds per round, and the console's requests; min and
# median over the repetitions, and the medians' difference from "none".
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
out=${1:-bench-results}/console
CLIENTS=${CLIENTS:-100}
K=${K:-10}
ROUNDS=${ROUNDS:-40}
EPOCHS=${EPOCHS:-25}
REPS=${REPS:-3}
SEED=${SEED:-1}
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
MODES=${MODES:-"none poll chromium"}
[ -x "$CHROMIUM" ] || MODES=${MODES//chromium/}
mkdir -p "$out"
build_bin ./cmd/broker-agg ./e2e/cmd/loadtest
need_mosquitto

data="$out/data"
loadtest_data "$data" "$SEED"

for rep in $(seq 1 "$REPS"); do
  for mode in $MODES; do
    echo "== rep $rep, console: $mode"
    "$bin/loadtest" run --broker-agg "$bin/broker-agg" --data "$data" --clients "$CLIENTS" --per-round "$K" \
      --rounds "$ROUNDS" --epochs "$EPOCHS" --seed "$SEED" "${train_flags[@]}" --console "$mode" --chromium "$CHROMIUM" \
      >"$out/$mode-$rep.txt" 2>"$out/$mode-$rep.log"
    grep '^RESULT' "$out/$mode-$rep.txt"
  done
done

field() { sed -n "s/^RESULT.* $1=\([^ ]*\).*/\1/p" "$out"/"$2"-*.txt; }
minmed() { sort -g | awk '{ v[NR] = $1 } END { printf "%s %s\n", v[1], v[int((NR + 1) / 2)] }'; }
declare -A med
for mode in $MODES; do
  for f in aggregator_cpu_s aggregator_vmhwm_kb per_round_mean_s; do
    read -r _ m < <(field "$f" "$mode" | minmed)
    med[$mode,$f]=$m
  done
done
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%+.1f %%", 100 * (a - b) / b }'; }

echo
echo "## The console's cost ($CLIENTS sites, K = $K, $ROUNDS rounds, up to $EPOCHS epochs; $(nproc) cores; $REPS runs each, alternating)"
echo
echo "| console | broker-agg CPU s min / median | vs none | broker-agg VmHWM MB min / median | vs none | s/round min / median | vs none | console requests (median) |"
echo "|---|---|---|---|---|---|---|---|"
for mode in $MODES; do
  read -r cmin cmed < <(field aggregator_cpu_s "$mode" | minmed)
  read -r hmin hmed < <(field aggregator_vmhwm_kb "$mode" | minmed)
  read -r smin smed < <(field per_round_mean_s "$mode" | minmed)
  read -r _ rmed < <(field console_requests "$mode" | minmed)
  printf '| %s | %.2f / %.2f | %s | %.1f / %.1f | %s | %.3f / %.3f | %s | %s |\n' "$mode" "$cmin" "$cmed" \
    "$(pct "$cmed" "${med[none,aggregator_cpu_s]}")" "$(awk -v v="$hmin" 'BEGIN{print v/1024}')" "$(awk -v v="$hmed" 'BEGIN{print v/1024}')" \
    "$(pct "$hmed" "${med[none,aggregator_vmhwm_kb]}")" "$smin" "$smed" "$(pct "$smed" "${med[none,per_round_mean_s]}")" "$rmed"
done
