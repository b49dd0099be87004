//! Kubernetes pod discovery flags (SMG's): `--service-discovery`, a label selector per role
//! (`--selector` in regular mode, `--prefill-selector`/`--decode-selector` in PD mode, plus
//! `--encode-selector` in EPD), `--service-discovery-port` and `--service-discovery-namespace`.
//! The API server is the kubeconfig's (`KUBECONFIG`, else `~/.kube/config`) or, in a pod,
//! the cluster's own, as kube clients find it.

use clap::Args;

use crate::config::{
    ConfigError, DEFAULT_DISCOVERY_PORT, DiscoverySettings, KubeSource, Mode, WorkerType,
};

/// `launch` flags under "Service discovery".
#[derive(Debug, Args)]
pub struct DiscoveryArgs {
    /// Discover workers as Kubernetes pods chosen by label selectors, following them as they
    /// come, go and turn ready (workers given by flag or the /workers API stay as they are).
    #[arg(long, help_heading = "Service discovery")]
    pub service_discovery: bool,
    /// Labels of the worker pods in regular mode (all must match).
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE", help_heading = "Service discovery")]
    pub selector: Vec<String>,
    /// Labels of the Prefill pods (PD and EPD mode).
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE", help_heading = "Service discovery")]
    pub prefill_selector: Vec<String>,
    /// Labels of the Decode pods (PD and EPD mode).
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE", help_heading = "Service discovery")]
    pub decode_selector: Vec<String>,
    /// Labels of the Encode pods (EPD mode).
    #[arg(long, num_args = 1.., value_name = "KEY=VALUE", help_heading = "Service discovery")]
    pub encode_selector: Vec<String>,
    /// Port the discovered workers listen on, 1-65535, unless a pod's smg.ai/worker-ports
    /// annotation lists its own [default: 80].
    #[arg(long, value_name = "PORT", help_heading = "Service discovery")]
    pub service_discovery_port: Option<u16>,
    /// Namespace of the worker pods [default: every namespace].
    #[arg(long, value_name = "NAMESPACE", help_heading = "Service discovery")]
    pub service_discovery_namespace: Option<String>,
}

/// One `KEY=VALUE` of `flag`, in Kubernetes label syntax.
fn label(flag: &str, raw: &str) -> Result<(String, String), ConfigError> {
    let bad = |why: &str| ConfigError(format!("{flag}: '{raw}' {why}"));
    let (k, v) = raw.split_once('=').ok_or_else(|| bad("is not KEY=VALUE"))?;
    let key_ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 253
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
    };
    let value_ok = |s: &str| {
        s.len() <= 63
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    if !key_ok(k) {
        return Err(bad("has no valid label key"));
    }
    if !value_ok(v) {
        return Err(bad(
            "has an invalid label value (at most 63 of a-z, 0-9, '-', '_', '.')",
        ));
    }
    Ok((k.to_owned(), v.to_owned()))
}

/// Where the API server is: `KUBECONFIG` (its first file), else the pod's cluster, else
/// `~/.kube/config`.
fn source() -> Result<KubeSource, ConfigError> {
    if let Some(first) = std::env::var_os("KUBECONFIG")
        .as_ref()
        .and_then(|v| std::env::split_paths(v).find(|p| !p.as_os_str().is_empty()))
    {
        return Ok(KubeSource::File(first));
    }
    if let (Ok(host), Ok(port)) = (
        std::env::var("KUBERNETES_SERVICE_HOST"),
        std::env::var("KUBERNETES_SERVICE_PORT"),
    ) && let Ok(port) = port.parse()
    {
        return Ok(KubeSource::InCluster { host, port });
    }
    let home = std::env::var_os("HOME").map(|h| std::path::PathBuf::from(h).join(".kube/config"));
    match home {
        Some(p) if p.is_file() => Ok(KubeSource::File(p)),
        _ => Err(ConfigError(
            "--service-discovery finds no Kubernetes API: run the router in a pod, or set \
             KUBECONFIG"
                .into(),
        )),
    }
}

impl DiscoveryArgs {
    fn given(&self) -> Option<&'static str> {
        [
            (!self.selector.is_empty(), "--selector"),
            (!self.prefill_selector.is_empty(), "--prefill-selector"),
            (!self.decode_selector.is_empty(), "--decode-selector"),
            (!self.encode_selector.is_empty(), "--encode-selector"),
            (
                self.service_discovery_port.is_some(),
                "--service-discovery-port",
            ),
            (
                self.service_discovery_namespace.is_some(),
                "--service-discovery-namespace",
            ),
        ]
        .into_iter()
        .find_map(|(given, flag)| given.then_some(flag))
    }

    /// The discovery settings for `mode`, checked: selectors only for the mode's roles, at
    /// least one, HTTP workers only.
    pub(super) fn resolve(&self, mode: Mode) -> Result<Option<DiscoverySettings>, ConfigError> {
        if !self.service_discovery {
            return match self.given() {
                Some(flag) => Err(ConfigError(format!("{flag} needs --service-discovery"))),
                None => Ok(None),
            };
        }
        if mode.is_grpc() {
            return Err(ConfigError(
                "--service-discovery registers http:// workers; grpc:// workers are given \
                 by flag or through the /workers API"
                    .into(),
            ));
        }
        let roles: &[(WorkerType, &str, &Vec<String>)] = &[
            (WorkerType::Regular, "--selector", &self.selector),
            (
                WorkerType::Prefill,
                "--prefill-selector",
                &self.prefill_selector,
            ),
            (
                WorkerType::Decode,
                "--decode-selector",
                &self.decode_selector,
            ),
            (
                WorkerType::Encode,
                "--encode-selector",
                &self.encode_selector,
            ),
        ];
        let mut selectors = Vec::new();
        for (role, flag, raw) in roles {
            if raw.is_empty() {
                continue;
            }
            let fits = match mode {
                Mode::Regular | Mode::RegularGrpc => *role == WorkerType::Regular,
                Mode::PdHttp | Mode::PdGrpc => {
                    matches!(role, WorkerType::Prefill | WorkerType::Decode)
                }
                Mode::EpdGrpc => *role != WorkerType::Regular,
            };
            if !fits {
                return Err(ConfigError(match mode {
                    Mode::Regular | Mode::RegularGrpc => {
                        format!("{flag} needs --pd-disaggregation; in regular mode use --selector")
                    }
                    _ => format!(
                        "{flag} is for regular mode; give --prefill-selector and --decode-selector"
                    ),
                }));
            }
            let pairs = raw
                .iter()
                .map(|r| label(flag, r))
                .collect::<Result<Vec<_>, _>>()?;
            selectors.push((*role, pairs));
        }
        if selectors.is_empty() {
            return Err(ConfigError(
                "--service-discovery needs a selector: --selector KEY=VALUE in regular mode, \
                 --prefill-selector and --decode-selector in PD mode"
                    .into(),
            ));
        }
        if let Some(ns) = &self.service_discovery_namespace {
            let ok = !ns.is_empty()
                && ns.len() <= 63
                && ns
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            if !ok {
                return Err(ConfigError(format!(
                    "--service-discovery-namespace: '{ns}' is not a namespace name"
                )));
            }
        }
        let port = self
            .service_discovery_port
            .unwrap_or(DEFAULT_DISCOVERY_PORT);
        if port == 0 {
            return Err(ConfigError(
                "--service-discovery-port must be 1-65535".into(),
            ));
        }
        Ok(Some(DiscoverySettings {
            selectors,
            port,
            namespace: self.service_discovery_namespace.clone(),
            source: source()?,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(on: bool) -> DiscoveryArgs {
        DiscoveryArgs {
            service_discovery: on,
            selector: Vec::new(),
            prefill_selector: Vec::new(),
            decode_selector: Vec::new(),
            encode_selector: Vec::new(),
            service_discovery_port: None,
            service_discovery_namespace: None,
        }
    }

    fn err(a: &DiscoveryArgs, mode: Mode) -> String {
        a.resolve(mode).unwrap_err().0
    }

    #[test]
    fn flags_need_discovery_and_fit_the_mode() {
        assert_eq!(args(false).resolve(Mode::Regular).unwrap(), None);
        let mut a = args(false);
        a.selector = vec!["app=x".into()];
        assert_eq!(
            err(&a, Mode::Regular),
            "--selector needs --service-discovery"
        );
        let mut a = args(true);
        assert!(err(&a, Mode::Regular).contains("needs a selector"));
        a.prefill_selector = vec!["app=p".into()];
        assert!(err(&a, Mode::Regular).contains("--prefill-selector needs --pd-disaggregation"));
        let mut a = args(true);
        a.selector = vec!["app=x".into()];
        assert!(err(&a, Mode::PdHttp).starts_with("--selector is for regular mode"));
        assert!(err(&a, Mode::PdGrpc).contains("http:// workers"));
        for bad in ["app", "=x", "app=a b", "app=x=y"] {
            let mut a = args(true);
            a.selector = vec![bad.into()];
            let e = err(&a, Mode::Regular);
            assert!(
                e.starts_with("--selector:") && e.contains(bad),
                "{bad}: {e}"
            );
        }
        let mut a = args(true);
        a.selector = vec!["app=x".into()];
        a.service_discovery_namespace = Some("Bad_NS".into());
        assert!(err(&a, Mode::Regular).contains("--service-discovery-namespace"));
        a.service_discovery_namespace = None;
        a.service_discovery_port = Some(0);
        assert!(err(&a, Mode::Regular).contains("1-65535"));
    }
}
