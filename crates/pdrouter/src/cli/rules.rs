//! The rules that tie flags of different groups together: each group checks its own flags,
//! and what one group's flag means depends on another's only here.
//!
//! Rules that any [`Config`](crate::config::Config) must keep, however it was built, are
//! config's, not these: Prefill admission needs PD mode (`RawAdmission::resolve`), the
//! admission store needs a fixed request limit (`RawStore::resolve`), and the workers, the
//! mode and the ranges agree (`Config::validate`).

use crate::config::{AdmissionSettings, ConfigError, LimiterConfig, Mode, PrioritySettings};

/// `--encode-policy` (policies) chooses Encode workers, which only EPD mode (workers) has:
/// refused elsewhere rather than ignored.
pub(super) fn encode_policy_needs_epd(
    encode_policy: Option<&str>,
    mode: Mode,
) -> Result<(), ConfigError> {
    if encode_policy.is_some() && mode != Mode::EpdGrpc {
        return Err(ConfigError(
            "--encode-policy needs --epd-disaggregation (only EPD has Encode workers)".into(),
        ));
    }
    Ok(())
}

/// Flags that would do nothing with these workers are refused rather than ignored (the same
/// rule as `--encode-policy`): the Prefill and Decode policies outside PD and EPD, a health
/// endpoint for gRPC workers (probed with their runtime's HealthCheck), and a KV connector
/// outside PD.
pub(super) fn flags_the_mode_uses(
    mode: Mode,
    role_policies: [(&str, bool); 2],
    health_endpoint: &str,
    kv_connector: bool,
) -> Result<(), ConfigError> {
    if !mode.is_pd()
        && let Some((flag, _)) = role_policies.iter().find(|(_, given)| *given)
    {
        return Err(ConfigError(format!(
            "{flag} chooses among Prefill or Decode workers, which only --pd-disaggregation \
             and --epd-disaggregation have; use --policy"
        )));
    }
    if mode.is_grpc() && health_endpoint != super::resilience::DEFAULT_HEALTH_ENDPOINT {
        return Err(ConfigError(
            "--health-check-endpoint applies to http(s):// workers; grpc:// workers are probed \
             with their runtime's HealthCheck"
                .into(),
        ));
    }
    if kv_connector && !matches!(mode, Mode::PdHttp | Mode::PdGrpc) {
        return Err(ConfigError(
            "--kv-connector says how vLLM Prefill/Decode pairs move the KV; it needs \
             --pd-disaggregation"
                .into(),
        ));
    }
    Ok(())
}

/// `--tool-call-parser` and `--reasoning-parser` are the router's parsing of what gRPC workers
/// generate; HTTP workers' servers parse their own output, so there they would do nothing.
pub(super) fn parsers_need_grpc(
    mode: Mode,
    parsers: crate::config::ChatParsers,
) -> Result<(), ConfigError> {
    if mode.is_grpc() || !parsers.given() {
        return Ok(());
    }
    let flag = if parsers.tool.is_some() {
        "--tool-call-parser"
    } else {
        "--reasoning-parser"
    };
    Err(ConfigError(format!(
        "{flag} applies to grpc:// workers, whose output the router parses; http(s):// \
         workers' servers parse their own (start them with their parser flags)"
    )))
}

/// `--priority-scheduler-enabled` (priority classes) orders a wait queue: Prefill
/// admission's or the global limiter's, so one of them must be on.
pub(super) fn priority_needs_a_queue(
    enabled: bool,
    admission: Option<&AdmissionSettings>,
    limiter: Option<&LimiterConfig>,
) -> Result<(), ConfigError> {
    if enabled && admission.is_none() && limiter.is_none() {
        return Err(ConfigError(
            "--priority-scheduler-enabled orders a wait queue, and none is on: give \
             --prefill-max-inflight-requests-per-worker (or the token budget) in PD mode, or \
             --max-concurrent-requests"
                .into(),
        ));
    }
    Ok(())
}

/// The classes order one queue: admission's when it is on, else the limiter's (whose queue
/// stays one FIFO when admission is ordered). Each class's queue size and timeout default to
/// that queue's own flags.
pub(super) fn order_one_queue(
    priority: Option<&PrioritySettings>,
    admission: &mut Option<AdmissionSettings>,
    limiter: &mut Option<LimiterConfig>,
) {
    let Some(p) = priority else { return };
    match (admission, limiter) {
        (Some(a), _) => a.priorities = Some(p.classes(a.queue_size, a.queue_timeout)),
        (None, Some(l)) => l.priorities = Some(p.classes(l.queue_size, l.queue_timeout)),
        (None, None) => {}
    }
}
