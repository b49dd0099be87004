//! Random draws: Poisson inter-arrival gaps and heavy-tailed prompt lengths.
//!
//! Everything is derived from uniform draws of a seeded [`StdRng`], so a run
//! with the same seed offers the same arrival schedule and the same prompts.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{RngExt as _, SeedableRng as _};
use serde::Serialize;

/// A seeded random source (one per generator task).
pub fn seeded(seed: u64) -> StdRng {
    StdRng::seed_from_u64(seed)
}

/// Derives the seed of stream `index` from a master seed (SplitMix64 step),
/// so that parallel tasks draw independent but reproducible sequences.
pub fn derive_seed(seed: u64, index: u64) -> u64 {
    let mut z = seed ^ index.wrapping_add(1).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A uniform draw in the open interval (0, 1): never 0, so logarithms and
/// negative powers stay finite.
fn open_unit(rng: &mut StdRng) -> f64 {
    loop {
        let u: f64 = rng.random();
        if u > 0.0 {
            return u;
        }
    }
}

/// Inter-arrival gaps of a Poisson process of `rate` arrivals per second:
/// exponential with mean `1 / rate`, drawn by inversion (`-ln(U) / rate`).
#[derive(Debug)]
pub struct PoissonGaps {
    rate: f64,
    rng: StdRng,
}

impl PoissonGaps {
    /// Gaps for `rate` arrivals per second (must be positive and finite).
    pub fn new(rate: f64, seed: u64) -> Self {
        assert!(
            rate.is_finite() && rate > 0.0,
            "rate must be positive, got {rate}"
        );
        PoissonGaps {
            rate,
            rng: seeded(seed),
        }
    }

    /// The next gap in seconds.
    pub fn next_secs(&mut self) -> f64 {
        -open_unit(&mut self.rng).ln() / self.rate
    }

    /// The next gap as a [`Duration`].
    pub fn next_gap(&mut self) -> Duration {
        Duration::from_secs_f64(self.next_secs())
    }
}

/// Shape of the prompt-length distribution.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum PromptDist {
    /// Every prompt has exactly the mean length.
    Fixed,
    /// Log-normal with σ = 1 (mean preserved): most prompts short, a few
    /// several times the mean.
    Lognormal,
    /// Pareto with shape α = 1.5 (mean preserved): a heavier tail, with rare
    /// prompts tens of times the mean.
    Pareto,
}

impl PromptDist {
    /// Lowercase name as on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            PromptDist::Fixed => "fixed",
            PromptDist::Lognormal => "lognormal",
            PromptDist::Pareto => "pareto",
        }
    }
}

impl fmt::Display for PromptDist {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for PromptDist {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fixed" => Ok(PromptDist::Fixed),
            "lognormal" => Ok(PromptDist::Lognormal),
            "pareto" => Ok(PromptDist::Pareto),
            _ => Err(format!(
                "unknown prompt distribution {s:?} (fixed, lognormal, pareto)"
            )),
        }
    }
}

/// σ of the log-normal prompt distribution.
const LOGNORMAL_SIGMA: f64 = 1.0;
/// Shape α of the Pareto prompt distribution (finite mean, infinite variance).
const PARETO_ALPHA: f64 = 1.5;
/// No prompt is longer than this multiple of the mean (keeps one draw from
/// dominating a short run).
const MAX_MULTIPLE_OF_MEAN: f64 = 64.0;

/// Draws prompt lengths (in words/tokens) from a [`PromptDist`].
#[derive(Debug)]
pub struct PromptSampler {
    dist: PromptDist,
    mean: f64,
    rng: StdRng,
}

impl PromptSampler {
    /// A sampler with the given mean length (at least 1) and seed.
    pub fn new(dist: PromptDist, mean_tokens: u32, seed: u64) -> Self {
        PromptSampler {
            dist,
            mean: f64::from(mean_tokens.max(1)),
            rng: seeded(seed),
        }
    }

    /// The next prompt length, at least 1.
    pub fn next_len(&mut self) -> u32 {
        let x = match self.dist {
            PromptDist::Fixed => self.mean,
            PromptDist::Lognormal => {
                // Box–Muller for a standard normal, then exp(mu + sigma z)
                // with mu chosen so that the mean is `self.mean`.
                let (u1, u2) = (open_unit(&mut self.rng), open_unit(&mut self.rng));
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                let mu = self.mean.ln() - LOGNORMAL_SIGMA * LOGNORMAL_SIGMA / 2.0;
                (mu + LOGNORMAL_SIGMA * z).exp()
            }
            PromptDist::Pareto => {
                // Inversion: x_m / U^(1/alpha), x_m chosen for the mean.
                let x_m = self.mean * (PARETO_ALPHA - 1.0) / PARETO_ALPHA;
                x_m / open_unit(&mut self.rng).powf(1.0 / PARETO_ALPHA)
            }
        };
        let capped = x.round().clamp(1.0, self.mean * MAX_MULTIPLE_OF_MEAN);
        capped as u32
    }

    /// A prompt of `len` words such as `"w123 w7 w981"`, drawn from this
    /// sampler's random source.
    pub fn words(&mut self, len: u32) -> String {
        let mut s = String::with_capacity(len as usize * 5);
        for i in 0..len {
            if i > 0 {
                s.push(' ');
            }
            let w: u32 = self.rng.random_range(0..1000);
            s.push('w');
            s.push_str(&w.to_string());
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn poisson_gap_mean_is_one_over_rate() {
        let rate = 250.0;
        let mut gaps = PoissonGaps::new(rate, 42);
        let n = 200_000;
        let mean = (0..n).map(|_| gaps.next_secs()).sum::<f64>() / f64::from(n);
        // Standard error is (1/rate)/sqrt(n) ≈ 0.2 % of the mean; allow 3 %.
        let expected = 1.0 / rate;
        assert!(
            (mean - expected).abs() < 0.03 * expected,
            "mean gap {mean} vs {expected}"
        );
    }

    #[test]
    fn poisson_gaps_are_positive_and_memoryless_shaped() {
        let mut gaps = PoissonGaps::new(10.0, 7);
        let draws: Vec<f64> = (0..100_000).map(|_| gaps.next_secs()).collect();
        assert!(draws.iter().all(|&g| g > 0.0 && g.is_finite()));
        // P(gap > mean) = 1/e ≈ 0.368 for an exponential.
        let above = draws.iter().filter(|&&g| g > 0.1).count() as f64 / draws.len() as f64;
        assert!(
            (above - (-1.0f64).exp()).abs() < 0.02,
            "share above mean {above}"
        );
    }

    #[test]
    fn poisson_gaps_are_reproducible() {
        let a: Vec<f64> = {
            let mut g = PoissonGaps::new(5.0, 9);
            (0..50).map(|_| g.next_secs()).collect()
        };
        let b: Vec<f64> = {
            let mut g = PoissonGaps::new(5.0, 9);
            (0..50).map(|_| g.next_secs()).collect()
        };
        assert_eq!(a, b);
    }

    #[test]
    fn fixed_prompts_have_the_mean_length() {
        let mut s = PromptSampler::new(PromptDist::Fixed, 37, 1);
        assert!((0..100).all(|_| s.next_len() == 37));
        let mut zero = PromptSampler::new(PromptDist::Fixed, 0, 1);
        assert_eq!(zero.next_len(), 1);
    }

    #[test]
    fn heavy_tailed_samplers_are_seeded_and_reproducible() {
        for dist in [PromptDist::Lognormal, PromptDist::Pareto] {
            let draw = |seed| {
                let mut s = PromptSampler::new(dist, 200, seed);
                (0..1000).map(|_| s.next_len()).collect::<Vec<_>>()
            };
            assert_eq!(draw(5), draw(5), "{dist}");
            assert_ne!(draw(5), draw(6), "{dist}");
        }
    }

    #[test]
    fn heavy_tailed_samplers_keep_the_mean_and_have_a_tail() {
        for dist in [PromptDist::Lognormal, PromptDist::Pareto] {
            let mut s = PromptSampler::new(dist, 100, 11);
            let mut v: Vec<u32> = (0..200_000).map(|_| s.next_len()).collect();
            let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
            // Generous: the cap trims a little of the Pareto mean, and the
            // infinite-variance tail makes the sample mean noisy.
            assert!((70.0..130.0).contains(&mean), "{dist}: mean {mean}");
            v.sort_unstable();
            let median = v[v.len() / 2];
            let p99 = v[v.len() * 99 / 100];
            assert!(median < 100, "{dist}: median {median} not below the mean");
            assert!(p99 > 300, "{dist}: p99 {p99} shows no tail");
            assert!(v.iter().all(|&x| (1..=6400).contains(&x)), "{dist}: bounds");
        }
    }

    #[test]
    fn words_builds_a_prompt_of_that_many_words() {
        let mut s = PromptSampler::new(PromptDist::Fixed, 3, 1);
        let p = s.words(5);
        let words: Vec<&str> = p.split(' ').collect();
        assert_eq!(words.len(), 5);
        assert!(
            words
                .iter()
                .all(|w| w.starts_with('w') && w[1..].parse::<u32>().is_ok())
        );
        assert_eq!(s.words(0), "");
    }

    #[test]
    fn derived_seeds_differ_per_index() {
        let seeds: std::collections::HashSet<u64> = (0..1000).map(|i| derive_seed(3, i)).collect();
        assert_eq!(seeds.len(), 1000);
        assert_eq!(derive_seed(3, 4), derive_seed(3, 4));
    }

    #[test]
    fn prompt_dist_parses_its_names() {
        for d in [PromptDist::Fixed, PromptDist::Lognormal, PromptDist::Pareto] {
            assert_eq!(d.as_str().parse::<PromptDist>(), Ok(d));
        }
        assert!("zipf".parse::<PromptDist>().is_err());
    }
}
