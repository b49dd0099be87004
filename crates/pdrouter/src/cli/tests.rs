//! The command line as a whole: flags of every group parsed into a `Config` (or the one-line
//! error naming the flag), and the help text stating every numeric flag's range.

use std::time::Duration;

use pdrouter_policy::{AssignmentMode, PolicyKind};

use super::*;
use crate::config::{Mode, WorkerType};

fn parse(args: &[&str]) -> Result<Config, String> {
    let mut full = vec!["pdrouter", "launch"];
    full.extend_from_slice(args);
    let cli = Cli::try_parse_args(full)
        .map_err(|e| numeric_value_error(&e).unwrap_or_else(|| e.to_string()))?;
    match cli.command {
        Command::Launch(a) => a.into_config().map_err(|e| e.0),
        Command::Demo(_) => unreachable!(),
    }
}

fn telemetry(args: &[&str]) -> TelemetryArgs {
    let mut full = vec!["pdrouter", "launch", "--worker-urls", "http://w:1"];
    full.extend_from_slice(args);
    match Cli::try_parse_args(full).unwrap().command {
        Command::Launch(a) => a.telemetry,
        Command::Demo(_) => unreachable!(),
    }
}

#[test]
fn an_otlp_endpoint_without_tracing_is_reported_unused() {
    let t = telemetry(&["--otlp-traces-endpoint", "collector:4317"]);
    assert_eq!(t.unused().len(), 1);
    assert!(t.unused()[0].contains("--enable-trace"));
    assert_eq!(t.settings().otlp_endpoint, None);
    let t = telemetry(&["--otlp-traces-endpoint", "collector:4317", "--enable-trace"]);
    assert!(t.unused().is_empty());
    assert_eq!(
        t.settings().otlp_endpoint.as_deref(),
        Some("http://collector:4317")
    );
    // Tracing alone goes to the default collector.
    let t = telemetry(&["--enable-trace"]);
    assert!(t.unused().is_empty());
    assert_eq!(
        t.settings().otlp_endpoint.as_deref(),
        Some("http://localhost:4317")
    );
}

#[test]
fn pd_flags_with_bootstrap_ports() {
    let c = parse(&[
        "--pd-disaggregation",
        "--prefill",
        "http://p1:8000",
        "9000",
        "--prefill",
        "http://p2:8000",
        "none",
        "--prefill",
        "http://p3:8000",
        "--decode",
        "http://d1:8000",
    ])
    .unwrap();
    assert_eq!(c.mode, Mode::PdHttp);
    let ports: Vec<_> = c.workers.iter().map(|w| w.bootstrap_port).collect();
    assert_eq!(ports, vec![Some(9000), None, None, None]);
    assert_eq!(c.port, 30000);
    assert_eq!(c.policy, PolicyKind::CacheAware);
    assert!(c.admission.is_none());
}

#[test]
fn invalid_configurations_name_the_flag() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--pd-disaggregation", "--decode", "http://d:1"],
            "--prefill",
        ),
        (
            &["--pd-disaggregation", "--prefill", "http://p:1"],
            "--decode",
        ),
        (&["--worker-urls", "ftp://x"], "http://"),
        (
            &["--worker-urls", "http://x:1", "--policy", "fastest"],
            "--policy",
        ),
        (
            &[
                "--pd-disaggregation",
                "--prefill",
                "http://p:1",
                "70000",
                "--decode",
                "http://d:1",
            ],
            "bootstrap port",
        ),
        (
            &["--worker-urls", "http://x:1", "--prefill-queue-size", "3"],
            "--prefill-queue-size",
        ),
        (
            &[
                "--worker-urls",
                "http://x:1",
                "--prefill-max-inflight-requests-per-worker",
                "2",
            ],
            "PD mode",
        ),
        (&[], "no workers"),
        (&["--encode", "http://e:1", "9000"], "--encode needs"),
        (
            &[
                "--pd-disaggregation",
                "--epd-disaggregation",
                "--prefill",
                "http://p:1",
                "--decode",
                "http://d:1",
            ],
            "exclude each other",
        ),
        (
            &["--worker-urls", "http://x:1", "--retry-jitter-factor", "2"],
            "--retry-jitter-factor",
        ),
        (
            &["--worker-urls", "http://x:1", "--log-level", "loud"],
            "--log-level",
        ),
    ];
    for (args, needle) in cases {
        let err = parse(args).unwrap_err();
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn runtime_hint_names_a_known_runtime_of_grpc_workers() {
    use crate::config::Runtime;
    let c = parse(&["--worker-urls", "grpc://h:1", "--runtime", "tokenspeed"]).unwrap();
    assert_eq!(c.grpc_runtime, Some(Runtime::TokenSpeed));
    let c = parse(&["--worker-urls", "grpc://h:1", "--backend", "sglang"]).unwrap();
    assert_eq!(c.grpc_runtime, Some(Runtime::Sglang));
    let c = parse(&["--worker-urls", "grpc://h:1"]).unwrap();
    assert_eq!(c.grpc_runtime, None);
    let c = parse(&["--worker-urls", "grpc://h:1", "--runtime", "vllm"]).unwrap();
    assert_eq!(c.grpc_runtime, Some(Runtime::Vllm));
    let e = parse(&["--worker-urls", "grpc://h:1", "--runtime", "trtllm"]).unwrap_err();
    assert!(e.contains("trtllm"), "{e}");
    let e = parse(&["--worker-urls", "http://h:1", "--runtime", "tokenspeed"]).unwrap_err();
    assert!(
        e.contains("--runtime tokenspeed applies to grpc:// workers"),
        "{e}"
    );
}

#[test]
fn runtime_names_the_engine_of_http_workers_and_the_connector_is_checked() {
    use crate::config::{HttpEngine, KvConnector};
    let pd = HTTP_PD;
    let c = parse(&[&pd[..], &["--runtime", "vllm"]].concat()).unwrap();
    assert_eq!(c.http_engine, Some(HttpEngine::Vllm));
    assert_eq!(c.kv_connector, KvConnector::Nixl);
    let c = parse(&[&pd[..], &["--runtime", "sglang"]].concat()).unwrap();
    assert_eq!(c.http_engine, Some(HttpEngine::Sglang));
    let c = parse(&pd).unwrap();
    assert_eq!(c.http_engine, None, "detected per worker");
    for (name, want) in [
        ("nixl", KvConnector::Nixl),
        ("mooncake", KvConnector::Mooncake),
        ("lmcache", KvConnector::Lmcache),
    ] {
        let c = parse(&[&pd[..], &["--kv-connector", name]].concat()).unwrap();
        assert_eq!(c.kv_connector, want);
    }
    let e = parse(&[&pd[..], &["--kv-connector", "p2p"]].concat()).unwrap_err();
    assert!(e.contains("p2p") && e.contains("nixl"), "{e}");
}

/// A PD launch over http:// workers, and over grpc:// ones.
const HTTP_PD: [&str; 5] = [
    "--pd-disaggregation",
    "--prefill",
    "http://p:1",
    "--decode",
    "http://d:1",
];
const GRPC_PD: [&str; 5] = [
    "--pd-disaggregation",
    "--prefill",
    "grpc://p:1",
    "--decode",
    "grpc://d:1",
];

#[test]
fn flags_that_would_do_nothing_in_the_mode_are_refused_naming_them() {
    let regular = ["--worker-urls", "http://w:1"];
    let grpc = ["--worker-urls", "grpc://w:1"];
    let (pd, grpc_pd) = (HTTP_PD, GRPC_PD);
    let refused: [(&[&str], &str, &str); 6] = [
        (&grpc, "--kv-connector", "nixl"),
        (&regular, "--prefill-policy", "random"),
        (&grpc, "--decode-policy", "random"),
        (&grpc, "--health-check-endpoint", "/ready"),
        (&grpc_pd, "--health-check-endpoint", "/ready"),
        (&regular, "--kv-connector", "nixl"),
    ];
    for (workers, flag, value) in refused {
        let e = parse(&[workers, &[flag, value]].concat()).unwrap_err();
        assert!(e.starts_with(flag), "{workers:?} {flag}: {e}");
    }
    // Where they do something they are taken.
    parse(
        &[
            &pd[..],
            &["--prefill-policy", "random", "--decode-policy", "random"],
        ]
        .concat(),
    )
    .unwrap();
    parse(&[&regular[..], &["--health-check-endpoint", "/ready"]].concat()).unwrap();
    parse(&[&grpc[..], &["--health-check-endpoint", "/health"]].concat()).unwrap();
    parse(&[&pd[..], &["--kv-connector", "lmcache"]].concat()).unwrap();
    // gRPC vLLM workers report their connector; the flag is what one that reports none uses.
    parse(&[&grpc_pd[..], &["--kv-connector", "mooncake"]].concat()).unwrap();
}

#[test]
fn epd_takes_grpc_workers_of_three_roles_and_the_pd_rules() {
    let epd = [
        "--epd-disaggregation",
        "--encode",
        "grpc://e:1",
        "9000",
        "--encode",
        "grpc://e:2",
        "--prefill",
        "grpc://p:1",
        "--decode",
        "grpc://d:1",
    ];
    let c = parse(&epd).unwrap();
    assert_eq!(c.mode, Mode::EpdGrpc);
    let encode: Vec<_> = c
        .workers
        .iter()
        .filter(|w| w.worker_type == WorkerType::Encode)
        .map(|w| (w.url.as_str(), w.bootstrap_port))
        .collect();
    assert_eq!(encode, [("grpc://e:1", Some(9000)), ("grpc://e:2", None)]);
    let http: Vec<String> = epd
        .iter()
        .map(|a| a.replace("grpc://", "http://"))
        .collect();
    let http: Vec<&str> = http.iter().map(String::as_str).collect();
    assert!(parse(&http).unwrap_err().contains("transport"));
    let bad_port = [&epd[..3], &["none"], &epd[4..]].concat();
    assert!(
        parse(&bad_port)
            .unwrap_err()
            .contains("--encode bootstrap port")
    );
    let no_encode = [&epd[..1], &epd[6..]].concat();
    assert!(parse(&no_encode).unwrap_err().contains("--encode"));
    let with_both = [
        &epd[..],
        &[
            "--prefill-max-inflight-requests-per-worker",
            "2",
            "--priority-scheduler-enabled",
        ],
    ]
    .concat();
    // Admission and priority classes compose in EPD as in PD.
    let both = parse(&with_both).unwrap();
    assert!(both.admission.unwrap().priorities.is_some());
}

#[test]
fn priority_classes_order_admission_else_the_limiter() {
    use pdrouter_admission::Priority;
    let pd = [
        "--pd-disaggregation",
        "--prefill",
        "http://p:1",
        "--decode",
        "http://d:1",
        "--max-concurrent-requests",
        "8",
        "--queue-size",
        "7",
    ];
    let with_admission = [
        &pd[..],
        &[
            "--prefill-max-inflight-requests-per-worker",
            "1",
            "--prefill-queue-size",
            "9",
            "--priority-scheduler-enabled",
            "--priority-scheduler-default-max-class",
            "interactive",
        ],
    ]
    .concat();
    let cfg = parse(&with_admission).unwrap();
    let classes = cfg
        .admission
        .unwrap()
        .priorities
        .expect("admission ordered");
    assert_eq!(
        classes.get(Priority::Bulk).queue_size,
        9,
        "the admission flag"
    );
    assert_eq!(
        cfg.limiter.unwrap().priorities,
        None,
        "the limiter stays one FIFO"
    );
    let p = cfg.priority.unwrap();
    assert_eq!(p.default_max_class, Priority::Interactive);
    assert_eq!(p.tenant_header, None, "not trusted");
    let limiter_only = parse(
        &[
            &pd[..],
            &["--priority-scheduler-enabled", "--trust-tenant-header"],
        ]
        .concat(),
    )
    .unwrap();
    let classes = limiter_only
        .limiter
        .unwrap()
        .priorities
        .expect("limiter ordered");
    assert_eq!(
        classes.get(Priority::System).queue_size,
        7,
        "the limiter flag"
    );
    assert_eq!(
        limiter_only
            .priority
            .unwrap()
            .tenant_header
            .unwrap()
            .as_str(),
        "x-smg-tenant-id"
    );
    assert!(parse(&pd).unwrap().priority.is_none());
}

#[test]
fn admission_flags_parse() {
    let args = [
        &PD_ADMISSION[..7],
        &[
            "--prefill-queue-size",
            "4",
            "--prefill-queue-timeout-secs",
            "30",
        ],
    ]
    .concat();
    let a = parse(&args).unwrap().admission.unwrap();
    assert_eq!((a.max_inflight_per_worker, a.queue_size), (1, 4));
    assert_eq!(a.queue_timeout, Duration::from_secs(30));
}

#[test]
fn auto_limits_are_refused_with_an_admission_store() {
    let store = ["--admission-store", "redis://127.0.0.1:6379"];
    let requests = ["--prefill-max-inflight-requests-per-worker", "auto"];
    let tokens = [
        "--prefill-max-inflight-requests-per-worker",
        "4",
        "--prefill-max-inflight-tokens-per-worker",
        "auto",
    ];
    for limits in [&requests[..], &tokens[..]] {
        let args = [&PD_ADMISSION[..5], limits, &store[..]].concat();
        let err = parse(&args).unwrap_err();
        assert!(err.contains("not auto"), "{err}");
    }
}

#[test]
fn auto_limits_parse() {
    let args = [
        &PD_ADMISSION[..5],
        &[
            "--prefill-max-inflight-requests-per-worker",
            "AUTO",
            "--prefill-limit-min",
            "2",
            "--prefill-limit-max",
            "12",
        ],
    ]
    .concat();
    let a = parse(&args).unwrap().admission.unwrap();
    assert_eq!(a.max_inflight_per_worker, 2);
    assert_eq!(
        a.auto,
        Some(crate::config::AutoConfig {
            unit: crate::config::Unit::Requests,
            min: 2,
            max: 12
        })
    );
    let tokens = [
        &PD_ADMISSION[..5],
        &["--prefill-max-inflight-tokens-per-worker", "auto"],
    ]
    .concat();
    let t = parse(&tokens).unwrap().admission.unwrap();
    assert_eq!(t.auto.map(|a| a.unit), Some(crate::config::Unit::Tokens));
    for bad in ["automatic", "1.5", ""] {
        let args = [
            &PD_ADMISSION[..5],
            &["--prefill-max-inflight-requests-per-worker", bad],
        ]
        .concat();
        let err = parse(&args).unwrap_err();
        assert!(
            err.contains("must be between 1 and 100000, got") && err.ends_with(", or auto"),
            "{bad}: {err}"
        );
    }
}

const PD_ADMISSION: &[&str] = &[
    "--pd-disaggregation",
    "--prefill",
    "http://p:1",
    "--decode",
    "http://d:1",
    "--prefill-max-inflight-requests-per-worker",
    "1",
    "--prefill-queue-size",
    "0",
    "--max-concurrent-requests",
    "1",
    "--queue-size",
    "0",
];

/// PD with admission on, and `flag=value` instead of any base setting of that flag.
fn parse_with(flag: &str, value: &str) -> Result<Config, String> {
    let mut args: Vec<&str> = Vec::new();
    let mut base = PD_ADMISSION.iter();
    while let Some(&a) = base.next() {
        if a == flag {
            base.next();
        } else {
            args.push(a);
        }
    }
    let arg = format!("{flag}={value}");
    if flag.starts_with("--admission-store-") {
        args.push("--admission-store=redis://127.0.0.1:6379");
    }
    args.push(&arg);
    // The bounds of an auto limit need one (the token budget's, whose range is theirs).
    if flag.starts_with("--prefill-limit-") {
        args.push("--prefill-max-inflight-tokens-per-worker=auto");
    }
    parse(&args)
}

#[test]
fn every_numeric_flag_states_its_range_in_its_help() {
    use clap::CommandFactory;
    let cli = Cli::command();
    let launch = cli.find_subcommand("launch").unwrap();
    let text = [
        "host",
        "api_key",
        "worker_urls",
        "prefill",
        "decode",
        "encode",
        "policy",
        "prefill_policy",
        "decode_policy",
        "encode_policy",
        "health_check_endpoint",
        "prometheus_host",
        "log_level",
        "tokenizer_path",
        "model_path",
        "runtime",
        "kv_connector",
        "chat_template",
        "request_id_headers",
        "cors_allowed_origins",
        "tls_cert_path",
        "tls_key_path",
        "control_plane_api_keys",
        "log_dir",
        "otlp_traces_endpoint",
        "assignment_mode",
        "model_alias",
        "admission_store",
        "admission_group",
        "admission_store_fallback",
        "priority_scheduler_default_max_class",
        "priority_scheduler_config",
        "tenant_header_name",
        "tool_call_parser",
        "reasoning_parser",
        "selector",
        "prefill_selector",
        "decode_selector",
        "encode_selector",
        // A port checked with the discovery flags (their rules come first).
        "service_discovery_port",
        "service_discovery_namespace",
    ];
    let mut seen = 0;
    for arg in launch.get_arguments() {
        let (Some(long), true) = (arg.get_long(), arg.get_action().takes_values()) else {
            continue;
        };
        if text.contains(&arg.get_id().as_str()) {
            continue;
        }
        let flag = format!("--{long}");
        let range =
            flag_range(&flag).unwrap_or_else(|| panic!("{flag} takes a value but has no range"));
        let help = arg.get_help().map(ToString::to_string).unwrap_or_default();
        assert!(
            help.contains(&range.text()),
            "{flag}: help '{help}' does not state {}",
            range.text()
        );
        seen += 1;
    }
    assert_eq!(
        seen,
        crate::config::FLAG_RANGES.len(),
        "a range without a flag"
    );
}

#[test]
fn each_range_is_inclusive_and_one_step_outside_is_one_line_naming_it() {
    for r in crate::config::FLAG_RANGES {
        let with = |v: String| parse_with(r.flag, &v);
        for inside in [r.min, r.max] {
            if let Err(e) = with(inside.to_string()) {
                panic!("{} {inside}: {e}", r.flag);
            }
        }
        let step = if r.max <= 1.0 { 0.5 } else { 1.0 };
        for outside in [r.min - step, r.max + step] {
            if (r.flag == "--prefill-max-inflight-requests-per-worker"
                || r.flag == "--max-concurrent-requests")
                && outside <= 0.0
            {
                continue; // turns admission (the limiter) off, a valid setting
            }
            let err = with(outside.to_string()).unwrap_err();
            let want = format!("{} must be between {} and {}", r.flag, r.min, r.max);
            assert!(err.starts_with(&want), "{} {outside}: {err}", r.flag);
            assert!(!err.contains('\n'), "{err}");
        }
    }
}

#[test]
fn values_beyond_the_flag_type_are_one_line_naming_the_range() {
    for (flag, value) in [
        ("--request-timeout-secs", "18446744073709551616"),
        ("--prefill-queue-timeout-secs", "99999999999999999999"),
        ("--cb-timeout-duration-secs", "-1"),
        ("--retry-max-retries", "lots"),
        ("--port", "70000"),
    ] {
        let err = parse_with(flag, value).unwrap_err();
        let range = flag_range(flag).unwrap();
        assert_eq!(err, range.error(format!("'{value}'")).0);
    }
    for (flag, value) in [
        ("--retry-backoff-multiplier", "NaN"),
        ("--cache-threshold", "inf"),
    ] {
        let err = parse_with(flag, value).unwrap_err();
        assert!(err.starts_with(&format!("{flag} must be between")), "{err}");
    }
}

#[test]
fn connection_limits_parse_with_their_defaults() {
    let w = ["--worker-urls", "http://x:1"];
    let c = parse(&w).unwrap();
    assert_eq!(c.client_header_timeout, Duration::from_secs(30));
    assert_eq!(c.max_connections, 32_768);
    let c = parse(&[
        w[0],
        w[1],
        "--client-header-timeout-secs",
        "5",
        "--max-connections",
        "10",
    ])
    .unwrap();
    assert_eq!(c.client_header_timeout, Duration::from_secs(5));
    assert_eq!(c.max_connections, 10);
}

#[test]
fn encode_policy_defaults_to_consistent_hashing_and_refuses_prompt_policies() {
    let epd = [
        "--epd-disaggregation",
        "--encode",
        "grpc://e:1",
        "--prefill",
        "grpc://p:1",
        "--decode",
        "grpc://d:1",
    ];
    let c = parse(&epd).unwrap();
    assert_eq!(c.encode_policy, PolicyKind::ConsistentHashing);
    let args = [&epd[..], &["--encode-policy", "power_of_two"]].concat();
    assert_eq!(parse(&args).unwrap().encode_policy, PolicyKind::PowerOfTwo);
    for bad in ["prefix_hash", "bucket", "nope"] {
        let args = [&epd[..], &["--encode-policy", bad]].concat();
        let err = parse(&args).unwrap_err();
        assert!(err.contains("--encode-policy"), "{err}");
    }
    // Outside EPD there is nothing for it to choose: refused, not ignored.
    let args = ["--worker-urls", "http://w:1", "--encode-policy", "random"];
    assert!(
        parse(&args)
            .unwrap_err()
            .contains("needs --epd-disaggregation")
    );
}

#[test]
fn image_flags_parse_into_the_image_limits() {
    let w = ["--worker-urls", "http://x:1"];
    let c = parse(&w).unwrap();
    assert_eq!(c.images, crate::config::ImageConfig::default());
    assert_eq!(c.images.max_bytes, 20 * 1024 * 1024);
    assert_eq!(c.images.max_pixels, 1 << 25);
    assert_eq!(c.images.fetch_timeout, Duration::from_secs(10));
    assert!(!c.images.allow_private_urls);
    let c = parse(&[
        w[0],
        w[1],
        "--max-image-bytes",
        "1000",
        "--max-image-pixels",
        "4096",
        "--image-fetch-timeout-secs",
        "3",
        "--allow-private-image-urls",
    ])
    .unwrap();
    assert_eq!(c.images.max_bytes, 1000);
    assert_eq!(c.images.max_pixels, 4096);
    assert_eq!(c.images.fetch_timeout, Duration::from_secs(3));
    assert!(c.images.allow_private_urls);
}

#[test]
fn smg_spellings_and_new_flags_parse() {
    let w = ["--worker-urls", "http://x:1"];
    let c = parse(&[w[0], w[1], "--eviction-interval", "30"]).unwrap();
    assert_eq!(c.eviction_interval, Duration::from_secs(30));
    let c = parse(&[
        w[0],
        w[1],
        "--policy",
        "manual",
        "--assignment-mode",
        "min_group",
        "--max-idle-secs",
        "60",
        "--prefix-token-count",
        "8",
        "--prefix-hash-load-factor",
        "2",
        "--max-concurrent-requests",
        "4",
        "--rate-limit-tokens-per-second",
        "10",
        "--model-alias",
        "a=m",
        "--model-alias",
        "b = m",
        "--worker-startup-timeout-secs",
        "5",
    ])
    .unwrap();
    assert_eq!(c.policy, PolicyKind::Manual);
    assert_eq!(c.manual.assignment_mode, AssignmentMode::MinGroup);
    assert_eq!(c.manual.max_idle_secs, 60);
    assert_eq!(c.prefix_hash.prefix_token_count, 8);
    let l = c.limiter.unwrap();
    assert_eq!((l.max_concurrent, l.queue_size), (4, 100));
    assert_eq!(l.queue_timeout, Duration::from_secs(60));
    assert_eq!(l.tokens_per_second, Some(10.0));
    assert_eq!(c.model_aliases[1], ("b".to_string(), "m".to_string()));
    assert_eq!(c.resolve_model("a"), "m");
    assert_eq!(c.resolve_model("m"), "m");
    let wait = c.startup_wait.unwrap();
    assert_eq!(wait.timeout, Duration::from_secs(5));
    assert_eq!(wait.check_interval, Duration::from_secs(30));
    assert!(parse(&w).unwrap().limiter.is_none());
    assert!(parse(&w).unwrap().startup_wait.is_none());
    // --model-path is accepted with http:// workers (prefix_hash's tokenizer).
    assert!(parse(&[w[0], w[1], "--model-path", "/m"]).is_ok());
}

#[test]
fn bad_new_flags_name_the_flag() {
    let w = ["--worker-urls", "http://x:1"];
    for (extra, needle) in [
        (&["--assignment-mode", "sticky"][..], "--assignment-mode"),
        (
            &["--queue-size", "5"][..],
            "positive --max-concurrent-requests",
        ),
        (
            &["--rate-limit-tokens-per-second", "5"][..],
            "positive --max-concurrent-requests",
        ),
        (
            &[
                "--max-concurrent-requests",
                "2",
                "--queue-timeout-secs",
                "0",
            ][..],
            "--queue-timeout-secs 0",
        ),
        (&["--model-alias", "nodelimiter"][..], "ALIAS=MODEL"),
        (&["--model-alias", "a=a"][..], "two different"),
        (
            &["--model-alias", "a=m", "--model-alias", "a=n"][..],
            "twice",
        ),
        (&["--chat-template", "/t.jinja"][..], "--chat-template"),
    ] {
        let err = parse(&[&w[..], extra].concat()).unwrap_err();
        assert!(err.contains(needle), "{extra:?}: {err}");
    }
}

#[test]
fn chat_parsers_are_named_and_only_for_grpc_workers() {
    use pdrouter_parsers::{ReasoningKind, ToolKind};
    let grpc = ["--worker-urls", "grpc://w:1"];
    let c = parse(&[&grpc[..], &["--tool-call-parser", "qwen"]].concat()).unwrap();
    assert_eq!(c.chat_parsers.tool, Some(ToolKind::Qwen));
    assert_eq!(c.chat_parsers.reasoning, None);
    let c = parse(&[&grpc[..], &["--reasoning-parser", "deepseek_r1"]].concat()).unwrap();
    assert_eq!(c.chat_parsers.reasoning, Some(ReasoningKind::DeepSeekR1));
    let e = parse(&[&grpc[..], &["--tool-call-parser", "bogus"]].concat()).unwrap_err();
    assert!(e.contains("bogus") && e.contains("qwen_xml"), "{e}");
    let e = parse(&[&grpc[..], &["--reasoning-parser", "think"]].concat()).unwrap_err();
    assert!(e.contains("deepseek_r1"), "{e}");
    let http = ["--worker-urls", "http://w:1"];
    let e = parse(&[&http[..], &["--tool-call-parser", "qwen"]].concat()).unwrap_err();
    assert!(
        e.starts_with("--tool-call-parser applies to grpc://"),
        "{e}"
    );
    let e = parse(&[&http[..], &["--reasoning-parser", "qwen3"]].concat()).unwrap_err();
    assert!(e.starts_with("--reasoning-parser"), "{e}");
}
