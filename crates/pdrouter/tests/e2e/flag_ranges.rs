//! Numeric flags: whatever values they get, parsing ends in a `Config` or in a one-line
//! error, never a panic (property); a `Config` that parses holds only in-range values and can
//! be used for every deadline and backoff the request path computes without panicking; the
//! binary exits 2 with that one line.

use std::time::Duration;

use pdrouter::cli::{Cli, Command, numeric_value_error};
use pdrouter::config::{Config, FLAG_RANGES, FlagRange, deadline_after};
use pdrouter::proxy::retry::backoff;
use proptest::prelude::*;
use tokio::time::Instant;

/// Values worth trying on a numeric flag: bounds and their neighbours, type limits, any
/// integer or float, and text that is not a number.
fn value(r: &'static FlagRange) -> impl Strategy<Value = String> {
    let edges = vec![
        r.min,
        r.max,
        r.min - 1.0,
        r.max + 1.0,
        r.max * 2.0,
        -1.0,
        0.0,
    ];
    prop_oneof![
        proptest::sample::select(edges).prop_map(|v| v.to_string()),
        proptest::sample::select(vec![
            u64::MAX.to_string(),
            i64::MIN.to_string(),
            u128::MAX.to_string(),
            "NaN".into(),
            "inf".into(),
            "-inf".into(),
            "1e308".into(),
            "".into(),
        ]),
        any::<i64>().prop_map(|v| v.to_string()),
        any::<u64>().prop_map(|v| v.to_string()),
        any::<f64>().prop_map(|v| v.to_string()),
        (0.0..=r.max * 1.1).prop_map(|v| v.to_string()),
        "[0-9a-z.+-]{0,12}",
    ]
}

fn flags() -> impl Strategy<Value = Vec<(&'static FlagRange, String)>> {
    proptest::sample::subsequence((0..FLAG_RANGES.len()).collect::<Vec<_>>(), 1..6).prop_flat_map(
        |picked| {
            picked
                .into_iter()
                .map(|i| {
                    let r = &FLAG_RANGES[i];
                    value(r).prop_map(move |v| (r, v))
                })
                .collect::<Vec<_>>()
        },
    )
}

const F32_FLAGS: &[&str] = &["--cache-threshold", "--balance-rel-threshold"];

const TOKENS: &str = "--prefill-max-inflight-tokens-per-worker";

/// The bounds of an auto limit need one: the token budget's (whose range is theirs).
fn bounded(flags: &[(&'static FlagRange, String)]) -> bool {
    flags
        .iter()
        .any(|(r, _)| r.flag == "--prefill-limit-min" || r.flag == "--prefill-limit-max")
}

/// With limit bounds, the token budget is `auto` whatever value was drawn for it; the flags
/// say so, so that the range check reads what was really passed.
fn as_passed(mut flags: Vec<(&'static FlagRange, String)>) -> Vec<(&'static FlagRange, String)> {
    if bounded(&flags) {
        for (r, v) in &mut flags {
            if r.flag == TOKENS {
                *v = "auto".into();
            }
        }
    }
    flags
}

fn parse(flags: &[(&'static FlagRange, String)], admission: bool) -> Result<Config, String> {
    let flags = &as_passed(flags.to_vec());
    let mut args: Vec<String> = [
        "pdrouter",
        "launch",
        "--pd-disaggregation",
        "--prefill",
        "http://p:1",
        "--decode",
        "http://d:1",
    ]
    .map(String::from)
    .to_vec();
    let given = |f: &str| flags.iter().any(|(r, _)| r.flag == f);
    if admission && !given("--prefill-max-inflight-requests-per-worker") {
        args.extend(["--prefill-max-inflight-requests-per-worker=2".to_string()]);
    }
    if admission
        && flags
            .iter()
            .any(|(r, _)| r.flag.starts_with("--admission-store-"))
    {
        args.push("--admission-store=redis://127.0.0.1:6379".to_string());
    }
    if bounded(flags) && !given(TOKENS) {
        args.push(format!("{TOKENS}=auto"));
    }
    args.extend(flags.iter().map(|(r, v)| format!("{}={v}", r.flag)));
    let cli = Cli::try_parse_args(args)
        .map_err(|e| numeric_value_error(&e).unwrap_or_else(|| e.to_string()))?;
    match cli.command {
        Command::Launch(a) => a.into_config().map_err(|e| e.0),
        Command::Demo(_) => unreachable!(),
    }
}

/// Everything the request path derives from the configuration's numbers.
fn exercise(cfg: &Config) {
    let now = Instant::now();
    let mut durations = vec![
        cfg.request_timeout,
        cfg.shutdown_grace,
        cfg.eviction_interval,
        cfg.breaker.timeout,
        cfg.health.interval,
        cfg.health.timeout,
        cfg.retry.initial_backoff,
        cfg.retry.max_backoff,
    ];
    if let Some(a) = cfg.admission {
        durations.push(a.queue_timeout);
    }
    durations.push(cfg.breaker.window);
    if let Some(l) = cfg.limiter {
        durations.push(l.queue_timeout);
    }
    if let Some(w) = cfg.startup_wait {
        durations.extend([w.timeout, w.check_interval]);
    }
    for attempt in 2..=cfg.retry.max_attempts.saturating_add(1) {
        durations.push(backoff(&cfg.retry, attempt));
    }
    for d in durations {
        assert!(deadline_after(now, d) >= now);
        // In range, so plain `+` would not have panicked either.
        let _ = now + d;
    }
}

proptest! {
    #[test]
    fn numeric_flags_parse_or_fail_cleanly_and_parsed_values_are_safe(
        flags in flags(),
        admission in any::<bool>(),
    ) {
        let flags = as_passed(flags);
        match parse(&flags, admission) {
            Err(e) => prop_assert!(!e.trim_end().is_empty()),
            Ok(cfg) => {
                for (r, v) in &flags {
                    // As the flag's type reads it (an f32 flag rounds tiny values to 0).
                    let v = if F32_FLAGS.contains(&r.flag) {
                        v.parse::<f32>().map(f64::from)
                    } else {
                        v.parse::<f64>()
                    };
                    let Ok(v) = v else { continue };
                    // Turn admission (the global limiter) off.
                    let off = (r.flag == "--prefill-max-inflight-requests-per-worker"
                        || r.flag == "--max-concurrent-requests")
                        && v <= 0.0;
                    prop_assert!(
                        off || (r.min <= v && v <= r.max),
                        "{} accepted {v} outside {}", r.flag, r.text()
                    );
                }
                exercise(&cfg);
            }
        }
    }
}

#[test]
fn the_binary_exits_2_with_one_line_naming_the_flag_and_the_range() {
    for (flag, value) in [
        ("--request-timeout-secs", "0"),
        ("--cb-timeout-duration-secs", "18446744073709551615"),
        ("--prefill-queue-timeout-secs", "99999999999"),
        ("--retry-backoff-multiplier", "NaN"),
        ("--port", "70000"),
    ] {
        let range = pdrouter::config::flag_range(flag).unwrap();
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_pdrouter"))
            .args([
                "launch",
                "--pd-disaggregation",
                "--prefill",
                "http://127.0.0.1:1",
            ])
            .args(["--decode", "http://127.0.0.1:2"])
            .args(["--prefill-max-inflight-requests-per-worker", "1"])
            .arg(format!("{flag}={value}"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        let want = format!(
            "error: {flag} must be between {} and {}",
            range.min, range.max
        );
        assert!(err.starts_with(&want), "{err}");
    }
}

#[test]
fn the_largest_values_leave_deadlines_representable() {
    // The bounds of an auto limit and the admission store's flags exclude each other (both
    // would set the workers' limits): all maxima together, once with each.
    for excluded in ["--admission-store-", "--prefill-limit-"] {
        let flags: Vec<(&FlagRange, String)> = FLAG_RANGES
            .iter()
            .filter(|r| !r.flag.starts_with(excluded))
            .map(|r| (r, r.max.to_string()))
            .collect();
        let cfg = parse(&flags, true).expect("all maxima together are valid");
        assert_eq!(cfg.request_timeout, Duration::from_secs(604_800));
        exercise(&cfg);
    }
}

#[test]
fn a_token_budget_drawn_beside_limit_bounds_is_checked_as_auto() {
    let range = |f: &str| FLAG_RANGES.iter().find(|r| r.flag == f).unwrap();
    let drawn = vec![
        (range(TOKENS), "0".to_string()),
        (range("--prefill-limit-max"), "1".to_string()),
    ];
    let flags = as_passed(drawn);
    assert_eq!(flags[0].1, "auto");
    let cfg = parse(&flags, false).unwrap();
    exercise(&cfg);
}
