#!/usr/bin/env bash
# Late binding: p99 time-to-first-token with and without router-side Prefill
# admission, at 85 % of the Prefill fleet's capacity with heavy-tailed prompts.
#
#   bench/late_binding.sh [--quick] [--duration SECS] [--no-build] [--out FILE.svg] [--vllm]
#
# --vllm runs the same fleet as vLLM servers with the NIXL connector (`pdrouter-mock
# --runtime vllm`): the router sends each Prefill leg first, capped at one token, waits for
# its answer (the slot is released then) and only then sends Decode with the KV transfer
# params; the load is streaming `/v1/completions` (vLLM serves no `/generate`).
#
# Fleet: 4 engine-mode Prefill mocks (`--engine --max-running 1
# --prefill-tokens-per-sec 16000`: one prompt in prefill per worker,
# the rest in the engine's own FIFO, prefill time = words / 16000 s) and one
# engine-mode Decode mock that waits for each request's KV bootstrap room
# before streaming 4 tokens. Capacity = 4 workers x 1 running x 16000 words/s
# / 200 words mean prompt = 320 req/s; the load is open loop (Poisson) at
# 85 % of that, prompts Pareto-distributed (mean 200 words), streaming
# `/generate`, TTFT = first SSE `data:` chunk.
#
# Three routers over the same fleet, one after the other:
#   round_robin   no admission, --policy round_robin
#   power_of_two  no admission, --policy power_of_two
#   admission     --prefill-max-inflight-requests-per-worker 1 (= max_running),
#                 queue 1000, timeout 60 s, --policy round_robin
# Without admission a long prompt blocks its worker's engine queue while other
# workers idle; with admission requests wait in the router and bind to
# whichever worker frees a slot first.
#
# Output: one table, an SVG of the TTFT CDFs (pdrouter-bench plot), and last
#   p99_ttft_ratio_vs_round_robin=… p99_ttft_ratio_vs_power_of_two=…
# where each ratio is admission's p99 TTFT divided by the other's (below 1 =
# admission better). Default 60 s per router; --quick 25 s (whole script
# under 2 minutes once built).

source "$(dirname "$0")/lib.sh"

OUT="$ROOT/bench/late_binding.svg"
VLLM=0
scenario_args 60 25 '2,34p' "$@"
LOAD_PATH=/generate
((VLLM)) && LOAD_PATH=/v1/completions

engine_scenario 0.85

LOAD=(--path "$LOAD_PATH" --stream --max-tokens 4 --rate "$OFFERED" --duration "$DURATION"
    --prompt-dist pareto --prompt-mean-tokens "$MEAN_WORDS" --seed 7 --timeout 120)

engine_case round_robin --policy round_robin
engine_case power_of_two --policy power_of_two
engine_case admission --policy round_robin --prefill-max-inflight-requests-per-worker "$RUNNING" \
    --prefill-queue-size 1000 --prefill-queue-timeout-secs 60

printf '%-13s %8s %8s %9s %9s %9s %9s %9s %15s\n' \
    config ok_rps 429% ttft_p50 ttft_p90 ttft_p99 ttft_max lat_p99 max_engine_wait
for label in round_robin power_of_two admission; do
    f="$WORK/$label.txt"
    printf '%-13s %8.1f %8.2f %9.1f %9.1f %9.1f %9.1f %9.1f %15.1f\n' "$label" \
        "$(kv "$f" ok_rps)" "$(calc %.2f "$(kv "$f" share_429) * 100")" \
        "$(kv "$f" ttft_p50_ms)" "$(kv "$f" ttft_p90_ms)" "$(kv "$f" ttft_p99_ms)" \
        "$(kv "$f" ttft_max_ms)" "$(kv "$f" lat_p99_ms)" "${ENGINE_WAIT[$label]}"
done
echo "(times in ms; max_engine_wait = longest wait inside a Prefill engine's own queue)"

"$BIN/pdrouter-bench" plot --title "TTFT at 85 % of Prefill capacity (heavy-tailed prompts)" \
    --out "$OUT" "$WORK/round_robin.csv" "$WORK/power_of_two.csv" "$WORK/admission.csv" >&2

adm=$(kv "$WORK/admission.txt" ttft_p99_ms)
echo "p99_ttft_ratio_vs_round_robin=$(calc %.3f "$adm / $(kv "$WORK/round_robin.txt" ttft_p99_ms)") p99_ttft_ratio_vs_power_of_two=$(calc %.3f "$adm / $(kv "$WORK/power_of_two.txt" ttft_p99_ms)")"
