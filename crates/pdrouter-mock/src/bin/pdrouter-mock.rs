//! `pdrouter-mock`: a mock SGLang-style worker (see the library docs).

use std::process::ExitCode;

use pdrouter_mock::CliError;

// In the benchmarks every mock shares one core with the load generator, and that core sets the
// load the router sees: with glibc's malloc about a tenth of a mock's CPU went to allocating
// (perf), jemalloc's thread caches cost a fraction of that.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    // The mock prints nothing through `tracing`. Without a subscriber set, though, every span
    // of hyper and h2 falls back to the `log` crate (the workspace enables tracing's `log`
    // feature), a few thousand instructions per request on the benchmarks' fleet core; with
    // this one every callsite is disabled once, at registration.
    let _ = tracing::subscriber::set_global_default(tracing::subscriber::NoSubscriber::default());
    match pdrouter_mock::run_cli(std::env::args()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Args(e)) => e.exit(),
        Err(e) => {
            eprintln!("pdrouter-mock: {e}");
            ExitCode::FAILURE
        }
    }
}
