//! [`Config::validate`]: the startup rules that hold whatever way the values were given (flags
//! or code), each failing with one line naming the flag at fault.

use std::collections::HashSet;
use std::time::Duration;

use super::{Config, ConfigError, Mode, NO_COUNT_LIMIT, WorkerType, bad, is_grpc_url, range};

impl Config {
    /// Cross-field rules that do not depend on how the values were given. They run in a fixed
    /// order, so a configuration breaking several rules always reports the same one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.check_transport()?;
        self.check_roles()?;
        self.check_unique_workers()?;
        self.check_ranges()?;
        if !self.health.endpoint.starts_with('/') {
            return Err(bad("--health-check-endpoint must start with '/'"));
        }
        if !self.mode.is_grpc() && self.tokenizer.chat_template.is_some() {
            return Err(bad(
                "--chat-template is for grpc:// workers (the router renders chats for them); \
                 http:// workers apply their own template",
            ));
        }
        self.check_aliases()?;
        self.check_admission()
    }

    /// One transport for every worker, the one the mode speaks.
    fn check_transport(&self) -> Result<(), ConfigError> {
        let grpc = self.workers.iter().filter(|w| is_grpc_url(&w.url)).count();
        if grpc != 0 && grpc != self.workers.len() {
            return Err(bad(if self.mode.is_pd() {
                "PD workers mix http(s):// and grpc:// URLs; give every --prefill and --decode \
                 worker the same transport"
            } else {
                "--worker-urls mix http(s):// and grpc:// URLs; give every worker the same transport"
            }));
        }
        if !self.workers.is_empty() && (grpc != 0) != self.mode.is_grpc() {
            return Err(bad(
                "the routing mode does not match the workers' transport (gRPC modes need \
                 grpc:// workers, HTTP modes http(s):// ones)",
            ));
        }
        if let Some(rt) = self.grpc_runtime
            && self.http_engine.is_none()
            && !self.workers.is_empty()
            && !self.mode.is_grpc()
        {
            return Err(bad(format!(
                "--runtime {rt} applies to grpc:// workers; these workers are http(s)://"
            )));
        }
        Ok(())
    }

    /// The worker roles the mode needs are all there, and no role it cannot use.
    fn check_roles(&self) -> Result<(), ConfigError> {
        // A role that discovery finds may have no worker at startup.
        let discovered = |t: WorkerType| self.discovery.as_ref().is_some_and(|d| d.discovers(t));
        let count = |t: WorkerType| {
            self.workers.iter().filter(|w| w.worker_type == t).count() + usize::from(discovered(t))
        };
        match self.mode {
            Mode::PdHttp | Mode::PdGrpc => {
                if count(WorkerType::Encode) > 0 {
                    return Err(bad("--encode needs --epd-disaggregation"));
                }
                if count(WorkerType::Prefill) == 0 {
                    return Err(bad(
                        "--pd-disaggregation needs at least one --prefill URL [BOOTSTRAP_PORT|none]",
                    ));
                }
                if count(WorkerType::Decode) == 0 {
                    return Err(bad("--pd-disaggregation needs at least one --decode URL"));
                }
                if count(WorkerType::Regular) > 0 {
                    return Err(bad(
                        "--worker-urls cannot be combined with --pd-disaggregation; use --prefill and --decode",
                    ));
                }
            }
            Mode::EpdGrpc => {
                for (t, flag) in [
                    (WorkerType::Encode, "--encode URL [BOOTSTRAP_PORT]"),
                    (WorkerType::Prefill, "--prefill URL [BOOTSTRAP_PORT|none]"),
                    (WorkerType::Decode, "--decode URL"),
                ] {
                    if count(t) == 0 {
                        return Err(bad(format!(
                            "--epd-disaggregation needs at least one {flag}"
                        )));
                    }
                }
                if count(WorkerType::Regular) > 0 {
                    return Err(bad(
                        "--worker-urls cannot be combined with --epd-disaggregation",
                    ));
                }
            }
            Mode::Regular | Mode::RegularGrpc => {
                if count(WorkerType::Prefill) + count(WorkerType::Decode) > 0 {
                    return Err(bad("--prefill and --decode need --pd-disaggregation"));
                }
            }
        }
        Ok(())
    }

    /// A URL appears at most once per role.
    fn check_unique_workers(&self) -> Result<(), ConfigError> {
        let mut seen = HashSet::new();
        for w in &self.workers {
            if !seen.insert((w.url.as_str(), w.worker_type)) {
                return Err(bad(format!(
                    "worker URL '{}' is given twice as a {} worker",
                    w.url,
                    w.worker_type.as_str()
                )));
            }
        }
        Ok(())
    }

    /// Every alias names a different model, and is given once.
    fn check_aliases(&self) -> Result<(), ConfigError> {
        let mut aliases = HashSet::new();
        for (alias, canonical) in &self.model_aliases {
            if alias.is_empty() || canonical.is_empty() || alias == canonical {
                return Err(bad(format!(
                    "--model-alias '{alias}={canonical}' must be ALIAS=MODEL with two different, \
                     non-empty names"
                )));
            }
            if !aliases.insert(alias.as_str()) {
                return Err(bad(format!("--model-alias '{alias}' is given twice")));
            }
        }
        Ok(())
    }

    /// The store shares a fixed request limit; admission needs PD mode. (The flags' own
    /// resolution refuses these first, with fuller messages; these hold for any `Config`.)
    fn check_admission(&self) -> Result<(), ConfigError> {
        if let Some(st) = &self.admission_store {
            if self.admission.is_some_and(|a| a.auto.is_some()) {
                return Err(bad(
                    "--admission-store shares fixed Prefill limits between replicas, not auto",
                ));
            }
            if self
                .admission
                .is_none_or(|a| a.max_inflight_per_worker == NO_COUNT_LIMIT)
            {
                return Err(bad(
                    "--admission-store needs a positive --prefill-max-inflight-requests-per-worker",
                ));
            }
            if st.lease_ttl < st.interval * 3 {
                return Err(bad(
                    "--admission-store-lease-ttl-ms must be at least 3 times \
                     --admission-store-interval-ms",
                ));
            }
        }
        if self.admission.is_some() && !self.mode.is_pd() {
            return Err(bad(
                "--prefill-max-inflight-requests-per-worker needs PD mode",
            ));
        }
        Ok(())
    }

    /// Every numeric setting against its flag's range (see [`FlagRange`]).
    fn check_ranges(&self) -> Result<(), ConfigError> {
        let secs = Duration::from_secs(1);
        let ms = Duration::from_millis(1);
        range::PORT.check(self.port)?;
        range::MAX_PAYLOAD_SIZE.check(self.max_payload_size)?;
        range::REQUEST_TIMEOUT_SECS.check_duration(self.request_timeout, secs)?;
        range::SHUTDOWN_GRACE_SECS.check_duration(self.shutdown_grace, secs)?;
        range::CACHE_THRESHOLD.check(self.cache.cache_threshold)?;
        range::BALANCE_ABS_THRESHOLD.check(self.cache.balance_abs_threshold)?;
        range::BALANCE_REL_THRESHOLD.check(self.cache.balance_rel_threshold)?;
        range::EVICTION_INTERVAL_SECS.check_duration(self.eviction_interval, secs)?;
        range::MAX_TREE_SIZE.check(self.cache.max_tree_size)?;
        range::RETRY_MAX_RETRIES.check(self.retry.max_attempts)?;
        range::RETRY_INITIAL_BACKOFF_MS.check_duration(self.retry.initial_backoff, ms)?;
        range::RETRY_MAX_BACKOFF_MS.check_duration(self.retry.max_backoff, ms)?;
        range::RETRY_BACKOFF_MULTIPLIER.check(self.retry.multiplier)?;
        range::RETRY_JITTER_FACTOR.check(self.retry.jitter)?;
        range::CB_FAILURE_THRESHOLD.check(self.breaker.failure_threshold)?;
        range::CB_SUCCESS_THRESHOLD.check(self.breaker.success_threshold)?;
        range::CB_TIMEOUT_SECS.check_duration(self.breaker.timeout, secs)?;
        range::HEALTH_FAILURE_THRESHOLD.check(self.health.failure_threshold)?;
        range::HEALTH_SUCCESS_THRESHOLD.check(self.health.success_threshold)?;
        range::HEALTH_CHECK_TIMEOUT_SECS.check_duration(self.health.timeout, secs)?;
        range::HEALTH_CHECK_INTERVAL_SECS.check_duration(self.health.interval, secs)?;
        range::CLIENT_HEADER_TIMEOUT_SECS.check_duration(self.client_header_timeout, secs)?;
        range::MAX_CONNECTIONS.check(self.max_connections)?;
        range::MAX_IMAGE_BYTES.check(self.images.max_bytes)?;
        range::MAX_IMAGE_PIXELS.check(self.images.max_pixels)?;
        range::IMAGE_FETCH_TIMEOUT_SECS.check_duration(self.images.fetch_timeout, secs)?;
        if let Some((_, port)) = self.prometheus {
            range::PROMETHEUS_PORT.check(port)?;
        }
        range::PREFIX_TOKEN_COUNT.check(self.prefix_hash.prefix_token_count)?;
        range::PREFIX_HASH_LOAD_FACTOR.check(self.prefix_hash.load_factor)?;
        range::MAX_IDLE_SECS.check(self.manual.max_idle_secs)?;
        range::CB_WINDOW_SECS.check_duration(self.breaker.window, secs)?;
        if let Some(l) = self.limiter {
            range::MAX_CONCURRENT_REQUESTS.check(l.max_concurrent)?;
            range::QUEUE_SIZE.check(l.queue_size)?;
            range::QUEUE_TIMEOUT_SECS.check_duration(l.queue_timeout, secs)?;
            if let Some(r) = l.tokens_per_second {
                range::RATE_LIMIT_TOKENS_PER_SECOND.check(r)?;
            }
        }
        if let Some(w) = self.startup_wait {
            range::WORKER_STARTUP_TIMEOUT_SECS.check_duration(w.timeout, secs)?;
            range::WORKER_STARTUP_CHECK_INTERVAL.check_duration(w.check_interval, secs)?;
        }
        if let Some(a) = self.admission {
            if a.max_inflight_per_worker != NO_COUNT_LIMIT {
                range::PREFILL_MAX_INFLIGHT.check(a.max_inflight_per_worker)?;
            }
            if let Some(t) = a.max_inflight_tokens_per_worker {
                range::PREFILL_MAX_INFLIGHT_TOKENS.check(t)?;
            }
            range::PREFILL_QUEUE_SIZE.check(a.queue_size)?;
            range::PREFILL_QUEUE_TIMEOUT_SECS.check_duration(a.queue_timeout, secs)?;
        }
        if let Some(st) = &self.admission_store {
            range::ADMISSION_STORE_INTERVAL_MS.check_duration(st.interval, ms)?;
            range::ADMISSION_STORE_LEASE_TTL_MS.check_duration(st.lease_ttl, ms)?;
        }
        Ok(())
    }
}
