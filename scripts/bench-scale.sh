#!/usr/bin/env bash
# Many sites on one aggregator: `broker-agg run` as its own process, on
# Mosquitto and on its embedded broker, with 1,000 and 10,000 sites driven
# from one load generator, against `broker-agg simulate` on the same clients.
#
#   scripts/bench-scale.sh [OUTDIR]            (default bench-results; writes OUTDIR/scale)
#
# Environment: SITES ("1000 10000"), BROKERS ("mosquitto embedded"),
# ROUNDS (4: round 1 connects and solves and is left out), EPOCHS (1),
# SEED (1), PERF (/usr/bin/perf; "" for no profile), SIMULATE (1; 0 skips
# simulate), CODEC (fp32: the uplink codec; fp32+raw skips zstd, which saves
# about 7% of an fp32 delta's bytes and costs the aggregator a zstd decode at
# ingest and another at the close). At 10,000 sites the embedded broker
# delivers every status and runs every round, but a few receipts were lost
# to paho's write timeout while it routed an announcement to every session
# (docs/results.md, "Scale", "After"): loadtest's sessions now re-send an
# update without a receipt as the agent does, after RESEND_MIN (30 s here,
# the agent's reconnect_min; its default, 2 s, is too short for 10,000
# sites: docs/results.md), doubling to 1 min, and the RESULT line counts
# those re-sends (resent_no_receipt).
#
# Setup: multinomial logistic regression, 784 features x 10 classes (7,850
# parameters), on the loadtest's synthetic MNIST-shaped data (22,000
# samples) split iid over SITES clients; fedprox (SGD, EPOCHS local
# epochs, batch 10, lr 0.01, mu 1, l2 1e-4), fp32 uplink, K = SITES (every
# site in every round), quorum 1.
#
# MQTT: e2e/cmd/loadtest scale runs broker-agg run (--broker against
# Mosquitto with a password file and the shipped ACL, or its embedded
# broker with a password file) and SITES MQTT sessions in one process, each
# with its own client id, username and password, a persistent session and
# its receipts awaited (the run fails on a missing or refused receipt), but
# no edge store: each site solves once, at round 1 (the agent's solve), and
# re-sends that DELTA under every later round's number (a delta against the
# announced global model stays valid from round to round; scale.go). So
# rounds 2..R measure the aggregator and the broker, not the sites' solves.
# Seconds per round come from the aggregator's log (one "round aggregated"
# to the next), broker-agg's CPU seconds from /proc, peak memory is VmHWM
# (with the embedded broker, the broker is inside broker-agg's figure).
# With PERF, perf record samples broker-agg over rounds 2..R (the Go binary
# keeps its symbols; broker-agg has no profile flag) and the top functions
# by self and by inclusive time are printed.
#
# simulate runs the same clients, K, epochs, solver and seed in one process
# (real solves every round, no MQTT, no bbolt): seconds per round from its
# results.json, the last (evaluating) round left out. Its gap to the
# centralised optimum is not used here: the optimum gets 100 evaluations.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
out=${1:-bench-results}/scale
SITES=${SITES:-"1000 10000"}
BROKERS=${BROKERS:-"mosquitto embedded"}
ROUNDS=${ROUNDS:-4}
EPOCHS=${EPOCHS:-1}
SEED=${SEED:-1}
PERF=${PERF-/usr/bin/perf}
SIMULATE=${SIMULATE:-1}
CODEC=${CODEC:-fp32}
RESEND_MIN=${RESEND_MIN:-30s}
mkdir -p "$out"
build_bin ./cmd/broker-agg ./e2e/cmd/loadtest
need_mosquitto

data="$out/data"
loadtest_data "$data" "$SEED"
flags=(--mu 1 --gamma 1e-3 --batch 10 --lr 0.01 --l2 1e-4)

summary=()
for N in $SITES; do
  sim="-"
  if [ "$SIMULATE" = 1 ]; then
    echo "== simulate: $N clients, K = $N, $ROUNDS rounds, $EPOCHS epochs, fedprox"
    rm -rf "$out/sim-$N"
    /usr/bin/time -v "$bin/broker-agg" simulate --dataset "idx:$data" --partition iid --clients "$N" --per-round "$N" \
      --rounds "$ROUNDS" --epochs "$EPOCHS" --seed "$SEED" --algo fedprox --solver sgd "${flags[@]}" \
      --eval-every "$ROUNDS" --optimum-evals 100 --optimum-cache "$out/optima" --out "$out/sim-$N" >"$out/sim-$N.txt" 2>"$out/sim-$N.log"
    "$bin/loadtest" simstats --results "$out/sim-$N/results.json" | tee -a "$out/sim-$N.txt"
    sim=$(sed -n 's/^SIM .*per_round_mean_s=\([0-9.]*\).*/\1/p' "$out/sim-$N.txt")
  fi
  for B in $BROKERS; do
    echo "== MQTT: $N sites, $B broker, $ROUNDS rounds"
    "$bin/loadtest" scale --broker-agg "$bin/broker-agg" --data "$data" --broker "$B" --sites "$N" \
      --rounds "$ROUNDS" --epochs "$EPOCHS" --seed "$SEED" --perf "$PERF" --codec "$CODEC" --resend-min "$RESEND_MIN" "${flags[@]}" | tee "$out/scale-$N-$B.txt"
    r=$(grep '^RESULT' "$out/scale-$N-$B.txt")
    get() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$r"; }
    s=$(get per_round_mean_s)
    ratio="-"
    [ "$sim" != "-" ] && ratio=$(awk -v a="$s" -v b="$sim" 'BEGIN { printf "%.2f", a / b }')
    mq=$(get mosquitto_vmhwm_kb)
    summary+=("| $N | $B | $s ($(get per_round_median_s)) | $sim | $ratio | $(get aggregator_cpu_s_per_round) | $(($(get aggregator_vmhwm_kb) / 1024)) | $([ "$mq" = 0 ] && echo "(in broker-agg)" || echo $((mq / 1024))) | $(get load_start)-$(get load_end) |")
  done
done

echo
echo "## Many sites on one aggregator (784 x 10 logreg, fedprox, $CODEC uplink, K = N; $(nproc) cores)"
echo
echo "| sites | broker | s/round mean (median), rounds 2..$ROUNDS | simulate s/round | ratio | broker-agg CPU s/round | broker-agg VmHWM MB | Mosquitto VmHWM MB | load average (1 min) |"
echo "|---|---|---|---|---|---|---|---|---|"
printf '%s\n' "${summary[@]}"
