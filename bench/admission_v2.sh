#!/usr/bin/env bash
# Prefill admission beyond a fixed count: p99 time-to-first-token with no admission, count
# limits 1 and 4, a token budget and `auto`, at 85 % load with heavy-tailed prompts; then two
# priority classes at 120 % load.
#
#   bench/admission_v2.sh [--quick] [--duration SECS] [--runs N] [--no-build] [--out FILE.svg]
#
# Fleet: 4 engine-mode Prefill mocks with chunked prefill (`--engine --max-running 4
# --chunked-prefill-tokens 8192 --step-overhead-ms 12 --prefill-tokens-per-sec 16000`): one
# scheduler loop per engine, each forward step taking at most 4 requests and 8192 prompt
# tokens (words) from the head of the engine's FIFO and lasting 12 ms plus 1/16000 s per
# token, a long prompt spanning steps. The step cost is the time of about 200 tokens, as a
# forward pass that must read the model's weights costs on a GPU; 8192 is a common chunked-
# prefill size. One engine-mode Decode mock streams 4 tokens after each request's KV
# bootstrap room is ready.
#
# Load: open loop (Poisson), streaming /generate, prompts Pareto-distributed (shape 1.5, mean
# 200 words, capped at 64x the mean), TTFT = first SSE data chunk. Capacity is estimated from
# the same distribution: with full steps a request costs T/16000 s plus its share of a step's
# overhead, the larger of 1/4 (one of four requests) and T/8192 (its share of the tokens).
#
# Repetition: a p99 of a heavy-tailed TTFT over one short stretch is mostly noise (a handful
# of the longest prompts decide it), so each configuration runs in 3 rounds, the rounds of
# all configurations interleaved (round 1 of each, then round 2, ...; a fresh router each
# time), round r with load seed 7+r for every configuration (paired: the same arrivals and
# prompts for each). A configuration's figures are over its three rounds' requests pooled.
# SECS (default 60, --quick 30) is each configuration's total time, a third per round.
# --runs N repeats the whole measurement N times on the same fleet and ends with the three
# ratios of every run and their spread (min, median, max).
#
# Part 1, 85 % of capacity (queue 1000, timeout 60 s, --policy round_robin):
#   no_admission  no Prefill admission
#   count_1       --prefill-max-inflight-requests-per-worker 1
#   count_4       --prefill-max-inflight-requests-per-worker 4 (the engines' real concurrency)
#   count_8       --prefill-max-inflight-requests-per-worker 8 (shown for reference, not in
#                 --quick: a freed slot's next request reaches the engine after its next step
#                 has begun, so a limit of exactly the concurrency leaves steps short of a
#                 request)
#   token_budget  --prefill-max-inflight-tokens-per-worker B, B = 4 mean prompts as the router
#                 estimates them (its body estimate: UTF-8 bytes / 4), the count limit 4
#                 spread by size instead of by request
#   auto          --prefill-max-inflight-requests-per-worker auto (default bounds 1-64; the
#                 router is not told the engines' concurrency)
# Part 2, two classes at 120 % of capacity: interactive (X-SMG-Priority: interactive, 20 % of
# the traffic) and bulk (X-SMG-Priority: bulk, 80 %), router with --priority-scheduler-enabled,
# part 1's token budget, queue 1000, timeout 10 s; interactive's p99 TTFT is compared with its own
# p99 when it runs alone at the same rate (unloaded), in the same rounds. Needs a router that
# serves priority classes inside Prefill admission; otherwise part 2 reports n/a and why.
#
# Output: tables, SVGs of the TTFT CDFs of the last run (pdrouter-bench plot: OUT and OUT with
# -priority), and last
#   auto_vs_best_fixed_p99=A token_budget_vs_best_count_p99=B interactive_p99_vs_unloaded=C
# A = auto's p99 / the better of count_1 and count_4; B = token_budget's p99 / the same;
# C = interactive p99 loaded / unloaded. Targets: A <= 1.2, B <= 0.8, C <= 1.5. With --runs,
# before it one `run K: ...` line per run and a `spread:` line. --quick: about 4 minutes a
# run once built.

source "$(dirname "$0")/lib.sh"

OUT="$ROOT/bench/admission_v2.svg"
RUNS=1
scenario_args 60 30 '2,56p' "$@"
ROUNDS=3
ROUND_SECS=$(calc %.1f "$DURATION / $ROUNDS")

WORKERS=4
RUNNING=4
RATE_WORDS=16000
CHUNK=8192
STEP_MS=12
MEAN_WORDS=200
# Mean bytes of one generated word ("w" and 0-999, then a space): the router's estimate of a
# prompt is its bytes / 4.
WORD_BYTES=4.89
TOKEN_BUDGET=$(calc %.0f "$RUNNING * $MEAN_WORDS * $WORD_BYTES / 4")

# Mean engine cost of a request (seconds) over the bench's Pareto prompt lengths, by
# quantiles (inversion, as pdrouter-bench draws them).
MEAN_COST=$(awk -v mean="$MEAN_WORDS" -v r="$RATE_WORDS" -v c="$CHUNK" -v d="$STEP_MS" \
    -v run="$RUNNING" 'BEGIN {
        n = 200000; xm = mean / 3; cap = mean * 64; sum = 0
        for (i = 0; i < n; i++) {
            u = (i + 0.5) / n
            t = xm / (u ^ (1 / 1.5)); if (t > cap) t = cap; t = int(t + 0.5); if (t < 1) t = 1
            share = t / c; if (share < 1 / run) share = 1 / run
            sum += t / r + d / 1000 * share
        }
        printf "%.6f", sum / n }')
CAPACITY=$(calc %.1f "$WORKERS / $MEAN_COST")
OFFERED=$(calc %.1f "0.85 * $CAPACITY")
((BUILD)) && build

PREFILL_ARGS=()
PREFILL_URLS=()
for ((i = 0; i < WORKERS; i++)); do
    start_mock "prefill$i" prefill --engine --max-running "$RUNNING" \
        --prefill-tokens-per-sec "$RATE_WORDS" --chunked-prefill-tokens "$CHUNK" \
        --step-overhead-ms "$STEP_MS" --bootstrap-port 0
    port=$(grep -m1 -o 'bootstrap_port=[0-9]*' "$WORK/prefill$i.out" | cut -d= -f2)
    [[ -n "$port" ]] || die "prefill$i printed no bootstrap port"
    PREFILL_ARGS+=(--prefill "$SPAWNED_URL" "$port")
    PREFILL_URLS+=("$SPAWNED_URL")
done
start_mock decode decode --engine --token-interval-ms 1
DECODE_URL=$SPAWNED_URL

echo "capacity ${CAPACITY} req/s (mean engine cost $(calc %.2f "$MEAN_COST * 1000") ms), offering ${OFFERED} req/s, ${ROUNDS} rounds of ${ROUND_SECS}s per configuration and run; token budget ${TOKEN_BUDGET}" >&2

QUEUE=(--prefill-queue-size 1000 --prefill-queue-timeout-secs 60)
CASES=(no_admission count_1 count_4 count_8 token_budget auto)
((QUICK)) && CASES=(no_admission count_1 count_4 token_budget auto)
# case_flags LABEL: the router flags of a part-1 configuration.
case_flags() {
    case "$1" in
    no_admission) echo --policy round_robin ;;
    count_1) echo --policy round_robin --prefill-max-inflight-requests-per-worker 1 "${QUEUE[@]}" ;;
    count_4) echo --policy round_robin --prefill-max-inflight-requests-per-worker 4 "${QUEUE[@]}" ;;
    count_8) echo --policy round_robin --prefill-max-inflight-requests-per-worker 8 "${QUEUE[@]}" ;;
    token_budget) echo --policy round_robin --prefill-max-inflight-tokens-per-worker \
        "$TOKEN_BUDGET" "${QUEUE[@]}" ;;
    auto) echo --policy round_robin --prefill-max-inflight-requests-per-worker auto "${QUEUE[@]}" ;;
    esac
}

# pool LABEL: LABEL's rounds ($WORK/LABEL-rK.csv) together: their summary line in
# $WORK/LABEL.txt (`kv: ...`, as pdrouter-bench prints; OK = 2xx and complete; percentiles by
# rank ceil(p * n), as the bench's) and one CSV, $WORK/LABEL.csv, for the plot.
pool() {
    local label=$1 out="$WORK/$1.txt"
    set -- "$WORK/$label"-r*.csv
    { head -n1 "$1"; tail -q -n +2 "$@"; } >"$WORK/$label.csv"
    local counts
    counts=$(awk -F, 'FNR == 1 { next } { n++ } $3 == 429 { n429++ }
        $3 >= 200 && $3 < 300 && $7 == 1 && $4 != "" { ok++ }
        END { printf "%d %d %d", n, n429, ok }' "$@")
    local n n429 ok
    read -r n n429 ok <<<"$counts"
    awk -F, 'FNR > 1 && $3 >= 200 && $3 < 300 && $7 == 1 && $4 != "" { print $4 }' "$@" |
        sort -g | awk -v n="$n" -v n429="$n429" -v m="$ok" \
            -v secs="$(calc %.3f "$ROUND_SECS * $#")" '
        { t[NR] = $1 }
        END {
            split("50 90 99 100", ps, " ")
            for (k = 1; k <= 4; k++) { r = int(ps[k] / 100 * m + 0.999999)
                if (r < 1) r = 1; q[k] = m ? t[r] : 0 }
            printf "kv: requests=%d ok=%d ok_rps=%.2f share_429=%.4f ttft_p50_ms=%.4f ttft_p90_ms=%.4f ttft_p99_ms=%.4f ttft_max_ms=%.4f\n",
                n, m, m / secs, n ? n429 / n : 0, q[1], q[2], q[3], q[4]
        }' >"$out"
}

# measure_run K: part 1 and part 2 once; the ratios in RATIO_A/B/C.
measure_run() {
    local run=$1 round label f
    declare -gA WAIT_MAX=()
    # The previous run's rounds (results and router logs) go: each name is reused, and a router
    # log still holding the last run's address would be read as the new router's.
    rm -f "$WORK"/*-r[0-9]*.*
    for ((round = 1; round <= ROUNDS; round++)); do
        LOAD=(--path /generate --stream --max-tokens 4 --rate "$OFFERED" --duration "$ROUND_SECS"
            --prompt-dist pareto --prompt-mean-tokens "$MEAN_WORDS" --seed $((6 + round))
            --timeout 120)
        for label in "${CASES[@]}"; do
            # shellcheck disable=SC2046
            engine_case "$label-r$round" $(case_flags "$label")
            local w=${ENGINE_WAIT[$label-r$round]} prev=${WAIT_MAX[$label]:-0}
            WAIT_MAX[$label]=$(calc %.1f "($w > $prev) ? $w : $prev")
        done
    done
    for label in "${CASES[@]}"; do
        pool "$label"
    done
    echo "run $run of $RUNS, 85 % of capacity:"
    printf '%-13s %8s %8s %9s %9s %9s %9s %15s\n' \
        config ok_rps 429% ttft_p50 ttft_p90 ttft_p99 ttft_max max_engine_wait
    for label in "${CASES[@]}"; do
        f="$WORK/$label.txt"
        printf '%-13s %8.1f %8.2f %9.1f %9.1f %9.1f %9.1f %15.1f\n' "$label" \
            "$(kv "$f" ok_rps)" "$(calc %.2f "$(kv "$f" share_429) * 100")" \
            "$(kv "$f" ttft_p50_ms)" "$(kv "$f" ttft_p90_ms)" "$(kv "$f" ttft_p99_ms)" \
            "$(kv "$f" ttft_max_ms)" "${WAIT_MAX[$label]}"
    done
    echo "(times in ms, each configuration's ${ROUNDS} rounds pooled; max_engine_wait = longest wait inside a Prefill engine's own queue)"
    echo "auto's per-worker limits at the end of its last round: $(grep '^smg_pd_prefill_admission_limit{' \
        "$WORK/auto-r$ROUNDS.metrics" 2>/dev/null | awk '{printf "%s ", $NF}')"

    local csvs=()
    for label in "${CASES[@]}"; do
        csvs+=("$WORK/$label.csv")
    done
    "$BIN/pdrouter-bench" plot --out "$OUT" "${csvs[@]}" \
        --title "TTFT at 85 % of Prefill capacity (heavy-tailed prompts, chunked-prefill engines)" >&2

    local best_count
    best_count=$(calc %.3f "($(p99 count_1) < $(p99 count_4)) ? $(p99 count_1) : $(p99 count_4)")
    RATIO_A=$(calc %.3f "$(p99 auto) / $best_count")
    RATIO_B=$(calc %.3f "$(p99 token_budget) / $best_count")
    RATIO_C=n/a
    ((PRIORITY_OK)) && priority_run
    return 0
}

p99() { kv "$WORK/$1.txt" ttft_p99_ms; }

# ---- Part 2: priority classes ----
INTERACTIVE_RATE=$(calc %.1f "0.2 * 1.2 * $CAPACITY")
BULK_RATE=$(calc %.1f "0.8 * 1.2 * $CAPACITY")
# Clients may ask for interactive (the default highest class is `default`).
PRIORITY_FLAGS=(--policy round_robin --priority-scheduler-enabled
    --priority-scheduler-default-max-class interactive
    --prefill-max-inflight-tokens-per-worker "$TOKEN_BUDGET" --prefill-queue-size 1000
    --prefill-queue-timeout-secs 10)

# priority_run: part 2 in ROUNDS rounds (a fresh router each), pooled; the ratio in RATIO_C.
priority_run() {
    local round label f
    for ((round = 1; round <= ROUNDS; round++)); do
        start_router "router-priority-r$round" "${PRIORITY_FLAGS[@]}" --pd-disaggregation \
            "${PREFILL_ARGS[@]}" --decode "$DECODE_URL" --disable-health-check
        local router=$SPAWNED_URL pid=$SPAWNED_PID
        wait_ready "$router" --path /generate --max-tokens 1
        local class_load=(--path /generate --stream --max-tokens 4 --duration "$ROUND_SECS"
            --prompt-dist pareto --prompt-mean-tokens "$MEAN_WORDS" --timeout 120)
        echo "running interactive alone at ${INTERACTIVE_RATE} req/s (round $round)" >&2
        bench --url "$router" "${class_load[@]}" --rate "$INTERACTIVE_RATE" --seed $((10 + round)) \
            --header "X-SMG-Priority: interactive" --label interactive_unloaded \
            --csv "$WORK/interactive_unloaded-r$round.csv" >/dev/null
        echo "running interactive ${INTERACTIVE_RATE} + bulk ${BULK_RATE} req/s (round $round)" >&2
        bench --url "$router" "${class_load[@]}" --rate "$BULK_RATE" --seed $((20 + round)) \
            --header "X-SMG-Priority: bulk" --label bulk_loaded \
            --csv "$WORK/bulk_loaded-r$round.csv" >/dev/null &
        local bulk=$!
        bench --url "$router" "${class_load[@]}" --rate "$INTERACTIVE_RATE" --seed $((10 + round)) \
            --header "X-SMG-Priority: interactive" --label interactive_loaded \
            --csv "$WORK/interactive_loaded-r$round.csv" >/dev/null
        wait "$bulk" || true
        stop "$pid"
    done
    printf '%-21s %8s %8s %9s %9s %9s\n' class ok_rps 429% ttft_p50 ttft_p99 ttft_max
    for label in interactive_unloaded interactive_loaded bulk_loaded; do
        pool "$label"
        f="$WORK/$label.txt"
        printf '%-21s %8.1f %8.2f %9.1f %9.1f %9.1f\n' "$label" "$(kv "$f" ok_rps)" \
            "$(calc %.2f "$(kv "$f" share_429) * 100")" "$(kv "$f" ttft_p50_ms)" \
            "$(kv "$f" ttft_p99_ms)" "$(kv "$f" ttft_max_ms)"
    done
    "$BIN/pdrouter-bench" plot --title "TTFT by class at 120 % of Prefill capacity" \
        --out "${OUT%.svg}-priority.svg" "$WORK/interactive_unloaded.csv" \
        "$WORK/interactive_loaded.csv" "$WORK/bulk_loaded.csv" >&2
    RATIO_C=$(calc %.3f "$(p99 interactive_loaded) / $(p99 interactive_unloaded)")
}

# The router refuses flags it cannot serve at startup (exit 2): that is the probe.
PRIORITY_OK=0
"$BIN/pdrouter" launch --host 127.0.0.1 --port 0 --prometheus-host 127.0.0.1 \
    --prometheus-port 0 --log-level warn --pd-disaggregation "${PREFILL_ARGS[@]}" \
    --decode "$DECODE_URL" --disable-health-check "${PRIORITY_FLAGS[@]}" \
    >"$WORK/probe.out" 2>"$WORK/probe.err" &
probe=$!
PIDS+=("$probe")
for _ in $(seq 100); do
    grep -q "listening on" "$WORK/probe.out" 2>/dev/null && break
    kill -0 "$probe" 2>/dev/null || break
    sleep 0.1
done
if kill -0 "$probe" 2>/dev/null; then
    stop "$probe"
    PRIORITY_OK=1
else
    wait "$probe" 2>/dev/null || true
    echo "interactive_p99_vs_unloaded n/a: this router refused the priority scenario at startup: $(head -n1 "$WORK/probe.err")"
fi

ALL_A=() ALL_B=() ALL_C=()
for ((run = 1; run <= RUNS; run++)); do
    measure_run "$run"
    ALL_A+=("$RATIO_A") ALL_B+=("$RATIO_B") ALL_C+=("$RATIO_C")
    ((RUNS > 1)) && echo "run $run: auto_vs_best_fixed_p99=$RATIO_A token_budget_vs_best_count_p99=$RATIO_B interactive_p99_vs_unloaded=$RATIO_C"
done
# spread NAME VALUES...: min, median and max of the values (n/a if any is).
spread() {
    local name=$1
    shift
    if [[ " $* " == *" n/a "* ]]; then
        echo -n "$name=n/a "
        return
    fi
    local sorted
    mapfile -t sorted < <(printf '%s\n' "$@" | sort -g)
    echo -n "$name=${sorted[0]}/$(median "$@")/${sorted[-1]} "
}
if ((RUNS > 1)); then
    echo "spread (min/median/max over $RUNS runs): $(spread auto_vs_best_fixed_p99 "${ALL_A[@]}")$(spread token_budget_vs_best_count_p99 "${ALL_B[@]}")$(spread interactive_p99_vs_unloaded "${ALL_C[@]}")"
fi
echo "auto_vs_best_fixed_p99=$RATIO_A token_budget_vs_best_count_p99=$RATIO_B interactive_p99_vs_unloaded=$RATIO_C"
