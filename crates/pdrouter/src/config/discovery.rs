//! Kubernetes pod discovery settings (`--service-discovery`): a label selector per worker
//! role, the port workers listen on, the namespace (all when none) and where the API
//! server's address and credentials come from.

use std::path::PathBuf;

use super::WorkerType;

/// Where the API server and its credentials are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeSource {
    /// Inside a pod: `KUBERNETES_SERVICE_HOST`/`_PORT` and the service account's token and CA.
    InCluster { host: String, port: u16 },
    /// A kubeconfig file's current context.
    File(PathBuf),
}

/// `--service-discovery` and its flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoverySettings {
    /// The pods of each role: a label selector (`key=value` pairs, all required).
    pub selectors: Vec<(WorkerType, Vec<(String, String)>)>,
    /// `--service-discovery-port`: where a pod's worker listens unless its
    /// `smg.ai/worker-ports` annotation says.
    pub port: u16,
    /// `--service-discovery-namespace`; `None` watches every namespace.
    pub namespace: Option<String>,
    /// The API server.
    pub source: KubeSource,
}

/// Default `--service-discovery-port`.
pub const DEFAULT_DISCOVERY_PORT: u16 = 80;

impl DiscoverySettings {
    /// Whether pods of `role` are discovered.
    pub fn discovers(&self, role: WorkerType) -> bool {
        self.selectors.iter().any(|(r, _)| *r == role)
    }
}
