#!/usr/bin/env bash
# The flood figure (docs/results.md, "A flooding site"): one authenticated site floods the aggregator at a
# paced RATE msg/s for FLOOD_SECONDS during a federation, through the
# embedded broker and through Mosquitto; what it costs the aggregator in
# memory and the federation in time.
#
#   scripts/bench-flood.sh [OUTDIR]          (default bench-results; writes OUTDIR/flood)
#
# Environment: BROKERS ("embedded mosquitto"), RATE (10000), BATCH (100),
# FLOOD_SECONDS (10), SITES (3), ROUNDS (8), ROUND_SECONDS (3),
# ROUND_EPOCHS (0), HIDDEN (0), REPEAT (1), SEED (1), FLOOD_CONTENT
# (stale: the flood re-publishes the flooder's update of the round it began
# in, and the flooder sends each later round's update once, as an agent
# does, through its own flood; current: each copy is the update of the
# round in progress, so the copies deliver its next update too),
# ROUND_TIMEOUT (broker-agg's round_timeout; default its own, 10 min: a
# round that loses the flooder's update waits that long), BROKER_AGG (a
# broker-agg binary to measure instead of this tree's, e.g. one built at an
# earlier commit for a before/after:
#   git worktree add /tmp/before adde76a && (cd /tmp/before && go build -o broker-agg ./cmd/broker-agg)
#   BROKER_AGG=/tmp/before/broker-agg BROKERS=embedded HIDDEN=512 scripts/bench-flood.sh OUT).
#
# Every party is a real process on loopback: `broker-agg run` (embedded: its
# own listener and a password file; mosquitto: `--broker` against Mosquitto
# with a password file and the shipped deploy/mosquitto/edgefl.acl), SITES
# `edge-agent run` processes (client k of synthetic(1,1), FedProx:FedSplit
# with SGD on a 60 x 10 logistic regression, fp32 uplink; HIDDEN=H > 0: a
# 60-H-10 MLP instead, H = 512 making each update 145 kB, the larger model
# whose flood the embedded broker's queue used to hold) and, in
# e2e/cmd/loadtest, the flooding site "flooder": its own password, a
# participant in every round (it announces itself online and answers each
# announcement with one valid FULL update for that round, ~2.5 kB). Each
# broker runs the same federation twice, on fresh state: a baseline, then
# the same run in which, FLOOD-seconds long from 1 s into round 3, the
# flooder re-publishes its current round's update at RATE msg/s (a ticker,
# BATCH messages a tick, QoS 0, on its one connection).
#
# Reported per broker: messages sent and the rate achieved; messages
# rate-limited by the embedded broker before routing
# (edgefl_broker_rate_limited_total{client="flooder"}; Mosquitto has no
# such limit) and by the aggregator before decoding
# (edgefl_aggregator_rate_limited_total{client="flooder"}), and
# the update messages that passed the limits beyond the baseline's; peak RSS
# (VmHWM) of the broker-agg process (embedded broker included) and of
# Mosquitto, flood run (baseline); their CPU seconds over the run; and the
# round delay: the rounds the flood overlapped (one "round aggregated" line
# of the aggregator's log to the next), summed, flood run minus baseline;
# and the machine's 1-minute load average before the baseline and after the
# flood run (other work on the machine slows the flooder and the rounds).
#
# Rounds are paced by the round's work budget in seconds (max_seconds =
# ROUND_SECONDS): an agent solves that long whatever CPU it gets, so the
# delay measured is the aggregator's and the broker's (announcements,
# updates, receipts, storage, aggregation under the flood), not the agents'
# loss of CPU to the flooder, broker and aggregator that share this
# machine's cores with them (on a real federation each site has its own
# gateway). For the same reason the agents run at nice 10, behind the
# aggregator, the broker and the flooder. ROUND_EPOCHS=N budgets N local
# epochs instead: the rounds then stretch with whatever CPU the flood takes
# from the agents on this machine, and vary by a second or more from run to
# run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/bench-lib.sh
out=${1:-bench-results}/flood
BROKERS=${BROKERS:-"embedded mosquitto"}
RATE=${RATE:-10000}
BATCH=${BATCH:-100}
FLOOD_SECONDS=${FLOOD_SECONDS:-10}
SITES=${SITES:-3}
ROUNDS=${ROUNDS:-8}
ROUND_SECONDS=${ROUND_SECONDS:-3}
ROUND_EPOCHS=${ROUND_EPOCHS:-0}
HIDDEN=${HIDDEN:-0}
REPEAT=${REPEAT:-1}
SEED=${SEED:-1}
FLOOD_CONTENT=${FLOOD_CONTENT:-stale}
ROUND_TIMEOUT=${ROUND_TIMEOUT:-0}
mkdir -p "$out"
build_bin ./cmd/broker-agg ./cmd/edge-agent ./e2e/cmd/loadtest
agg_bin=${BROKER_AGG:-$bin/broker-agg}
if [[ " $BROKERS " == *" mosquitto "* ]]; then
  need_mosquitto
fi

rows=()
for b in $BROKERS; do
  for i in $(seq 1 "$REPEAT"); do
    echo "== $b broker, run $i of $REPEAT"
    "$bin/loadtest" flood --broker-agg "$agg_bin" --edge-agent "$bin/edge-agent" --broker "$b" \
      --work "$out/work/$b-$i" --sites "$SITES" --rounds "$ROUNDS" --round-seconds "$ROUND_SECONDS" \
      --round-epochs "$ROUND_EPOCHS" --rate "$RATE" --batch "$BATCH" --flood-seconds "${FLOOD_SECONDS}s" \
      --flood-round 3 --flood-after 1s --hidden "$HIDDEN" --seed "$SEED" \
      --flood-content "$FLOOD_CONTENT" --round-timeout "$ROUND_TIMEOUT" | tee "$out/$b-$i.txt"
    r=$(grep '^RESULT ' "$out/$b-$i.txt")
    v() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$r"; }
    mb() { awk -v k="$1" 'BEGIN { printf "%.1f", k / 1024 }'; }
    mq="-"
    if [ "$b" = mosquitto ]; then mq="$(mb "$(v mosquitto_vmhwm_kb)") ($(mb "$(v baseline_mosquitto_vmhwm_kb)"))"; fi
    rows+=("| $b | $(v sent) ($(v sent_rate)/s, $(v message_bytes) B) | $(v broker_rate_limited) | $(v rate_limited) | $(v passed_limit) | $(mb "$(v aggregator_vmhwm_kb)") ($(mb "$(v baseline_aggregator_vmhwm_kb)")) | $mq | $(v flooded_rounds) | $(v baseline_rounds_s) | $(v flood_rounds_s) | $(v delay_s) | $(v worst_round_delay_s) | $(v aggregator_cpu_s) ($(v baseline_aggregator_cpu_s)) | $(v loadavg_start)-$(v loadavg_end) |")
  done
done

budget="${ROUND_SECONDS} s of local work (max_seconds)"
model="60 x 10 logistic regression"
[ "$HIDDEN" -gt 0 ] && model="60-$HIDDEN-10 MLP"
[ "$ROUND_EPOCHS" -gt 0 ] && budget="$ROUND_EPOCHS local epochs"
{
  rt="round_timeout $ROUND_TIMEOUT"
  [ "$ROUND_TIMEOUT" = 0 ] && rt="the default round_timeout"
  echo "## Flood: one site at $RATE msg/s of $FLOOD_CONTENT copies for $FLOOD_SECONDS s ($SITES edge agents + the flooder, $ROUNDS rounds of $budget, $model, $rt, $(nproc) cores)"
  echo
  echo "| broker | messages sent (rate, size) | dropped by the broker | dropped by the aggregator | passed the limit | broker-agg VmHWM MiB flood (baseline) | mosquitto VmHWM MiB flood (baseline) | flooded rounds | their s baseline | their s flood | round delay s | worst round s | broker-agg CPU s flood (baseline) | load average |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$out/summary.txt"
