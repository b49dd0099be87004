#!/usr/bin/env bash
# Several replicas: p99 time-to-first-token and 429 share when the same load,
# split 70/20/10 over three router replicas, is admitted
#
#   single  by one router with N per worker (the reference: one FIFO queue),
#   shared  by three routers sharing N through a Redis admission store with the
#           default settings (--admission-store; interval 200 ms, lease TTL 3 s),
#   fast    the same with a short store interval, the best case
#           (--admission-store-interval-ms 10 unless --interval-ms says otherwise),
#   split   by three routers with N/3 each (the advice without a store).
#
#   bench/replicas.sh [--quick] [--duration SECS] [--no-build] [--interval-ms MS] [--static]
#
# --interval-ms MS: the store interval of `fast` (default 10).
# --static: also run `static`, three routers with a fixed partition of the
# slots in proportion to the load (replica 0: 2 of each worker's 3, replica 1:
# one slot of worker 0, replica 2: one of worker 1; every replica needs a slot
# and replica 0 more than 3), the floor a fixed split gives.
#
# Fleet: 2 engine-mode Prefill mocks (`--engine --max-running 3
# --prefill-tokens-per-sec 4000`, prefill time = words / 4000 s, so 50 ms for
# the fixed 200-word prompts) and one engine-mode Decode mock; N = 3 = the
# engines' running slots. Capacity = 2 x 3 / 0.05 s = 120 req/s; the offered
# load is open loop (Poisson) at 80 % of it, streaming /generate with 4 tokens,
# from three load generators at 70, 20 and 10 % of the rate. In `single` all
# three send to the one router. Queue 1000, timeout 60 s everywhere.
#
# Needs redis-server (Debian: apt-get install redis-server); it runs on a
# free loopback port below 32768, without persistence, and is stopped at the
# end.
#
# Output: one table, then the line for the default settings, prefixed
# `default:`, and last the one for the best case (`fast`):
#   shared_vs_single_p99=X shared_vs_split_p99=Y max_inflight_over_limit=Z
# X and Y are the sharing run's p99 TTFT over single's and split's (targets
# X <= 1.2, Y < 1.0); Z is the most any Prefill mock had in flight during it
# minus N (target 0). Default 60 s per configuration; --quick 25 s (whole
# script under 3 minutes once built). During each sharing run each replica's shares
# are sampled every 200 ms from its metrics; a summary line (mean share per
# replica, share changes, exchanges per second), and one with the store's
# script cost (calls, Redis time per call), go to stderr.

source "$(dirname "$0")/lib.sh"

FAST_MS=10
STATIC=0
ARGS=()
while [[ $# -gt 0 ]]; do
    case "$1" in
    --interval-ms) FAST_MS=$2; shift ;;
    --static) STATIC=1 ;;
    *) ARGS+=("$1") ;;
    esac
    shift
done
scenario_args 60 25 '2,41p' "${ARGS[@]}"
command -v redis-server >/dev/null || die "redis-server is needed (Debian: apt-get install redis-server)"

WORKERS=2
N=3
RATE_WORDS=4000
MEAN_WORDS=200
CAPACITY=$(calc %.1f "$WORKERS * $N * $RATE_WORDS / $MEAN_WORDS")
OFFERED=$(calc %.1f "0.8 * $CAPACITY")
SPLIT=(0.7 0.2 0.1)

((BUILD)) && build

# A private store on a free port below 32768; its uptime must pass one lease TTL (3 s)
# before it grants new shares (it cannot tell a fresh start from a restart that lost leases).
REDIS_DIR="$WORK/redis"
mkdir -p "$REDIS_DIR"
REDIS_PORT=""
for ((try = 0; try < 50; try++)); do
    port=$((20000 + RANDOM % 12000))
    # Taken if something accepts a connection there.
    (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && continue
    "${OTHERS_CPU[@]}" redis-server --bind 127.0.0.1 --port "$port" --save '' \
        --appendonly no --dir "$REDIS_DIR" >"$REDIS_DIR/log" 2>&1 &
    REDIS_PID=$!
    PIDS+=("$REDIS_PID")
    for ((i = 0; i < 100; i++)); do
        if grep -q "Ready to accept" "$REDIS_DIR/log"; then
            REDIS_PORT=$port
            break 2
        fi
        kill -0 "$REDIS_PID" 2>/dev/null || break
        sleep 0.1
    done
done
[[ -n "$REDIS_PORT" ]] || die "redis-server did not start (see $REDIS_DIR/log)"
STORE="redis://127.0.0.1:$REDIS_PORT"
STORE_UP=$SECONDS

start_engine_fleet "$WORKERS" "$N" "$RATE_WORDS" 1
echo "capacity ${CAPACITY} req/s, offering ${OFFERED} req/s (70/20/10) for ${DURATION}s per configuration" >&2

# routers LABEL COUNT PER_WORKER [FLAGS...]: starts COUNT replicas into ROUTERS/ROUTER_PIDS
# (`single` has one; its three load generators all send to it).
routers() {
    local label=$1 count=$2 per=$3 i
    shift 3
    ROUTERS=()
    ROUTER_PIDS=()
    METRICS=()
    for ((i = 0; i < count; i++)); do
        router "$label-$i" "$per" "${PREFILL_ARGS[@]}" "$@"
    done
    for i in "${!ROUTERS[@]}"; do
        wait_ready "${ROUTERS[$i]}" --path /generate --max-tokens 1
    done
}

# router NAME PER_WORKER PREFILL_FLAGS+FLAGS...: one replica into ROUTERS/ROUTER_PIDS/METRICS.
router() {
    local name=$1 per=$2
    shift 2
    start_router "router-$name" --pd-disaggregation --decode "$DECODE_URL" \
        --disable-health-check --policy round_robin \
        --prefill-max-inflight-requests-per-worker "$per" \
        --prefill-queue-size 1000 --prefill-queue-timeout-secs 60 "$@"
    ROUTERS+=("$SPAWNED_URL")
    ROUTER_PIDS+=("$SPAWNED_PID")
    METRICS+=("$(grep -m1 -oE 'metrics on http://[^/ ]*' "$WORK/router-$name.out" | awk '{print $NF}')")
}

# sample_shares FILE: every 200 ms, appends "second replica worker share" lines read from each
# replica's smg_pd_prefill_admission_share gauges (run in the background, killed by the caller).
sample_shares() {
    local i
    while :; do
        for i in "${!METRICS[@]}"; do
            http "${METRICS[$i]}" GET /metrics 2>/dev/null |
                awk -v t="$SECONDS" -v r="$i" '/^smg_pd_prefill_admission_share\{/ {
                    match($0, /worker="[^"]*"/); print t, r, substr($0, RSTART + 8, RLENGTH - 9), $NF }'
        done >>"$1"
        sleep 0.2
    done
}

# exchanges: store exchanges over all replicas so far (the RTT histogram's count).
exchanges() {
    local m total=0 v
    for m in "${METRICS[@]}"; do
        v=$(http "$m" GET /metrics | awk '/^smg_admission_store_rtt_seconds_count/ { print $NF }')
        total=$((total + ${v%.*}))
    done
    echo "$total"
}

# store_cost: "calls usec" of the lease script (EVALSHA) in the store so far.
store_cost() {
    exec 4<>"/dev/tcp/127.0.0.1/$REDIS_PORT"
    printf 'INFO commandstats\r\nQUIT\r\n' >&4
    tr -d '\r' <&4 | awk -F'[=,:]' '/^cmdstat_evalsha:/ { c = $3; u = $5 } END { print c + 0, u + 0 }'
    exec 4<&-
}

# share_summary FILE EXCHANGES: mean share per replica (summed over workers), how often a
# replica's share of a worker changed between samples, and exchanges per second.
share_summary() {
    awk -v ex="$2" -v d="$DURATION" '
        { k = $2 " " $3; if (k in last && last[k] != $4) changes++; last[k] = $4
          sum[$2] += $4; n[k]++ }
        END { printf "mean share per replica (sum over workers):"
              for (r = 0; r < 3; r++) { m = 0; for (k in n) if (k ~ "^" r " ") { m = n[k]; break }
                  printf " r%d=%.2f", r, (m ? sum[r] / m : 0) }
              printf "; share changes %d; store exchanges %.1f/s\n", changes, ex / d }' "$1" >&2
}

# max_inflight: the largest max_inflight over the Prefill mocks.
max_inflight() {
    local url v max=0
    for url in "${PREFILL_URLS[@]}"; do
        v=$(json_num "$(http "$url" GET /mock/stats)" max_inflight)
        ((v > max)) && max=$v
    done
    echo "$max"
}

# run LABEL: the three load generators against ROUTERS (all against the first when there is
# one router); merged CSV in $WORK/LABEL.csv, MAX_INFLIGHT[LABEL].
declare -A MAX_INFLIGHT
run() {
    local label=$1 i url pids=()
    reset_engine_stats
    echo "running $label" >&2
    for i in 0 1 2; do
        url=${ROUTERS[$((i < ${#ROUTERS[@]} ? i : 0))]}
        bench --url "$url" --path /generate --stream --max-tokens 4 \
            --rate "$(calc %.2f "${SPLIT[$i]} * $OFFERED")" --duration "$DURATION" \
            --prompt-dist fixed --prompt-mean-tokens "$MEAN_WORDS" --seed $((7 + i)) \
            --timeout 120 --label "$label" --csv "$WORK/$label-$i.csv" \
            >"$WORK/$label-$i.txt" &
        pids+=($!)
    done
    for i in "${pids[@]}"; do
        wait "$i" || die "$label: a load generator failed (see $WORK/$label-*.txt)"
    done
    MAX_INFLIGHT[$label]=$(max_inflight)
    head -n1 "$WORK/$label-0.csv" >"$WORK/$label.csv"
    tail -q -n +2 "$WORK/$label-0.csv" "$WORK/$label-1.csv" "$WORK/$label-2.csv" >>"$WORK/$label.csv"
    if [[ -z "${run_keep:-}" ]]; then
        for i in "${ROUTER_PIDS[@]}"; do
            stop "$i"
        done
    fi
}

# stat LABEL: "p50 p99 max share_429 ok_rps" of the merged CSV (TTFT of complete OK
# requests, ms; nearest-rank percentiles).
stat() {
    local f="$WORK/$1.csv"
    awk -F, 'NR > 1 && $3 >= 200 && $3 < 300 && $4 != "" && $7 == 1 { print $4 }' "$f" \
        | sort -n >"$WORK/$1.ttft"
    local k n r
    k=$(wc -l <"$WORK/$1.ttft")
    n=$(($(wc -l <"$f") - 1))
    r=$(awk -F, 'NR > 1 && $3 == 429' "$f" | wc -l)
    ((k > 0)) || die "$1: no successful request"
    pick() { sed -n "$1p" "$WORK/$2.ttft"; }
    echo "$(pick $(((k + 1) / 2)) "$1") $(pick $(((99 * k + 99) / 100)) "$1") \
$(pick "$k" "$1") $(calc %.5f "$r / $n") $(calc %.1f "$k / $DURATION")"
}

declare -A P99
routers single 1 "$N"
run single
# Leases need the store up for one TTL; wait out what is left of it.
while ((SECONDS - STORE_UP < 4)); do sleep 0.2; done
# sharing LABEL FLAGS...: three replicas sharing N through the store, with FLAGS; their
# shares and the store's cost are summarised on stderr.
sharing() {
    local label=$1 i
    shift
    routers "$label" 3 "$N" --admission-store "$STORE" --admission-group "bench-$label" "$@"
    sample_shares "$WORK/shares-$label.txt" &
    SAMPLER=$!
    PIDS+=("$SAMPLER")
    EX0=$(exchanges)
    read -r CALLS0 USEC0 <<<"$(store_cost)"
    run_keep=1 run "$label"
    EX1=$(exchanges)
    read -r CALLS1 USEC1 <<<"$(store_cost)"
    kill "$SAMPLER" 2>/dev/null || true
    for i in "${ROUTER_PIDS[@]}"; do
        stop "$i"
    done
    echo -n "$label: " >&2
    share_summary "$WORK/shares-$label.txt" $((EX1 - EX0))
    CALLS=$((CALLS1 - CALLS0))
    ((CALLS > 0)) && echo "$label store: $CALLS script calls, $(calc %.1f "($USEC1 - $USEC0) / $CALLS") us each, \
$(calc %.2f "($USEC1 - $USEC0) / 10000 / $DURATION") % of one store core" >&2
    return 0
}
sharing shared
sharing fast --admission-store-interval-ms "$FAST_MS"
routers split 3 $((N / 3))
run split
LABELS=(single shared fast split)
if ((STATIC)); then
    ROUTERS=()
    ROUTER_PIDS=()
    METRICS=()
    router static-0 2 "${PREFILL_ARGS[@]}"
    router static-1 1 "${PREFILL_ARGS[@]:0:3}"
    router static-2 1 "${PREFILL_ARGS[@]:3:3}"
    for i in "${!ROUTERS[@]}"; do
        wait_ready "${ROUTERS[$i]}" --path /generate --max-tokens 1
    done
    run static
    LABELS+=(static)
fi

printf '%-7s %8s %8s %9s %9s %9s %13s\n' config ok_rps 429% ttft_p50 ttft_p99 ttft_max max_inflight
for label in "${LABELS[@]}"; do
    read -r p50 p99 max s429 okrps <<<"$(stat "$label")"
    printf '%-7s %8.1f %8.2f %9.1f %9.1f %9.1f %13s\n' "$label" "$okrps" \
        "$(calc %.2f "$s429 * 100")" "$p50" "$p99" "$max" "${MAX_INFLIGHT[$label]}"
    P99[$label]=$p99
done
echo "(times in ms; N = $N per Prefill worker; max_inflight = most any Prefill mock had in flight)"

# ratios LABEL: the summary line of one sharing run.
ratios() {
    echo "shared_vs_single_p99=$(calc %.3f "${P99[$1]} / ${P99[single]}") shared_vs_split_p99=$(calc %.3f "${P99[$1]} / ${P99[split]}") max_inflight_over_limit=$((MAX_INFLIGHT[$1] - N))"
}
echo "default: $(ratios shared)"
echo "(last line: best case, --admission-store-interval-ms $FAST_MS)"
ratios fast
