//! Policy flags: the routing policy of each worker role and the knobs of cache_aware,
//! prefix_hash and manual.

use std::time::Duration;

use clap::Args;
use pdrouter_policy::{
    AssignmentMode, CacheAwareConfig, ManualConfig, PolicyKind, PrefixHashConfig,
};

use crate::config::ConfigError;

/// `launch` flags under "Policies".
#[derive(Debug, Args)]
pub struct PolicyArgs {
    /// Routing policy: random, round_robin, power_of_two, cache_aware, consistent_hashing,
    /// prefix_hash, manual, bucket.
    #[arg(long, default_value = "cache_aware", help_heading = "Policies")]
    pub policy: String,
    /// Policy for Prefill selection (defaults to --policy).
    #[arg(long, help_heading = "Policies")]
    pub prefill_policy: Option<String>,
    /// Policy for Decode selection (defaults to --policy).
    #[arg(long, help_heading = "Policies")]
    pub decode_policy: Option<String>,
    /// EPD: policy choosing each image's Encode worker, keyed by the image's content hash:
    /// consistent_hashing (the same image always goes to the same worker), random,
    /// round_robin, power_of_two, cache_aware, manual [default: consistent_hashing; only with
    /// --epd-disaggregation].
    #[arg(long, help_heading = "Policies")]
    pub encode_policy: Option<String>,
    /// cache_aware: prefix match rate above which cache affinity wins, 0-1.
    #[arg(long, default_value_t = 0.3, help_heading = "Policies")]
    pub cache_threshold: f32,
    /// cache_aware: absolute load spread that counts as imbalance, 0-1000000.
    #[arg(long, default_value_t = 64, help_heading = "Policies")]
    pub balance_abs_threshold: u64,
    /// cache_aware: relative load spread that counts as imbalance, 1-1000.
    #[arg(long, default_value_t = 1.5, help_heading = "Policies")]
    pub balance_rel_threshold: f32,
    /// cache_aware: seconds between tree evictions, 1-86400; manual: between idle-key
    /// evictions.
    #[arg(
        long,
        visible_alias = "eviction-interval",
        default_value_t = 120,
        help_heading = "Policies"
    )]
    pub eviction_interval_secs: u64,
    /// cache_aware: maximum characters kept per worker tree, 1-1073741824.
    #[arg(long, default_value_t = 67_108_864, help_heading = "Policies")]
    pub max_tree_size: usize,
    /// prefix_hash: prompt tokens that make the hash key, 1-1048576 (4 characters of text per
    /// token unless a tokenizer is given).
    #[arg(long, default_value_t = 256, help_heading = "Policies")]
    pub prefix_token_count: usize,
    /// prefix_hash: a worker whose load is above this many times the mean is skipped, 1-1000.
    #[arg(long, default_value_t = 1.25, help_heading = "Policies")]
    pub prefix_hash_load_factor: f64,
    /// manual: how a routing key seen for the first time picks its worker: random, min_load
    /// (fewest in-flight requests) or min_group (fewest keys).
    #[arg(long, default_value = "random", help_heading = "Policies")]
    pub assignment_mode: String,
    /// manual: seconds a routing key may go unused before it is forgotten, 1-2592000.
    #[arg(long, default_value_t = 14_400, help_heading = "Policies")]
    pub max_idle_secs: u64,
}

/// The policies' part of [`Config`](crate::config::Config).
#[derive(Debug)]
pub(super) struct Policies {
    pub(super) policy: PolicyKind,
    pub(super) prefill_policy: PolicyKind,
    pub(super) decode_policy: PolicyKind,
    pub(super) encode_policy: PolicyKind,
    pub(super) cache: CacheAwareConfig,
    pub(super) eviction_interval: Duration,
    pub(super) prefix_hash: PrefixHashConfig,
    pub(super) manual: ManualConfig,
}

impl PolicyArgs {
    /// The policies by name, each leg's defaulting to `--policy`. (That `--encode-policy`
    /// needs EPD is a rule across groups, in `rules`.)
    pub(super) fn resolve(self) -> Result<Policies, ConfigError> {
        let base = policy("--policy", &self.policy)?;
        let prefill_policy = match &self.prefill_policy {
            Some(p) => policy("--prefill-policy", p)?,
            None => base,
        };
        let decode_policy = match &self.decode_policy {
            Some(p) => policy("--decode-policy", p)?,
            None => base,
        };
        let encode_policy = match &self.encode_policy {
            Some(name) => encode_policy(name)?,
            None => PolicyKind::ConsistentHashing,
        };
        let assignment_mode = AssignmentMode::parse(&self.assignment_mode).ok_or_else(|| {
            ConfigError(format!(
                "--assignment-mode '{}' is not one of {}",
                self.assignment_mode,
                AssignmentMode::NAMES.join(", ")
            ))
        })?;
        Ok(Policies {
            policy: base,
            prefill_policy,
            decode_policy,
            encode_policy,
            cache: CacheAwareConfig {
                cache_threshold: self.cache_threshold,
                balance_abs_threshold: self.balance_abs_threshold,
                balance_rel_threshold: self.balance_rel_threshold,
                max_tree_size: self.max_tree_size,
            },
            eviction_interval: Duration::from_secs(self.eviction_interval_secs),
            prefix_hash: PrefixHashConfig {
                prefix_token_count: self.prefix_token_count,
                load_factor: self.prefix_hash_load_factor,
            },
            manual: ManualConfig {
                assignment_mode,
                max_idle_secs: self.max_idle_secs,
            },
        })
    }
}

fn policy(flag: &str, name: &str) -> Result<PolicyKind, ConfigError> {
    PolicyKind::parse(name).ok_or_else(|| {
        ConfigError(format!(
            "{flag} '{name}' is not a policy; use one of {}",
            PolicyKind::NAMES.join(", ")
        ))
    })
}

/// `--encode-policy`: the policies that can rank Encode workers by an image's content hash
/// (prefix_hash needs prompt tokens and bucket prompt lengths, which an image has not).
fn encode_policy(name: &str) -> Result<PolicyKind, ConfigError> {
    let kind = policy("--encode-policy", name)?;
    if matches!(kind, PolicyKind::PrefixHash | PolicyKind::Bucket) {
        return Err(ConfigError(format!(
            "--encode-policy '{name}' cannot choose Encode workers (it needs the prompt); use \
             consistent_hashing, random, round_robin, power_of_two, cache_aware or manual"
        )));
    }
    Ok(kind)
}
