# Shared helpers for the bench/ scripts (sourced, not run).
#
# Needs only bash, coreutils and awk besides the Rust toolchain; `taskset`
# (util-linux) is used for core pinning when present.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN="${CARGO_TARGET_DIR:-$ROOT/target}/release"
# The router binary start_router runs (a script may switch it, e.g. to a baseline build).
ROUTER_BIN="$BIN/pdrouter"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/pdrouter-bench.XXXXXX")
PIDS=()

cleanup() {
    local pid
    for pid in "${PIDS[@]}"; do
        kill "$pid" 2>/dev/null || true
    done
    for pid in "${PIDS[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
    if [[ -n "${KEEP_WORK:-}" ]]; then
        echo "kept work dir $WORK" >&2
    else
        rm -rf "$WORK"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

die() {
    echo "error: $*" >&2
    exit 1
}

build() {
    (cd "$ROOT" && cargo build --release -p pdrouter -p pdrouter-mock -p pdrouter-bench) >&2
}

# Pinning: the router on core 0, everything else on core 1, when the machine
# has two cores and taskset exists; otherwise unpinned (numbers less stable).
if command -v taskset >/dev/null 2>&1 && [[ $(nproc) -ge 2 ]]; then
    ROUTER_CPU=(taskset -c 0)
    OTHERS_CPU=(taskset -c 1)
else
    echo "warning: taskset or a second core missing; running unpinned" >&2
    ROUTER_CPU=()
    OTHERS_CPU=()
fi

# spawn NAME PATTERN CMD...: starts CMD in the background with stdout in
# $WORK/NAME.out and stderr in $WORK/NAME.err, waits (up to 30 s) for a
# stdout line matching PATTERN ("listening on http://ADDR", or grpc://) and stores the
# URL found in it in SPAWNED_URL (and the process id in SPAWNED_PID). (Not meant for `$(...)`: the process id
# must reach PIDS in this shell so the exit trap can stop it.)
spawn() {
    local name=$1 pattern=$2
    shift 2
    "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    local pid=$!
    PIDS+=("$pid")
    SPAWNED_PID=$pid
    local deadline=$((SECONDS + 30)) url=""
    while [[ -z "$url" ]]; do
        url=$(grep -m1 -oE "$pattern (http|grpc)://[^ ]*" "$WORK/$name.out" 2>/dev/null | awk '{print $NF}') || true
        if [[ -n "$url" ]]; then
            break
        fi
        if ! kill -0 "$pid" 2>/dev/null; then
            cat "$WORK/$name.err" >&2
            die "$name exited before listening"
        fi
        if ((SECONDS > deadline)); then
            die "$name did not print its address within 30 s"
        fi
        sleep 0.05
    done
    SPAWNED_URL=$url
}

# start_mock NAME ROLE [FLAGS...]: a pdrouter-mock pinned with the others;
# its URL ends up in SPAWNED_URL.
start_mock() {
    local name=$1 role=$2
    shift 2
    spawn "$name" "listening on" "${OTHERS_CPU[@]}" "$BIN/pdrouter-mock" \
        --host 127.0.0.1 --port 0 --role "$role" "$@"
}

# start_fleet NAME N [FLAGS...]: one pdrouter-mock process (`--pairs N`) serving N Prefill and
# N Decode workers, pinned with the others; their URLs end up in FLEET_PREFILL and FLEET_DECODE.
# (A Decode worker's KV rendezvous with a Prefill worker of the same process is in memory.)
start_fleet() {
    local name=$1 n=$2
    shift 2
    spawn "$name" "listening on" "${OTHERS_CPU[@]}" "$BIN/pdrouter-mock" \
        --host 127.0.0.1 --pairs "$n" "$@"
    local deadline=$((SECONDS + 30))
    while (($(grep -c "listening on" "$WORK/$name.out") < 2 * n)); do
        ((SECONDS < deadline)) || die "$name did not print its $((2 * n)) addresses within 30 s"
        sleep 0.05
    done
    mapfile -t FLEET_PREFILL < <(grep "role=prefill" "$WORK/$name.out" |
        grep -oE "(http|grpc)://[^ ]*")
    mapfile -t FLEET_DECODE < <(grep "role=decode" "$WORK/$name.out" |
        grep -oE "(http|grpc)://[^ ]*")
}

# start_router NAME FLAGS...: `pdrouter launch` on its own core with one tokio
# worker thread, Prometheus on an ephemeral port, warn-level logs; its URL
# ends up in SPAWNED_URL.
start_router() {
    local name=$1
    shift
    TOKIO_WORKER_THREADS=1 spawn "$name" "pdrouter listening on" "${ROUTER_CPU[@]}" \
        "$ROUTER_BIN" launch --host 127.0.0.1 --port 0 \
        --prometheus-host 127.0.0.1 --prometheus-port 0 --log-level warn "$@"
}

# bench ARGS...: pdrouter-bench pinned with the others; prints its summary.
bench() {
    "${OTHERS_CPU[@]}" "$BIN/pdrouter-bench" --quiet "$@"
}

# kv FILE KEY: the value of KEY in the `kv:` line of a saved summary.
kv() {
    awk -v key="$2" '/^kv: /{for(i=2;i<=NF;i++){split($i,a,"=");if(a[1]==key){print a[2]; exit}}}' "$1"
}

# wait_ready URL [BENCH ARGS...]: sends short bursts until one request
# succeeds (up to 30 s), e.g. while the router probes its workers.
wait_ready() {
    local url=$1
    shift
    local deadline=$((SECONDS + 30))
    while :; do
        bench --url "$url" --duration 0.2 --timeout 2 "$@" >"$WORK/ready.txt" 2>&1 || true
        if [[ "$(kv "$WORK/ready.txt" ok)" =~ ^[1-9] ]]; then
            return 0
        fi
        ((SECONDS < deadline)) || {
            cat "$WORK/ready.txt" >&2
            die "$url never answered a request successfully"
        }
        sleep 0.2
    done
}

# calc FORMAT EXPR: floating-point arithmetic through awk, e.g.
# `calc %.1f "2 * 3.5"`.
calc() {
    awk "BEGIN { printf \"$1\", $2 }"
}

# stop PID: stops one process started by spawn and waits for it.
stop() {
    kill "$1" 2>/dev/null || true
    wait "$1" 2>/dev/null || true
}

# http URL METHOD PATH [BODY]: a tiny HTTP/1.0 client over bash's /dev/tcp
# (no curl needed); prints the response body.
http() {
    local hostport=${1#http://} method=$2 path=$3 body=${4:-}
    local host=${hostport%:*} port=${hostport##*:}
    exec 3<>"/dev/tcp/$host/$port"
    printf '%s %s HTTP/1.0\r\nHost: %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' \
        "$method" "$path" "$hostport" "${#body}" "$body" >&3
    awk 'body { print } /^\r?$/ { body = 1 }' <&3
    exec 3<&-
}

# json_num JSON KEY: the first numeric value of "KEY" in a flat JSON text.
json_num() {
    grep -o "\"$2\":[-0-9.eE+]*" <<<"$1" | head -n1 | cut -d: -f2
}

# Engine fleet: start_engine_fleet N MAX_RUNNING TOKENS_PER_SEC
# TOKEN_INTERVAL_MS starts N engine-mode prefill mocks and one engine-mode
# decode mock. Sets PREFILL_ARGS (the router's `--prefill URL PORT` flags),
# PREFILL_URLS and DECODE_URL.
start_engine_fleet() {
    local n=$1 running=$2 rate=$3 interval=$4 i port
    PREFILL_ARGS=()
    PREFILL_URLS=()
    for ((i = 0; i < n; i++)); do
        if ((${VLLM:-0})); then
            # vLLM's servers (NIXL): the router sends the Prefill first; no bootstrap port.
            start_mock "prefill$i" prefill --runtime vllm --engine --max-running "$running" \
                --prefill-tokens-per-sec "$rate"
            PREFILL_ARGS+=(--prefill "$SPAWNED_URL" none)
        else
            start_mock "prefill$i" prefill --engine --max-running "$running" \
                --prefill-tokens-per-sec "$rate" --bootstrap-port 0
            port=$(grep -m1 -o 'bootstrap_port=[0-9]*' "$WORK/prefill$i.out" | cut -d= -f2)
            [[ -n "$port" ]] || die "prefill$i printed no bootstrap port"
            PREFILL_ARGS+=(--prefill "$SPAWNED_URL" "$port")
        fi
        PREFILL_URLS+=("$SPAWNED_URL")
    done
    if ((${VLLM:-0})); then
        start_mock decode decode --runtime vllm --token-interval-ms "$interval"
    else
        start_mock decode decode --engine --token-interval-ms "$interval"
    fi
    DECODE_URL=$SPAWNED_URL
}

# max_engine_wait_ms: the largest max_engine_queue_wait_ms over PREFILL_URLS.
max_engine_wait_ms() {
    local url v max=0
    for url in "${PREFILL_URLS[@]}"; do
        v=$(json_num "$(http "$url" GET /mock/stats)" max_engine_queue_wait_ms)
        max=$(calc %.1f "($v > $max) ? $v : $max")
    done
    echo "$max"
}

# reset_engine_stats: zeroes the engines' max queue wait (and max_inflight).
reset_engine_stats() {
    local url
    for url in "${PREFILL_URLS[@]}"; do
        http "$url" POST /mock/controls '{"reset_max_inflight":true}' >/dev/null
    done
}

# scenario_args DEFAULT_SECS QUICK_SECS HELP_LINES "$@": the flags every scenario takes —
# --quick, --duration SECS, --no-build, -h/--help (prints lines HELP_LINES, e.g. '2,24p', of the
# script), --out FILE and --runs N for scripts that set OUT or RUNS beforehand — into DURATION,
# QUICK, BUILD, OUT and RUNS.
scenario_args() {
    DURATION=$1
    BUILD=1
    QUICK=0
    local quick=$2 help=$3
    shift 3
    while [[ $# -gt 0 ]]; do
        case "$1" in
        --quick) DURATION=$quick QUICK=1 ;;
        --duration) DURATION=$2; shift ;;
        --no-build) BUILD=0 ;;
        --vllm) [[ -v VLLM ]] || die "unknown argument $1"; VLLM=1 ;;
        --out) [[ -v OUT ]] || die "unknown argument $1"; OUT=$2; shift ;;
        --runs)
            [[ -v RUNS ]] || die "unknown argument $1"
            [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "--runs needs a positive count"
            RUNS=$2
            shift
            ;;
        -h | --help) sed -n "$help" "$0"; exit 0 ;;
        *) die "unknown argument $1" ;;
        esac
        shift
    done
}

# engine_scenario LOAD_FACTOR: the fleet both engine scenarios measure — 4 engine-mode Prefill
# workers running one prompt each at 16000 words/s, prompts averaging 200 words. Sets WORKERS,
# RUNNING, RATE_WORDS, MEAN_WORDS, CAPACITY and OFFERED (= LOAD_FACTOR x CAPACITY, req/s),
# builds unless BUILD=0, and starts the fleet.
engine_scenario() {
    WORKERS=4
    RUNNING=1
    RATE_WORDS=16000
    MEAN_WORDS=200
    CAPACITY=$(calc %.1f "$WORKERS * $RUNNING * $RATE_WORDS / $MEAN_WORDS")
    OFFERED=$(calc %.1f "$1 * $CAPACITY")
    ((BUILD)) && build
    start_engine_fleet "$WORKERS" "$RUNNING" "$RATE_WORDS" 1
    echo "capacity ${CAPACITY} req/s, offering ${OFFERED} req/s for ${DURATION}s per router" >&2
}

# engine_case LABEL ROUTER-FLAGS...: one PD router (health checks off) over the fleet that
# engine_scenario started, loaded with the bench flags in LOAD. Results go to $WORK/LABEL.txt
# and .csv, the longest wait inside an engine's own queue to ENGINE_WAIT[LABEL], and the
# router's Prometheus text at the end of the run to $WORK/LABEL.metrics.
declare -A ENGINE_WAIT
engine_case() {
    local label=$1
    shift
    start_router "router-$label" --pd-disaggregation "${PREFILL_ARGS[@]}" --decode "$DECODE_URL" \
        --disable-health-check "$@"
    local router=$SPAWNED_URL pid=$SPAWNED_PID
    wait_ready "$router" --path "${LOAD_PATH:-/generate}" --max-tokens 1
    reset_engine_stats
    echo "running $label" >&2
    bench --url "$router" "${LOAD[@]}" --label "$label" --csv "$WORK/$label.csv" \
        >"$WORK/$label.txt"
    ENGINE_WAIT[$label]=$(max_engine_wait_ms)
    local metrics
    metrics=$(grep -m1 -oE 'metrics on http://[^/ ]*' "$WORK/router-$label.out" | awk '{print $NF}') || true
    if [[ -n "$metrics" ]]; then
        http "$metrics" GET /metrics >"$WORK/$label.metrics" || true
    fi
    stop "$pid"
}

# median VALUES...: the median of the values (the lower middle one of an even count).
median() { printf '%s\n' "$@" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# words_for TOKENS: the bench's words ("w123 w7 ...", 4.89 bytes each with their space) giving
# about TOKENS byte-level tokens.
words_for() { calc %.0f "$1 / 4.89"; }
