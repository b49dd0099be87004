//! Self-sizing per-worker limits: the control law behind `auto`.
//!
//! One [`AutoLimit`] per worker turns what the router observes of that worker's Prefills into
//! the worker's limit, in requests ([`Unit::Requests`]) or prompt tokens ([`Unit::Tokens`]).
//! It is a delay-based controller in the manner of TCP Vegas, with latency normalised by prompt
//! size because an engine's prefill time grows with the prompt:
//!
//! 1. **Baseline.** Prompts are grouped by size in quarter-octave classes (sizes within 19 % of
//!    each other). A class's baseline is the shortest Prefill duration seen for it over the last
//!    one to two [`BASELINE_WINDOW`]s: what a prompt of that size costs when it does not wait
//!    behind others inside the engine.
//! 2. **Stretch.** Each completed Prefill of duration `D` gives `s = D / baseline ≥ 1`; the
//!    smoothed stretch `S` is the exponentially weighted geometric mean of `s` (weight
//!    [`SMOOTHING`]), so one long prompt that delays a batch does not swing it.
//! 3. **Queue estimate.** With `I` in flight on the worker when the Prefill ended, the engine
//!    holds about `q = I · (1 − 1/S)` more than it needs to run at its baseline speed: the
//!    part of the in-flight work that is waiting rather than computing.
//! 4. **Step.** With `u` the unit of one request (1, or the mean prompt size for a token
//!    budget) and `L` the limit: if `q > β·u`, `L −= u²/L`; if `q < α·u` and the limit was
//!    what held the worker back (`I ≥ L − u`), `L += u²/L`. Each completion moves `L` by a
//!    fraction of `u`, so `L` moves by about one `u` per `L/u` completions (one round of the
//!    worker's in-flight requests). `α` = [`ALPHA`], `β` = [`BETA`].
//! 5. **Overload.** A 429 or 503 from the engine halves `L`, at most once per smoothed Prefill
//!    duration (one round), so a burst of refusals counts as one signal.
//! 6. `L` stays within `[min, max]`; the limit in force is `⌊L⌋`, never below 1.
//!
//! Below its real concurrency an engine finishes Prefills near their baseline (`q` small) and,
//! when the limit binds, the limit grows. Beyond it, extra requests wait inside the engine, `D`
//! grows with them and `q` passes `β`: the limit shrinks. An idle or lightly loaded worker (the
//! limit not binding) keeps its limit. Batching in the engine stretches Prefills a little even
//! without a queue; `α` and `β` leave room for that.
//!
//! Invariants: the limit is always within `[min, max]` (and at least 1); the law does no I/O
//! and reads no clock (time is the caller's `now`), so it is tested deterministically.

use std::time::Duration;

use tokio::time::Instant;

/// Lower threshold of the queue estimate, in requests.
pub const ALPHA: f64 = 2.0;
/// Upper threshold of the queue estimate, in requests.
pub const BETA: f64 = 4.0;
/// Weight of one completion in the smoothed stretch and mean prompt size.
pub const SMOOTHING: f64 = 1.0 / 16.0;
/// How long one baseline measurement window lasts; a baseline is the minimum over the current
/// and the previous window, so it can rise again (an engine that became slower) within two.
pub const BASELINE_WINDOW: Duration = Duration::from_secs(30);

/// Size classes per doubling of the prompt.
const CLASSES_PER_OCTAVE: f64 = 4.0;
/// Size classes: prompts up to 2^32 tokens.
const CLASSES: usize = 32 * CLASSES_PER_OCTAVE as usize + 1;

/// What a limit counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Unit {
    /// In-flight Prefill requests.
    Requests,
    /// In-flight prompt tokens.
    Tokens,
}

/// The limit's bounds and unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AutoConfig {
    /// What the limit counts.
    pub unit: Unit,
    /// Smallest limit (at least 1).
    pub min: u32,
    /// Largest limit (at least `min`).
    pub max: u32,
}

/// One Prefill as the router saw it end on a worker.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Completion {
    /// The request's prompt tokens (counted or estimated).
    pub prompt_tokens: u32,
    /// From admission to the end of the Prefill answer.
    pub duration: Duration,
    /// What the worker had in flight when it ended, this request included, in the limit's
    /// unit.
    pub inflight: u32,
}

/// The control law for one worker's limit (see the module docs).
#[derive(Clone, Debug)]
pub struct AutoLimit {
    config: AutoConfig,
    limit: f64,
    /// Natural log of the smoothed stretch (0 = no stretch).
    log_stretch: f64,
    /// Smoothed prompt size, the unit of a token limit; `None` before the first completion.
    mean_tokens: Option<f64>,
    /// Smoothed Prefill duration, seconds (spacing of overload back-offs).
    mean_duration: f64,
    /// Per size class: minimum duration (seconds) in the current and the previous window.
    current: Box<[f64; CLASSES]>,
    previous: Box<[f64; CLASSES]>,
    window_start: Option<Instant>,
    last_backoff: Option<Instant>,
}

impl AutoLimit {
    /// A controller starting at `config.min`. A `min` of 0 counts as 1 and a `max` below `min`
    /// as `min`.
    pub fn new(config: AutoConfig) -> Self {
        let min = config.min.max(1);
        let config = AutoConfig {
            min,
            max: config.max.max(min),
            ..config
        };
        AutoLimit {
            config,
            limit: f64::from(min),
            log_stretch: 0.0,
            mean_tokens: None,
            mean_duration: 0.0,
            current: Box::new([f64::INFINITY; CLASSES]),
            previous: Box::new([f64::INFINITY; CLASSES]),
            window_start: None,
            last_backoff: None,
        }
    }

    /// The limit in force: `⌊L⌋` within `[min, max]`.
    pub fn limit(&self) -> u32 {
        // `limit` is kept within [min, max], both u32.
        (self.limit.floor() as u32).clamp(self.config.min, self.config.max)
    }

    /// The smoothed stretch `S` (1 = Prefills at their baseline).
    pub fn stretch(&self) -> f64 {
        self.log_stretch.exp()
    }

    /// The configuration in force (after the corrections of [`AutoLimit::new`]).
    pub fn config(&self) -> AutoConfig {
        self.config
    }

    /// One unit of the limit: 1 request, or the mean prompt size.
    fn unit(&self) -> f64 {
        match self.config.unit {
            Unit::Requests => 1.0,
            Unit::Tokens => self.mean_tokens.unwrap_or(1.0).max(1.0),
        }
    }

    /// Learns from one completed Prefill at `now`; answers the new limit.
    pub fn on_completion(&mut self, c: Completion, now: Instant) -> u32 {
        let d = c.duration.as_secs_f64();
        if !d.is_finite() {
            return self.limit();
        }
        let tokens = f64::from(c.prompt_tokens);
        self.mean_tokens = Some(match self.mean_tokens {
            Some(m) => m + SMOOTHING * (tokens - m),
            None => tokens,
        });
        self.mean_duration += SMOOTHING * (d - self.mean_duration);

        let base = self.record_baseline(class_of(c.prompt_tokens), d, now);
        // A zero duration (a clock that did not move) carries no stretch.
        let s = if base > 0.0 { (d / base).max(1.0) } else { 1.0 };
        self.log_stretch += SMOOTHING * (s.ln() - self.log_stretch);

        let u = self.unit();
        let inflight = f64::from(c.inflight);
        let queued = inflight * (1.0 - 1.0 / self.stretch());
        let step = u * u / self.limit.max(1.0);
        if queued > BETA * u {
            self.limit -= step;
        } else if queued < ALPHA * u && inflight >= self.limit - u {
            self.limit += step;
        }
        self.clamp();
        self.limit()
    }

    /// Learns that the worker refused a Prefill as overloaded (429 or 503) at `now`; answers
    /// the new limit.
    pub fn on_overload(&mut self, now: Instant) -> u32 {
        let spacing = Duration::from_secs_f64(self.mean_duration.clamp(0.0, 3600.0));
        let recent = self
            .last_backoff
            .is_some_and(|at| now.saturating_duration_since(at) < spacing);
        if !recent {
            self.last_backoff = Some(now);
            self.limit /= 2.0;
            self.clamp();
        }
        self.limit()
    }

    fn clamp(&mut self) {
        let (min, max) = (f64::from(self.config.min), f64::from(self.config.max));
        self.limit = if self.limit.is_finite() {
            self.limit.clamp(min, max)
        } else {
            min
        };
    }

    /// Records `d` seconds for size class `class` and answers the class's baseline.
    fn record_baseline(&mut self, class: usize, d: f64, now: Instant) -> f64 {
        let start = *self.window_start.get_or_insert(now);
        let age = now.saturating_duration_since(start);
        if age >= BASELINE_WINDOW {
            // A whole idle window or more forgets both.
            if age >= 2 * BASELINE_WINDOW {
                self.previous.fill(f64::INFINITY);
            } else {
                std::mem::swap(&mut self.previous, &mut self.current);
            }
            self.current.fill(f64::INFINITY);
            self.window_start = Some(now);
        }
        let cur = &mut self.current[class];
        *cur = cur.min(d);
        cur.min(self.previous[class])
    }
}

/// The quarter-octave size class of a prompt of `tokens` tokens.
fn class_of(tokens: u32) -> usize {
    let t = f64::from(tokens.max(1));
    ((t.log2() * CLASSES_PER_OCTAVE) as usize).min(CLASSES - 1)
}

#[cfg(test)]
mod tests;
