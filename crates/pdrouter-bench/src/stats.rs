//! Per-request records and the run summary (percentiles, throughput, status
//! counts).

use std::collections::BTreeMap;

use serde::Serialize;

/// What happened to one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Record {
    /// Label of the run the request belongs to.
    pub label: String,
    /// When the request was sent, in milliseconds since the run started.
    pub start_offset_ms: f64,
    /// HTTP status, or 0 when no response head arrived (connection error,
    /// timeout).
    pub status: u16,
    /// Time to first byte (streaming: first `data:` chunk) in milliseconds;
    /// `None` when no such byte arrived.
    pub ttft_ms: Option<f64>,
    /// Time until the response was complete (or failed), in milliseconds.
    pub latency_ms: f64,
    /// Prompt length in words.
    pub prompt_tokens: u32,
    /// The body arrived whole and, for an event stream, ended with `[DONE]`
    /// (or a Responses API completion) without an error event.
    pub complete: bool,
}

impl Record {
    /// Whether the request succeeded: a 2xx answer with a complete body.
    pub fn is_ok(&self) -> bool {
        (200..300).contains(&self.status) && self.complete
    }
}

/// The `p`-th percentile (0..=100) of ascending-sorted `sorted` by the
/// nearest-rank method: the smallest value with at least `p` % of the values
/// at or below it. `None` for an empty slice.
pub fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let n = sorted.len();
    let rank = (p.clamp(0.0, 100.0) / 100.0 * n as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, n) - 1])
}

/// Percentiles of one quantity, in milliseconds (all zero when there were no
/// samples; see `count`).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Percentiles {
    /// Number of samples.
    pub count: usize,
    /// Arithmetic mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Largest sample.
    pub max: f64,
}

impl Percentiles {
    /// Percentiles of `values` (any order; NaNs are dropped).
    pub fn of(mut values: Vec<f64>) -> Self {
        values.retain(|v| !v.is_nan());
        if values.is_empty() {
            return Percentiles::default();
        }
        values.sort_by(f64::total_cmp);
        let at = |p| percentile(&values, p).unwrap_or(0.0);
        Percentiles {
            count: values.len(),
            mean: values.iter().sum::<f64>() / values.len() as f64,
            p50: at(50.0),
            p90: at(90.0),
            p99: at(99.0),
            max: at(100.0),
        }
    }
}

/// The summary of one run, as printed and as written by `--json`.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Summary {
    /// Label of the run.
    pub label: String,
    /// `"closed"` (fixed concurrency) or `"open"` (Poisson arrivals).
    pub mode: String,
    /// Concurrency of a closed-loop run.
    pub concurrency: Option<usize>,
    /// Offered arrivals per second of an open-loop run.
    pub rate: Option<f64>,
    /// Seconds during which requests were started: the configured duration,
    /// or less when the request cap ended the run first.
    pub duration_secs: f64,
    /// Wall time from start until the last request finished, in seconds.
    pub elapsed_secs: f64,
    /// Requests sent.
    pub requests: usize,
    /// Requests that finished within the configured duration.
    pub completed_in_window: usize,
    /// `completed_in_window / duration_secs`.
    pub throughput_rps: f64,
    /// OK requests that finished within the duration, per second.
    pub ok_rps: f64,
    /// OK requests: a 2xx answer with a complete body (see [`Record::is_ok`]).
    pub ok: usize,
    /// 2xx answers whose body was not a complete answer (a stream cut short
    /// or carrying an error event); they are not OK.
    pub incomplete_2xx: usize,
    /// Share (0..=1) of requests that were not OK (1 when none was sent).
    pub error_rate: f64,
    /// Count per status (`"200"`, `"429"`, …; `"error"` for no response).
    pub status_counts: BTreeMap<String, usize>,
    /// Share (0..=1) of requests answered 429.
    pub share_429: f64,
    /// End-to-end latency of OK requests.
    pub latency_ms: Percentiles,
    /// End-to-end latency of every request, OK or not (a failure counts
    /// until it failed, a timeout until the timeout).
    pub latency_all_ms: Percentiles,
    /// Time to first byte (streaming: first `data:` chunk) of OK requests.
    pub ttft_ms: Percentiles,
    /// End-to-end latency of requests that were not OK (how long a rejection
    /// or failure took).
    pub rejected_latency_ms: Percentiles,
}

/// How a run was driven, for [`summarize`].
#[derive(Clone, Debug, PartialEq)]
pub struct RunShape {
    /// Label of the run.
    pub label: String,
    /// Concurrency (closed loop) …
    pub concurrency: Option<usize>,
    /// … or arrival rate (open loop).
    pub rate: Option<f64>,
    /// Configured duration in seconds.
    pub duration_secs: f64,
    /// Wall time of the whole run in seconds.
    pub elapsed_secs: f64,
}

/// Builds the summary of `records`.
pub fn summarize(shape: &RunShape, records: &[Record]) -> Summary {
    let window_ms = shape.duration_secs * 1000.0;
    let in_window = |r: &&Record| r.start_offset_ms + r.latency_ms <= window_ms;
    let completed_in_window = records.iter().filter(in_window).count();
    let ok_in_window = records
        .iter()
        .filter(in_window)
        .filter(|r| r.is_ok())
        .count();
    let per_sec = |n: usize| {
        if shape.duration_secs > 0.0 {
            n as f64 / shape.duration_secs
        } else {
            0.0
        }
    };
    let mut status_counts = BTreeMap::new();
    for r in records {
        let key = if r.status == 0 {
            "error".to_owned()
        } else {
            r.status.to_string()
        };
        *status_counts.entry(key).or_insert(0) += 1;
    }
    let n429 = records.iter().filter(|r| r.status == 429).count();
    let ok: Vec<&Record> = records.iter().filter(|r| r.is_ok()).collect();
    Summary {
        label: shape.label.clone(),
        mode: if shape.rate.is_some() {
            "open"
        } else {
            "closed"
        }
        .to_owned(),
        concurrency: shape.concurrency,
        rate: shape.rate,
        duration_secs: shape.duration_secs,
        elapsed_secs: shape.elapsed_secs,
        requests: records.len(),
        completed_in_window,
        throughput_rps: per_sec(completed_in_window),
        ok_rps: per_sec(ok_in_window),
        ok: ok.len(),
        incomplete_2xx: records
            .iter()
            .filter(|r| (200..300).contains(&r.status) && !r.complete)
            .count(),
        error_rate: if records.is_empty() {
            1.0
        } else {
            (records.len() - ok.len()) as f64 / records.len() as f64
        },
        status_counts,
        share_429: if records.is_empty() {
            0.0
        } else {
            n429 as f64 / records.len() as f64
        },
        latency_ms: Percentiles::of(ok.iter().map(|r| r.latency_ms).collect()),
        latency_all_ms: Percentiles::of(records.iter().map(|r| r.latency_ms).collect()),
        ttft_ms: Percentiles::of(ok.iter().filter_map(|r| r.ttft_ms).collect()),
        rejected_latency_ms: Percentiles::of(
            records
                .iter()
                .filter(|r| !r.is_ok())
                .map(|r| r.latency_ms)
                .collect(),
        ),
    }
}

impl Summary {
    /// The human-readable report printed at the end of a run.
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let load = match (self.concurrency, self.rate) {
            (Some(c), _) => format!("closed loop, concurrency {c}"),
            (_, Some(r)) => format!("open loop, {r} req/s offered"),
            _ => self.mode.clone(),
        };
        let _ = writeln!(
            s,
            "[{}] {load}, {:.1} s (elapsed {:.2} s)",
            self.label, self.duration_secs, self.elapsed_secs
        );
        let statuses: Vec<String> = self
            .status_counts
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(
            s,
            "  requests {}  throughput {:.1} req/s  ok {} ({:.1} req/s)  status {}  \
             2xx incomplete {}  429 share {:.2} %  error rate {:.2} %",
            self.requests,
            self.throughput_rps,
            self.ok,
            self.ok_rps,
            statuses.join(" "),
            self.incomplete_2xx,
            self.share_429 * 100.0,
            self.error_rate * 100.0
        );
        for (name, p) in [
            ("latency ok", &self.latency_ms),
            ("latency all", &self.latency_all_ms),
            ("ttft ok", &self.ttft_ms),
            ("not ok", &self.rejected_latency_ms),
        ] {
            if p.count == 0 && name == "not ok" {
                continue;
            }
            let _ = writeln!(
                s,
                "  {name:<11} ms  p50 {:>9.3}  p90 {:>9.3}  p99 {:>9.3}  max {:>9.3}  (n={})",
                p.p50, p.p90, p.p99, p.max, p.count
            );
        }
        let _ = writeln!(s, "{}", self.kv_line());
        s
    }

    /// One machine-readable line, `kv: label=… requests=… rps=… …`, the last
    /// line of [`Summary::render`], so shell scripts can pick numbers with
    /// `awk` alone. Times are in milliseconds, shares in 0..=1.
    pub fn kv_line(&self) -> String {
        let n = |k: &str| self.status_counts.get(k).copied().unwrap_or(0);
        format!(
            "kv: label={} requests={} ok={} n429={} errors={} incomplete_2xx={} error_rate={:.5} \
             rps={:.3} ok_rps={:.3} share_429={:.5} \
             lat_p50_ms={:.4} lat_p90_ms={:.4} lat_p99_ms={:.4} lat_max_ms={:.4} \
             lat_all_p50_ms={:.4} lat_all_p99_ms={:.4} \
             ttft_p50_ms={:.4} ttft_p90_ms={:.4} ttft_p99_ms={:.4} ttft_max_ms={:.4} \
             rejected_p99_ms={:.4} rejected_max_ms={:.4}",
            self.label.replace(char::is_whitespace, "_"),
            self.requests,
            self.ok,
            n("429"),
            n("error"),
            self.incomplete_2xx,
            self.error_rate,
            self.throughput_rps,
            self.ok_rps,
            self.share_429,
            self.latency_ms.p50,
            self.latency_ms.p90,
            self.latency_ms.p99,
            self.latency_ms.max,
            self.latency_all_ms.p50,
            self.latency_all_ms.p99,
            self.ttft_ms.p50,
            self.ttft_ms.p90,
            self.ttft_ms.p99,
            self.ttft_ms.max,
            self.rejected_latency_ms.p99,
            self.rejected_latency_ms.max,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), Some(50.0));
        assert_eq!(percentile(&v, 90.0), Some(90.0));
        assert_eq!(percentile(&v, 99.0), Some(99.0));
        assert_eq!(percentile(&v, 99.5), Some(100.0));
        assert_eq!(percentile(&v, 100.0), Some(100.0));
        assert_eq!(percentile(&v, 0.0), Some(1.0));
        assert_eq!(percentile(&[], 50.0), None);
        assert_eq!(percentile(&[7.0], 99.0), Some(7.0));
        // Ten values: p50 is the 5th, p90 the 9th, p99 the 10th.
        let t: Vec<f64> = (1..=10).map(f64::from).collect();
        assert_eq!(percentile(&t, 50.0), Some(5.0));
        assert_eq!(percentile(&t, 90.0), Some(9.0));
        assert_eq!(percentile(&t, 99.0), Some(10.0));
        assert_eq!(percentile(&t, 150.0), Some(10.0));
    }

    #[test]
    fn percentiles_sort_and_drop_nan() {
        let p = Percentiles::of(vec![3.0, f64::NAN, 1.0, 2.0, 4.0]);
        assert_eq!(p.count, 4);
        assert_eq!(p.p50, 2.0);
        assert_eq!(p.max, 4.0);
        assert_eq!(p.mean, 2.5);
        assert_eq!(Percentiles::of(Vec::new()), Percentiles::default());
    }

    fn rec(start: f64, status: u16, latency: f64) -> Record {
        Record {
            label: "x".to_owned(),
            start_offset_ms: start,
            status,
            ttft_ms: (status != 0).then_some(latency / 2.0),
            latency_ms: latency,
            prompt_tokens: 1,
            complete: status != 0,
        }
    }

    #[test]
    fn summary_counts_statuses_and_window_throughput() {
        let records = vec![
            rec(0.0, 200, 10.0),
            rec(100.0, 200, 30.0),
            rec(200.0, 429, 1.0),
            rec(900.0, 200, 200.0), // finishes after the 1 s window
            rec(950.0, 0, 5.0),
        ];
        let shape = RunShape {
            label: "x".to_owned(),
            concurrency: Some(2),
            rate: None,
            duration_secs: 1.0,
            elapsed_secs: 1.1,
        };
        let s = summarize(&shape, &records);
        assert_eq!(s.mode, "closed");
        assert_eq!(s.requests, 5);
        assert_eq!(s.completed_in_window, 4);
        assert_eq!(s.throughput_rps, 4.0);
        assert_eq!(s.ok_rps, 2.0);
        assert_eq!(s.ok, 3);
        assert_eq!(s.status_counts["200"], 3);
        assert_eq!(s.status_counts["429"], 1);
        assert_eq!(s.status_counts["error"], 1);
        assert_eq!(s.share_429, 0.2);
        assert_eq!(s.latency_ms.count, 3);
        assert_eq!(s.latency_ms.max, 200.0);
        // Over every request: the fast 429 and the failure are in, so the median drops.
        assert_eq!(s.latency_all_ms.count, 5);
        assert_eq!(s.latency_all_ms.p50, 10.0);
        assert_eq!(s.latency_ms.p50, 30.0);
        assert_eq!(s.error_rate, 0.4);
        assert_eq!(s.incomplete_2xx, 0);
        assert_eq!(s.ttft_ms.p50, 15.0);
        assert_eq!(s.rejected_latency_ms.count, 2);
        let text = s.render();
        assert!(text.contains("429=1"), "{text}");
        assert!(text.contains("20.00 %"), "{text}");
        let kv = text.lines().last().unwrap();
        assert!(
            kv.starts_with(
                "kv: label=x requests=5 ok=3 n429=1 errors=1 incomplete_2xx=0 error_rate=0.40000 \
                 rps=4.000"
            ),
            "{kv}"
        );
        assert!(kv.contains(" lat_p99_ms=200.0000 "), "{kv}");
        assert!(kv.contains(" lat_all_p50_ms=10.0000 "), "{kv}");
        assert!(!kv.contains("  "), "{kv}");
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["latency_ms"]["p99"], 200.0);
        assert_eq!(json["status_counts"]["200"], 3);
    }

    #[test]
    fn a_2xx_with_an_incomplete_body_is_not_ok() {
        let mut cut = rec(0.0, 200, 50.0);
        cut.complete = false;
        let records = vec![rec(0.0, 200, 10.0), cut];
        let shape = RunShape {
            label: "x".to_owned(),
            concurrency: Some(1),
            rate: None,
            duration_secs: 1.0,
            elapsed_secs: 1.0,
        };
        let s = summarize(&shape, &records);
        assert_eq!((s.ok, s.incomplete_2xx), (1, 1));
        assert_eq!(s.status_counts["200"], 2);
        assert_eq!(s.error_rate, 0.5);
        assert_eq!(s.ok_rps, 1.0);
        assert_eq!((s.latency_ms.count, s.latency_ms.max), (1, 10.0));
        assert_eq!((s.latency_all_ms.count, s.latency_all_ms.max), (2, 50.0));
        assert_eq!(s.rejected_latency_ms.count, 1);
    }

    #[test]
    fn empty_run_summarises_to_zeros() {
        let shape = RunShape {
            label: "e".to_owned(),
            concurrency: None,
            rate: Some(5.0),
            duration_secs: 0.0,
            elapsed_secs: 0.0,
        };
        let s = summarize(&shape, &[]);
        assert_eq!(s.mode, "open");
        assert_eq!((s.requests, s.throughput_rps, s.share_429), (0, 0.0, 0.0));
        assert_eq!(s.error_rate, 1.0, "nothing succeeded");
    }
}
