//! Logging and tracing settings (`--log-level`, `--log-json`, `--log-dir`, `--enable-trace`,
//! `--otlp-traces-endpoint`), checked at startup; `crate::telemetry` sets logging up from them.

use std::path::{Path, PathBuf};

use super::ConfigError;

/// How logging and tracing are set up (from the launch flags).
#[derive(Debug, Clone, Default)]
pub struct LogSettings {
    /// `--log-level` (or a tracing filter); `RUST_LOG` wins when set.
    pub level: String,
    /// `--log-json`.
    pub json: bool,
    /// `--log-dir`.
    pub dir: Option<PathBuf>,
    /// The collector, when `--enable-trace` is on.
    pub otlp_endpoint: Option<String>,
}

/// `--otlp-traces-endpoint` as the URI the exporter dials: `host:port` gets `http://`.
pub fn otlp_endpoint(raw: &str) -> Result<String, ConfigError> {
    let raw = raw.trim();
    let full = if raw.contains("://") {
        raw.to_string()
    } else {
        format!("http://{raw}")
    };
    let bad = |why: &str| {
        ConfigError(format!(
            "--otlp-traces-endpoint '{raw}' {why}; give host:port or http://host:port"
        ))
    };
    let uri: http::Uri = full.parse().map_err(|_| bad("is not an address"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some("https") => {
            return Err(bad(
                "uses TLS, which this build does not speak to collectors; run a local collector",
            ));
        }
        _ => return Err(bad("has an unknown scheme")),
    }
    if uri.host().is_none_or(str::is_empty) || uri.port_u16().is_none() {
        return Err(bad("needs a host and a port"));
    }
    Ok(full)
}

/// Creates `--log-dir` if needed and checks that a file can be made in it.
pub fn check_log_dir(dir: &Path) -> Result<(), ConfigError> {
    let fail = |e: std::io::Error| {
        ConfigError(format!(
            "--log-dir: cannot write log files in '{}': {e}",
            dir.display()
        ))
    };
    std::fs::create_dir_all(dir).map_err(fail)?;
    let probe = dir.join(".pdrouter-write-check");
    std::fs::write(&probe, b"").map_err(fail)?;
    let _ = std::fs::remove_file(probe);
    Ok(())
}

/// Whether `--log-level` is a level (trace, debug, info, warn, error, off) or a tracing filter
/// naming targets (`target=level,...`).
pub fn valid_log_level(level: &str) -> bool {
    matches!(
        level.to_ascii_lowercase().as_str(),
        "trace" | "debug" | "info" | "warn" | "warning" | "error" | "off"
    ) || tracing_subscriber::EnvFilter::try_new(level).is_ok() && level.contains('=')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn otlp_endpoints() {
        assert_eq!(
            otlp_endpoint("localhost:4317").unwrap(),
            "http://localhost:4317"
        );
        assert_eq!(
            otlp_endpoint("http://10.0.0.1:4317").unwrap(),
            "http://10.0.0.1:4317"
        );
        for bad in ["localhost", "https://c:4317", "ftp://c:1", "", "a b:1"] {
            let e = otlp_endpoint(bad).unwrap_err();
            assert!(e.0.starts_with("--otlp-traces-endpoint"), "{bad}: {e}");
        }
    }

    #[test]
    fn log_dir_is_created_and_checked() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("a/b");
        check_log_dir(&dir).unwrap();
        assert!(dir.is_dir());
        let file = tmp.path().join("file");
        std::fs::write(&file, b"x").unwrap();
        assert!(check_log_dir(&file).unwrap_err().0.contains("--log-dir"));
    }
}
