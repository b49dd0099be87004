#!/usr/bin/env bash
# Overload: 150 % of the Prefill fleet's capacity, with and without
# router-side Prefill admission.
#
#   bench/overload.sh [--quick] [--duration SECS] [--no-build]
#
# Same fleet as late_binding.sh: 4 engine-mode Prefill mocks (max_running 1,
# 16000 words/s), one engine-mode Decode mock; capacity 320 req/s at a mean
# prompt of 200 words (Pareto). Open-loop load at 480 req/s, streaming.
#
#   no_admission  --policy round_robin: every request is accepted and waits
#                 inside an engine queue that grows for the whole run.
#   admission     --prefill-max-inflight-requests-per-worker 1, queue 32,
#                 timeout 2 s: the excess is refused with 429
#                 (pd_prefill_queue_full / pd_prefill_queue_timeout) and the
#                 waits of admitted requests stay bounded.
#
# Output: a table (ok req/s, 429 share, TTFT of successes, how long a
# rejection took, longest wait inside an engine's own queue) and, last,
#   share_429_admission=… ttft_p99_ms_admission=… ttft_p99_ms_no_admission=…
#   max_engine_wait_ms_admission=… max_engine_wait_ms_no_admission=…
# Default 40 s per router; --quick 15 s.

source "$(dirname "$0")/lib.sh"

scenario_args 40 15 '2,23p' "$@"

engine_scenario 1.5

LOAD=(--path /generate --stream --max-tokens 4 --rate "$OFFERED" --duration "$DURATION"
    --prompt-dist pareto --prompt-mean-tokens "$MEAN_WORDS" --seed 11 --timeout 300)

engine_case no_admission --policy round_robin
engine_case admission --policy round_robin --prefill-max-inflight-requests-per-worker "$RUNNING" \
    --prefill-queue-size 32 --prefill-queue-timeout-secs 2

printf '%-13s %8s %8s %9s %9s %9s %12s %15s\n' \
    config ok_rps 429% ttft_p50 ttft_p99 ttft_max rejected_max max_engine_wait
for label in no_admission admission; do
    f="$WORK/$label.txt"
    printf '%-13s %8.1f %8.2f %9.1f %9.1f %9.1f %12.1f %15.1f\n' "$label" \
        "$(kv "$f" ok_rps)" "$(calc %.2f "$(kv "$f" share_429) * 100")" \
        "$(kv "$f" ttft_p50_ms)" "$(kv "$f" ttft_p99_ms)" "$(kv "$f" ttft_max_ms)" \
        "$(kv "$f" rejected_max_ms)" "${ENGINE_WAIT[$label]}"
done
echo "(times in ms; TTFT of successful requests; rejected_max = slowest non-2xx answer)"

echo "share_429_admission=$(kv "$WORK/admission.txt" share_429) ttft_p99_ms_admission=$(kv "$WORK/admission.txt" ttft_p99_ms) ttft_p99_ms_no_admission=$(kv "$WORK/no_admission.txt" ttft_p99_ms) max_engine_wait_ms_admission=${ENGINE_WAIT[admission]} max_engine_wait_ms_no_admission=${ENGINE_WAIT[no_admission]}"
