#!/usr/bin/env bash
# The test command (README, .ci/run): installs what the tests need when it is
# missing (Mosquitto, Fashion-MNIST, qemu-user, Chromium and chromedriver),
# then vets, runs every test, and runs each fuzzer briefly on top of its seed
# corpus. The whole run takes about 8-9 minutes on a 2-core machine with
# everything installed, about 20 on a fresh one (the apt installs and the
# golangci-lint build below).
set -euo pipefail
cd "$(dirname "$0")/.."
echo "scripts/test.sh: about 8-9 min on a 2-core machine with everything installed; about 20 min on a fresh one (apt installs, building golangci-lint)"

need=()
[ -x /usr/sbin/mosquitto ] || command -v mosquitto >/dev/null 2>&1 || need+=(mosquitto)
command -v mosquitto_pub >/dev/null 2>&1 || need+=(mosquitto-clients)
[ -f /usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz ] || need+=(dataset-fashion-mnist)
command -v nats-server >/dev/null 2>&1 || need+=(nats-server)
command -v qemu-aarch64-static >/dev/null 2>&1 || command -v qemu-aarch64 >/dev/null 2>&1 || need+=(qemu-user-static)
# The console's browser test (e2e/console_test.go) drives headless Chromium
# through chromedriver.
[ -x /usr/bin/chromium ] || need+=(chromium)
[ -x /usr/bin/chromedriver ] || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing test dependencies: ${need[*]}"
  sudo=""; [ "$(id -u)" -eq 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi

# No build output or other bulk in the repository: every tracked file over
# 1 MB must be a fixture named in scripts/large-files.allow (one path a line,
# with why it is there). A 31 MB broker-agg binary was once committed.
echo "== tracked files over 1 MB"
if git rev-parse --git-dir >/dev/null 2>&1; then
  large=$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk '$1 > 1048576 {print $2}' |
    grep -vxF -f <(grep -v '^#' scripts/large-files.allow | awk 'NF {print $1}') || true)
  if [ -n "$large" ]; then
    echo "tracked files over 1 MB that are not documented fixtures: $large" >&2
    echo "remove them (git rm --cached; build outputs are ignored by .gitignore) or list them in scripts/large-files.allow with the reason" >&2
    exit 1
  fi
fi

echo "== go vet"
go vet ./...
# golangci-lint's gofmt (below) sees only what the default build compiles;
# this covers every tracked file (build-tagged and `ignore` ones too).
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change: $unformatted" >&2
  exit 1
fi

# wire's Go code (messages_gen.go, codec_gen.go, text_gen.go) is generated
# from proto/wire/edgefl.proto by proto/wire/internal/gen: regenerate it and fail when
# that changes anything under wire/, as etcd raft's verify-genproto does.
echo "== go generate ./proto/wire"
go generate ./proto/wire
if git rev-parse --git-dir >/dev/null 2>&1; then
  if ! git diff --exit-code --stat -- wire || git status --porcelain -- 'proto/wire/*_gen.go' | grep -q .; then
    git status --short -- wire >&2
    echo "go generate ./proto/wire changed the files above: the generated wire code was stale (proto/wire/edgefl.proto edited without regenerating, or a *_gen.go file edited by hand), or wire/ has uncommitted changes. Run go generate ./proto/wire and commit the result (CONTRIBUTING.md, Changing the wire schema)." >&2
    exit 1
  fi
fi

# The linters: .golangci.yml's set (staticcheck, errcheck, ineffassign,
# unused, misspell, gofmt) through golangci-lint, pinned, built from the Go
# module proxy into GOPATH/bin when missing: about 3 minutes on an idle
# 2-core machine, once (CONTRIBUTING.md, "Linters"). GOLANGCI_INSTALL=0
# skips that build where golangci-lint is not installed; staticcheck alone
# (the same v0.8.2 checks; pinned, built when missing, about 1 minute) is
# then the gate.
golangci_version=v2.15.0
gl="$(go env GOPATH)/bin/golangci-lint"
have_golangci() { "$gl" version 2>/dev/null | grep -q "version ${golangci_version#v} "; }
if ! have_golangci && [ "${GOLANGCI_INSTALL:-1}" != 0 ]; then
  echo "installing golangci-lint $golangci_version"
  go install "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$golangci_version"
fi
if have_golangci; then
  echo "== golangci-lint"
  "$gl" run --allow-parallel-runners ./...
else
  echo "golangci-lint $golangci_version not installed (GOLANGCI_INSTALL=0): staticcheck alone"
  staticcheck_version=v0.8.2
  sc="$(go env GOPATH)/bin/staticcheck"
  if ! "$sc" -version 2>/dev/null | grep -q "${staticcheck_version#v}"; then
    echo "installing staticcheck $staticcheck_version"
    go install "honnef.co/go/tools/cmd/staticcheck@$staticcheck_version"
  fi
  echo "== staticcheck"
  "$sc" ./...
fi

# The gateways include 32-bit armv7: everything must at least build there
# (integer widths, untyped constants).
echo "== build linux/arm (32-bit)"
GOOS=linux GOARCH=arm GOARM=7 go build ./...

echo "== go test"
go test -count=1 -timeout 15m ./...

# Each fuzzer runs briefly on top of its committed seed corpus (which go test
# above already replayed). FUZZTIME=0 skips this step. The budget is a count
# of executions, not a duration: Go 1.26's fuzz coordinator can report a
# duration's deadline as a failure ("context deadline exceeded", no input;
# golang/go#75804), which a count never reaches. 100,000 executions take
# 2.5-8 s per fuzzer on two cores.
fuzztime=${FUZZTIME:-100000x}
if [ "$fuzztime" != "0" ]; then
  echo "== fuzz ($fuzztime each)"
  for pkg in $(go list ./...); do
    dir=$(go list -f '{{.Dir}}' "$pkg")
    for f in $(grep -ho '^func Fuzz[A-Za-z0-9_]*' "$dir"/*_test.go 2>/dev/null | sed 's/^func //' | sort -u); do
      log=$(mktemp)
      ft=$fuzztime
      # The state-file fuzzers write and open a real bbolt file per execution
      # (about 1 ms): 20,000 of them take 20-30 s.
      case "$f" in FuzzAggFile|FuzzEdgeFile) [ "$fuzztime" = 100000x ] && ft=20000x ;; esac
      # The simulate fuzzer runs a whole --schema simulation per input that
      # parses (about 1 ms); minimising each new input it finds would take
      # up to a minute at that rate, so its minimisation is bounded too.
      mt=60s
      case "$f" in FuzzSimulateSchema) [ "$fuzztime" = 100000x ] && ft=10000x; mt=500x ;; esac
      if ! go test -run='^$' -fuzz="^${f}\$" -fuzztime="$ft" -fuzzminimizetime="$mt" "$pkg" >"$log" 2>&1; then
        # A finding is written to testdata/fuzz/$f and fails the replay
        # below. A fuzzer that stops without one (the fuzz engine's own
        # trouble, as with duration budgets) is shown and retried once.
        if ! go test -run="^${f}\$" "$pkg"; then
          echo "fuzzer $f in $pkg found a failing input:" >&2; grep -v '^fuzz: elapsed' "$log" | tail -40 >&2; exit 1
        fi
        echo "fuzzer $f in $pkg stopped without a failing input; retrying once. Its output:" >&2
        grep -v '^fuzz: elapsed' "$log" | tail -20 >&2
        go test -run='^$' -fuzz="^${f}\$" -fuzztime="$ft" -fuzzminimizetime="$mt" "$pkg" >"$log" 2>&1 || {
          echo "fuzzer $f in $pkg failed again:" >&2; grep -v '^fuzz: elapsed' "$log" | tail -40 >&2; exit 1; }
      fi
      rm -f "$log"
      echo "ok   $pkg $f"
    done
  done
fi
