//! Test-only worker type.

use crate::WorkerRef;

/// A worker with a fixed url and load.
#[derive(Debug, Clone)]
pub(crate) struct W {
    pub(crate) url: String,
    pub(crate) load: u64,
}

impl WorkerRef for W {
    fn url(&self) -> &str {
        &self.url
    }
    fn load(&self) -> u64 {
        self.load
    }
}

/// Workers `http://w{i}` with the given loads.
pub(crate) fn workers(loads: &[u64]) -> Vec<W> {
    loads
        .iter()
        .enumerate()
        .map(|(i, &load)| W {
            url: format!("http://w{i}"),
            load,
        })
        .collect()
}

/// Workers with the given urls and zero load.
pub(crate) fn named(urls: &[&str]) -> Vec<W> {
    urls.iter()
        .map(|u| W {
            url: (*u).to_owned(),
            load: 0,
        })
        .collect()
}
