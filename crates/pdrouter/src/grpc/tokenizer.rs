//! The router's tokenizer for gRPC workers, resolved once at startup.
//!
//! Order: `--tokenizer-path` (file or directory), `--model-path` (directory), the tokenizer
//! path a worker reports through `GetModelInfo` when it exists on this machine, else the
//! `GetTokenizer` bundle of the first worker that serves one (checksum verified, size-limited,
//! extracted into a private directory that lives as long as the router).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use pdrouter_tokenizer::Tokenizer;
use pdrouter_tokenizer::bundle::Unpacked;

use super::client::WorkerChannel;
use crate::config::TokenizerSource;

/// A loaded tokenizer and, when it came from a worker, the directory it was extracted to.
pub struct RouterTokenizer {
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Where it came from, for the startup log.
    pub origin: String,
    /// Keeps a fetched bundle's directory until the router stops.
    _unpacked: Option<Unpacked>,
}

impl RouterTokenizer {
    /// The directory of a tokenizer fetched from a worker (its bundle's files).
    pub fn fetched_dir(&self) -> Option<&Path> {
        self._unpacked.as_ref().map(Unpacked::path)
    }
}

impl std::fmt::Debug for RouterTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RouterTokenizer")
            .field("origin", &self.origin)
            .finish()
    }
}

fn load(path: &Path, template: Option<&Path>) -> Result<Tokenizer, String> {
    Tokenizer::load(path, template).map_err(|e| {
        // The load error names the file it failed on; name the given path only when that
        // is another one (a file inside the given directory), so the line never repeats it.
        let (shown, msg) = (path.display().to_string(), e.to_string());
        if msg.starts_with(&shown) {
            msg
        } else {
            format!("{shown}: {msg}")
        }
    })
}

/// Resolves the tokenizer (see the module docs) with the gRPC `workers`' channels, each with
/// its worker's URL, in registration order; the error is one line for the operator.
pub async fn resolve(
    source: &TokenizerSource,
    workers: &[(&str, &WorkerChannel)],
    timeout: Duration,
) -> Result<RouterTokenizer, String> {
    let template = source.chat_template.clone();
    let local = |path: std::path::PathBuf, origin: String| {
        let template = template.clone();
        async move {
            let t = tokio::task::spawn_blocking(move || load(&path, template.as_deref()))
                .await
                .map_err(|e| e.to_string())??;
            Ok::<_, String>(RouterTokenizer {
                tokenizer: Arc::new(t),
                origin,
                _unpacked: None,
            })
        }
    };
    if let Some(p) = &source.tokenizer_path {
        return local(p.clone(), format!("--tokenizer-path {}", p.display()))
            .await
            .map_err(|e| format!("--tokenizer-path: {e}"));
    }
    if let Some(p) = &source.model_path {
        return local(p.clone(), format!("--model-path {}", p.display()))
            .await
            .map_err(|e| format!("--model-path: {e}"));
    }
    let mut last = String::from("no gRPC worker is registered");
    for &(url, ch) in workers {
        if let Some(info) = ch.model_info(timeout).await {
            let reported = std::path::PathBuf::from(&info.tokenizer_path);
            if !info.tokenizer_path.is_empty() && reported.exists() {
                let origin = format!("{url}'s tokenizer path {}", reported.display());
                match local(reported, origin).await {
                    Ok(t) => return Ok(t),
                    Err(e) => {
                        tracing::warn!(error = %e, "the worker's tokenizer path did not load")
                    }
                }
            }
        }
        match ch.fetch_tokenizer(timeout, &std::env::temp_dir()).await {
            Ok(unpacked) => {
                let path = unpacked.path().to_owned();
                let template = template.clone();
                let t = tokio::task::spawn_blocking(move || load(&path, template.as_deref()))
                    .await
                    .map_err(|e| e.to_string())?;
                match t {
                    Ok(t) => {
                        return Ok(RouterTokenizer {
                            tokenizer: Arc::new(t),
                            origin: format!("GetTokenizer from {url}"),
                            _unpacked: Some(unpacked),
                        });
                    }
                    Err(e) => last = format!("tokenizer from {url}: {e}"),
                }
            }
            Err(e) => last = format!("{url}: {e}"),
        }
    }
    Err(format!(
        "no tokenizer for the gRPC workers ({last}); give --tokenizer-path or --model-path"
    ))
}
