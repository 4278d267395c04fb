#!/usr/bin/env bash
# End-to-end figures: a federation over MQTT against `broker-agg simulate` on
# the same configuration, and the aggregator's recovery after kill -9.
#
#   scripts/bench-e2e.sh [OUTDIR]            (default bench-results; writes OUTDIR/e2e)
#
# Environment: CLIENTS (100), ROUNDS (20), EPOCHS (5), KS ("100 10": the
# per-round K values to measure), REPEATS (1: MQTT and simulate runs per K,
# interleaved; each ratio, and their median), KILLS (5; 0: no recovery
# part), KILL_ROUNDS (12), SEED (1).
#
# Setup: multinomial logistic regression, 784 features x 10 classes (7,850
# parameters), on a synthetic MNIST-shaped data set (loadtest gen: 22,000
# samples, 10% random labels) split iid over CLIENTS clients; FedProx-split
# with SGD (EPOCHS local epochs, batch 10, lr 0.01, mu 1, step 1, gamma 1e-3),
# fp32 uplink, l2 1e-4.
#
# MQTT: e2e/cmd/loadtest runs Mosquitto (password file, the shipped ACL),
# `broker-agg run --broker` as its own process, and CLIENTS edge agents (the
# agent package, as edge-agent runs it) in one process, each with its own
# bbolt state file. Seconds per round come from the aggregator's log (one
# "round aggregated" to the next: announcement, local solves, uplink,
# durable writes, aggregation, checkpoint); peak memory is VmHWM of the
# broker-agg process. simulate runs the same clients, K, epochs, solver and
# seed in one process (the same solver, split and aggregate code, no MQTT,
# no bbolt); its seconds per round are from its results.json (the last
# round, which evaluates, left out). Both solve the clients of a round in
# parallel on every core.
#
# Recovery: the same federation with K = CLIENTS, broker-agg killed with
# SIGKILL KILLS times with a random share of a round's updates in, restarted
# at once on its state file: time from the restart (process start) to its
# first announcement and to its first accepted update.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
out=${1:-bench-results}/e2e
CLIENTS=${CLIENTS:-100}
ROUNDS=${ROUNDS:-20}
EPOCHS=${EPOCHS:-5}
KS=${KS:-"100 10"}
REPEATS=${REPEATS:-1}
KILLS=${KILLS:-5}
KILL_ROUNDS=${KILL_ROUNDS:-12}
SEED=${SEED:-1}
mkdir -p "$out"
build_bin ./cmd/broker-agg ./e2e/cmd/loadtest
need_mosquitto

data="$out/data"
loadtest_data "$data" "$SEED"

# The centralised optimum simulate measures its gap against is computed
# once here (minutes; cached in $out/optima), so that no pair's simulate
# CPU seconds include it.
"$bin/broker-agg" simulate --dataset "idx:$data" --partition iid --clients "$CLIENTS" --per-round 1 \
  --rounds 1 --epochs 1 --seed "$SEED" --algo fedproxsplit "${train_flags[@]}" \
  --optimum-cache "$out/optima" --out "$out/sim-optimum" >/dev/null 2>&1
summary=()
ratios=()
for K in $KS; do
  walls=() cpus=()
  for rep in $(seq 1 "$REPEATS"); do
    # MQTT and simulate one after the other, REPEATS times (interleaved:
    # the load of a shared machine moves between runs, so each ratio
    # compares neighbours and the median is reported).
    sfx="k$K"
    ((REPEATS > 1)) && sfx="k$K-r$rep"
    l0=$(cut -d' ' -f1 /proc/loadavg)
    echo "== MQTT: $CLIENTS agents, K = $K, $ROUNDS rounds, $EPOCHS epochs (repeat $rep of $REPEATS)"
    /usr/bin/time -f "CPU user=%U sys=%S" -o "$out/mqtt-$sfx.time" \
      "$bin/loadtest" run --broker-agg "$bin/broker-agg" --data "$data" --clients "$CLIENTS" --per-round "$K" \
      --rounds "$ROUNDS" --epochs "$EPOCHS" --seed "$SEED" "${train_flags[@]}" | tee "$out/mqtt-$sfx.txt"
    echo "== simulate: the same configuration"
    rm -rf "$out/sim-$sfx"
    /usr/bin/time -v "$bin/broker-agg" simulate --dataset "idx:$data" --partition iid --clients "$CLIENTS" --per-round "$K" \
      --rounds "$ROUNDS" --epochs "$EPOCHS" --seed "$SEED" --algo fedproxsplit "${train_flags[@]}" \
      --eval-every "$ROUNDS" --optimum-cache "$out/optima" --out "$out/sim-$sfx" >"$out/sim-$sfx.txt" 2>"$out/sim-$sfx.log"
    "$bin/loadtest" simstats --results "$out/sim-$sfx/results.json" | tee -a "$out/sim-$sfx.txt"
    l1=$(cut -d' ' -f1 /proc/loadavg)
    mqtt=$(sed -n 's/.*per_round_mean_s=\([0-9.]*\).*/\1/p' "$out/mqtt-$sfx.txt")
    mqttmed=$(sed -n 's/.*per_round_median_s=\([0-9.]*\).*/\1/p' "$out/mqtt-$sfx.txt")
    hwm=$(sed -n 's/.*aggregator_vmhwm_kb=\([0-9]*\).*/\1/p' "$out/mqtt-$sfx.txt")
    sim=$(sed -n 's/^SIM .*per_round_mean_s=\([0-9.]*\).*/\1/p' "$out/sim-$sfx.txt")
    simmed=$(sed -n 's/^SIM .*per_round_median_s=\([0-9.]*\).*/\1/p' "$out/sim-$sfx.txt")
    simrss=$(sed -n 's/.*Maximum resident set size (kbytes): \([0-9]*\).*/\1/p' "$out/sim-$sfx.log")
    # CPU seconds of each whole command (user + system; the MQTT one
    # includes the agents, broker-agg and Mosquitto, which the loadtest
    # waits for): less moved by the load than the wall clock.
    mcpu=$(awk '/^CPU/ { split($2, u, "="); split($3, s, "="); printf "%.1f", u[2] + s[2] }' "$out/mqtt-$sfx.time")
    scpu=$(awk -F': ' '/User time/ { u = $2 } /System time/ { s = $2 } END { printf "%.1f", u + s }' "$out/sim-$sfx.log")
    ratio=$(awk -v a="$mqtt" -v b="$sim" 'BEGIN { printf "%.2f", a / b }')
    cratio=$(awk -v a="$mcpu" -v b="$scpu" 'BEGIN { printf "%.2f", a / b }')
    walls+=("$ratio") cpus+=("$cratio")
    summary+=("| $CLIENTS | $K | $ROUNDS | $EPOCHS | $mqtt ($mqttmed) | $sim ($simmed) | $ratio | $mcpu / $scpu = $cratio | $((hwm / 1024)) | $((simrss / 1024)) | $l0-$l1 |")
  done
  medof() { printf '%s\n' "$@" | sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
  ratios+=("K = $K: wall ratios ${walls[*]}, median $(medof "${walls[@]}"); CPU ratios ${cpus[*]}, median $(medof "${cpus[@]}")")
done

overhead_table() {
  echo
  echo "## End to end over MQTT vs simulate (784 x 10 logreg, 7,850 parameters; $(nproc) cores)"
  echo
  echo "| clients | K | rounds | epochs | MQTT s/round mean (median) | simulate s/round mean (median) | overhead ratio | CPU s, MQTT / simulate (whole commands) | broker-agg VmHWM MB | simulate max RSS MB | load average (1 min) |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${summary[@]}"
  echo
  printf '%s\n' "${ratios[@]}"
}
if ((KILLS == 0)); then # the overhead table only
  overhead_table
  exit 0
fi
echo "== recovery: $KILLS kills of broker-agg, K = $CLIENTS"
"$bin/loadtest" run --broker-agg "$bin/broker-agg" --data "$data" --clients "$CLIENTS" --per-round "$CLIENTS" \
  --rounds "$KILL_ROUNDS" --epochs "$EPOCHS" --seed "$SEED" "${train_flags[@]}" --kills "$KILLS" | tee "$out/recovery.txt"

overhead_table
echo
echo "## Recovery after kill -9 of broker-agg ($CLIENTS agents, K = $CLIENTS)"
echo
echo "| kill | round | restart -> announcement (ms) | restart -> first accepted update (ms) |"
echo "|---|---|---|---|"
sed -n 's/^RECOVERY kill=\([0-9]*\) round=\([0-9]*\) start_to_announcement_ms=\([0-9]*\) start_to_accepted_update_ms=\([0-9]*\)/| \1 | \2 | \3 | \4 |/p' "$out/recovery.txt"
med() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)] }'; }
ann=$(sed -n 's/^RECOVERY.*start_to_announcement_ms=\([0-9]*\).*/\1/p' "$out/recovery.txt" | med)
acc=$(sed -n 's/^RECOVERY.*start_to_accepted_update_ms=\([0-9]*\).*/\1/p' "$out/recovery.txt" | med)
accmax=$(sed -n 's/^RECOVERY.*start_to_accepted_update_ms=\([0-9]*\).*/\1/p' "$out/recovery.txt" | sort -n | tail -1)
echo
echo "median over $(grep -c '^RECOVERY' "$out/recovery.txt") kills: restart -> announcement ${ann} ms, -> first accepted update ${acc} ms (max ${accmax} ms)"
