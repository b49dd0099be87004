//! Logs and traces: the console log, optional rotated log files (`--log-dir`), JSON lines
//! (`--log-json`), and OpenTelemetry spans over OTLP/gRPC (`--enable-trace`).
//!
//! Span layout: a request is the `request` span (opened by the access middleware, carrying
//! the request id); its children are `admission_wait` (the time a PD request waited for a
//! Prefill slot) and one span per worker leg, `prefill`, `decode` or `worker` (regular mode),
//! with the worker's URL. Leg and wait spans are at debug level, so with tracing off and the
//! usual `info` log level they are disabled (never created, no fields recorded); the trace
//! exporter sees them whatever the log level, and sees spans only (log events stay in the
//! logs).
//!
//! With tracing on, a client's `traceparent` (W3C trace context) makes the `request` span a
//! child of the client's span, and every HTTP leg sends the worker its own leg span's
//! `traceparent`/`tracestate` instead of the client's, so an engine that traces joins the same
//! trace under the right leg. With tracing off, both headers pass through unchanged.
//!
//! Keys never reach a span or a log line: middleware records a control-plane key's id, never
//! the key, and worker credentials are not span fields.

use std::sync::atomic::{AtomicBool, Ordering};

use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt;

use tracing_subscriber::Layer;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

use crate::error::Leg;

/// Log files kept in `--log-dir` (one per day).
pub const LOG_FILES_KEPT: usize = 7;
/// Name of the log files in `--log-dir`, before the date.
pub const LOG_FILE_PREFIX: &str = "pdrouter.log";

/// Whether spans are exported (set once by [`init`]); checked per request, so a relaxed load.
static TRACING: AtomicBool = AtomicBool::new(false);

/// Whether `--enable-trace` is on in this process.
pub(crate) fn tracing_on() -> bool {
    TRACING.load(Ordering::Relaxed)
}

// The settings and their startup checks are configuration; re-exported for the binary.
pub use crate::config::telemetry::{LogSettings, check_log_dir, otlp_endpoint};

/// Keeps the log-file writer and the trace exporter alive; dropping it flushes both.
#[derive(Debug)]
pub struct TelemetryGuard {
    _file: Option<tracing_appender::non_blocking::WorkerGuard>,
    tracer: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        if let Some(provider) = self.tracer.take() {
            // Sends the spans still batched; a collector that is gone only loses them.
            let _ = provider.shutdown();
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

fn filter(level: &str) -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_default_env()
        .or_else(|_| tracing_subscriber::EnvFilter::try_new(level.replace("warning", "warn")))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
}

/// A log layer in the chosen format over `writer`, filtered by the log level.
fn log_layer<S, W>(
    settings: &LogSettings,
    writer: W,
    ansi: bool,
) -> Box<dyn Layer<S> + Send + Sync + 'static>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let base = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(writer);
    if settings.json {
        base.json()
            .flatten_event(true)
            .with_current_span(true)
            .with_filter(filter(&settings.level))
            .boxed()
    } else {
        base.with_filter(filter(&settings.level)).boxed()
    }
}

/// Installs the global subscriber. Must run inside the Tokio runtime when tracing is on (the
/// exporter's channel lives there). Errors are for the caller to print (exit 2).
pub fn init(settings: &LogSettings) -> Result<TelemetryGuard, String> {
    let mut layers: Vec<BoxedLayer> = Vec::new();
    layers.push(log_layer(settings, std::io::stderr, use_colour()));
    let mut file_guard = None;
    if let Some(dir) = &settings.dir {
        let appender = tracing_appender::rolling::Builder::new()
            .rotation(tracing_appender::rolling::Rotation::DAILY)
            .filename_prefix(LOG_FILE_PREFIX)
            .max_log_files(LOG_FILES_KEPT)
            .build(dir)
            .map_err(|e| {
                format!(
                    "--log-dir: cannot open a log file in '{}': {e}",
                    dir.display()
                )
            })?;
        let (writer, guard) = tracing_appender::non_blocking(appender);
        file_guard = Some(guard);
        layers.push(log_layer(settings, writer, false));
    }
    let mut tracer = None;
    if let Some(endpoint) = &settings.otlp_endpoint {
        let (layer, provider) = otel_layer(endpoint)?;
        layers.push(layer);
        tracer = Some(provider);
    }
    tracing_subscriber::registry()
        .with(layers)
        .try_init()
        .map_err(|e| format!("cannot set up logging: {e}"))?;
    TRACING.store(tracer.is_some(), Ordering::Relaxed);
    Ok(TelemetryGuard {
        _file: file_guard,
        tracer,
    })
}

type BoxedLayer = Box<dyn Layer<tracing_subscriber::Registry> + Send + Sync + 'static>;

/// The OpenTelemetry layer: this crate's spans, batched and sent to `endpoint`.
fn otel_layer(
    endpoint: &str,
) -> Result<(BoxedLayer, opentelemetry_sdk::trace::SdkTracerProvider), String> {
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig as _;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| format!("--otlp-traces-endpoint: cannot set up the exporter: {e}"))?;
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(
            opentelemetry_sdk::Resource::builder()
                .with_service_name("pdrouter")
                .build(),
        )
        .build();
    let tracer = provider.tracer("pdrouter");
    let only_our_spans = tracing_subscriber::filter::filter_fn(|meta| {
        meta.is_span() && meta.target().starts_with("pdrouter")
    });
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(only_our_spans)
        .boxed();
    Ok((layer, provider))
}

/// Reads W3C trace-context headers.
struct HeaderReader<'a>(&'a http::HeaderMap);

impl Extractor for HeaderReader<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Writes W3C trace-context headers, replacing any already there.
struct HeaderWriter<'a>(&'a mut http::HeaderMap);

impl Injector for HeaderWriter<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// With tracing on and a valid client `traceparent`, makes `span` (a request's, not yet
/// entered) a child of the client's span. An invalid header is ignored: the span stays a root.
pub(crate) fn continue_client_trace(span: &tracing::Span, headers: &http::HeaderMap) {
    if !tracing_on() || !headers.contains_key("traceparent") {
        return;
    }
    use opentelemetry::trace::TraceContextExt as _;
    let cx = TraceContextPropagator::new().extract(&HeaderReader(headers));
    if cx.span().span_context().is_valid() {
        let _ = span.set_parent(cx);
    }
}

/// With tracing on, sets a worker request's `traceparent`/`tracestate` to the current (leg)
/// span's, replacing the client's.
pub(crate) fn propagate_to_worker(headers: &mut http::HeaderMap) {
    if !tracing_on() {
        return;
    }
    use opentelemetry::trace::TraceContextExt as _;
    let cx = tracing::Span::current().context();
    if cx.span().span_context().is_valid() {
        headers.remove("traceparent");
        headers.remove("tracestate");
        TraceContextPropagator::new().inject_context(&cx, &mut HeaderWriter(headers));
    }
}

/// With tracing on, gives a gRPC worker call the current (leg) span's `traceparent` and
/// `tracestate` as metadata, as HTTP legs get them as headers.
pub(crate) fn propagate_to_grpc(metadata: &mut tonic::metadata::MetadataMap) {
    if !tracing_on() {
        return;
    }
    let mut headers = http::HeaderMap::new();
    propagate_to_worker(&mut headers);
    for (name, value) in &headers {
        let key = tonic::metadata::MetadataKey::from_bytes(name.as_str().as_bytes());
        let value = value
            .to_str()
            .ok()
            .and_then(|v| tonic::metadata::MetadataValue::try_from(v).ok());
        if let (Ok(key), Some(value)) = (key, value) {
            metadata.insert(key, value);
        }
    }
}

/// The span of one worker leg (see the module docs).
pub(crate) fn leg_span(leg: Leg, url: &str) -> tracing::Span {
    match leg {
        Leg::Prefill => tracing::debug_span!("prefill", worker = url),
        Leg::Decode => tracing::debug_span!("decode", worker = url),
        Leg::Worker => tracing::debug_span!("worker", worker = url),
    }
}

/// A PD request's wait for a Prefill slot, in its `admission_wait` span. Every queued
/// request holds this future for its whole wait, so the span is boxed with the wait only when
/// something records it; otherwise the future is the wait itself (plus the variant tag).
pub(crate) fn in_admission_span<F: std::future::Future>(
    wait: F,
) -> futures_util::future::Either<F, std::pin::Pin<Box<tracing::instrument::Instrumented<F>>>> {
    use futures_util::future::Either;
    let span = tracing::debug_span!("admission_wait");
    if span.is_disabled() {
        Either::Left(wait)
    } else {
        Either::Right(Box::pin(tracing::Instrument::instrument(wait, span)))
    }
}
