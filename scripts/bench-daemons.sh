#!/usr/bin/env bash
# Wall times of whole federations run by the real daemons (docs/results.md,
# "Daemon wall times"): what an operator waits for, startup to exit.
#
#   scripts/bench-daemons.sh [OUTDIR]     (default bench-results; writes OUTDIR/daemons)
#
# Environment: REPEAT (1): runs of (a); PARTS ("a b c"): which rows to run;
# KS ("10 100"): the K values of (c); BEFORE (a git revision: (a) also runs
# that revision's binaries, interleaved, for before/after figures).
#
#   (a) broker-agg run on its embedded broker (passwords, the federation ACL)
#       and 3 edge-agent run processes (synthetic:1,1 data, 60 features x 10
#       classes), 20 rounds of 3 sites, every other flag at its default
#       (FedProx, SGD, 20 epochs, --settle 5s, ...). Wall: from starting
#       broker-agg to its exit (--exit-when-finished), the sites started
#       once it listens; "rounds" is its first announcement to "federation
#       finished" in its log.
#   (b) Fed-Heart-Disease, 4 hospitals, 100 rounds, mutual TLS:
#       scripts/bench-heart.sh's daemons (broker-agg run and four edge-agent
#       run, deploy/hospital's FedProx:FedSplit with an L-BFGS prox) with the
#       default --settle (5s); the wall is its DAEMONS line (start of
#       broker-agg to its exit).
#   (c) MQTT vs simulate overhead at K = 10 and 100 (100 agents):
#       scripts/bench-e2e.sh with KILLS=0 (no recovery part).
#
# The machine may be shared: the load average is printed next to each figure.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results}/daemons
REPEAT=${REPEAT:-1}
PARTS=${PARTS:-"a b c"}
KS=${KS:-"10 100"}
mkdir -p "$out"
out=$(cd "$out" && pwd)
bin=$(mktemp -d)
pids=()
cleanup() { # the processes this script started, by pid
  local p
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$bin"
}
trap cleanup EXIT
go build -o "$bin/" ./cmd/broker-agg ./cmd/edge-agent
builds=("$bin")
if [ -n "${BEFORE:-}" ]; then
  mkdir -p "$bin/src" "$bin/before"
  git archive "$BEFORE" | tar -x -C "$bin/src"
  (cd "$bin/src" && go build -o "$bin/before/" ./cmd/broker-agg ./cmd/edge-agent)
  builds+=("$bin/before")
fi
load() { cut -d' ' -f1-3 /proc/loadavg; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
now() { date +%s.%N; }
summary="$out/summary.txt"
echo "host: $(nproc) cores; $(git describe --always --dirty)" | tee "$summary"

# rounds_s LOG: seconds from the first "round announced" to "federation finished".
rounds_s() {
  python3 - "$1" <<'EOF'
import sys, re, datetime, json
t = lambda l: datetime.datetime.fromisoformat((json.loads(l)["time"] if l.startswith("{") else re.search(r'time=(\S+)', l).group(1)).replace('Z', '+00:00'))
lines = open(sys.argv[1]).read().splitlines()
first = next(l for l in lines if 'round announced' in l)
fin = next(l for l in lines if 'federation finished' in l)
print(f"{(t(fin) - t(first)).total_seconds():.2f}")
EOF
}

# (a): one run in DIR with the binaries in BIN; prints the wall and the
# rounds' seconds.
run_a() {
  local dir=$1 bin=$2 p s i agg t0 t1 sites=(site-1 site-2 site-3)
  # run_a runs in a subshell (read < <(run_a ...)): its own trap stops what
  # it started, on failure too.
  trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
  rm -rf "$dir"; mkdir -p "$dir"
  p=$(port)
  for s in "${sites[@]}"; do
    echo "pw-$s" | "$bin/broker-agg" pki passwd --file "$dir/passwd" --user "$s" --password-stdin --iterations 1000 >/dev/null
    echo "pw-$s" >"$dir/$s.pw"
  done
  t0=$(now)
  "$bin/broker-agg" run --federation bench --listen "127.0.0.1:$p" --password-file "$dir/passwd" \
    --state-file "$dir/agg.db" --metrics-addr "127.0.0.1:$(port)" --features 60 --classes 10 \
    --per-round 3 --rounds 20 --exit-when-finished >"$dir/agg.log" 2>&1 &
  agg=$!
  pids+=("$agg")
  until (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; do
    kill -0 "$agg" 2>/dev/null || { echo "(a): broker-agg exited; see $dir/agg.log" >&2; return 1; }
    sleep 0.05
  done
  i=0
  for s in "${sites[@]}"; do
    "$bin/edge-agent" run --site-id "$s" --federation bench --broker "tcp://127.0.0.1:$p" --username "$s" \
      --password-file "$dir/$s.pw" --state-file "$dir/$s.db" \
      --data synthetic:1,1 --data-client "$i" --data-clients 3 --data-seed 3 >"$dir/$s.log" 2>&1 &
    pids+=($!)
    i=$((i + 1))
  done
  wait "$agg" || { echo "(a): broker-agg run failed; see $dir/agg.log" >&2; return 1; }
  t1=$(now)
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
  awk -v a="$t0" -v b="$t1" -v r="$(rounds_s "$dir/agg.log")" 'BEGIN { printf "%.2f %s\n", b - a, r }'
}

if [[ " $PARTS " == *" a "* ]]; then
  for r in $(seq 1 "$REPEAT"); do
    for b in "${builds[@]}"; do
      name=this; [ "$b" = "$bin" ] || name="before ($BEFORE)"
      l=$(load)
      read -r wall rs < <(run_a "$out/a-$r-${name%% *}" "$b")
      echo "(a) 20 rounds, 3 sites, embedded broker, default flags, $name: wall ${wall} s (rounds ${rs} s), load ${l} at the start" | tee -a "$summary"
    done
  done
fi

if [[ " $PARTS " == *" b "* ]]; then
  l=$(load)
  ROUNDS=100 SEEDS=1 SETTLE=5s scripts/bench-heart.sh "$out/heart" >"$out/heart.txt" 2>&1 ||
    { echo "(b): bench-heart.sh failed; see $out/heart.txt" >&2; exit 1; }
  line=$(grep '^DAEMONS ' "$out/heart.txt")
  echo "(b) Fed-Heart-Disease, 4 hospitals, 100 rounds, mTLS daemons, --settle 5s: ${line#DAEMONS }, load ${l} at the start" | tee -a "$summary"
fi

if [[ " $PARTS " == *" c "* ]]; then
  l=$(load)
  KS="$KS" KILLS=0 scripts/bench-e2e.sh "$out" >"$out/e2e.txt" 2>&1 ||
    { echo "(c): bench-e2e.sh failed; see $out/e2e.txt" >&2; exit 1; }
  echo "(c) MQTT vs simulate, load ${l} at the start, $(load) at the end:" | tee -a "$summary"
  grep '^| ' "$out/e2e.txt" | tee -a "$summary"
fi
