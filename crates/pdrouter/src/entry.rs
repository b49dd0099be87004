//! The `pdrouter` command as a library function: what the binary's `main` does, callable with
//! any argv, so the binary and the Python extension (`bindings/python`) run the same command.
//!
//! [`run`] never exits the process: help, version, usage errors and failures are printed as the
//! binary prints them and come back as the exit code (0, 1, or 2 for argument errors), so an
//! embedder (a Python interpreter) can unwind normally. The process-wide choices stay with the
//! caller: the binary's allocator (jemalloc) is `main.rs`'s. `launch` installs its SIGTERM and
//! SIGINT handlers ([`shutdown_signal`](crate::app::shutdown_signal)) once the router has
//! started and before it prints `pdrouter listening on ...`, so a signal sent after that line
//! always shuts down gracefully, and one sent before it has the signal's default action.

use std::ffi::OsString;
use std::io::Write;

use crate::cli::{Cli, Command, LaunchArgs};
use crate::config::{Config, ConfigError};
use crate::telemetry::LogSettings;

/// The version `pdrouter --version` prints (this crate's).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Runs the `pdrouter` command line `args` (the first item is the program name) to its end:
/// `launch` serves until SIGTERM or Ctrl-C, `demo` until its walk-through is done. Returns
/// the process exit code.
pub fn run<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let code = run_inner(args);
    // A cdylib's stdout is not flushed at exit by Rust's runtime (the host owns the exit).
    let _ = std::io::stdout().flush();
    code
}

fn run_inner<I, T>(args: I) -> u8
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    let open_files = raise_open_files_limit();
    let cli = match Cli::parse_from(args) {
        Ok(cli) => cli,
        Err(code) => return code,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return 1;
        }
    };
    match cli.command {
        Command::Launch(args) => {
            let launch = match Launch::new(*args) {
                Ok(l) => l,
                Err(e) => {
                    eprintln!("error: {e}");
                    return 2;
                }
            };
            // The trace exporter's channel lives on the runtime.
            let _guard = match runtime.block_on(async { crate::telemetry::init(&launch.log) }) {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("error: {e}");
                    return 2;
                }
            };
            let config = launch.finish(open_files);
            let scheme = if config.edge.tls.is_some() {
                "https"
            } else {
                "http"
            };
            runtime.block_on(async move {
                match crate::start(config).await {
                    Ok(handle) => {
                        // Before the announcement: whoever reads it may signal at once.
                        let signal = crate::app::shutdown_signal();
                        println!("pdrouter listening on {scheme}://{}", handle.addr());
                        if let Some(m) = handle.metrics_addr() {
                            println!("pdrouter metrics on http://{m}/metrics");
                        }
                        handle.run_until(signal).await;
                        0
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        1
                    }
                }
            })
        }
        Command::Demo(args) => {
            let log = LogSettings {
                level: "warn".into(),
                ..Default::default()
            };
            let _guard = crate::telemetry::init(&log);
            runtime.block_on(async move {
                match crate::demo::run(args).await {
                    Ok(()) => 0,
                    Err(e) => {
                        eprintln!("error: {e}");
                        1
                    }
                }
            })
        }
    }
}

/// A `launch` command line turned into a validated configuration and its log settings, with
/// what is still to do once logging is up (warnings to log, the connection cap to fit).
#[derive(Debug)]
pub struct Launch {
    /// The router's configuration, before [`Launch::finish`] fits its connection cap.
    config: Config,
    /// What [`crate::telemetry::init`] needs.
    pub log: LogSettings,
    warnings: Vec<&'static str>,
    explicit_max_connections: bool,
}

impl Launch {
    /// Validates `args` (the error is the one line the binary prints after `error: `).
    pub fn new(args: LaunchArgs) -> Result<Self, ConfigError> {
        let log = args.telemetry.settings();
        let warnings = args.telemetry.unused();
        let explicit_max_connections = args.listener.max_connections.is_some();
        Ok(Self {
            config: args.into_config()?,
            log,
            warnings,
            explicit_max_connections,
        })
    }

    /// Logs the warnings about flags that do nothing and fits the connection cap to the
    /// open-file limit `open_files` (see [`raise_open_files_limit`]); call once logging is set
    /// up, so the warnings are seen.
    pub fn finish(self, open_files: Option<u64>) -> Config {
        let mut config = self.config;
        for warning in self.warnings {
            tracing::warn!("{warning}");
        }
        fit_connections_to_open_files(open_files, &mut config, self.explicit_max_connections);
        check_open_files(open_files, &config);
        config
    }
}

/// Every client connection, parked admission waiters included, holds a file descriptor, and
/// the usual soft limit (1024) would cap a queue of thousands long before its configured
/// size. Like most servers, raise the soft limit to the hard one. Returns the limit in force.
#[cfg(unix)]
pub fn raise_open_files_limit() -> Option<u64> {
    use rustix::process::{Resource, getrlimit, setrlimit};
    // Linux refuses an unlimited open-file limit; its default ceiling (fs.nr_open) is 2^20.
    const CEILING: u64 = 1 << 20;
    let mut limit = getrlimit(Resource::Nofile);
    let hard = limit.maximum.unwrap_or(CEILING);
    match limit.current {
        Some(soft) if soft < hard => {
            limit.current = Some(hard);
            match setrlimit(Resource::Nofile, limit) {
                Ok(()) => Some(hard),
                Err(_) => Some(soft),
            }
        }
        soft => soft,
    }
}

/// Elsewhere the limit is not known, and nothing is fitted to it.
#[cfg(not(unix))]
pub fn raise_open_files_limit() -> Option<u64> {
    None
}

/// Descriptors kept free of client connections: upstream connections, listeners, files.
const OPEN_FILES_MARGIN: u64 = 256;

/// Without `--max-connections`, lowers the default cap to what the open-file limit can hold,
/// so a flood of clients waits in the accept backlog instead of failing accepts (and starving
/// upstream connections) with "too many open files". Warns when an explicit cap cannot be
/// reached.
fn fit_connections_to_open_files(limit: Option<u64>, config: &mut Config, explicit: bool) {
    let Some(limit) = limit else { return };
    let room = limit.saturating_sub(OPEN_FILES_MARGIN).max(1);
    if config.max_connections as u64 <= room {
        return;
    }
    if explicit {
        tracing::warn!(
            open_files_limit = limit,
            max_connections = config.max_connections,
            "--max-connections is above what the open-file limit holds: past about {room} \
             connections, accepting fails (and is retried) instead of new connections waiting \
             in the backlog; raise the limit (ulimit -n) or lower --max-connections"
        );
    } else {
        config.max_connections = room as usize;
        // The documented default, so only at debug.
        tracing::debug!(
            open_files_limit = limit,
            max_connections = room,
            "default connection cap lowered to fit the open-file limit"
        );
    }
}

/// Warns when the open-file limit cannot hold a full admission queue (each waiter is a client
/// connection) plus a margin for in-flight requests, upstream connections and listeners.
fn check_open_files(limit: Option<u64>, config: &Config) {
    if let (Some(limit), Some(admission)) = (limit, &config.admission) {
        let wanted = admission.queue_size as u64 + OPEN_FILES_MARGIN;
        if limit < wanted {
            tracing::warn!(
                open_files_limit = limit,
                prefill_queue_size = admission.queue_size,
                "the open-file limit is too low for a full admission queue; raise it \
                 (ulimit -n) to at least {wanted} or lower --prefill-queue-size"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_connections: usize) -> Config {
        let mut c = Config::with_workers(crate::config::Mode::Regular, vec![]);
        c.max_connections = max_connections;
        c
    }

    #[test]
    fn the_default_connection_cap_fits_the_open_file_limit() {
        let mut c = config(32_768);
        fit_connections_to_open_files(Some(20_000), &mut c, false);
        assert_eq!(c.max_connections, 20_000 - 256);
        let mut c = config(32_768);
        fit_connections_to_open_files(Some(100), &mut c, false);
        assert_eq!(c.max_connections, 1);
        // An explicit cap is kept (and warned about); one that fits is left alone.
        let mut c = config(50_000);
        fit_connections_to_open_files(Some(20_000), &mut c, true);
        assert_eq!(c.max_connections, 50_000);
        let mut c = config(1_000);
        fit_connections_to_open_files(Some(20_000), &mut c, false);
        assert_eq!(c.max_connections, 1_000);
        fit_connections_to_open_files(None, &mut c, false);
        assert_eq!(c.max_connections, 1_000);
    }

    #[test]
    fn argument_errors_are_exit_code_two_without_exiting() {
        // clap's usage error, then one of the configuration's: both return (the test goes on).
        assert_eq!(run(["pdrouter", "--no-such-flag"]), 2);
        let bad_policy = [
            "pdrouter",
            "--worker-urls",
            "http://127.0.0.1:1",
            "--policy",
            "nope",
        ];
        assert_eq!(run(bad_policy), 2);
    }
}
