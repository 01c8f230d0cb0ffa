#!/bin/bash
# A new user's path after the README: clone, install with empty Go
# caches, start, the quick start's simulator, the first chart.
set -e
base=/tmp/nu
rm -rf "$base"; mkdir -p "$base"
export GOMODCACHE=$base/mod GOCACHE=$base/cache GOFLAGS=-modcacherw GOBIN=$base/bin
export PATH="$GOBIN:$PATH"
t0=$(date +%s.%N)
stamp() { printf '%.1f s  %s  (load %s)\n' "$(echo "$(date +%s.%N) - $t0" | bc)" "$*" "$(cut -d' ' -f1 /proc/loadavg)"; }
git clone -q "${1:?usage: first-run.sh CLONE-URL-OR-PATH}" "$base/telemetryd"
cd "$base/telemetryd"
stamp "cloned"
deploy/install.sh 2> "$base/install.log"
stamp "installed (deploy/install.sh: modules downloaded, built)"
telemetryd -version
telemetryd -http-addr 127.0.0.1:18181 -nats-listen 127.0.0.1:14333 -mqtt-listen 127.0.0.1:11993 > "$base/service.log" 2>&1 &
pid=$!
until curl -sf http://127.0.0.1:18181/readyz >/dev/null 2>&1; do sleep 0.2; done
stamp "service ready"
TELEMETRY_SIM_NATS_URL=nats://127.0.0.1:14333 go run ./cmd/telemetry-sim -devices 20 -rate 50 -duration 10s > "$base/sim.log" 2>&1
stamp "simulator done (go run, 10 s of readings)"
chromium --headless --no-sandbox --disable-gpu --window-size=1200,800 --virtual-time-budget=5000 \
  --screenshot="$base/first-chart.png" 'http://127.0.0.1:18181/ui/#/device/sim-0001?w=1h' >/dev/null 2>&1 || true
stamp "first chart (headless Chromium screenshot)"
kill "$pid"; wait "$pid" || true
