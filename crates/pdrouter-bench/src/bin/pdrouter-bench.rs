//! `pdrouter-bench`: load generator and TTFT plotter (see the library docs).

use std::process::ExitCode;

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
