#!/usr/bin/env bash
# The same federation over the three broker tiers, in one run: broker-agg's
# embedded broker, Mosquitto (deploy/mosquitto's ACL, passwords) and a
# three-node NATS cluster (deploy/nats as shipped: mutual TLS, users.sh's
# ACL, three JetStream replicas), all on loopback.
#
#   scripts/bench-brokers.sh [OUTDIR]     (default bench-results; writes OUTDIR/brokers)
#
# Environment: SITES (20), ROUNDS (20), REPEAT (2).
#
# Each run: broker-agg run and SITES edge-agent processes (synthetic:1,1,
# 60 features x 10 classes, FedProx-split, SGD, 1 epoch, every site every
# round); with NATS the sites are spread over the three nodes (each lists
# the other two for fail-over). Seconds per round are from the aggregator's
# log (first announcement to "federation finished", over ROUNDS); broker
# memory is the broker processes' VmHWM (the embedded broker's is the
# aggregator's). The tiers run one after the other, REPEAT times,
# interleaved.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results}/brokers
SITES=${SITES:-20}
ROUNDS=${ROUNDS:-20}
REPEAT=${REPEAT:-2}
mkdir -p "$out"
bin=$(mktemp -d)
trap 'pkill -P $$ 2>/dev/null || true; rm -rf "$bin"' EXIT
go build -o "$bin/" ./cmd/broker-agg ./cmd/edge-agent
command -v nats-server >/dev/null || { echo "needs nats-server (apt-get install nats-server)" >&2; exit 1; }
[ -x /usr/sbin/mosquitto ] || { echo "needs mosquitto (apt-get install mosquitto)" >&2; exit 1; }

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
hwm() { awk '/VmHWM/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
sites=$(seq -f 'site-%g' 1 "$SITES" | paste -sd, -)

# run TIER DIR: one federation; prints "TIER seconds_per_round broker_kib agg_kib"
run() {
  local tier=$1 dir=$2 fed=bench agg_args=() site_url=() pids=() bpids=()
  rm -rf "$dir"; mkdir -p "$dir"
  "$bin/broker-agg" pki --dir "$dir/pki" --clients "$sites" --hosts 127.0.0.1 >/dev/null 2>&1
  case $tier in
    embedded)
      local p; p=$(port)
      for s in ${sites//,/ }; do echo "pw-$s" | "$bin/broker-agg" pki passwd --file "$dir/passwd" --user "$s" --password-stdin --iterations 1000 >/dev/null; done
      agg_args=(--listen "127.0.0.1:$p" --password-file "$dir/passwd")
      for s in ${sites//,/ }; do site_url+=("--broker tcp://127.0.0.1:$p --username $s --password-file $dir/$s.pw"); echo "pw-$s" > "$dir/$s.pw"; done ;;
    mosquitto)
      local p; p=$(port)
      for s in ${sites//,/ } aggregator; do echo "pw-$s" | "$bin/broker-agg" pki passwd --file "$dir/passwd" --user "$s" --password-stdin --iterations 1000 >/dev/null; echo "pw-$s" > "$dir/$s.pw"; done
      sed "s#edgefl/ward-7/#edgefl/$fed/#" deploy/mosquitto/edgefl.acl > "$dir/edgefl.acl"
      printf 'user %s\nallow_anonymous false\nacl_file %s\npassword_file %s\npersistence true\npersistence_location %s/\nmax_queued_messages 100000\nmax_inflight_messages 20\nmax_packet_size 16777216\nlistener %s 127.0.0.1\n' \
        "$(id -un)" "$dir/edgefl.acl" "$dir/passwd" "$dir" "$p" > "$dir/mosquitto.conf"
      /usr/sbin/mosquitto -c "$dir/mosquitto.conf" >"$dir/mosquitto.log" 2>&1 & bpids+=($!)
      sleep 1
      agg_args=(--broker "tcp://127.0.0.1:$p" --username aggregator --broker-password-file "$dir/aggregator.pw")
      for s in ${sites//,/ }; do site_url+=("--broker tcp://127.0.0.1:$p --username $s --password-file $dir/$s.pw"); done ;;
    nats)
      deploy/nats/users.sh "$fed" ${sites//,/ } > "$dir/edgefl-users.conf"
      local mq=() rt=() i
      for i in 1 2 3; do mq+=("$(port)"); rt+=("$(port)"); done
      for i in 0 1 2; do
        sed -e "s#\$EDGEFL_NATS_NODE#nats-$((i+1))#; s#/var/lib/nats/jetstream#$dir/js$i#; s#/etc/nats/certs/#$dir/pki/#; s#127.0.0.1:4222#127.0.0.1:$(port)#; s#0.0.0.0:6222#127.0.0.1:${rt[$i]}#; s#0.0.0.0:8883#127.0.0.1:${mq[$i]}#" \
          -e "s#nats-route://nats-1:6222#nats-route://127.0.0.1:${rt[0]}#; s#nats-route://nats-2:6222#nats-route://127.0.0.1:${rt[1]}#; s#nats-route://nats-3:6222#nats-route://127.0.0.1:${rt[2]}#" \
          deploy/nats/node.conf > "$dir/nats-$i.conf"
        nats-server -c "$dir/nats-$i.conf" >"$dir/nats-$i.log" 2>&1 & bpids+=($!)
      done
      sleep 3
      agg_args=(--broker "ssl://127.0.0.1:${mq[0]}" --tls-ca "$dir/pki/ca.crt" --tls-cert "$dir/pki/clients/aggregator.crt" --tls-key "$dir/pki/clients/aggregator.key")
      i=0
      for s in ${sites//,/ }; do
        site_url+=("--broker ssl://127.0.0.1:${mq[$((i%3))]},ssl://127.0.0.1:${mq[$(((i+1)%3))]},ssl://127.0.0.1:${mq[$(((i+2)%3))]} --tls-ca $dir/pki/ca.crt --tls-cert $dir/pki/clients/$s.crt --tls-key $dir/pki/clients/$s.key")
        i=$((i+1))
      done ;;
  esac
  "$bin/broker-agg" run --federation "$fed" --state-file "$dir/agg.db" --metrics-addr "127.0.0.1:$(port)" \
    --model logreg --features 60 --classes 10 --per-round "$SITES" --rounds "$ROUNDS" --max-epochs 1 \
    --algorithm fedproxsplit --solver sgd --settle 30s "${agg_args[@]}" >"$dir/agg.log" 2>&1 &
  local agg=$!
  i=0
  for s in ${sites//,/ }; do
    # shellcheck disable=SC2086
    "$bin/edge-agent" run --site-id "$s" --federation "$fed" ${site_url[$i]} --state-file "$dir/$s.db" \
      --data synthetic:1,1 --data-client "$i" --data-clients "$SITES" --data-seed 3 >"$dir/$s.log" 2>&1 & pids+=($!)
    i=$((i+1))
  done
  local deadline=$((SECONDS + 600))
  until [ -f "$dir/agg.log" ] && grep -q '"federation finished"\|msg="federation finished"' "$dir/agg.log"; do
    [ $SECONDS -lt $deadline ] || { echo "$tier: no finish in 600 s; see $dir" >&2; return 1; }
    kill -0 $agg 2>/dev/null || { echo "$tier: broker-agg exited; see $dir/agg.log" >&2; return 1; }
    sleep 0.5
  done
  local bmem=0 p
  for p in "${bpids[@]}"; do bmem=$((bmem + $(hwm "$p"))); done
  local amem; amem=$(hwm $agg)
  kill "${pids[@]}" $agg "${bpids[@]}" 2>/dev/null || true
  wait 2>/dev/null || true
  python3 - "$dir/agg.log" "$ROUNDS" "$tier" "$bmem" "$amem" <<'EOF'
import sys, re, datetime
log, rounds, tier, bmem, amem = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
t = lambda l: datetime.datetime.fromisoformat(re.search(r'time=(\S+)', l).group(1).replace('Z', '+00:00'))
lines = open(log).read().splitlines()
first = next(l for l in lines if 'msg="round announced"' in l)
fin = next(l for l in lines if 'msg="federation finished"' in l)
print(f"{tier} {(t(fin) - t(first)).total_seconds() / rounds:.3f} {bmem} {amem}")
EOF
}

echo "host: $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg); $SITES sites, $ROUNDS rounds" | tee "$out/summary.txt"
: > "$out/runs.txt"
for r in $(seq 1 "$REPEAT"); do
  for tier in embedded mosquitto nats; do
    run "$tier" "$out/$tier-$r" | tee -a "$out/runs.txt"
  done
done
python3 - "$out/runs.txt" <<'EOF' | tee -a "$out/summary.txt"
import sys, collections
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    tier, s, b, a = l.split(); d[tier].append((float(s), int(b), int(a)))
print(f"{'broker':<10} {'s/round':>16} {'broker MiB':>11} {'broker-agg MiB':>15}")
for tier, v in d.items():
    s = [x[0] for x in v]
    print(f"{tier:<10} {min(s):7.3f}-{max(s):<8.3f} {max(x[1] for x in v)/1024:11.1f} {max(x[2] for x in v)/1024:15.1f}")
EOF
