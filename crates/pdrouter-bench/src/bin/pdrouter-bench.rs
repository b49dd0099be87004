//! `pdrouter-bench`: load generator and TTFT plotter (see the library docs).

use std::process::ExitCode;

// The load generator shares one core with the mock workers in the benchmarks; jemalloc's thread
// caches leave more of that core to the load than glibc's malloc does.
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> ExitCode {
    match pdrouter_bench::run_cli(std::env::args()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Ok(clap_error)) => clap_error.exit(),
        Err(Err(message)) => {
            eprintln!("pdrouter-bench: {message}");
            ExitCode::FAILURE
        }
    }
}
