#!/usr/bin/env bash
# Router overhead: tiny requests sent straight to a decode mock versus through
# pdrouter in PD mode, closed loop at concurrency 1 and 64.
#
#   bench/overhead.sh [--quick] [--duration SECS] [--no-build]
#
# Setup: a decode and a prefill pdrouter-mock (no delays), pdrouter
# (`--pd-disaggregation`, round_robin, health checks off) pinned to core 0
# with TOKIO_WORKER_THREADS=1; the mocks and pdrouter-bench share core 1.
# Requests are `POST /generate` with a two-word text and max_new_tokens 1,
# non-streaming.
#
# Read the ratio with care: through the router every client request becomes
# TWO upstream requests (the prefill leg and the decode leg, sent at once),
# while the direct baseline is ONE request to the decode mock (its body
# carries a fixed `bootstrap_room`, which a mock requires). The mocks and the
# load generator also share one core, so at concurrency 64 that core, not
# the router's, may be the limit in either mode.
#
# Output: a table (mode, concurrency, req/s, p50, p99, router CPU seconds used and
# requests per router CPU-second = capacity per router core) and, last, one line
#   added_p50_us_c1=… router_rps_c64=… direct_rps_c64=… rps_ratio_c64=… router_rps_per_core_c64=…
# Default 10 s per measurement; --quick uses 3 s. Needs only the Rust
# toolchain (plus bash, awk and, for pinning, taskset).

source "$(dirname "$0")/lib.sh"

scenario_args 10 3 '2,24p' "$@"

((BUILD)) && build

start_mock decode decode
DECODE=$SPAWNED_URL
start_mock prefill prefill
PREFILL=$SPAWNED_URL
start_router router --pd-disaggregation --prefill "$PREFILL" --decode "$DECODE" \
    --disable-health-check --policy round_robin
ROUTER=$SPAWNED_URL
ROUTER_PID=$SPAWNED_PID
TICKS=$(getconf CLK_TCK)
# CPU seconds the router process has used so far (user + system).
router_cpu() { awk -v t="$TICKS" '{ printf "%.4f", ($14 + $15) / t }' "/proc/$ROUTER_PID/stat"; }
echo "decode $DECODE  prefill $PREFILL  router $ROUTER" >&2

COMMON=(--path /generate --prompt-mean-tokens 2 --max-tokens 1)
DIRECT_BODY='{"bootstrap_room":1}'

wait_ready "$DECODE" "${COMMON[@]}" --body-extra "$DIRECT_BODY"
wait_ready "$ROUTER" "${COMMON[@]}"

run() { # MODE CONCURRENCY
    local mode=$1 c=$2 url extra=()
    if [[ $mode == direct ]]; then
        url=$DECODE
        extra=(--body-extra "$DIRECT_BODY")
    else
        url=$ROUTER
    fi
    # Warm the connections up, then measure.
    bench --url "$url" "${COMMON[@]}" "${extra[@]}" --concurrency "$c" --duration 0.5 >/dev/null
    local cpu0=$(router_cpu)
    bench --url "$url" "${COMMON[@]}" "${extra[@]}" --concurrency "$c" --duration "$DURATION" \
        --label "$mode-c$c" >"$WORK/$mode-c$c.txt"
    calc %.4f "$(router_cpu) - $cpu0" >"$WORK/$mode-c$c.cpu"
    local errors=$(( $(kv "$WORK/$mode-c$c.txt" requests) - $(kv "$WORK/$mode-c$c.txt" ok) ))
    ((errors == 0)) || echo "warning: $mode c$c had $errors unsuccessful requests" >&2
}

for c in 1 64; do
    for mode in direct router; do
        echo "running $mode at concurrency $c for ${DURATION}s" >&2
        run "$mode" "$c"
    done
done

printf '%-8s %11s %12s %10s %10s %12s %16s\n' mode concurrency req/s p50_ms p99_ms router_cpu_s req/router_cpu_s
for c in 1 64; do
    for mode in direct router; do
        f="$WORK/$mode-c$c.txt"
        cpu=$(cat "$WORK/$mode-c$c.cpu")
        per="-"
        [[ $mode == router ]] && per=$(calc %.0f "$(kv "$f" ok) / $cpu")
        printf '%-8s %11s %12.1f %10.3f %10.3f %12.2f %16s\n' "$mode" "$c" \
            "$(kv "$f" ok_rps)" "$(kv "$f" lat_p50_ms)" "$(kv "$f" lat_p99_ms)" "$cpu" "$per"
    done
done

added=$(calc %.0f "($(kv "$WORK/router-c1.txt" lat_p50_ms) - $(kv "$WORK/direct-c1.txt" lat_p50_ms)) * 1000")
router_rps=$(kv "$WORK/router-c64.txt" ok_rps)
direct_rps=$(kv "$WORK/direct-c64.txt" ok_rps)
ratio=$(calc %.3f "$router_rps / $direct_rps")
# Requests per CPU-second of the router is its capacity per core, whether or not the shared
# client/mock core (not the router) was the limit in this run.
per_core=$(calc %.0f "$(kv "$WORK/router-c64.txt" ok) / $(cat "$WORK/router-c64.cpu")")
echo "added_p50_us_c1=$added router_rps_c64=$(calc %.0f "$router_rps") direct_rps_c64=$(calc %.0f "$direct_rps") rps_ratio_c64=$ratio router_rps_per_core_c64=$per_core"
