//! Load generator and TTFT plotter for pdrouter and its mock workers.
//!
//! [`run`] drives a URL either in a closed loop (a fixed number of tasks,
//! each sending back to back over its own keep-alive connection) or in an
//! open loop (Poisson arrivals from a seeded random source, each sent at once
//! regardless of how many are outstanding). Every request is measured —
//! status, time to first byte (for server-sent events, to the first `data:`
//! chunk), end-to-end latency, and whether it is OK: a 2xx status **and** a
//! complete body (an event stream must end with `[DONE]` or a Responses API
//! completion, with no error event) — and summarised into a [`Summary`]
//! (throughput, status counts, 429 share, error rate, latency percentiles
//! over every request and over the OK ones). A run stops starting requests
//! after its duration or its request cap, whichever comes first.
//!
//! Prompts are made of words (`"w123 w7 …"`) whose count follows a fixed,
//! log-normal or Pareto distribution ([`PromptDist`]), all drawn from the
//! seed, so a run can be repeated exactly.
//!
//! [`write_csv`] writes one row per request; [`render_svg`] draws the
//! empirical CDFs of TTFT per label, by hand, as SVG.
//!
//! ```no_run
//! # async fn demo() -> Result<(), pdrouter_bench::LoadError> {
//! use std::time::Duration;
//! use pdrouter_bench::{Load, LoadOptions, run};
//! let mut opts = LoadOptions::new("http://127.0.0.1:30000");
//! opts.load = Load::Closed { concurrency: 8 };
//! opts.duration = Duration::from_secs(5);
//! let report = run(opts).await?;
//! print!("{}", report.summary.render());
//! # Ok(()) }
//! ```

mod check;
mod cli;
mod csv;
mod load;
mod plot;
mod sample;
mod stats;

pub use cli::{BenchCli, Command, LoadArgs, PlotArgs, run_cli};
pub use csv::{HEADER as CSV_HEADER, read_csv, write_csv};
pub use load::{Load, LoadError, LoadOptions, Report, request_body, run};
pub use plot::{Series, render_svg, series_from_records};
pub use sample::{PoissonGaps, PromptDist, PromptSampler, derive_seed, seeded};
pub use stats::{Percentiles, Record, RunShape, Summary, percentile, summarize};
