//! Command line of the `pdrouter-bench` binary.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Write as _};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use hyper::header::{HeaderName, HeaderValue};
use serde_json::{Map, Value};

use crate::csv::{read_csv, write_csv};
use crate::load::{Load, LoadOptions, run};
use crate::plot::{render_svg, series_from_records};
use crate::sample::PromptDist;
use crate::stats::Summary;

/// Command line of `pdrouter-bench`.
#[derive(Debug, Parser)]
#[command(
    name = "pdrouter-bench",
    version,
    about = "Load generator for pdrouter and its mock workers (closed or open loop), and a TTFT plotter",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
pub struct BenchCli {
    /// Another mode than the load generator.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Load-generator flags (the default mode).
    #[command(flatten)]
    pub load: LoadArgs,
}

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Render the TTFT distributions of one or more `--csv` files as an SVG
    /// (empirical CDF per label, log time axis).
    Plot(PlotArgs),
}

/// Flags of `pdrouter-bench plot`.
#[derive(Debug, Args)]
pub struct PlotArgs {
    /// SVG file to write.
    #[arg(long, value_name = "FILE.svg")]
    pub out: PathBuf,
    /// Title above the plot.
    #[arg(long, default_value = "Time to first token")]
    pub title: String,
    /// CSV files written by `--csv`.
    #[arg(required = true, value_name = "CSV")]
    pub csv: Vec<PathBuf>,
}

/// Flags of the load generator.
#[derive(Debug, Args)]
pub struct LoadArgs {
    /// Base URL of the router or worker, e.g. http://127.0.0.1:30000.
    #[arg(long, required = true)]
    pub url: Option<String>,
    /// Request path; also selects the body shape.
    #[arg(long, default_value = "/v1/chat/completions")]
    pub path: String,
    /// Closed loop: this many tasks sending back to back.
    #[arg(long, value_name = "C", conflicts_with = "rate")]
    pub concurrency: Option<usize>,
    /// Open loop: Poisson arrivals at R requests per second.
    #[arg(long, value_name = "R")]
    pub rate: Option<f64>,
    /// Seconds during which requests are started (required unless --requests
    /// is given; with both, whichever ends first).
    #[arg(long, value_name = "SECS", required_unless_present = "requests")]
    pub duration: Option<f64>,
    /// Start at most N requests (at least 1).
    #[arg(long, value_name = "N")]
    pub requests: Option<u64>,
    /// Exit with status 1 when the share of requests that were not OK (not
    /// 2xx, or a body cut short or carrying an error event) exceeds R
    /// (0..=1). Without it the run fails only when no request was OK.
    #[arg(long, value_name = "R", value_parser = parse_rate_share)]
    pub max_error_rate: Option<f64>,
    /// Ask for server-sent events (TTFT = first `data:` chunk).
    #[arg(long)]
    pub stream: bool,
    /// Seed for arrivals and prompts.
    #[arg(long, default_value_t = 1, value_name = "S")]
    pub seed: u64,
    /// Prompt-length distribution.
    #[arg(long, value_enum, default_value_t = PromptDist::Fixed)]
    pub prompt_dist: PromptDist,
    /// Mean prompt length in words.
    #[arg(long, default_value_t = 16, value_name = "N")]
    pub prompt_mean_tokens: u32,
    /// Output tokens per request.
    #[arg(long, default_value_t = 8, value_name = "K")]
    pub max_tokens: u32,
    /// Model name sent in the body.
    #[arg(long, default_value = "mock-model")]
    pub model: String,
    /// JSON object merged into every request body, e.g. '{"bootstrap_room":1}'.
    #[arg(long, value_name = "JSON", value_parser = parse_extra)]
    pub body_extra: Option<Map<String, Value>>,
    /// Extra request header NAME:VALUE sent with every request (repeatable), e.g.
    /// 'X-SMG-Priority: interactive'.
    #[arg(long = "header", value_name = "NAME:VALUE", value_parser = parse_header)]
    pub headers: Vec<(HeaderName, HeaderValue)>,
    /// Seconds before a single request counts as failed.
    #[arg(long, default_value_t = 60.0, value_name = "SECS")]
    pub timeout: f64,
    /// Write one CSV row per request to this file.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Write the summary as JSON to this file.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Label of this run (summary and CSV).
    #[arg(long, default_value = "run", value_name = "NAME")]
    pub label: String,
    /// No progress line on stderr.
    #[arg(long)]
    pub quiet: bool,
}

fn parse_header(s: &str) -> Result<(HeaderName, HeaderValue), String> {
    let (name, value) = s
        .split_once(':')
        .ok_or_else(|| format!("{s:?} is not NAME:VALUE"))?;
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| format!("{:?} is not a header name", name.trim()))?;
    let value = HeaderValue::from_str(value.trim())
        .map_err(|_| format!("{:?} is not a header value", value.trim()))?;
    Ok((name, value))
}

fn parse_extra(s: &str) -> Result<Map<String, Value>, String> {
    match serde_json::from_str(s) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err("must be a JSON object".to_owned()),
        Err(e) => Err(format!("invalid JSON: {e}")),
    }
}

fn parse_rate_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
        _ => Err(format!("must be a number from 0 to 1, got {s:?}")),
    }
}

/// With `--requests` alone, requests are started until the cap is reached.
const NO_TIME_LIMIT: Duration = Duration::from_secs(365 * 24 * 3600);

fn secs(v: f64, name: &str) -> Result<Duration, String> {
    Duration::try_from_secs_f64(v).map_err(|_| format!("--{name} must be a non-negative number"))
}

impl LoadArgs {
    /// The run these flags describe.
    pub fn to_options(&self) -> Result<LoadOptions, String> {
        let url = self.url.clone().ok_or("--url is required")?;
        let load = match (self.concurrency, self.rate) {
            (Some(_), Some(_)) => return Err("give --concurrency or --rate, not both".into()),
            (_, Some(rate)) if !(rate.is_finite() && rate > 0.0) => {
                return Err("--rate must be positive".into());
            }
            (_, Some(rate)) => Load::Open { rate },
            (Some(0), None) => return Err("--concurrency must be at least 1".into()),
            (Some(c), None) => Load::Closed { concurrency: c },
            (None, None) => Load::Closed { concurrency: 1 },
        };
        Ok(LoadOptions {
            url,
            path: self.path.clone(),
            load,
            duration: match self.duration {
                Some(d) => secs(d, "duration")?,
                None => NO_TIME_LIMIT,
            },
            max_requests: match self.requests {
                Some(0) => return Err("--requests must be at least 1".into()),
                n => n,
            },
            stream: self.stream,
            seed: self.seed,
            prompt_dist: self.prompt_dist,
            prompt_mean_tokens: self.prompt_mean_tokens,
            max_tokens: self.max_tokens,
            model: self.model.clone(),
            extra: self.body_extra.clone().unwrap_or_default(),
            headers: self.headers.clone(),
            timeout: secs(self.timeout, "timeout")?,
            label: self.label.clone(),
            progress: !self.quiet,
        })
    }
}

fn create(path: &PathBuf) -> Result<BufWriter<File>, String> {
    File::create(path)
        .map(BufWriter::new)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// Runs `pdrouter-bench` with `args` (including the program name). Errors are
/// messages for stderr; clap's own errors (and `--help`) are returned as
/// [`clap::Error`] through `Err(Ok(e))`. A load run whose summary shows no
/// OK request, or an error rate above `--max-error-rate`, is an error too
/// (after the summary, CSV and JSON were written).
pub async fn run_cli(
    args: impl IntoIterator<Item = String>,
) -> Result<(), Result<clap::Error, String>> {
    let cli = BenchCli::try_parse_from(args).map_err(Ok)?;
    match cli.command {
        Some(Command::Plot(p)) => plot(&p).map_err(Err),
        None => load(&cli.load).await.map_err(Err),
    }
}

async fn load(args: &LoadArgs) -> Result<(), String> {
    let opts = args.to_options()?;
    let report = run(opts).await.map_err(|e| e.to_string())?;
    print!("{}", report.summary.render());
    io::stdout().flush().map_err(|e| e.to_string())?;
    if let Some(path) = &args.csv {
        write_csv(create(path)?, &report.records)
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if let Some(path) = &args.json {
        let mut out = create(path)?;
        serde_json::to_writer_pretty(&mut out, &report.summary)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        writeln!(out)
            .and_then(|()| out.flush())
            .map_err(|e| format!("{}: {e}", path.display()))?;
    }
    verdict(&report.summary, args.max_error_rate)
}

/// Whether a finished run counts as a failure: no OK request at all, or more
/// errors than `max_error_rate` allows.
pub(crate) fn verdict(summary: &Summary, max_error_rate: Option<f64>) -> Result<(), String> {
    if summary.ok == 0 {
        return Err(format!("no request succeeded ({} sent)", summary.requests));
    }
    match max_error_rate {
        Some(max) if summary.error_rate > max => Err(format!(
            "error rate {:.4} is above --max-error-rate {max}",
            summary.error_rate
        )),
        _ => Ok(()),
    }
}

fn plot(args: &PlotArgs) -> Result<(), String> {
    let mut records = Vec::new();
    for path in &args.csv {
        let file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        records.extend(
            read_csv(BufReader::new(file)).map_err(|e| format!("{}: {e}", path.display()))?,
        );
    }
    let svg = render_svg(&args.title, &series_from_records(&records));
    std::fs::write(&args.out, svg).map_err(|e| format!("{}: {e}", args.out.display()))?;
    println!("wrote {}", args.out.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Result<BenchCli, clap::Error> {
        BenchCli::try_parse_from(std::iter::once("pdrouter-bench").chain(args.iter().copied()))
    }

    #[test]
    fn load_flags_become_options() {
        let cli = parse(&[
            "--url",
            "http://127.0.0.1:9",
            "--rate",
            "50",
            "--duration",
            "2.5",
            "--stream",
            "--prompt-dist",
            "pareto",
            "--body-extra",
            r#"{"bootstrap_room":1}"#,
            "--header",
            "X-SMG-Priority: interactive",
            "--header",
            "x-a:b",
            "--quiet",
        ])
        .unwrap();
        assert!(cli.command.is_none());
        let o = cli.load.to_options().unwrap();
        assert_eq!(o.load, Load::Open { rate: 50.0 });
        assert_eq!(o.duration, Duration::from_millis(2500));
        assert!(o.stream && !o.progress);
        assert_eq!(o.prompt_dist, PromptDist::Pareto);
        assert_eq!(o.extra["bootstrap_room"], 1);
        let headers: Vec<_> = o
            .headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.to_str().unwrap()))
            .collect();
        assert_eq!(headers, [("x-smg-priority", "interactive"), ("x-a", "b")]);
    }

    #[test]
    fn closed_loop_is_the_default() {
        let cli = parse(&["--url", "http://h:1", "--duration", "1"]).unwrap();
        assert_eq!(
            cli.load.to_options().unwrap().load,
            Load::Closed { concurrency: 1 }
        );
    }

    #[test]
    fn bad_flags_are_refused() {
        assert!(parse(&["--duration", "1"]).is_err(), "url required");
        assert!(
            parse(&["--url", "http://h:1"]).is_err(),
            "duration required"
        );
        // A valid base plus one bad choice each.
        let with = |extra: &[&str]| {
            let mut args = vec!["--url", "http://h:1", "--duration", "1"];
            args.extend_from_slice(extra);
            parse(&args)
        };
        assert!(with(&["--rate", "1", "--concurrency", "2"]).is_err());
        assert!(with(&["--body-extra", "[1]"]).is_err());
        assert!(with(&["--header", "no-colon"]).is_err());
        assert!(with(&["--header", "bad name: v"]).is_err());
        let zero = with(&["--concurrency", "0"]).unwrap();
        assert!(zero.load.to_options().is_err());
        let neg = parse(&["--url", "http://h:1", "--duration=-1"]).unwrap();
        assert!(neg.load.to_options().is_err());
    }

    #[test]
    fn request_cap_and_error_rate_flags() {
        let cli = parse(&["--url", "http://h:1", "--requests", "10"]).unwrap();
        let o = cli.load.to_options().unwrap();
        assert_eq!(o.max_requests, Some(10));
        assert!(o.duration >= Duration::from_secs(3600), "no time limit");
        let both = parse(&["--url", "http://h:1", "--requests", "3", "--duration", "2"]).unwrap();
        let o = both.load.to_options().unwrap();
        assert_eq!(
            (o.max_requests, o.duration),
            (Some(3), Duration::from_secs(2))
        );
        let zero = parse(&["--url", "http://h:1", "--requests", "0"]).unwrap();
        assert!(zero.load.to_options().is_err());
        let with_rate = |r: &str| {
            parse(&[
                "--url",
                "http://h:1",
                "--duration",
                "1",
                "--max-error-rate",
                r,
            ])
        };
        assert_eq!(with_rate("0.25").unwrap().load.max_error_rate, Some(0.25));
        for bad in ["-0.1", "1.5", "NaN", "x"] {
            assert!(with_rate(bad).is_err(), "{bad}");
        }
    }

    fn summary(requests: usize, ok: usize) -> Summary {
        let records: Vec<crate::stats::Record> = (0..requests)
            .map(|i| crate::stats::Record {
                label: "x".to_owned(),
                start_offset_ms: 0.0,
                status: if i < ok { 200 } else { 503 },
                ttft_ms: None,
                latency_ms: 1.0,
                prompt_tokens: 1,
                complete: true,
            })
            .collect();
        let shape = crate::stats::RunShape {
            label: "x".to_owned(),
            concurrency: Some(1),
            rate: None,
            duration_secs: 1.0,
            elapsed_secs: 1.0,
        };
        crate::stats::summarize(&shape, &records)
    }

    #[test]
    fn a_run_fails_when_nothing_succeeded_or_errors_exceed_the_limit() {
        assert!(verdict(&summary(0, 0), None).is_err(), "nothing sent");
        let err = verdict(&summary(4, 0), None).unwrap_err();
        assert!(err.contains("no request succeeded"), "{err}");
        assert!(verdict(&summary(4, 1), None).is_ok(), "no limit given");
        assert!(verdict(&summary(4, 2), Some(0.5)).is_ok(), "at the limit");
        let err = verdict(&summary(4, 2), Some(0.4)).unwrap_err();
        assert!(err.contains("--max-error-rate"), "{err}");
        assert!(verdict(&summary(4, 4), Some(0.0)).is_ok());
    }

    #[test]
    fn plot_is_a_subcommand() {
        let cli = parse(&["plot", "--out", "x.svg", "a.csv", "b.csv"]).unwrap();
        match cli.command {
            Some(Command::Plot(p)) => {
                assert_eq!(p.csv.len(), 2);
                assert_eq!(p.out, PathBuf::from("x.svg"));
            }
            other => panic!("{other:?}"),
        }
        assert!(parse(&["plot", "--out", "x.svg"]).is_err(), "needs a CSV");
    }
}
