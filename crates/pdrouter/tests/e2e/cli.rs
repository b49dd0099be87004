//! The `pdrouter` binary: startup validation exits, help, graceful shutdown and restart.

use std::process::{Child, Command};
use std::time::Duration;

use crate::support::*;

fn pdrouter() -> Command {
    Command::new(env!("CARGO_BIN_EXE_pdrouter"))
}

fn fails_with(args: &[&str], needle: &str) {
    let out = pdrouter().arg("launch").args(args).output().unwrap();
    assert!(!out.status.success(), "{args:?} should fail");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(needle), "{args:?}: stderr was {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn invalid_configurations_exit_non_zero_naming_the_problem() {
    let pd = [
        "--pd-disaggregation",
        "--prefill",
        "http://127.0.0.1:1",
        "--decode",
        "http://127.0.0.1:2",
    ];
    fails_with(
        &["--pd-disaggregation", "--decode", "http://127.0.0.1:2"],
        "--prefill",
    );
    fails_with(
        &["--pd-disaggregation", "--prefill", "http://127.0.0.1:2"],
        "--decode",
    );
    fails_with(&["--worker-urls", "localhost:8000"], "http://");
    fails_with(
        &["--worker-urls", "http://127.0.0.1:1", "--port", "65536"],
        "--port",
    );
    fails_with(
        &["--worker-urls", "http://127.0.0.1:1", "--policy", "best"],
        "--policy",
    );
    fails_with(
        &[&pd[..], &["--prefill-policy", "nope"]].concat(),
        "--prefill-policy",
    );
    fails_with(
        &[&pd[..], &["--encode-policy", "nope"]].concat(),
        "--encode-policy",
    );
    fails_with(
        &[
            "--worker-urls",
            "http://127.0.0.1:1",
            "--prefill-queue-size",
            "5",
        ],
        "--prefill-queue-size",
    );
    fails_with(
        &[
            "--worker-urls",
            "http://127.0.0.1:1",
            "--prefill-max-inflight-requests-per-worker",
            "1",
        ],
        "PD mode",
    );
    for bad in ["0", "-3", "1000000001", "many"] {
        fails_with(
            &[&pd[..], &["--prefill-max-inflight-tokens-per-worker", bad]].concat(),
            "--prefill-max-inflight-tokens-per-worker",
        );
    }
    fails_with(
        &[
            "--worker-urls",
            "http://127.0.0.1:1",
            "--prefill-max-inflight-tokens-per-worker",
            "4096",
        ],
        "PD mode",
    );
    for (args, want) in [
        (
            &["--prefill-max-inflight-requests-per-worker", "sometimes"][..],
            "--prefill-max-inflight-requests-per-worker",
        ),
        (
            &[
                "--prefill-max-inflight-requests-per-worker",
                "auto",
                "--prefill-max-inflight-tokens-per-worker",
                "auto",
            ],
            "auto sizes one Prefill limit",
        ),
        (
            &["--prefill-limit-max", "8"],
            "bound a limit sized at run time",
        ),
        (
            &[
                "--prefill-max-inflight-requests-per-worker",
                "auto",
                "--prefill-limit-min",
                "9",
                "--prefill-limit-max",
                "8",
            ],
            "--prefill-limit-min 9 is above --prefill-limit-max 8",
        ),
        (
            &[
                "--prefill-max-inflight-tokens-per-worker",
                "auto",
                "--prefill-limit-min",
                "0",
            ],
            "--prefill-limit-min must be between 1 and 1000000000",
        ),
    ] {
        fails_with(&[&pd[..], args].concat(), want);
    }
    fails_with(
        &[
            &pd[..],
            &[
                "--prefill-max-inflight-requests-per-worker",
                "1",
                "--prefill-queue-timeout-secs",
                "0",
            ],
        ]
        .concat(),
        "--prefill-queue-timeout-secs 0",
    );
    fails_with(
        &[&pd[..], &["--prefill", "http://127.0.0.1:3", "notaport"]].concat(),
        "bootstrap port",
    );
}

/// Priority classes: a bad file, an unknown class name or a flag that would have no effect
/// exits 2 with one line naming the problem.
#[test]
fn bad_priority_settings_exit_2_naming_the_problem() {
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: &str| {
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        path.to_str().unwrap().to_string()
    };
    let malformed = file("malformed.yaml", "classes: [1, 2\n");
    let unknown_class = file("class.yaml", "classes:\n  urgent:\n    queue_size: 1\n");
    let unknown_key = file("key.yaml", "classes:\n  bulk:\n    queue_sise: 1\n");
    let tenants = file(
        "tenants.yaml",
        "tenant_policies:\n  \"header:a\":\n    max_class: system\n",
    );
    let limited = [
        "--worker-urls",
        "http://127.0.0.1:1",
        "--max-concurrent-requests",
        "4",
    ];
    let on = [&limited[..], &["--priority-scheduler-enabled"]].concat();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec![
                "--worker-urls",
                "http://127.0.0.1:1",
                "--priority-scheduler-enabled",
            ],
            "orders a wait queue, and none is on",
        ),
        (
            [&on[..], &["--priority-scheduler-config", &malformed]].concat(),
            "not a valid priority scheduler file",
        ),
        (
            [&on[..], &["--priority-scheduler-config", &unknown_class]].concat(),
            "'urgent' is not a priority class",
        ),
        (
            [&on[..], &["--priority-scheduler-config", &unknown_key]].concat(),
            "unknown field `queue_sise`",
        ),
        (
            [
                &on[..],
                &["--priority-scheduler-config", "/nonexistent.yaml"],
            ]
            .concat(),
            "cannot read it",
        ),
        (
            [&on[..], &["--priority-scheduler-config", &tenants]].concat(),
            "need --trust-tenant-header",
        ),
        (
            [&on[..], &["--priority-scheduler-default-max-class", "vip"]].concat(),
            "'vip' is not a priority class",
        ),
        (
            [&on[..], &["--tenant-header-name", "x-team"]].concat(),
            "--tenant-header-name needs --trust-tenant-header",
        ),
        (
            [
                &on[..],
                &[
                    "--trust-tenant-header",
                    "--tenant-header-name",
                    "bad header",
                ],
            ]
            .concat(),
            "not a valid HTTP header name",
        ),
        (
            [
                &limited[..],
                &["--priority-scheduler-default-max-class", "bulk"],
            ]
            .concat(),
            "--priority-scheduler-default-max-class needs --priority-scheduler-enabled",
        ),
        (
            [
                &limited[..],
                &["--priority-scheduler-tenant-metric-top-n", "8"],
            ]
            .concat(),
            "--priority-scheduler-tenant-metric-top-n is not supported",
        ),
    ];
    for (args, needle) in cases {
        let out = pdrouter().arg("launch").args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: stderr was {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
}

#[test]
fn help_is_grouped() {
    let out = pdrouter().args(["launch", "--help"]).output().unwrap();
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for heading in [
        "Workers:",
        "Policies:",
        "Prefill admission:",
        "Retries:",
        "Circuit breaker:",
        "Health checks:",
    ] {
        assert!(help.contains(heading), "missing {heading}");
    }
    assert!(help.contains("--prefill-max-inflight-requests-per-worker"));
}

#[tokio::test]
async fn sigterm_finishes_in_flight_requests_and_the_port_is_reusable_at_once() {
    let w = mock(Role::Regular, 800).await;
    let url = w.url();
    // The router's port stays reserved between the two runs, so nobody else can take it.
    let reserved = PortReservation::new().unwrap();
    let port = reserved.port().to_string();
    let args = [
        "--worker-urls",
        url.as_str(),
        "--disable-health-check",
        "--port",
        port.as_str(),
    ];
    let (mut child, addr) = launch_binary(&args, &[]);
    let sock: std::net::SocketAddr = addr.parse().unwrap();
    assert_eq!(sock, reserved.addr());
    let inflight = tokio::spawn(async move { post(sock, "/v1/completions", COMPLETION).await });
    assert!(eventually(Duration::from_secs(5), || w.stats().inflight == 1).await);
    sigterm(&child);
    let reply = inflight.await.unwrap();
    assert_eq!(
        reply.status, 200,
        "in-flight request finished during the grace period"
    );
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success(), "{status:?}");

    // Restart on the very same port.
    let (mut child, addr2) = launch_binary(&args, &[]);
    assert_eq!(addr2, addr);
    let reply = post(
        addr2.parse().unwrap(),
        "/v1/completions",
        r#"{"prompt":"y"}"#,
    )
    .await;
    assert_eq!(reply.status, 200);
    sigterm(&child);
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success());
}

#[tokio::test]
async fn a_client_that_hangs_up_before_the_answer_is_logged_at_debug() {
    use tokio::io::AsyncWriteExt;
    let w = mock(Role::Regular, 60_000).await;
    let url = w.url();
    let args = [
        "--worker-urls",
        url.as_str(),
        "--disable-health-check",
        "--log-level",
        "debug",
    ];
    let (mut child, addr) = launch_binary_with(&args, &[], std::process::Stdio::piped());
    let mut client = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let request = format!(
        "POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
         content-length: {}\r\n\r\n{COMPLETION}",
        COMPLETION.len()
    );
    client.write_all(request.as_bytes()).await.unwrap();
    assert!(eventually(Duration::from_secs(5), || w.stats().inflight == 1).await);
    drop(client);
    // The router gives up the upstream request too.
    assert!(eventually(Duration::from_secs(5), || w.stats().inflight == 0).await);
    sigterm(&child);
    let log = log_until_exit(&mut child);
    assert!(
        log.contains("client went away before the response"),
        "{log}"
    );
}

/// Starts the binary through `sh` so that `limits` (a `ulimit` command) applies to it, waits
/// until it listens, and returns its open-file limits (soft, hard) and what it logged.
#[cfg(target_os = "linux")]
fn launched_with_limits(limits: &str, extra: &[&str]) -> ((u64, u64), String) {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    let script = format!(r#"{limits} 2>/dev/null; exec "$0" "$@""#);
    let mut child = Command::new("sh")
        .args(["-c", &script, env!("CARGO_BIN_EXE_pdrouter"), "launch"])
        .args([
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--prometheus-port",
            "0",
            "--disable-health-check",
            "--pd-disaggregation",
            "--prefill",
            "http://127.0.0.1:1",
            "--decode",
            "http://127.0.0.1:2",
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("listening"), "{line}");
    let text = std::fs::read_to_string(format!("/proc/{}/limits", child.id())).unwrap();
    let row = text
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let nums: Vec<u64> = row
        .split_whitespace()
        .filter_map(|t| t.parse().ok())
        .collect();
    child.kill().unwrap();
    ((nums[0], nums[1]), log_until_exit(&mut child))
}

/// Everything a child with piped stderr logs until it exits.
fn log_until_exit(child: &mut Child) -> String {
    use std::io::Read;
    let mut log = String::new();
    if let Some(mut stderr) = child.stderr.take() {
        stderr.read_to_string(&mut log).unwrap();
    }
    child.wait().unwrap();
    log
}

#[cfg(target_os = "linux")]
#[test]
fn open_files_soft_limit_is_raised_and_a_too_low_one_is_reported() {
    // Soft limit lowered below the hard one: the router raises it back.
    let ((soft, hard), log) = launched_with_limits("ulimit -S -n 512", &[]);
    assert_eq!(soft, hard, "soft open-file limit raised to the hard one");
    assert!(!log.contains("open-file limit"), "{log}");
    // Hard limit below what a full queue (100 by default) needs: told at startup.
    let ((soft, _), log) = launched_with_limits(
        "ulimit -n 300",
        &["--prefill-max-inflight-requests-per-worker", "1"],
    );
    assert!(soft <= 300);
    assert!(log.contains("open-file limit is too low"), "{log}");
}

/// Flags without a subcommand are `launch`'s (as SMG runs `launch` by default); `--help`
/// still shows the top-level help; `--model-path` is accepted with http:// workers.
#[tokio::test]
async fn launch_is_the_default_subcommand() {
    let help = pdrouter().arg("--help").output().unwrap();
    assert!(help.status.success());
    let text = String::from_utf8_lossy(&help.stdout);
    assert!(text.contains("launch") && text.contains("demo"), "{text}");
    let w = mock(Role::Regular, 0).await;
    let mut child = pdrouter()
        .args([
            "--worker-urls",
            &w.url(),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
        ])
        .args(["--prometheus-port", "0", "--disable-health-check"])
        // SMG command lines name a hub model; only prefix_hash would load it.
        .args(["--model-path", "meta-llama/Llama-3.1-8B-Instruct"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let addr = listening_addr(&mut child);
    let reply = post(addr.parse().unwrap(), "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    sigterm(&child);
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
    assert!(status.success());
}

/// Every SMG flag pdrouter deliberately does not take exits 2 with one line naming it, saying
/// it is not supported and what to use instead; with or without `launch`, `--flag=value` too.
#[test]
fn unsupported_smg_flags_exit_2_saying_what_to_use_instead() {
    for (flag, instead) in pdrouter::cli::UNSUPPORTED_FLAGS {
        for args in [
            vec!["launch", "--worker-urls", "http://127.0.0.1:1", flag],
            vec!["--worker-urls", "http://127.0.0.1:1", flag],
            vec![
                Box::leak(format!("{flag}=x").into_boxed_str()) as &str,
                "--worker-urls",
                "http://127.0.0.1:1",
            ],
        ] {
            let out = pdrouter().args(&args).output().unwrap();
            assert_eq!(out.status.code(), Some(2), "{args:?}");
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains(&format!("{flag} is not supported: {instead}")),
                "{args:?}: {err}"
            );
        }
    }
}

/// `--worker-startup-timeout-secs`: the router waits for its workers and exits non-zero,
/// naming them, when they are not ready in time.
#[test]
fn workers_not_ready_within_the_startup_timeout_fail_startup() {
    let dead = dead_url();
    let url = format!("http://{}", dead.addr());
    let started = tokio::time::Instant::now();
    let out = pdrouter()
        .args(["--worker-urls", &url, "--host", "127.0.0.1", "--port", "0"])
        .args(["--prometheus-port", "0"])
        .args(["--worker-startup-timeout-secs", "1"])
        .args(["--worker-startup-check-interval", "1"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(started.elapsed() >= Duration::from_secs(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not ready after 1s") && err.contains(&url),
        "{err}"
    );
    assert!(!String::from_utf8_lossy(&out.stdout).contains("listening"));
}

/// With live workers the startup wait ends as soon as they are ready.
#[tokio::test]
async fn the_startup_wait_ends_when_the_workers_are_ready() {
    let w = mock(Role::Regular, 0).await;
    let args = [
        "--worker-urls".to_string(),
        w.url(),
        "--worker-startup-timeout-secs".into(),
        "60".into(),
        "--worker-startup-check-interval".into(),
        "1".into(),
    ];
    let (child, addr) = tokio::task::spawn_blocking(move || launch_binary(&args, &[]))
        .await
        .unwrap();
    let reply = post(addr.parse().unwrap(), "/v1/completions", COMPLETION).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    sigterm(&child);
    let mut child = child;
    tokio::task::spawn_blocking(move || child.wait().unwrap())
        .await
        .unwrap();
}

/// prefix_hash given a tokenizer path that holds none: the router does not start, and says
/// which flag and path in one line that names the path once.
#[test]
fn prefix_hash_with_a_path_holding_no_tokenizer_fails_startup() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().display().to_string();
    let out = pdrouter()
        .args([
            "--worker-urls",
            "http://127.0.0.1:1",
            "--policy",
            "prefix_hash",
        ])
        .args(["--model-path", &path, "--host", "127.0.0.1", "--port", "0"])
        .args(["--prometheus-port", "0", "--disable-health-check"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let line = err
        .lines()
        .find(|l| l.starts_with("error:"))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(
        line.contains("--model-path") && line.contains("no tokenizer.json"),
        "{line}"
    );
    assert_eq!(line.matches(&path).count(), 1, "{line}");
}
