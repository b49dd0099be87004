#!/usr/bin/env bash
# Router overhead: tiny requests sent straight to a decode mock versus through
# pdrouter in PD mode, closed loop at concurrency 1 and 64, for two router
# configurations measured in the same run:
#
#   round_robin  --policy round_robin --disable-health-check, admission off
#                (the cheapest configuration)
#   default      the defaults (cache_aware, health checks on: /health every
#                60 s), plus Prefill admission on with a limit the load never
#                reaches (--prefill-max-inflight-requests-per-worker 1024
#                --prefill-queue-size 100), so every request takes and
#                releases a slot but none waits
#
#   bench/overhead.sh [--quick] [--duration SECS] [--no-build]
#
# Setup: a decode and a prefill pdrouter-mock (no delays); each router runs
# alone, pinned to core 0 with TOKIO_WORKER_THREADS=1; the mocks and
# pdrouter-bench share core 1. Requests are `POST /generate` with a two-word
# text and max_new_tokens 1, non-streaming.
#
# Read the ratio with care: through the router every client request becomes
# TWO upstream requests (the prefill leg and the decode leg, sent at once),
# while the direct baseline is ONE request to the decode mock (its body
# carries a fixed `bootstrap_room`, which a mock requires). The mocks and the
# load generator also share one core, so at concurrency 64 that core, not
# the router's, may be the limit in either mode; hence the router's own CPU
# time (from /proc) per request.
#
# Output: a table (mode, concurrency, OK req/s, p50 and p99 of OK requests,
# router CPU seconds, OK requests per router CPU-second = capacity per router
# core, router CPU microseconds per request) and, last, one line
#   added_p50_us_c1=… default_added_p50_us_c1=… router_rps_per_core_c64=…
#   default_rps_per_core_c64=… cpu_per_request_ratio_default_vs_round_robin_c64=… …
# A run with any unsuccessful request prints a warning. Default 10 s per
# measurement; --quick uses 3 s. Needs only the Rust toolchain (plus bash,
# awk and, for pinning, taskset).

source "$(dirname "$0")/lib.sh"

scenario_args 10 3 '2,38p' "$@"

((BUILD)) && build

start_mock decode decode
DECODE=$SPAWNED_URL
start_mock prefill prefill
PREFILL=$SPAWNED_URL
echo "decode $DECODE  prefill $PREFILL" >&2
TICKS=$(getconf CLK_TCK)
# CPU seconds the router process has used so far (user + system).
router_cpu() { awk -v t="$TICKS" '{ printf "%.4f", ($14 + $15) / t }' "/proc/$ROUTER_PID/stat"; }

COMMON=(--path /generate --prompt-mean-tokens 2 --max-tokens 1)
DIRECT_BODY='{"bootstrap_room":1}'
CONCURRENCIES=(1 64)
MODES=(direct round_robin default)

# router_flags MODE: the launch flags of a router configuration.
router_flags() {
    case "$1" in
    round_robin) echo --policy round_robin --disable-health-check ;;
    default) echo --prefill-max-inflight-requests-per-worker 1024 --prefill-queue-size 100 ;;
    esac
}

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
    local cpu0=0
    [[ $mode == direct ]] || cpu0=$(router_cpu)
    bench --url "$url" "${COMMON[@]}" "${extra[@]}" --concurrency "$c" --duration "$DURATION" \
        --label "$mode-c$c" >"$WORK/$mode-c$c.txt"
    if [[ $mode == direct ]]; then
        echo 0 >"$WORK/$mode-c$c.cpu"
    else
        calc %.4f "$(router_cpu) - $cpu0" >"$WORK/$mode-c$c.cpu"
    fi
    local errors=$(( $(kv "$WORK/$mode-c$c.txt" requests) - $(kv "$WORK/$mode-c$c.txt" ok) ))
    ((errors == 0)) || echo "warning: $mode c$c had $errors unsuccessful requests" >&2
}

wait_ready "$DECODE" "${COMMON[@]}" --body-extra "$DIRECT_BODY"
for c in "${CONCURRENCIES[@]}"; do
    echo "running direct at concurrency $c for ${DURATION}s" >&2
    run direct "$c"
done
for mode in round_robin default; do
    # shellcheck disable=SC2046 # the flags are words on purpose
    start_router "router-$mode" --pd-disaggregation --prefill "$PREFILL" --decode "$DECODE" \
        $(router_flags "$mode")
    ROUTER=$SPAWNED_URL
    ROUTER_PID=$SPAWNED_PID
    echo "router ($mode) $ROUTER" >&2
    wait_ready "$ROUTER" "${COMMON[@]}"
    for c in "${CONCURRENCIES[@]}"; do
        echo "running $mode at concurrency $c for ${DURATION}s" >&2
        run "$mode" "$c"
    done
    stop "$ROUTER_PID"
done

printf '%-12s %11s %12s %10s %10s %12s %16s %18s\n' mode concurrency ok_req/s p50_ms p99_ms \
    router_cpu_s req/router_cpu_s router_cpu_us/req
for c in "${CONCURRENCIES[@]}"; do
    for mode in "${MODES[@]}"; do
        f="$WORK/$mode-c$c.txt"
        cpu=$(cat "$WORK/$mode-c$c.cpu")
        per="-" us="-"
        if [[ $mode != direct ]]; then
            per=$(calc %.0f "$(kv "$f" ok) / $cpu")
            us=$(calc %.1f "$cpu * 1000000 / $(kv "$f" ok)")
        fi
        printf '%-12s %11s %12.1f %10.3f %10.3f %12.2f %16s %18s\n' "$mode" "$c" \
            "$(kv "$f" ok_rps)" "$(kv "$f" lat_p50_ms)" "$(kv "$f" lat_p99_ms)" "$cpu" "$per" "$us"
    done
done

added() { calc %.0f "($(kv "$WORK/$1-c1.txt" lat_p50_ms) - $(kv "$WORK/direct-c1.txt" lat_p50_ms)) * 1000"; }
# Requests per CPU-second of the router is its capacity per core, whether or not the shared
# client/mock core (not the router) was the limit in this run.
per_core() { calc %.0f "$(kv "$WORK/$1-c64.txt" ok) / $(cat "$WORK/$1-c64.cpu")"; }
router_rps=$(kv "$WORK/round_robin-c64.txt" ok_rps)
direct_rps=$(kv "$WORK/direct-c64.txt" ok_rps)
cpu_ratio=$(calc %.3f "$(per_core round_robin) / $(per_core default)")
echo "added_p50_us_c1=$(added round_robin) default_added_p50_us_c1=$(added default)" \
    "router_rps_c64=$(calc %.0f "$router_rps") direct_rps_c64=$(calc %.0f "$direct_rps")" \
    "rps_ratio_c64=$(calc %.3f "$router_rps / $direct_rps")" \
    "router_rps_per_core_c64=$(per_core round_robin) default_rps_per_core_c64=$(per_core default)" \
    "cpu_per_request_ratio_default_vs_round_robin_c64=$cpu_ratio"
