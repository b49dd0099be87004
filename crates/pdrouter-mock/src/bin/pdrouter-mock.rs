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
    match pdrouter_mock::run_cli(std::env::args()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(CliError::Args(e)) => e.exit(),
        Err(e) => {
            eprintln!("pdrouter-mock: {e}");
            ExitCode::FAILURE
        }
    }
}
