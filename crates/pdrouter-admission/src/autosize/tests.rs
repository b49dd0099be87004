//! The control law alone (deterministic steps) and against a simulated chunked-prefill engine.

use std::collections::VecDeque;

use proptest::prelude::*;

use super::*;

fn requests(min: u32, max: u32) -> AutoLimit {
    AutoLimit::new(AutoConfig {
        unit: Unit::Requests,
        min,
        max,
    })
}

fn done(tokens: u32, ms: u64, inflight: u32) -> Completion {
    Completion {
        prompt_tokens: tokens,
        duration: Duration::from_millis(ms),
        inflight,
    }
}

#[test]
fn a_binding_limit_grows_while_prefills_keep_their_baseline() {
    let t0 = Instant::now();
    let mut c = requests(1, 16);
    assert_eq!(c.limit(), 1);
    let mut limits = Vec::new();
    for i in 0..40 {
        let l = c.limit();
        // Always full, always as fast as ever.
        limits.push(c.on_completion(done(100, 20, l), t0 + Duration::from_millis(i)));
    }
    assert!(limits.windows(2).all(|w| w[0] <= w[1]), "{limits:?}");
    assert!(c.limit() >= 8, "{limits:?}");
}

#[test]
fn a_limit_that_does_not_bind_stays() {
    let t0 = Instant::now();
    let mut c = requests(4, 16);
    for i in 0..100 {
        // One in flight under a limit of 4: the limit is not what holds the worker back.
        assert_eq!(
            c.on_completion(done(100, 20, 1), t0 + Duration::from_millis(i)),
            4
        );
    }
}

#[test]
fn prefills_slowed_by_a_queue_shrink_the_limit() {
    let t0 = Instant::now();
    let mut c = requests(1, 64);
    // Learn the baseline, then grow to 12.
    c.on_completion(done(100, 20, 1), t0);
    while c.limit() < 12 {
        let l = c.limit();
        c.on_completion(done(100, 20, l), t0);
    }
    // Twelve in flight, each taking three times its baseline: about eight are waiting.
    let mut last = c.limit();
    for i in 0..200 {
        let l = c.limit();
        let now = t0 + Duration::from_millis(i);
        let next = c.on_completion(done(100, 60, l), now);
        assert!(next <= last);
        last = next;
    }
    // q = L (1 - 1/3) <= BETA once L <= 6.
    assert_eq!(c.limit(), 6, "stretch {}", c.stretch());
}

#[test]
fn stretch_is_measured_against_prompts_of_the_same_size() {
    let t0 = Instant::now();
    let mut c = requests(4, 64);
    // Long prompts take long, short ones short: no stretch at all.
    for i in 0..50 {
        let now = t0 + Duration::from_millis(i);
        c.on_completion(done(10_000, 600, 2), now);
        c.on_completion(done(50, 15, 2), now);
    }
    assert!((c.stretch() - 1.0).abs() < 1e-9, "{}", c.stretch());
    // Prompts of 10% more tokens share the class and its baseline.
    c.on_completion(done(11_000, 1200, 2), t0);
    assert!(c.stretch() > 1.0);
}

#[test]
fn the_baseline_forgets_after_two_windows() {
    let t0 = Instant::now();
    let mut c = requests(4, 64);
    c.on_completion(done(100, 10, 1), t0);
    // Later prefills of that size all take 40 ms: stretched while the 10 ms is remembered...
    let later = t0 + BASELINE_WINDOW + Duration::from_secs(1);
    c.on_completion(done(100, 40, 1), later);
    assert!(c.stretch() > 1.0);
    // ...and the new normal once it has aged out.
    let much_later = later + BASELINE_WINDOW + Duration::from_secs(1);
    let before = c.stretch();
    c.on_completion(done(100, 40, 1), much_later);
    assert!(c.stretch() < before);
}

#[test]
fn an_overload_halves_the_limit_once_per_round() {
    let t0 = Instant::now();
    let mut c = requests(1, 64);
    for _ in 0..2000 {
        let l = c.limit();
        c.on_completion(done(100, 100, l), t0);
        if c.limit() >= 32 {
            break;
        }
    }
    assert_eq!(c.limit(), 32);
    assert_eq!(c.on_overload(t0), 16);
    // A burst of refusals within one smoothed Prefill duration is one signal.
    assert_eq!(c.on_overload(t0 + Duration::from_millis(50)), 16);
    assert_eq!(c.on_overload(t0 + Duration::from_millis(150)), 8);
    for i in 0..10 {
        c.on_overload(t0 + Duration::from_secs(1 + i));
    }
    assert_eq!(c.limit(), 1, "never below min");
}

#[test]
fn a_token_limit_moves_by_the_mean_prompt() {
    let t0 = Instant::now();
    let mut c = AutoLimit::new(AutoConfig {
        unit: Unit::Tokens,
        min: 1000,
        max: 1_000_000,
    });
    assert_eq!(c.limit(), 1000);
    for i in 0..30 {
        let l = c.limit();
        c.on_completion(done(500, 20, l), t0 + Duration::from_millis(i));
    }
    // Bound and unstretched: up by about one 500-token prompt per round.
    assert!(c.limit() > 3000, "{}", c.limit());
    let grown = c.limit();
    // A queue worth many prompts (tokens in flight 4x what runs at baseline speed) shrinks it.
    for i in 0..200 {
        let l = c.limit();
        c.on_completion(done(500, 80, l), t0 + Duration::from_millis(100 + i));
    }
    assert!(c.limit() < grown, "{} vs {grown}", c.limit());
    assert!(c.limit() >= 1000);
}

#[test]
fn bad_bounds_are_corrected_and_bad_durations_ignored() {
    let mut c = AutoLimit::new(AutoConfig {
        unit: Unit::Requests,
        min: 0,
        max: 0,
    });
    assert_eq!((c.config().min, c.config().max), (1, 1));
    let t0 = Instant::now();
    assert_eq!(c.on_completion(done(0, 0, 0), t0), 1);
    assert_eq!(c.on_completion(done(u32::MAX, u64::MAX, u32::MAX), t0), 1);
    assert_eq!(c.on_overload(t0), 1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn the_limit_stays_within_its_bounds(
        min in 1u32..50,
        span in 0u32..200,
        tokens_unit in any::<bool>(),
        events in prop::collection::vec(
            (any::<bool>(), 0u32..100_000, 0u64..100_000, 0u32..1_000_000, 0u64..5_000),
            1..300,
        ),
    ) {
        let unit = if tokens_unit { Unit::Tokens } else { Unit::Requests };
        let max = min + span;
        let mut c = AutoLimit::new(AutoConfig { unit, min, max });
        let mut now = Instant::now();
        for (overload, tokens, us, inflight, gap_ms) in events {
            now += Duration::from_millis(gap_ms);
            let l = if overload {
                c.on_overload(now)
            } else {
                let d = Completion {
                    prompt_tokens: tokens,
                    duration: Duration::from_micros(us),
                    inflight,
                };
                c.on_completion(d, now)
            };
            prop_assert!((min..=max).contains(&l), "{l} outside [{min}, {max}]");
            prop_assert_eq!(l, c.limit());
        }
    }

    #[test]
    fn the_limit_settles_near_a_simulated_engines_concurrency(
        seed in 1u64..u64::MAX,
        start_high in any::<bool>(),
        load in 0.8f64..1.3,
    ) {
        let engine = SimEngine { max_running: 4, chunk: 8192, tokens_per_sec: 16_000.0, step_overhead: 0.012 };
        let (min, max) = if start_high { (10, 64) } else { (1, 64) };
        let mut c = requests(min, max);
        if start_high {
            // Start far above the engine's concurrency, then let it come down.
            c.config.min = 1;
        }
        let mean = simulate(&engine, &mut c, seed, load, 60.0);
        // Near 4, from below or above, under and over load. About twice 4 is right here: a
        // freed place's next request reaches the engine after its next step has begun, so
        // exactly 4 in flight would leave steps a request short. Over 600 seeds the mean
        // ranged 4.0-8.1 (a bound of 8.0 failed about one run in ten), hence 9.
        prop_assert!((3.0..=9.0).contains(&mean), "mean limit {mean:.2} (stretch {:.2})", c.stretch());
    }
}

/// A chunked-prefill engine as the mock worker models it: forward steps of at most
/// `max_running` requests and `chunk` prompt tokens from the head of one FIFO, each lasting
/// `step_overhead + tokens / tokens_per_sec` seconds.
struct SimEngine {
    max_running: usize,
    chunk: u64,
    tokens_per_sec: f64,
    step_overhead: f64,
}

/// A request inside the simulated engine.
struct Job {
    tokens: u32,
    remaining: u64,
    dispatched: f64,
}

/// Deterministic xorshift64* in (0, 1).
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11;
        (x as f64 + 0.5) / (1u64 << 53) as f64
    }

    /// Pareto prompt sizes with shape 1.5, mean about 200 tokens, capped at 64x the mean.
    fn prompt(&mut self) -> u32 {
        let x_m = 200.0 / 3.0;
        (x_m / self.unit().powf(1.0 / 1.5)).clamp(1.0, 12_800.0) as u32
    }
}

/// Runs Poisson arrivals at `load` x the engine's capacity for `secs` simulated seconds
/// through a router FIFO whose in-flight limit `c` sets; answers the mean limit over the
/// second half.
fn simulate(engine: &SimEngine, c: &mut AutoLimit, seed: u64, load: f64, secs: f64) -> f64 {
    let mut rng = Rng(seed | 1);
    // Capacity in requests/s with full steps: a request costs its tokens plus its share of the
    // step overhead (a quarter of a step, or its share of the token budget when larger).
    let mut cost = 0.0;
    let mut probe = Rng(seed.rotate_left(17) | 1);
    for _ in 0..20_000 {
        let t = f64::from(probe.prompt());
        cost += t / engine.tokens_per_sec
            + engine.step_overhead * (1.0 / engine.max_running as f64).max(t / engine.chunk as f64);
    }
    let rate = load / (cost / 20_000.0);

    let t0 = Instant::now();
    let at = |t: f64| t0 + Duration::from_secs_f64(t);
    let mut now = 0.0;
    let mut next_arrival = -rng.unit().ln() / rate;
    let mut router: VecDeque<u32> = VecDeque::new();
    let mut fifo: VecDeque<Job> = VecDeque::new();
    let mut step_end: Option<(f64, Vec<u64>)> = None;
    let (mut sum, mut samples) = (0.0, 0.0);
    // The next step from the head of the engine's FIFO: its end and each request's share.
    let next_step = |fifo: &VecDeque<Job>, now: f64| {
        let mut budget = engine.chunk;
        let mut shares = Vec::new();
        for job in fifo.iter().take(engine.max_running) {
            if budget == 0 {
                break;
            }
            let share = job.remaining.min(budget);
            budget -= share;
            shares.push(share);
        }
        let tokens = (engine.chunk - budget) as f64;
        (
            now + engine.step_overhead + tokens / engine.tokens_per_sec,
            shares,
        )
    };
    while now < secs {
        // Dispatch from the router queue while the limit allows.
        while fifo.len() < c.limit() as usize {
            let Some(tokens) = router.pop_front() else {
                break;
            };
            fifo.push_back(Job {
                tokens,
                remaining: u64::from(tokens.max(1)),
                dispatched: now,
            });
        }
        if step_end.is_none() && !fifo.is_empty() {
            step_end = Some(next_step(&fifo, now));
        }
        let step_at = step_end.as_ref().map_or(f64::INFINITY, |s| s.0);
        if next_arrival <= step_at {
            now = next_arrival;
            router.push_back(rng.prompt());
            next_arrival = now - rng.unit().ln() / rate;
            continue;
        }
        let Some((end, shares)) = step_end.take() else {
            break;
        };
        now = end;
        for (job, share) in fifo.iter_mut().zip(&shares) {
            job.remaining -= share;
        }
        while fifo.front().is_some_and(|j| j.remaining == 0) {
            let inflight = fifo.len() as u32;
            let Some(job) = fifo.pop_front() else { break };
            let d = Completion {
                prompt_tokens: job.tokens,
                duration: Duration::from_secs_f64(now - job.dispatched),
                inflight,
            };
            c.on_completion(d, at(now));
            if now > secs / 2.0 {
                sum += f64::from(c.limit());
                samples += 1.0;
            }
        }
        // The engine goes on at once: what the router sends for the freed places reaches it
        // after the next step has begun, as over a network.
        if !fifo.is_empty() {
            step_end = Some(next_step(&fifo, now));
        }
    }
    if samples == 0.0 { 0.0 } else { sum / samples }
}
