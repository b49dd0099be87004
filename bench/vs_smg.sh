#!/usr/bin/env bash
# pdrouter beside the reference router, Shepherd Model Gateway, in one run: the same mocks,
# the same load, the same flags, one router at a time on the same core.
#
#   bench/vs_smg.sh [--quick] [--duration SECS] [--no-build] [--runs N]
#
# The reference is installed from the package registry into a private venv
# (target/smg-venv, `pip install smg==1.13.0`, the version pinned below) unless one is there;
# the script stops with an error if it cannot be installed. It is started as its users start
# it, `smg launch ...`, with the same flags as pdrouter's `pdrouter launch ...`.
#
# Fleet (pdrouter-mock, no delays, on core 1 with the load generator): 2 HTTP Prefill and 2
# HTTP Decode workers (SGLang's HTTP API and bootstrap) in one process, and 2 gRPC Prefill and
# 2 gRPC Decode workers (SGLang's scheduler service, with its byte-level tokenizer served over
# GetTokenizer to both routers) in another (`pdrouter-mock --pairs 2`: a Decode mock waits for
# its Prefill's KV room in memory rather than over an HTTP long poll per request, so the
# fleet's core serves requests instead of talking to itself). The router under test runs alone on core 0 (taskset) with one tokio worker
# thread (TOKIO_WORKER_THREADS=1, which both routers' runtimes read).
#
# Paths and configurations, each at concurrency 64 and 1 (closed loop):
#   http_rr       HTTP PD, POST /generate (a two-word prompt, max_new_tokens 1),
#                 --policy round_robin --disable-health-check
#   http_default  the same with the defaults (cache_aware, health checks on) plus Prefill
#                 admission at a limit the load never reaches
#                 (--prefill-max-inflight-requests-per-worker 1024 --prefill-queue-size 100):
#                 every request takes and releases a slot, none waits
#   grpc_rr       gRPC PD, POST /v1/chat/completions (one short user message, max_tokens 1),
#                 round_robin, no health checks: the routers render the chat template,
#                 tokenize and detokenize
#   grpc_default  the same with http_default's flags
# Each (router, configuration) is measured RUNS times (default 1), the routers alternating.
# Figures: OK requests per router CPU-second at c=64 (the router's CPU from /proc, all its
# threads; the capacity of one router core), that CPU per request split into user and kernel
# time, p50/p99 at c=64 and c=1, and how busy the router's core and the fleet's core were at
# c=64 (a router that idles part of the time, waiting on a saturated fleet, pays more wake-ups
# per request than one kept busy). A `kernel-bound ceiling` line divides the reference's CPU
# per request by pdrouter's kernel time per request: the ratio pdrouter would reach if its
# own code cost nothing (on loopback each send also runs the receiver's TCP input, so most
# of a proxy's kernel time is the same for any router).
#
# Then pdrouter's own targets, same run and same fleet: gRPC PD router CPU per request over
# HTTP PD's on /generate at 16 and 1,024 prompt tokens (c=64, round_robin), and its added p50
# at c=1 over a direct exchange with a Decode mock on the router's core (the baseline crosses
# the same core boundary; the same exchange within one core is printed beside it).
#
# Last lines: a `targets:` line (each target, its figure, met or not), then
#   http_rr=X http_default=Y grpc_rr=Z grpc_default=W c1_p50_ratio=V
# X..W = pdrouter's requests per router CPU-second / SMG's (the medians over runs), V = SMG's
# p50 at c=1 / pdrouter's (http_rr; above 1: pdrouter answers sooner).
# Default 10 s per measurement; --quick 3 s.

source "$(dirname "$0")/lib.sh"

SMG_VERSION=1.13.0
RUNS=1
scenario_args 10 3 '2,42p' "$@"
((BUILD)) && build

# ---- The reference, from the package registry ----
SMG_VENV="${CARGO_TARGET_DIR:-$ROOT/target}/smg-venv"
SMG="$SMG_VENV/bin/smg"
installed=$("$SMG_VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("smg"))' \
    2>/dev/null || true)
if [[ $installed != "$SMG_VERSION" ]]; then
    echo "installing smg==$SMG_VERSION into $SMG_VENV" >&2
    python3 -m venv "$SMG_VENV" >&2 || die "cannot create a venv at $SMG_VENV (python3 -m venv)"
    "$SMG_VENV/bin/pip" install -q "smg==$SMG_VERSION" >&2 ||
        die "cannot install smg==$SMG_VERSION from the package registry"
fi
[[ -x $SMG ]] || die "$SMG is missing after installing smg==$SMG_VERSION"

# ---- Fleet ----
start_pair() { # KIND (http|grpc): two Prefill and two Decode mocks; their flags in KIND_ARGS
    local kind=$1 url extra=()
    [[ $kind == grpc ]] && extra=(--grpc)
    local -n args="${kind^^}_ARGS"
    args=()
    start_fleet "$kind-fleet" 2 "${extra[@]}"
    for url in "${FLEET_PREFILL[@]}"; do
        # A gRPC Prefill mock serves KV rooms on its own port (the bootstrap port the Decode
        # mock is sent to); the HTTP mocks need none.
        if [[ $kind == grpc ]]; then
            args+=(--prefill "$url" "${url##*:}")
        else
            args+=(--prefill "$url")
        fi
    done
    for url in "${FLEET_DECODE[@]}"; do
        args+=(--decode "$url")
    done
    local -n first="${kind^^}_DECODE"
    first=${FLEET_DECODE[0]}
}
start_pair http
start_pair grpc
echo "HTTP workers: ${HTTP_ARGS[*]}" >&2
echo "gRPC workers: ${GRPC_ARGS[*]}" >&2

# Every process of the tree rooted at PID (the reference may run helpers of its own).
tree() {
    local p
    echo "$1"
    for p in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        tree "$p"
    done
}
TICKS=$(getconf CLK_TCK)
# tree_cpu PID: CPU seconds the process tree has used so far, "USER KERNEL".
tree_cpu() {
    local user=0 kernel=0 p
    for p in $(tree "$1"); do
        [[ -r /proc/$p/stat ]] || continue
        read -r user kernel < <(awk -v t="$TICKS" -v u="$user" -v k="$kernel" \
            '{ printf "%.4f %.4f\n", u + $14 / t, k + $15 / t }' "/proc/$p/stat")
    done
    echo "$user $kernel"
}

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# start_smg NAME FLAGS...: `smg launch` on the router's core, one tokio worker thread; its URL
# in SPAWNED_URL once it answers.
start_smg() {
    local name=$1 port
    shift
    port=$(free_port)
    TOKIO_WORKER_THREADS=1 "${ROUTER_CPU[@]}" "$SMG" launch --host 127.0.0.1 --port "$port" \
        --prometheus-host 127.0.0.1 --prometheus-port "$(free_port)" --log-level warn "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
    SPAWNED_PID=$!
    PIDS+=("$SPAWNED_PID")
    SPAWNED_URL="http://127.0.0.1:$port"
}

# config_flags CONFIG: the launch flags of a configuration (the workers' flags excluded).
config_flags() {
    case "$1" in
    *_rr) echo --policy round_robin --disable-health-check ;;
    *_default) echo --prefill-max-inflight-requests-per-worker 1024 --prefill-queue-size 100 ;;
    esac
}

HTTP_LOAD=(--path /generate --prompt-mean-tokens 2 --max-tokens 1)
# The reference requires a model name on chat requests (the mocks serve "mock-model").
CHAT_LOAD=(--path /v1/chat/completions --prompt-mean-tokens 2 --max-tokens 1
    --body-extra '{"model":"mock-model"}')

# core_ticks CORE: one core's busy and total jiffies so far (/proc/stat).
core_ticks() {
    awk -v c="cpu$1" '$1 == c { b = $2 + $3 + $4 + $7 + $8 + $9; print b, b + $5 + $6 }' /proc/stat
}
# busy BEFORE AFTER: the busy percentage between two core_ticks readings.
busy() {
    local b0 t0 b1 t1
    read -r b0 t0 <<<"$1"
    read -r b1 t1 <<<"$2"
    calc %.0f "($t1 > $t0) ? 100 * ($b1 - $b0) / ($t1 - $t0) : 0"
}

# measure LABEL URL PID CONCURRENCY [BENCH ARGS...]: 0.5 s of warm-up, then DURATION s; the
# summary in $WORK/LABEL.txt, the process tree's CPU seconds meanwhile in $WORK/LABEL.cpu and
# the kernel's part of them in $WORK/LABEL.sys (PID - for none: a mock measured directly).
measure() {
    local label=$1 url=$2 pid=$3 c=$4
    shift 4
    bench --url "$url" "$@" --concurrency "$c" --duration 0.5 >/dev/null
    local cpu0="0 0" router0 fleet0
    [[ $pid == - ]] || cpu0=$(tree_cpu "$pid")
    router0=$(core_ticks 0) fleet0=$(core_ticks 1)
    bench --url "$url" "$@" --concurrency "$c" --duration "$DURATION" --label "$label" \
        >"$WORK/$label.txt"
    echo "$(busy "$router0" "$(core_ticks 0)") $(busy "$fleet0" "$(core_ticks 1)")" \
        >"$WORK/$label.busy"
    local cpu1="0 0" user0 kernel0 user1 kernel1
    [[ $pid == - ]] || cpu1=$(tree_cpu "$pid")
    read -r user0 kernel0 <<<"$cpu0"
    read -r user1 kernel1 <<<"$cpu1"
    calc %.4f "$user1 + $kernel1 - $user0 - $kernel0" >"$WORK/$label.cpu"
    calc %.4f "$kernel1 - $kernel0" >"$WORK/$label.sys"
    local errors=$(($(kv "$WORK/$label.txt" requests) - $(kv "$WORK/$label.txt" ok)))
    ((errors == 0)) || echo "warning: $label had $errors unsuccessful requests" >&2
}

CONFIGS=(http_rr http_default grpc_rr grpc_default)
ROUTERS=(pdrouter smg)
for ((run = 1; run <= RUNS; run++)); do
    for config in "${CONFIGS[@]}"; do
        for who in "${ROUTERS[@]}"; do
            if [[ $config == http_* ]]; then
                workers=("${HTTP_ARGS[@]}") load=("${HTTP_LOAD[@]}")
            else
                workers=("${GRPC_ARGS[@]}") load=("${CHAT_LOAD[@]}")
            fi
            # shellcheck disable=SC2046 # the flags are words on purpose
            if [[ $who == pdrouter ]]; then
                start_router "$who-$config-$run" --pd-disaggregation "${workers[@]}" \
                    $(config_flags "$config")
            else
                start_smg "$who-$config-$run" --pd-disaggregation "${workers[@]}" \
                    $(config_flags "$config")
            fi
            url=$SPAWNED_URL pid=$SPAWNED_PID
            wait_ready "$url" "${load[@]}"
            for c in 64 1; do
                echo "run $run: $who $config at concurrency $c for ${DURATION}s" >&2
                measure "$who-$config-c$c-r$run" "$url" "$pid" "$c" "${load[@]}"
            done
            stop "$pid"
        done
    done
done

# ---- pdrouter's own targets: gRPC over HTTP per request, c=1 over a direct exchange ----
measure direct-c1 "$HTTP_DECODE" - 1 "${HTTP_LOAD[@]}" --body-extra '{"bootstrap_room":1}'
# The same exchange with a Decode mock on the router's core: the client then crosses the core
# boundary it crosses to reach a router, and the wake-up of an idle core that costs (on a VM
# often several times the exchange itself) is in the baseline instead of counted as added.
spawn direct-decode "listening on" "${ROUTER_CPU[@]}" "$BIN/pdrouter-mock" \
    --host 127.0.0.1 --port 0 --role decode
cross_pid=$SPAWNED_PID
measure direct-cross-c1 "$SPAWNED_URL" - 1 "${HTTP_LOAD[@]}" --body-extra '{"bootstrap_room":1}'
stop "$cross_pid"
for transport in http grpc; do
    if [[ $transport == http ]]; then workers=("${HTTP_ARGS[@]}"); else workers=("${GRPC_ARGS[@]}"); fi
    start_router "pdrouter-$transport-prompts" --pd-disaggregation "${workers[@]}" \
        --policy round_robin --disable-health-check
    url=$SPAWNED_URL pid=$SPAWNED_PID
    wait_ready "$url" --path /generate --max-tokens 1
    for p in 16 1024; do
        echo "pdrouter PD over $transport, ${p}-token prompts, concurrency 64 for ${DURATION}s" >&2
        measure "$transport-p$p" "$url" "$pid" 64 --path /generate \
            --prompt-mean-tokens "$(words_for "$p")" --max-tokens 1
    done
    stop "$pid"
done

# ---- Report ----
per_cpu() { calc %.0f "$(kv "$WORK/$1.txt" ok) / $(cat "$WORK/$1.cpu")"; }
# user_us / kernel_us LABEL: the router's user and kernel CPU microseconds per OK request.
user_us() { calc %.1f "($(cat "$WORK/$1.cpu") - $(cat "$WORK/$1.sys")) * 1000000 / $(kv "$WORK/$1.txt" ok)"; }
kernel_us() { calc %.1f "$(cat "$WORK/$1.sys") * 1000000 / $(kv "$WORK/$1.txt" ok)"; }
# figure WHO CONFIG C KEY: the median over runs of KEY (rps_cpu, user_us, kernel_us, or a kv
# key) at concurrency C.
figure() {
    local who=$1 config=$2 c=$3 key=$4 r vals=()
    for ((r = 1; r <= RUNS; r++)); do
        if [[ $key == rps_cpu ]]; then
            vals+=("$(per_cpu "$who-$config-c$c-r$r")")
        elif [[ $key == user_us || $key == kernel_us ]]; then
            vals+=("$("$key" "$who-$config-c$c-r$r")")
        elif [[ $key == router_busy || $key == fleet_busy ]]; then
            local i=1
            [[ $key == fleet_busy ]] && i=2
            vals+=("$(awk -v i="$i" '{ print $i }' "$WORK/$who-$config-c$c-r$r.busy")")
        else
            vals+=("$(kv "$WORK/$who-$config-c$c-r$r.txt" "$key")")
        fi
    done
    median "${vals[@]}"
}

echo
echo "smg==$SMG_VERSION beside pdrouter $("$ROUTER_BIN" --version 2>/dev/null | awk '{print $NF}'), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')), ${DURATION}s per measurement, $RUNS run(s), medians"
printf '%-13s %-9s %14s %8s %10s %10s %10s %10s %10s %12s %11s\n' config router req/cpu_s_c64 \
    user_us kernel_us p50_c64 p99_c64 p50_c1 p99_c1 core_busy_% fleet_busy_%
for config in "${CONFIGS[@]}"; do
    for who in "${ROUTERS[@]}"; do
        printf '%-13s %-9s %14s %8s %10s %10.3f %10.3f %10.3f %10.3f %12s %11s\n' "$config" \
            "$who" "$(figure "$who" "$config" 64 rps_cpu)" "$(figure "$who" "$config" 64 user_us)" \
            "$(figure "$who" "$config" 64 kernel_us)" "$(figure "$who" "$config" 64 lat_p50_ms)" \
            "$(figure "$who" "$config" 64 lat_p99_ms)" "$(figure "$who" "$config" 1 lat_p50_ms)" \
            "$(figure "$who" "$config" 1 lat_p99_ms)" "$(figure "$who" "$config" 64 router_busy)" \
            "$(figure "$who" "$config" 64 fleet_busy)"
    done
done
# How far the kernel's part alone lets pdrouter go: the reference's whole CPU per request over
# pdrouter's kernel CPU per request (medians), the ratio pdrouter would reach with no user time.
ceilings=()
for config in "${CONFIGS[@]}"; do
    ceilings+=("$config $(calc %.2f "1000000 / $(figure smg "$config" 64 rps_cpu) \
        / $(figure pdrouter "$config" 64 kernel_us)")x")
done
echo "kernel-bound ceiling (the reference's CPU per request / pdrouter's kernel CPU per" \
    "request): $(IFS=,; echo "${ceilings[*]}" | sed 's/,/, /g')"
if ((RUNS > 1)); then
    for config in "${CONFIGS[@]}"; do
        ratios=()
        for ((r = 1; r <= RUNS; r++)); do
            ratios+=("$(calc %.2f "$(per_cpu "pdrouter-$config-c64-r$r") / $(per_cpu "smg-$config-c64-r$r")")")
        done
        echo "$config ratio per run: ${ratios[*]}"
        for who in "${ROUTERS[@]}"; do
            vals=()
            for ((r = 1; r <= RUNS; r++)); do
                vals+=("$(per_cpu "$who-$config-c64-r$r")")
            done
            echo "  $who req/cpu_s per run: ${vals[*]}"
        done
    done
fi
echo "(times in ms; req/cpu_s = OK requests per router CPU-second at concurrency 64;" \
    "user_us, kernel_us = the router's user and kernel CPU microseconds per request there;" \
    "core_busy_% = the router's core busy at concurrency 64, fleet_busy_% = the mocks' and" \
    "the load generator's core: below 100 on the router's core with the fleet's at 100 means" \
    "the fleet, not the router, set the load)"

ratio() { calc %.2f "$(figure pdrouter "$1" 64 rps_cpu) / $(figure smg "$1" 64 rps_cpu)"; }
us_per() { calc %.2f "$(cat "$WORK/$1.cpu") * 1000000 / $(kv "$WORK/$1.txt" ok)"; }
grpc16=$(calc %.2f "$(us_per grpc-p16) / $(us_per http-p16)")
grpc1024=$(calc %.2f "$(us_per grpc-p1024) / $(us_per http-p1024)")
direct=$(kv "$WORK/direct-c1.txt" lat_p50_ms)
cross=$(kv "$WORK/direct-cross-c1.txt" lat_p50_ms)
ours_c1=$(figure pdrouter http_rr 1 lat_p50_ms)
added=$(calc %.3f "$ours_c1 - $cross")
added_ratio=$(calc %.2f "$added / $cross")
c1_ratio=$(calc %.2f "$(figure smg http_rr 1 lat_p50_ms) / $ours_c1")
met() { calc %s "($1) ? \"met\" : \"not met\""; }
HTTP_RR=$(ratio http_rr) HTTP_DEFAULT=$(ratio http_default)
GRPC_RR=$(ratio grpc_rr) GRPC_DEFAULT=$(ratio grpc_default)
echo "pdrouter gRPC vs HTTP PD router CPU per request: ${grpc16}x at 16 tokens" \
    "($(us_per grpc-p16) vs $(us_per http-p16) us), ${grpc1024}x at 1024" \
    "($(us_per grpc-p1024) vs $(us_per http-p1024) us); c=1 p50 ${ours_c1} ms, direct" \
    "exchange ${direct} ms on one core, ${cross} ms across cores (the router's), added" \
    "${added} ms = ${added_ratio}x the direct exchange across cores"
echo "targets: http_rr>=5 $(met "$HTTP_RR >= 5"), http_default>=5 $(met "$HTTP_DEFAULT >= 5")," \
    "grpc_rr>=4 $(met "$GRPC_RR >= 4"), grpc_default>=4 $(met "$GRPC_DEFAULT >= 4")," \
    "grpc_vs_http_p16<=1.5 ($grpc16) $(met "$grpc16 <= 1.5"), grpc_vs_http_p1024<=3 ($grpc1024)" \
    "$(met "$grpc1024 <= 3"), c1_added_vs_direct<=3 ($added_ratio) $(met "$added_ratio <= 3")"
echo "http_rr=$HTTP_RR http_default=$HTTP_DEFAULT grpc_rr=$GRPC_RR grpc_default=$GRPC_DEFAULT c1_p50_ratio=$c1_ratio"
