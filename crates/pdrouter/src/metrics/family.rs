//! What families share: the buckets of every latency histogram, and the family type of a
//! labelled histogram built with them.

use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;

/// A labelled histogram family whose histograms have [`latency_histogram`]'s buckets.
pub(super) type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;

/// A histogram with the latency buckets.
pub(super) fn latency_histogram() -> Histogram {
    // 1 ms .. ~10 min: covers tiny requests through long generations and queue waits.
    Histogram::new([
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        120.0, 300.0, 600.0,
    ])
}
