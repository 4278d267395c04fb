#!/usr/bin/env bash
# Durable ingest at the aggregator (docs/results.md, "Durable ingest: group
# commit"): updates/s, each receipted only once the transaction holding it
# is fsynced, on this machine's disk. Usage: scripts/bench-ingest.sh [OUTDIR]
#   - the store alone: updates made durable one transaction each (group=1,
#     as before group commit) and in groups of 8 and 64;
#   - the aggregator's event loop driven by its ingest workers: one
#     transaction per update (group=1) against group commit with 4 and 16
#     workers, rounds of 250 sites, and a round of 1,000 sites; and the
#     FedSplit family's updates (each with its site's z_j) one transaction
#     each against group commit, rounds of 250 sites.
# Each benchmark runs once; the figures of one run compare on one disk.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-results}
mkdir -p "$out"
go test -count=1 -run '^$' -bench 'BenchmarkPutUpdatesGroup' -benchtime 300x ./node/aggstore/ | tee "$out/ingest-store.txt"
go test -count=1 -run '^$' -bench 'BenchmarkIngest$' -benchtime 996x ./node/aggregator/ | tee "$out/ingest-loop.txt"
