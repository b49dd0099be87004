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
# then HTTP PD beside gRPC PD (both round_robin, no health checks) at
# concurrency 64 with 16- and 1,024-token prompts: over gRPC the router
# tokenizes each prompt and detokenizes the answer itself (the gRPC mocks'
# byte-level tokenizer: one token per prompt byte).
#
#   bench/overhead.sh [--quick] [--duration SECS] [--no-build] [--tokenize-check | --callgrind]
#                     [--baseline PATH]
#
# --baseline PATH measures a second router binary (e.g. a build of an earlier commit) in the
# same run, on the same mocks and load, alternating with this checkout's: with --callgrind
# both routers' instructions per request and their change; otherwise every router
# configuration's CPU per request for both and the change (`vs_baseline: ...`). Before/after
# figures of a change are read from one such run.
#
# --callgrind runs only this: an HTTP PD router, then a gRPC PD router, each under valgrind's
# callgrind (needs `valgrind` on PATH), serving 1,000 16-token requests at concurrency 64
# after 300 to warm up; prints the instructions each router executed per request and their
# ratio (grpc_vs_http_instructions_per_request_p16=…). Then, for this checkout's router only,
# SGLang HTTP PD and vLLM PD (NIXL: the Prefill leg first, its params relayed) both on
# /v1/completions (vllm_vs_sglang_instructions_per_request_p16=…). Instruction counts barely move with
# the machine's load, so this is the figure to compare changes with; the CPU-time table is
# the one the target is read from.
#
# --tokenize-check runs only this: small requests (16 tokens, concurrency 1)
# through a gRPC PD router alone, then again while a second client sends
# ~32k-token prompts back to back; prints both p99s and their difference
# (target: at most 1 ms more; tokenization of large prompts runs off the
# router's async threads). The small requests run alone twice, before and
# after the large prompts, and the lower p99 is the baseline. The large
# prompts name another model, served by a Prefill/Decode mock pair of its own
# that runs at idle CPU priority (`chrt --idle`, when present) on the mocks'
# core: in a deployment the engines run elsewhere, and here the mocks' own
# work on 100-odd large prompts a second would otherwise delay the small
# requests' mocks on their shared core, a cost that is the harness's, not the
# router's. The router is shared by both streams: one process, one async
# thread, one tokenizer pool. A last run sends the large prompts to the small
# requests' own mock pair and prints that difference too
# (shared_engines_p99_added_ms), for comparison only.
#
# Setup: a decode and a prefill pdrouter-mock (no delays), and the same over
# gRPC; each router runs alone, pinned to core 0 with TOKIO_WORKER_THREADS=1;
# the mocks and pdrouter-bench share core 1. Requests are `POST /generate`
# with max_new_tokens 1, non-streaming (a two-word text unless said above).
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
# core, router CPU microseconds per request), one line
#   added_p50_us_c1=… default_added_p50_us_c1=… router_rps_per_core_c64=…
#   default_rps_per_core_c64=… cpu_per_request_ratio_default_vs_round_robin_c64=… …
# then the transport table (transport, prompt tokens, the same columns) and
# one line grpc_vs_http_cpu_per_request_p16=… grpc_vs_http_cpu_per_request_p1024=…
# (target at 16 tokens: at most 2); then gRPC chat without and with tools through a router
# with a tool-call parser, and grpc_chat_tools_vs_plain_cpu_per_request=… (target: 1.2). A run with any unsuccessful request prints
# a warning. Default 10 s per measurement; --quick uses 3 s. Needs only the
# Rust toolchain (plus bash, awk and, for pinning, taskset; valgrind for --callgrind).

source "$(dirname "$0")/lib.sh"

TOKENIZE_CHECK=0
CALLGRIND=0
BASELINE=
ARGS=()
while (($#)); do
    case "$1" in
    --tokenize-check) TOKENIZE_CHECK=1 ;;
    --callgrind) CALLGRIND=1 ;;
    --baseline)
        (($# >= 2)) || die "--baseline needs a router binary"
        BASELINE=$2
        shift
        ;;
    *) ARGS+=("$1") ;;
    esac
    shift
done
((TOKENIZE_CHECK && CALLGRIND)) && die "--tokenize-check and --callgrind are separate runs"
if [[ -n $BASELINE ]]; then
    [[ -x $BASELINE ]] || die "--baseline $BASELINE is not an executable"
    ((TOKENIZE_CHECK)) && die "--baseline compares --callgrind or the CPU tables, not --tokenize-check"
    BASELINE=$(cd "$(dirname "$BASELINE")" && pwd)/$(basename "$BASELINE")
fi
# The routers measured: this checkout's, and the baseline's first when one is given.
CURRENT_BIN=$ROUTER_BIN
WHO=(current)
[[ -n $BASELINE ]] && WHO=(baseline current)
# use_router WHO: start_router (and --callgrind) run that router binary from now on.
use_router() { if [[ $1 == baseline ]]; then ROUTER_BIN=$BASELINE; else ROUTER_BIN=$CURRENT_BIN; fi; }
# prefix WHO: the label prefix of that router's measurements.
prefix() { [[ $1 == baseline ]] && echo "base-" || true; }
# change NEW OLD: the relative change from OLD to NEW, in percent.
change() { calc %+.1f "($1 - $2) * 100 / $2"; }
scenario_args 10 3 '2,56p' "${ARGS[@]}"

((BUILD)) && build


# start_grpc_pair NAME [MOCK ARGS...]: a gRPC Prefill and Decode mock (the Decode mock fetches
# the KV room from the Prefill mock's own port); the router's --prefill/--decode flags for them
# in PAIR_ARGS, the Decode mock's URL in PAIR_DECODE.
start_grpc_pair() {
    local name=$1
    shift
    start_mock "$name-prefill" prefill --grpc "$@"
    PAIR_ARGS=(--prefill "$SPAWNED_URL" "${SPAWNED_URL##*:}")
    start_mock "$name-decode" decode --grpc "$@"
    PAIR_DECODE=$SPAWNED_URL
    PAIR_ARGS+=(--decode "$PAIR_DECODE")
    echo "gRPC pair $name: ${PAIR_ARGS[*]}" >&2
}

# prompt_tokens DECODE_URL: the prompt length in tokens of that gRPC Decode mock's last request.
prompt_tokens() {
    local ids
    ids=$(http "http://${1#grpc://}" GET /mock/stats | grep -o '"input_ids":\[[0-9,]*\]' | head -n1)
    echo $(( $(tr -cd ',' <<<"$ids" | wc -c) + 1 ))
}

if ((CALLGRIND)); then
    command -v valgrind >/dev/null 2>&1 || die "--callgrind needs valgrind on PATH"
    command -v callgrind_control >/dev/null 2>&1 || die "--callgrind needs callgrind_control"
    start_mock decode decode
    DECODE=$SPAWNED_URL
    start_mock prefill prefill
    PREFILL=$SPAWNED_URL
    start_grpc_pair g
    # vLLM PD (NIXL, the legs one after the other) beside SGLang HTTP PD, both on
    # /v1/completions (vLLM serves no /generate): the current router only.
    start_mock vllm-prefill prefill --runtime vllm
    VLLM_ARGS=(--prefill "$SPAWNED_URL" none)
    start_mock vllm-decode decode --runtime vllm
    VLLM_ARGS+=(--decode "$SPAWNED_URL")
    SMALL=(--prompt-mean-tokens "$(words_for 16)" --max-tokens 1 --concurrency 64 --timeout 60)
    declare -A PER_REQ
    for run in "${WHO[@]/%/:http}" "${WHO[@]/%/:grpc}" current:completions current:vllm; do
        who=${run%%:*} transport=${run##*:}
        use_router "$who"
        path=/generate
        case $transport in
            http) workers=(--prefill "$PREFILL" --decode "$DECODE") ;;
            grpc) workers=("${PAIR_ARGS[@]}") ;;
            completions) workers=(--prefill "$PREFILL" --decode "$DECODE") path=/v1/completions ;;
            vllm) workers=("${VLLM_ARGS[@]}") path=/v1/completions ;;
        esac
        # Counting starts at the zeroing below and ends at the dump: the measured requests only.
        TOKIO_WORKER_THREADS=1 spawn "callgrind-$transport" "pdrouter listening on" \
            "${ROUTER_CPU[@]}" valgrind --tool=callgrind \
            --callgrind-out-file="$WORK/callgrind-$transport.%p" "$ROUTER_BIN" launch \
            --host 127.0.0.1 --port 0 --prometheus-host 127.0.0.1 --prometheus-port 0 \
            --log-level warn --pd-disaggregation "${workers[@]}" \
            --policy round_robin --disable-health-check
        ROUTER=$SPAWNED_URL
        ROUTER_PID=$SPAWNED_PID
        echo "router (PD over $transport, under callgrind) $ROUTER" >&2
        wait_ready "$ROUTER" --path "$path" --max-tokens 1
        bench --url "$ROUTER" --path "$path" "${SMALL[@]}" --requests 300 >/dev/null
        callgrind_control -z "$ROUTER_PID" >/dev/null
        bench --url "$ROUTER" --path "$path" "${SMALL[@]}" --requests 1000 >"$WORK/cg-$transport.txt"
        callgrind_control -d "$ROUTER_PID" >/dev/null
        ok=$(kv "$WORK/cg-$transport.txt" ok)
        ((ok == 1000)) || echo "warning: $transport had $((1000 - ok)) unsuccessful requests" >&2
        # The dump's `summary:` line: the instructions counted since the zeroing.
        instr=$(awk '/^summary:/ { print $2 }' "$WORK/callgrind-$transport.$ROUTER_PID".*)
        PER_REQ[$who-$transport]=$(calc %.0f "$instr / $ok")
        stop "$ROUTER_PID"
    done
    if [[ -n $BASELINE ]]; then
        echo "baseline_http_instructions_per_request_p16=${PER_REQ[baseline-http]}" \
            "baseline_grpc_instructions_per_request_p16=${PER_REQ[baseline-grpc]}"
    fi
    echo "http_instructions_per_request_p16=${PER_REQ[current-http]}" \
        "grpc_instructions_per_request_p16=${PER_REQ[current-grpc]}" \
        "grpc_vs_http_instructions_per_request_p16=$(calc %.2f "${PER_REQ[current-grpc]} / ${PER_REQ[current-http]}")"
    echo "sglang_completions_instructions_per_request_p16=${PER_REQ[current-completions]}" \
        "vllm_instructions_per_request_p16=${PER_REQ[current-vllm]}" \
        "vllm_vs_sglang_instructions_per_request_p16=$(calc %.2f "${PER_REQ[current-vllm]} / ${PER_REQ[current-completions]}")"
    if [[ -n $BASELINE ]]; then
        echo "vs_baseline: http_instructions_change_pct=$(change "${PER_REQ[current-http]}" "${PER_REQ[baseline-http]}")" \
            "grpc_instructions_change_pct=$(change "${PER_REQ[current-grpc]}" "${PER_REQ[baseline-grpc]}")"
    fi
    exit 0
fi

if ((TOKENIZE_CHECK)); then
    start_grpc_pair small --model small
    SMALL_ARGS=("${PAIR_ARGS[@]}")
    SMALL_DECODE=$PAIR_DECODE
    saved_cpu=("${OTHERS_CPU[@]}")
    if command -v chrt >/dev/null 2>&1; then
        OTHERS_CPU=(chrt --idle 0 "${OTHERS_CPU[@]}")
    else
        echo "warning: chrt missing; the large prompts' mocks run at normal priority" >&2
    fi
    start_grpc_pair large --model large
    OTHERS_CPU=("${saved_cpu[@]}")
    LARGE_ARGS=("${PAIR_ARGS[@]}")
    LARGE_DECODE=$PAIR_DECODE
    start_router router-grpc --pd-disaggregation "${SMALL_ARGS[@]}" "${LARGE_ARGS[@]}" \
        --policy round_robin --disable-health-check
    ROUTER=$SPAWNED_URL
    SMALL=(--path /generate --prompt-mean-tokens "$(words_for 16)" --max-tokens 1 --concurrency 1
        --body-extra '{"model":"small"}')
    BIG=(--path /generate --prompt-mean-tokens "$(words_for 31500)" --max-tokens 1 --concurrency 1
        --timeout 120)
    wait_ready "$ROUTER" "${SMALL[@]}"
    bench --url "$ROUTER" "${SMALL[@]}" --duration 0.5 >/dev/null
    small_tokens=$(prompt_tokens "$SMALL_DECODE")
    # alone N: small requests on their own (run twice, before and after the first stream of
    # large prompts: the lower p99 is the baseline, so a disturbed baseline cannot hide an
    # added delay).
    alone() {
        echo "small requests alone for ${DURATION}s" >&2
        bench --url "$ROUTER" "${SMALL[@]}" --duration "$DURATION" --label alone \
            >"$WORK/alone-$1.txt"
    }
    alone 1
    # beside LABEL MODEL: small requests while large prompts for MODEL stream alongside.
    beside() {
        echo "small requests beside a stream of large prompts ($1) for ${DURATION}s" >&2
        bench --url "$ROUTER" "${BIG[@]}" --body-extra "{\"model\":\"$2\"}" \
            --duration "$DURATION" --label "big-$1" >"$WORK/big-$1.txt" &
        local big_pid=$!
        bench --url "$ROUTER" "${SMALL[@]}" --duration "$DURATION" --label "beside-$1" \
            >"$WORK/beside-$1.txt"
        wait "$big_pid"
    }
    beside own large
    big_tokens=$(prompt_tokens "$LARGE_DECODE")
    alone 2
    beside shared small
    for f in alone-1 alone-2 beside-own big-own beside-shared big-shared; do
        errors=$(( $(kv "$WORK/$f.txt" requests) - $(kv "$WORK/$f.txt" ok) ))
        ((errors == 0)) || echo "warning: $f had $errors unsuccessful requests" >&2
    done
    p99_first=$(kv "$WORK/alone-1.txt" lat_p99_ms)
    p99_second=$(kv "$WORK/alone-2.txt" lat_p99_ms)
    p99_alone=$(calc %.4f "$p99_first < $p99_second ? $p99_first : $p99_second")
    p99_beside=$(kv "$WORK/beside-own.txt" lat_p99_ms)
    p99_shared=$(kv "$WORK/beside-shared.txt" lat_p99_ms)
    delta=$(calc %.3f "$p99_beside - $p99_alone")
    echo "small_prompt_tokens=$small_tokens large_prompt_tokens=$big_tokens" \
        "large_ok_req_s=$(kv "$WORK/big-own.txt" ok_rps)" \
        "small_p99_ms_alone=$p99_alone small_p99_ms_beside_large=$p99_beside" \
        "p99_added_ms=$delta within_1ms=$(calc %s "($delta <= 1) ? \"yes\" : \"no\"")" \
        "shared_engines_p99_ms=$p99_shared" \
        "shared_engines_p99_added_ms=$(calc %.3f "$p99_shared - $p99_alone")"
    exit 0
fi

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

# measure LABEL URL CONCURRENCY [BENCH ARGS...]: warms up, then measures; the summary goes
# to $WORK/LABEL.txt and, unless URL is a mock, the router's CPU seconds to $WORK/LABEL.cpu.
measure() {
    local label=$1 url=$2 c=$3
    shift 3
    # Warm the connections up, then measure.
    bench --url "$url" "$@" --concurrency "$c" --duration 0.5 >/dev/null
    local cpu0=0
    [[ $url == "$ROUTER" ]] && cpu0=$(router_cpu)
    bench --url "$url" "$@" --concurrency "$c" --duration "$DURATION" \
        --label "$label" >"$WORK/$label.txt"
    if [[ $url == "$ROUTER" ]]; then
        calc %.4f "$(router_cpu) - $cpu0" >"$WORK/$label.cpu"
    else
        echo 0 >"$WORK/$label.cpu"
    fi
    local errors=$(( $(kv "$WORK/$label.txt" requests) - $(kv "$WORK/$label.txt" ok) ))
    ((errors == 0)) || echo "warning: $label had $errors unsuccessful requests" >&2
}

run() { # MODE CONCURRENCY
    local mode=$1 c=$2
    if [[ $mode == direct ]]; then
        measure "$mode-c$c" "$DECODE" "$c" "${COMMON[@]}" --body-extra "$DIRECT_BODY"
    else
        measure "$mode-c$c" "$ROUTER" "$c" "${COMMON[@]}"
    fi
}

ROUTER=none
wait_ready "$DECODE" "${COMMON[@]}" --body-extra "$DIRECT_BODY"
for c in "${CONCURRENCIES[@]}"; do
    echo "running direct at concurrency $c for ${DURATION}s" >&2
    run direct "$c"
done
for mode in round_robin default; do
    for who in "${WHO[@]}"; do
        use_router "$who"
        # shellcheck disable=SC2046 # the flags are words on purpose
        start_router "router-$who-$mode" --pd-disaggregation --prefill "$PREFILL" \
            --decode "$DECODE" $(router_flags "$mode")
        ROUTER=$SPAWNED_URL
        ROUTER_PID=$SPAWNED_PID
        echo "router ($who, $mode) $ROUTER" >&2
        wait_ready "$ROUTER" "${COMMON[@]}"
        for c in "${CONCURRENCIES[@]}"; do
            echo "running $who $mode at concurrency $c for ${DURATION}s" >&2
            run "$(prefix "$who")$mode" "$c"
        done
        stop "$ROUTER_PID"
    done
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

# HTTP PD beside gRPC PD, same router flags, 16- and 1,024-token prompts.
start_grpc_pair g
GRPC_ARGS=("${PAIR_ARGS[@]}")
GDECODE=$PAIR_DECODE
PROMPTS=(16 1024)
TRANSPORT_C=64
for transport in http grpc; do
    for who in "${WHO[@]}"; do
        use_router "$who"
        if [[ $transport == http ]]; then
            start_router "router-pd-$who-$transport" --pd-disaggregation --prefill "$PREFILL" \
                --decode "$DECODE" --policy round_robin --disable-health-check
        else
            start_router "router-pd-$who-$transport" --pd-disaggregation "${GRPC_ARGS[@]}" \
                --policy round_robin --disable-health-check
        fi
        ROUTER=$SPAWNED_URL
        ROUTER_PID=$SPAWNED_PID
        echo "router ($who, PD over $transport) $ROUTER" >&2
        wait_ready "$ROUTER" --path /generate --max-tokens 1
        for p in "${PROMPTS[@]}"; do
            echo "running $who PD over $transport, ${p}-token prompts, concurrency $TRANSPORT_C for ${DURATION}s" >&2
            measure "$(prefix "$who")$transport-p$p" "$ROUTER" "$TRANSPORT_C" --path /generate \
                --prompt-mean-tokens "$(words_for "$p")" --max-tokens 1
            [[ $transport == grpc ]] && prompt_tokens "$GDECODE" >"$WORK/grpc-p$p.tokens"
        done
        stop "$ROUTER_PID"
    done
done

echo
printf '%-10s %13s %12s %10s %10s %12s %16s %18s\n' transport prompt_tokens ok_req/s p50_ms \
    p99_ms router_cpu_s req/router_cpu_s router_cpu_us/req
for p in "${PROMPTS[@]}"; do
    for transport in http grpc; do
        f="$WORK/$transport-p$p.txt"
        cpu=$(cat "$WORK/$transport-p$p.cpu")
        printf '%-10s %13s %12.1f %10.3f %10.3f %12.2f %16s %18s\n' "$transport" \
            "$(cat "$WORK/grpc-p$p.tokens")" "$(kv "$f" ok_rps)" "$(kv "$f" lat_p50_ms)" \
            "$(kv "$f" lat_p99_ms)" "$cpu" "$(calc %.0f "$(kv "$f" ok) / $cpu")" \
            "$(calc %.1f "$cpu * 1000000 / $(kv "$f" ok)")"
    done
done
us_per_req() { calc %.4f "$(cat "$WORK/$1.cpu") * 1000000 / $(kv "$WORK/$1.txt" ok)"; }
ratios=()
for p in "${PROMPTS[@]}"; do
    ratios+=("grpc_vs_http_cpu_per_request_p$p=$(calc %.2f "$(us_per_req "grpc-p$p") / $(us_per_req "http-p$p")")")
done
echo "${ratios[*]}"

# gRPC chat with tools: the same chat request without and with `tools` through one gRPC PD
# router started with --tool-call-parser qwen (and no reasoning parser, so without tools
# nothing is parsed), over mocks whose model writes a sentence and a Qwen-style tool call
# (about 90 byte-level tokens), 16-token prompts, concurrency 64. Alternated AGENT_RUNS times
# to show the spread; the line reports each run's ratio and their median (target: 1.2).
AGENT_TEXT=$'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
AGENT_TOOLS='{"tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]}'
AGENT_RUNS=3
start_grpc_pair agent --output-text "$AGENT_TEXT" --output-tokens "$(( ${#AGENT_TEXT} + 1 ))"
use_router current
start_router router-agent --pd-disaggregation "${PAIR_ARGS[@]}" --policy round_robin \
    --disable-health-check --tool-call-parser qwen
ROUTER=$SPAWNED_URL
ROUTER_PID=$SPAWNED_PID
AGENT=(--path /v1/chat/completions --prompt-mean-tokens "$(words_for 16)" --max-tokens 200)
wait_ready "$ROUTER" "${AGENT[@]}"
reply=$(http "$ROUTER" POST /v1/chat/completions \
    '{"messages":[{"role":"user","content":"weather?"}],"tools":'"${AGENT_TOOLS#*:}")
grep -q '"finish_reason":"tool_calls"' <<<"$reply" ||
    echo "warning: the agent router did not parse the tool call: $reply" >&2
agent_ratios=()
for ((r = 1; r <= AGENT_RUNS; r++)); do
    echo "running gRPC chat without and with tools (run $r of $AGENT_RUNS) for ${DURATION}s each" >&2
    measure "agent-plain-$r" "$ROUTER" 64 "${AGENT[@]}"
    measure "agent-tools-$r" "$ROUTER" 64 "${AGENT[@]}" --body-extra "$AGENT_TOOLS"
    agent_ratios+=("$(calc %.3f "$(us_per_req "agent-tools-$r") / $(us_per_req "agent-plain-$r")")")
done
stop "$ROUTER_PID"
echo
printf '%-14s %4s %12s %10s %10s %18s\n' grpc_chat run ok_req/s p50_ms p99_ms router_cpu_us/req
for ((r = 1; r <= AGENT_RUNS; r++)); do
    for kind in plain tools; do
        f="$WORK/agent-$kind-$r.txt"
        printf '%-14s %4s %12.1f %10.3f %10.3f %18.1f\n' "$kind" "$r" "$(kv "$f" ok_rps)" \
            "$(kv "$f" lat_p50_ms)" "$(kv "$f" lat_p99_ms)" "$(us_per_req "agent-$kind-$r")"
    done
done
median=$(printf '%s\n' "${agent_ratios[@]}" | sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }')
echo "grpc_chat_tools_vs_plain_cpu_per_request=$median runs=$(IFS=,; echo "${agent_ratios[*]}")"
if [[ -n $BASELINE ]]; then
    # CPU per request of every router configuration, this checkout's against the baseline's.
    cmp=()
    for mode in round_robin default; do
        for c in "${CONCURRENCIES[@]}"; do
            cmp+=("${mode}_c${c}_cpu_us_change_pct=$(change "$(us_per_req "$mode-c$c")" "$(us_per_req "base-$mode-c$c")")")
        done
    done
    for p in "${PROMPTS[@]}"; do
        for transport in http grpc; do
            cmp+=("${transport}_p${p}_cpu_us_change_pct=$(change "$(us_per_req "$transport-p$p")" "$(us_per_req "base-$transport-p$p")")")
        done
    done
    echo "vs_baseline: ${cmp[*]}"
fi
