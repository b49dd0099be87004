//! `pdrouter._pdrouter`: the Python extension behind the `pdrouter` package.
//!
//! Two ways in, both running the router in this process with the GIL released while it works:
//! - [`run`]: the `pdrouter` command line, exactly as the binary runs it
//!   ([`pdrouter::entry::run`]): same flags, output, exit codes and signal handling.
//! - [`Router`]: a `launch` command line started on a runtime shared by every `Router` of the
//!   process, stopped by a method call instead of a signal (the interpreter owns the signals).
//!
//! Invariants: no call holds the GIL while it waits (router startup, shutdown, readiness), so
//! other Python threads run meanwhile; logging is set up once per process, by the first
//! `Router` (a tracing subscriber is global), and a later `Router`'s log flags do nothing; a
//! `Router` that is dropped without `stop()` stops its router (its stop channel closes).
//! The names the package lists (policies, parsers) come from the Rust crates, never copies.
//!
//! The crate is empty under `cfg(test)`: `cargo test --all-targets` builds a library's test
//! harness even with `test = false`, and an extension module has nothing for it (the Python
//! suite in `tests/` is its test); empty, the harness links nothing of the router or Python.
#![cfg(not(test))]

use std::ffi::OsString;
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use pdrouter::cli::{Cli, Command};
use pdrouter::entry::Launch;
use pyo3::exceptions::{PyRuntimeError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use tokio::sync::oneshot;

/// Runs the `pdrouter` command line `argv` (program name first) to its end and returns its
/// exit code. `launch` serves until SIGTERM or SIGINT, as the binary does.
#[pyfunction]
fn run(py: Python<'_>, argv: Vec<OsString>) -> u8 {
    py.detach(|| pdrouter::entry::run(argv))
}

/// The routing policy names `--policy` takes.
#[pyfunction]
fn policies() -> Vec<&'static str> {
    pdrouter_policy::PolicyKind::NAMES.to_vec()
}

/// The tool-call parser names `--tool-call-parser` takes (canonical names; aliases are also
/// accepted).
#[pyfunction]
fn tool_call_parsers() -> Vec<&'static str> {
    pdrouter_parsers::ToolKind::ALL
        .iter()
        .map(|k| k.name())
        .collect()
}

/// The reasoning parser names `--reasoning-parser` takes (canonical names; aliases are also
/// accepted).
#[pyfunction]
fn reasoning_parsers() -> Vec<&'static str> {
    pdrouter_parsers::ReasoningKind::ALL
        .iter()
        .map(|k| k.name())
        .collect()
}

/// Where a [`Router`] is in its life; only the router's task moves it forward, except that
/// a start abandoned by `stop()` goes straight to `Stopped`.
#[derive(Debug, Clone)]
enum Phase {
    Starting,
    Serving {
        url: String,
        metrics_url: Option<String>,
    },
    Failed(String),
    Stopped,
}

/// The phase and the condition variable that announces each change.
#[derive(Debug)]
struct Shared {
    phase: Mutex<Phase>,
    changed: Condvar,
}

impl Shared {
    fn set(&self, phase: Phase) {
        *lock(&self.phase) = phase;
        self.changed.notify_all();
    }

    /// Waits until `done` holds for the phase or `timeout` passes (`None`: no limit); returns
    /// the phase then.
    fn wait(&self, timeout: Option<Duration>, done: impl Fn(&Phase) -> bool) -> Phase {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut phase = lock(&self.phase);
        while !done(&phase) {
            match deadline {
                None => {
                    phase = self.changed.wait(phase).unwrap_or_else(|e| e.into_inner());
                }
                Some(deadline) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    phase = self
                        .changed
                        .wait_timeout(phase, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0;
                }
            }
        }
        phase.clone()
    }
}

/// A poisoned lock only means a panic elsewhere; the phase is still a whole value.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The runtime every `Router` of the process runs on (built on first use, never dropped, so
/// the trace exporter that logging set up on it outlives any one router).
fn runtime() -> PyResult<&'static tokio::runtime::Runtime> {
    static RUNTIME: OnceLock<Result<tokio::runtime::Runtime, String>> = OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("pdrouter")
                .build()
                .map_err(|e| format!("cannot start the async runtime: {e}"))
        })
        .as_ref()
        .map_err(|e| PyRuntimeError::new_err(e.clone()))
}

/// Sets up logging with `launch`'s settings the first time; later calls do nothing. The guard
/// is kept for the life of the process (it owns the log-file writer and the trace exporter).
fn init_logging(rt: &tokio::runtime::Runtime, launch: &Launch) -> PyResult<()> {
    static GUARD: Mutex<Option<pdrouter::telemetry::TelemetryGuard>> = Mutex::new(None);
    static DONE: OnceLock<()> = OnceLock::new();
    let mut guard = lock(&GUARD);
    if DONE.get().is_some() {
        return Ok(());
    }
    // The trace exporter's channel lives on the runtime.
    let _enter = rt.enter();
    let g = pdrouter::telemetry::init(&launch.log).map_err(PyValueError::new_err)?;
    *guard = Some(g);
    let _ = DONE.set(());
    Ok(())
}

/// The message of a command line the binary would refuse: its `error: ...` text without the
/// prefix (the first line, as the binary prints it for a bad value).
fn parse_error(e: &clap::Error) -> String {
    if let Some(line) = pdrouter::cli::numeric_value_error(e) {
        return line;
    }
    let text = e.render().to_string();
    let text = text.trim_end();
    text.strip_prefix("error: ").unwrap_or(text).to_string()
}

/// A router started from a `launch` command line, serving on the process's shared runtime.
#[pyclass(module = "pdrouter._pdrouter")]
#[derive(Debug)]
struct Router {
    shared: Arc<Shared>,
    /// Taken by `stop()`; dropping it also stops the router.
    stop: Mutex<Option<oneshot::Sender<()>>>,
}

#[pymethods]
impl Router {
    /// Validates `args` (`launch`'s flags, with or without a leading `launch`) and starts the
    /// router in the background. Raises `ValueError` with the binary's message for a command
    /// line it would refuse with exit code 2.
    #[new]
    fn new(py: Python<'_>, args: Vec<OsString>) -> PyResult<Self> {
        let mut argv: Vec<OsString> = vec!["pdrouter".into()];
        if args.first().is_none_or(|a| a != "launch") {
            argv.push("launch".into());
        }
        argv.extend(args);
        let cli = Cli::try_parse_args(argv).map_err(|e| PyValueError::new_err(parse_error(&e)))?;
        // `launch` was put first above, so clap read every other word as its flags.
        let Command::Launch(launch) = cli.command else {
            return Err(PyValueError::new_err("a Router runs `launch` only"));
        };
        let launch = Launch::new(*launch).map_err(|e| PyValueError::new_err(e.to_string()))?;
        let rt = runtime()?;
        py.detach(|| init_logging(rt, &launch))?;
        let config = launch.finish(pdrouter::entry::raise_open_files_limit());
        let scheme = if config.edge.tls.is_some() {
            "https"
        } else {
            "http"
        };
        let shared = Arc::new(Shared {
            phase: Mutex::new(Phase::Starting),
            changed: Condvar::new(),
        });
        let (stop_tx, mut stop_rx) = oneshot::channel::<()>();
        let task = Arc::clone(&shared);
        rt.spawn(async move {
            let started = tokio::select! {
                r = pdrouter::start(config) => r,
                // stop() (or the Router dropped) while waiting for workers: abandon the start.
                _ = &mut stop_rx => {
                    task.set(Phase::Stopped);
                    return;
                }
            };
            match started {
                Ok(handle) => {
                    task.set(Phase::Serving {
                        url: format!("{scheme}://{}", handle.addr()),
                        metrics_url: handle.metrics_addr().map(|m| format!("http://{m}/metrics")),
                    });
                    handle
                        .run_until(async move {
                            let _ = stop_rx.await;
                        })
                        .await;
                    task.set(Phase::Stopped);
                }
                Err(e) => task.set(Phase::Failed(e.to_string())),
            }
        });
        Ok(Self {
            shared,
            stop: Mutex::new(Some(stop_tx)),
        })
    }

    /// Waits until the router listens and returns its URL (`http://host:port`). Raises
    /// `RuntimeError` if it could not start (or was stopped first), `TimeoutError` after
    /// `timeout` seconds (`None`: wait as long as startup takes).
    #[pyo3(signature = (timeout=None))]
    fn wait_ready(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<String> {
        let timeout = seconds(timeout)?;
        let phase = py.detach(|| self.shared.wait(timeout, |p| !matches!(p, Phase::Starting)));
        match phase {
            Phase::Serving { url, .. } => Ok(url),
            Phase::Starting => Err(PyTimeoutError::new_err("the router is not listening yet")),
            Phase::Failed(e) => Err(PyRuntimeError::new_err(e)),
            Phase::Stopped => Err(PyRuntimeError::new_err("the router was stopped")),
        }
    }

    /// Stops accepting, lets in-flight requests finish within `--shutdown-grace-period-secs`
    /// and returns once the router has stopped (at once if it never started). Raises
    /// `TimeoutError` if that takes longer than `timeout` seconds.
    #[pyo3(signature = (timeout=None))]
    fn stop(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let timeout = seconds(timeout)?;
        if let Some(tx) = lock(&self.stop).take() {
            let _ = tx.send(());
        }
        let phase = py.detach(|| {
            self.shared
                .wait(timeout, |p| matches!(p, Phase::Stopped | Phase::Failed(_)))
        });
        match phase {
            Phase::Stopped | Phase::Failed(_) => Ok(()),
            _ => Err(PyTimeoutError::new_err("the router has not stopped yet")),
        }
    }

    /// The router's URL while it serves, else `None`.
    #[getter]
    fn url(&self) -> Option<String> {
        match &*lock(&self.shared.phase) {
            Phase::Serving { url, .. } => Some(url.clone()),
            _ => None,
        }
    }

    /// The Prometheus endpoint's URL while the router serves, else `None`.
    #[getter]
    fn metrics_url(&self) -> Option<String> {
        match &*lock(&self.shared.phase) {
            Phase::Serving { metrics_url, .. } => metrics_url.clone(),
            _ => None,
        }
    }

    /// Whether the router is serving.
    #[getter]
    fn running(&self) -> bool {
        matches!(&*lock(&self.shared.phase), Phase::Serving { .. })
    }

    /// `with Router(...) as r:` stops the router when the block ends.
    fn __enter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    /// Stops the router (waiting for it as `stop()` does); exceptions propagate.
    fn __exit__(
        &self,
        py: Python<'_>,
        _kind: Option<Bound<'_, PyAny>>,
        _value: Option<Bound<'_, PyAny>>,
        _traceback: Option<Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        self.stop(py, None)?;
        Ok(false)
    }
}

/// A Python timeout in seconds as a duration (`None` stays none); negative or NaN is refused.
fn seconds(timeout: Option<f64>) -> PyResult<Option<Duration>> {
    timeout
        .map(|t| {
            Duration::try_from_secs_f64(t).map_err(|_| {
                PyValueError::new_err(format!(
                    "timeout must be a finite number of seconds >= 0, not {t}"
                ))
            })
        })
        .transpose()
}

/// The module: [`run`], [`Router`], the name lists and `__version__`.
#[pymodule]
fn _pdrouter(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", pdrouter::entry::VERSION)?;
    m.add_function(wrap_pyfunction!(run, m)?)?;
    m.add_function(wrap_pyfunction!(policies, m)?)?;
    m.add_function(wrap_pyfunction!(tool_call_parsers, m)?)?;
    m.add_function(wrap_pyfunction!(reasoning_parsers, m)?)?;
    m.add_class::<Router>()?;
    Ok(())
}
