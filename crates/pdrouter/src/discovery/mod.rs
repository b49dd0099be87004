//! Kubernetes pod discovery (`--service-discovery`): one task per role follows the pods its
//! label selector picks, with a LIST and then a WATCH from the list's `resourceVersion`
//! (bookmarks asked for and followed), and keeps the registry's discovered workers equal to
//! the pods that are serving ([`pods::workers`]).
//!
//! - A pod that turns ready is registered (one worker per port); one that turns not ready,
//!   starts terminating or is deleted is removed at once: it drains (requests in flight
//!   finish), its admission slot is released, and if it comes back it starts clean. (Of
//!   SMG's two behaviours, removing rather than keeping a not-ready pod registered: the
//!   health checker then never probes a pod Kubernetes already says cannot serve.)
//! - An expired `resourceVersion` (410) means a fresh LIST, reconciled against what was
//!   registered; any other failure is counted, then retried after a backoff (1 s doubling to
//!   30 s) with a fresh LIST. Serving never waits on the API server.
//!
//! Invariants: discovery removes only workers it registered itself: a URL already registered
//! (by flag, through `/workers`, or by another pod) is never taken over, and so never
//! removed by it; its tasks end with the router (they are among its background tasks).

pub mod kube;
pub mod pods;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use tokio::task::JoinHandle;

use crate::config::{Config, DiscoverySettings, WorkerSpec, WorkerType};
use crate::metrics::Metrics;
use crate::proxy::client::UpstreamClient;
use crate::registry::{Registry, health};
use kube::{KubeApi, KubeError};

/// Longest a WATCH may stay silent before it is opened again (the server is asked to end it
/// after [`WATCH_SECS`], with bookmarks meanwhile).
const WATCH_IDLE: Duration = Duration::from_secs(330);
const WATCH_SECS: u64 = 290;
const BACKOFF_MIN: Duration = Duration::from_secs(1);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// What a discovery task needs of the router.
#[derive(Debug, Clone)]
pub struct Sink {
    pub registry: Arc<Registry>,
    pub metrics: Arc<Metrics>,
    pub client: UpstreamClient,
    pub cfg: Arc<Config>,
}

/// Starts one task per discovered role; their handles join the router's background tasks.
pub fn spawn(settings: &DiscoverySettings, sink: Sink) -> Result<Vec<JoinHandle<()>>, String> {
    let api = KubeApi::new(&settings.source)?;
    Ok(settings
        .selectors
        .iter()
        .map(|(role, labels)| {
            let selector: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let follower = Follower {
                api: api.clone(),
                role: *role,
                path: pods_path(settings.namespace.as_deref(), &selector.join(",")),
                port: settings.port,
                sink: sink.clone(),
                owned: HashMap::new(),
            };
            tokio::spawn(follower.run())
        })
        .collect())
}

/// The pods path and selector query of a LIST (a WATCH adds its own parameters).
fn pods_path(namespace: Option<&str>, selector: &str) -> String {
    let escaped: String = selector
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'_' | b'.' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    match namespace {
        Some(ns) => format!("/api/v1/namespaces/{ns}/pods?labelSelector={escaped}"),
        None => format!("/api/v1/pods?labelSelector={escaped}"),
    }
}

/// How a WATCH ended.
enum Ended {
    /// Open a new one from the last version seen.
    Rewatch,
    /// List again (the version expired, or the watch failed).
    Relist,
}

/// The task following one role's pods.
struct Follower {
    api: KubeApi,
    role: WorkerType,
    path: String,
    port: u16,
    sink: Sink,
    /// Each pod's URLs this task registered.
    owned: HashMap<String, Vec<String>>,
}

impl Follower {
    async fn run(mut self) {
        let mut backoff = BACKOFF_MIN;
        loop {
            match self.api.list(&self.path).await {
                Ok((pods, version)) => {
                    backoff = BACKOFF_MIN;
                    self.reconcile(&pods).await;
                    let mut version = version;
                    // Watch again from the last version until a fresh LIST is needed.
                    while let Ended::Rewatch = self.watch(&mut version).await {}
                }
                Err(e) => {
                    self.sink.metrics.discovery_sync_error();
                    tracing::warn!(role = self.role.as_str(), error = %e, "pod list failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(BACKOFF_MAX);
                }
            }
        }
    }

    /// Follows one WATCH from `version`, keeping `version` at the last one seen.
    async fn watch(&mut self, version: &mut String) -> Ended {
        let path = format!(
            "{}&watch=true&allowWatchBookmarks=true&timeoutSeconds={WATCH_SECS}&resourceVersion={version}",
            self.path
        );
        let mut w = match self.api.watch(&path).await {
            Ok(w) => w,
            Err(e) => return self.failed(&e).await,
        };
        loop {
            let event = match tokio::time::timeout(WATCH_IDLE, w.next()).await {
                Err(_) | Ok(None) => return Ended::Rewatch,
                Ok(Some(Err(e))) => return self.failed(&e).await,
                Ok(Some(Ok(e))) => e,
            };
            let pod = &event["object"];
            if let Some(v) = pod
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
            {
                v.clone_into(version);
            }
            match event["type"].as_str() {
                Some("ADDED" | "MODIFIED") => self.apply(pod).await,
                Some("DELETED") => {
                    if let Some(key) = pods::key(pod) {
                        self.set(&key, Vec::new()).await;
                    }
                }
                _ => {}
            }
        }
    }

    async fn failed(&self, e: &KubeError) -> Ended {
        if !matches!(e, KubeError::Gone) {
            self.sink.metrics.discovery_sync_error();
            tracing::warn!(role = self.role.as_str(), error = %e, "pod watch failed");
            tokio::time::sleep(BACKOFF_MIN).await;
        }
        Ended::Relist
    }

    /// After a LIST: pods gone from it lose their workers, the others are applied.
    async fn reconcile(&mut self, pods: &[Value]) {
        let listed: Vec<String> = pods.iter().filter_map(pods::key).collect();
        let gone: Vec<String> = self
            .owned
            .keys()
            .filter(|k| !listed.contains(k))
            .cloned()
            .collect();
        for key in gone {
            self.set(&key, Vec::new()).await;
        }
        for pod in pods {
            self.apply(pod).await;
        }
    }

    async fn apply(&mut self, pod: &Value) {
        let Some(key) = pods::key(pod) else { return };
        match pods::workers(pod, self.role, self.port) {
            Ok(specs) => self.set(&key, specs).await,
            Err(why) => {
                self.sink.metrics.discovery_sync_error();
                tracing::warn!(pod = %key, role = self.role.as_str(), "pod skipped: {why}");
                self.set(&key, Vec::new()).await;
            }
        }
    }

    /// Makes pod `key`'s registered workers `specs`.
    async fn set(&mut self, key: &str, specs: Vec<WorkerSpec>) {
        let had = self.owned.remove(key).unwrap_or_default();
        let mut kept = Vec::new();
        for url in had {
            if specs.iter().any(|s| s.url == url) {
                kept.push(url);
            } else {
                self.deregister(&url, key);
            }
        }
        for spec in specs {
            if !kept.contains(&spec.url) && self.register(spec.clone(), key).await {
                kept.push(spec.url);
            }
        }
        if !kept.is_empty() {
            self.owned.insert(key.to_owned(), kept);
        }
    }

    async fn register(&self, mut spec: WorkerSpec, pod: &str) -> bool {
        let sink = &self.sink;
        spec.api_key = sink.cfg.api_key.clone();
        match health::register_running(&sink.registry, &sink.client, &sink.cfg, &spec, false).await
        {
            Ok(_) => {
                sink.metrics.discovery_registered(self.role.as_str());
                tracing::info!(url = %spec.url, pod, role = self.role.as_str(), "discovered worker added");
                true
            }
            Err(e) => {
                tracing::info!(url = %spec.url, pod, "discovered worker already registered: {e}");
                false
            }
        }
    }

    fn deregister(&self, url: &str, pod: &str) {
        let ids: Vec<String> = self
            .sink
            .registry
            .snapshot()
            .all()
            .iter()
            .filter(|w| w.base_url() == url && w.worker_type() == self.role)
            .map(|w| w.id().to_owned())
            .collect();
        for id in ids {
            self.sink.registry.remove(&id);
        }
        self.sink.metrics.discovery_deregistered(self.role.as_str());
        tracing::info!(
            url,
            pod,
            role = self.role.as_str(),
            "discovered worker removed"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pods_path_escapes_the_selector_and_names_the_namespace() {
        assert_eq!(
            pods_path(None, "app=sglang,role=prefill"),
            "/api/v1/pods?labelSelector=app%3Dsglang%2Crole%3Dprefill"
        );
        assert_eq!(
            pods_path(Some("ml"), "a.b/c=d"),
            "/api/v1/namespaces/ml/pods?labelSelector=a.b%2Fc%3Dd"
        );
    }
}
