//! `pdrouter-mock`: a mock SGLang-style worker (see the library docs).

use std::process::ExitCode;

use pdrouter_mock::CliError;

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
