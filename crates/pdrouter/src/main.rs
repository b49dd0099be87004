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

/// Warns when the open-file limit cannot hold a full admission queue (each waiter is a client
/// connection) plus a margin for in-flight requests, upstream connections and listeners.
fn check_open_files(limit: Option<u64>, config: &pdrouter::Config) {
    const MARGIN: u64 = 256;
    if let (Some(limit), Some(admission)) = (limit, &config.admission) {
        let wanted = admission.queue_size as u64 + MARGIN;
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

/// Colour only for a person watching a terminal: a file, a pipe or a log collector gets plain
/// text, and `NO_COLOR` (any non-empty value) turns colour off everywhere.
fn use_colour() -> bool {
    use std::io::IsTerminal;
    let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
    !no_color && std::io::stderr().is_terminal()
}

fn init_logging(level: &str, json: bool) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level.replace("warning", "warn")))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(use_colour())
        .with_writer(std::io::stderr);
    if json {
        builder
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .init();
    } else {
        builder.init();
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
            let (level, json) = (args.log_level.clone(), args.log_json);
            let config = match args.into_config() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("error: {e}");
                    return std::process::ExitCode::from(2);
                }
            };
            init_logging(&level, json);
            check_open_files(open_files, &config);
            runtime.block_on(async move {
                match pdrouter::start(config).await {
                    Ok(handle) => {
                        println!("pdrouter listening on http://{}", handle.addr());
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
            init_logging("warn", false);
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
