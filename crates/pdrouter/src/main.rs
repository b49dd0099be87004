//! `pdrouter` binary: parse the command line, set up logging, run, map failure to an exit code.

use pdrouter::cli::{Cli, Command};

// jemalloc with a background purge thread hands the memory of a drained admission queue back
// to the OS (glibc keeps it); see bench/queue_memory.py.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn tune_allocator() {
    // Best effort: a failure only means freed memory is returned later.
    let _ = tikv_jemalloc_ctl::background_thread::write(true);
}

/// Every client connection, parked admission waiters included, holds a file descriptor, and
/// the usual soft limit (1024) would cap a queue of thousands long before its configured
/// size. Like most servers, raise the soft limit to the hard one. Returns the limit in force.
#[cfg(unix)]
fn raise_open_files_limit() -> Option<u64> {
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

#[cfg(not(unix))]
fn raise_open_files_limit() -> Option<u64> {
    None
}

/// Descriptors kept free of client connections: upstream connections, listeners, files.
const OPEN_FILES_MARGIN: u64 = 256;

/// Without `--max-connections`, lowers the default cap to what the open-file limit can hold,
/// so a flood of clients waits in the accept backlog instead of failing accepts (and starving
/// upstream connections) with "too many open files". Warns when an explicit cap cannot be
/// reached.
fn fit_connections_to_open_files(
    limit: Option<u64>,
    config: &mut pdrouter::Config,
    explicit: bool,
) {
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
fn check_open_files(limit: Option<u64>, config: &pdrouter::Config) {
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

fn main() -> std::process::ExitCode {
    tune_allocator();
    let open_files = raise_open_files_limit();
    let cli = Cli::parse_from_env();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match cli.command {
        Command::Launch(args) => {
            let log = args.telemetry.settings();
            let unused = args.telemetry.unused();
            let explicit_max_connections = args.listener.max_connections.is_some();
            let mut config = match args.into_config() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    return std::process::ExitCode::from(2);
                }
            };
            // The trace exporter's channel lives on the runtime.
            let _guard = match runtime.block_on(async { pdrouter::telemetry::init(&log) }) {
                Ok(g) => g,
                Err(e) => {
                    eprintln!("error: {e}");
                    return std::process::ExitCode::from(2);
                }
            };
            for warning in unused {
                tracing::warn!("{warning}");
            }
            fit_connections_to_open_files(open_files, &mut config, explicit_max_connections);
            check_open_files(open_files, &config);
            let scheme = if config.edge.tls.is_some() {
                "https"
            } else {
                "http"
            };
            runtime.block_on(async move {
                match pdrouter::start(config).await {
                    Ok(handle) => {
                        println!("pdrouter listening on {scheme}://{}", handle.addr());
                        if let Some(m) = handle.metrics_addr() {
                            println!("pdrouter metrics on http://{m}/metrics");
                        }
                        handle.run_until_signal().await;
                        std::process::ExitCode::SUCCESS
                    }
                    Err(e) => {
                        eprintln!("error: {e}");
                        std::process::ExitCode::FAILURE
                    }
                }
            })
        }
        Command::Demo(args) => {
            let log = pdrouter::telemetry::LogSettings {
                level: "warn".into(),
                ..Default::default()
            };
            let _guard = pdrouter::telemetry::init(&log);
            runtime.block_on(async move {
                match pdrouter::demo::run(args).await {
                    Ok(()) => std::process::ExitCode::SUCCESS,
                    Err(e) => {
                        eprintln!("error: {e}");
                        std::process::ExitCode::FAILURE
                    }
                }
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(max_connections: usize) -> pdrouter::Config {
        let mut c = pdrouter::Config::with_workers(pdrouter::config::Mode::Regular, vec![]);
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
}
