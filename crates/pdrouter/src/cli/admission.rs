//! Prefill admission flags: each Prefill worker's limit (requests, prompt tokens, or `auto`
//! within bounds) and the router-wide wait queue.

use clap::Args;

use crate::config::{AdmissionSettings, ConfigError, Mode, RawAdmission, RawAuto};

/// `launch` flags under "Prefill admission", but those of the admission store
/// ([`StoreArgs`](super::StoreArgs)).
#[derive(Debug, Args)]
pub struct AdmissionArgs {
    /// In-flight Prefill requests per Prefill worker (per DP rank), 1-100000; <= 0 disables
    /// admission; auto sizes each worker's limit from its Prefill latencies, within
    /// --prefill-limit-min/--prefill-limit-max.
    #[arg(
        long,
        default_value = "-1",
        allow_negative_numbers = true,
        value_name = "N|auto",
        help_heading = "Prefill admission"
    )]
    pub prefill_max_inflight_requests_per_worker: LimitArg,
    /// In-flight prompt tokens per Prefill worker (per DP rank), 1-1000000000: a request is
    /// admitted to a worker only if its prompt tokens fit what the worker's admitted requests
    /// leave; an idle worker takes any one request. Alone or with the request limit; auto
    /// sizes each worker's budget like the request limit's auto.
    #[arg(
        long,
        allow_negative_numbers = true,
        value_name = "T|auto",
        help_heading = "Prefill admission"
    )]
    pub prefill_max_inflight_tokens_per_worker: Option<LimitArg>,
    /// Smallest limit an auto Prefill limit takes, and where every worker starts, 1-1000000000
    /// (requests, or prompt tokens for an auto token budget; default 1 request, 1024 tokens).
    #[arg(
        long,
        allow_negative_numbers = true,
        help_heading = "Prefill admission"
    )]
    pub prefill_limit_min: Option<i64>,
    /// Largest limit an auto Prefill limit takes, 1-1000000000 (requests, at most 100000, or
    /// prompt tokens; default 64 requests, 1048576 tokens).
    #[arg(
        long,
        allow_negative_numbers = true,
        help_heading = "Prefill admission"
    )]
    pub prefill_limit_max: Option<i64>,
    /// Router-wide wait-queue depth, 0-1000000 (default 100 when admission is on; 0 = never
    /// wait).
    #[arg(
        long,
        allow_negative_numbers = true,
        help_heading = "Prefill admission"
    )]
    pub prefill_queue_size: Option<i64>,
    /// Longest wait for a Prefill slot in seconds, 0-86400 (default 60 when admission is on;
    /// 0 only with a queue size of 0).
    #[arg(
        long,
        allow_negative_numbers = true,
        help_heading = "Prefill admission"
    )]
    pub prefill_queue_timeout_secs: Option<i64>,
}

impl AdmissionArgs {
    /// The admission settings, `None` when admission is off. The rules, the PD-mode one
    /// included, are [`RawAdmission::resolve`]'s.
    pub(super) fn resolve(&self, mode: Mode) -> Result<Option<AdmissionSettings>, ConfigError> {
        let requests = self.prefill_max_inflight_requests_per_worker;
        let tokens = self.prefill_max_inflight_tokens_per_worker;
        RawAdmission {
            max_inflight: requests.number(),
            max_inflight_tokens: tokens.map(LimitArg::number),
            auto: RawAuto {
                requests: requests == LimitArg::Auto,
                tokens: tokens == Some(LimitArg::Auto),
                min: self.prefill_limit_min,
                max: self.prefill_limit_max,
            },
            queue_size: self.prefill_queue_size,
            queue_timeout_secs: self.prefill_queue_timeout_secs,
        }
        .resolve(mode)
    }
}

/// A Prefill limit flag's value: a number, or `auto` (sized at run time).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitArg {
    /// A fixed limit (`<= 0`: none).
    Number(i64),
    /// Sized per worker at run time.
    Auto,
}

impl LimitArg {
    /// The number, with `auto` as 0 (its limit comes from the `auto` settings).
    fn number(self) -> i64 {
        match self {
            LimitArg::Number(n) => n,
            LimitArg::Auto => 0,
        }
    }
}

impl std::str::FromStr for LimitArg {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        if s.eq_ignore_ascii_case("auto") {
            return Ok(LimitArg::Auto);
        }
        s.trim()
            .parse()
            .map(LimitArg::Number)
            .map_err(|_| format!("'{s}' is neither a whole number nor auto"))
    }
}
