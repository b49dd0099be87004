//! Which workers a Kubernetes pod is: none until it is `Running` with condition `Ready=True`
//! and has a `podIP`, none once it is terminating (`deletionTimestamp` set); else one worker
//! per port, `http://POD_IP:PORT`, the port `--service-discovery-port` or each of the
//! `smg.ai/worker-ports` annotation's (comma-separated). A Prefill or Encode pod's bootstrap
//! port is its `sglang.ai/bootstrap-port` annotation (`none` or absent: none).
//!
//! Invariant: a pod whose annotations cannot be read is no worker, with the reason (the
//! caller counts it as a sync error), rather than a guess.

use std::net::IpAddr;

use serde_json::Value;

use crate::config::{WorkerSpec, WorkerType};

/// The annotation listing a pod's worker ports.
pub const WORKER_PORTS: &str = "smg.ai/worker-ports";
/// The annotation giving a Prefill or Encode pod's bootstrap port.
pub const BOOTSTRAP_PORT: &str = "sglang.ai/bootstrap-port";
/// Most ports one pod's annotation may list.
const MAX_PORTS: usize = 64;

/// A pod's identity in the cluster: `namespace/name`.
pub fn key(pod: &Value) -> Option<String> {
    let m = pod.get("metadata")?;
    Some(format!(
        "{}/{}",
        m.get("namespace")
            .and_then(Value::as_str)
            .unwrap_or_default(),
        m.get("name")?.as_str()?
    ))
}

fn annotation<'a>(pod: &'a Value, name: &str) -> Option<&'a str> {
    pod.pointer("/metadata/annotations")?.get(name)?.as_str()
}

fn port(text: &str, what: &str) -> Result<u16, String> {
    match text.trim().parse::<u16>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(format!("{what} '{text}' is not a port number 1-65535")),
    }
}

/// Whether the pod is serving: running, ready, not terminating.
fn serving(pod: &Value) -> bool {
    let running = pod.pointer("/status/phase").and_then(Value::as_str) == Some("Running");
    let ready = pod
        .pointer("/status/conditions")
        .and_then(Value::as_array)
        .is_some_and(|cs| {
            cs.iter().any(|c| {
                c.get("type").and_then(Value::as_str) == Some("Ready")
                    && c.get("status").and_then(Value::as_str) == Some("True")
            })
        });
    let terminating = pod
        .pointer("/metadata/deletionTimestamp")
        .is_some_and(|t| !t.is_null());
    running && ready && !terminating
}

/// The workers pod `pod` is for `role`, with `default_port` when it names none.
pub fn workers(
    pod: &Value,
    role: WorkerType,
    default_port: u16,
) -> Result<Vec<WorkerSpec>, String> {
    if !serving(pod) {
        return Ok(Vec::new());
    }
    let Some(ip) = pod
        .pointer("/status/podIP")
        .and_then(Value::as_str)
        .and_then(|ip| ip.parse::<IpAddr>().ok())
    else {
        return Ok(Vec::new());
    };
    let ports = match annotation(pod, WORKER_PORTS) {
        None => vec![default_port],
        Some(list) => {
            let ports = list
                .split(',')
                .filter(|p| !p.trim().is_empty())
                .map(|p| port(p, WORKER_PORTS))
                .collect::<Result<Vec<_>, _>>()?;
            if ports.is_empty() || ports.len() > MAX_PORTS {
                return Err(format!("{WORKER_PORTS} must list 1 to {MAX_PORTS} ports"));
            }
            ports
        }
    };
    let bootstrap = match (role, annotation(pod, BOOTSTRAP_PORT)) {
        (WorkerType::Prefill | WorkerType::Encode, Some(p)) if !p.eq_ignore_ascii_case("none") => {
            Some(port(p, BOOTSTRAP_PORT)?)
        }
        _ => None,
    };
    let host = match ip {
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => format!("[{v6}]"),
    };
    Ok(ports
        .into_iter()
        .map(|p| {
            let mut spec = WorkerSpec::new(format!("http://{host}:{p}"), role);
            spec.bootstrap_port = bootstrap;
            spec
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn pod(phase: &str, ready: &str, annotations: Value) -> Value {
        json!({
            "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
            "status": {"phase": phase, "podIP": "10.0.0.7",
                "conditions": [{"type": "Ready", "status": ready}]},
        })
    }

    #[test]
    fn a_ready_running_pod_is_one_worker_per_port() {
        let p = pod("Running", "True", json!({}));
        assert_eq!(key(&p).unwrap(), "ns/p");
        let w = workers(&p, WorkerType::Decode, 8000).unwrap();
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].url, "http://10.0.0.7:8000");
        let p = pod(
            "Running",
            "True",
            json!({WORKER_PORTS: "8001, 8002", BOOTSTRAP_PORT: "9000"}),
        );
        let w = workers(&p, WorkerType::Prefill, 80).unwrap();
        let urls: Vec<&str> = w.iter().map(|s| s.url.as_str()).collect();
        assert_eq!(urls, ["http://10.0.0.7:8001", "http://10.0.0.7:8002"]);
        assert!(w.iter().all(|s| s.bootstrap_port == Some(9000)));
        // A Decode pod's bootstrap annotation means nothing.
        assert_eq!(
            workers(&p, WorkerType::Decode, 80).unwrap()[0].bootstrap_port,
            None
        );
    }

    #[test]
    fn pods_not_serving_are_no_workers_and_bad_annotations_are_reasons() {
        for p in [
            pod("Pending", "True", json!({})),
            pod("Running", "False", json!({})),
        ] {
            assert!(workers(&p, WorkerType::Regular, 80).unwrap().is_empty());
        }
        let mut terminating = pod("Running", "True", json!({}));
        terminating["metadata"]["deletionTimestamp"] = json!("2026-12-01T00:00:00Z");
        assert!(
            workers(&terminating, WorkerType::Regular, 80)
                .unwrap()
                .is_empty()
        );
        let mut no_ip = pod("Running", "True", json!({}));
        no_ip["status"].as_object_mut().unwrap().remove("podIP");
        assert!(workers(&no_ip, WorkerType::Regular, 80).unwrap().is_empty());
        let mut v6 = pod("Running", "True", json!({}));
        v6["status"]["podIP"] = json!("fd00::7");
        assert_eq!(
            workers(&v6, WorkerType::Regular, 80).unwrap()[0].url,
            "http://[fd00::7]:80"
        );
        for bad in [
            json!({WORKER_PORTS: "80,x"}),
            json!({WORKER_PORTS: ","}),
            json!({BOOTSTRAP_PORT: "0"}),
        ] {
            let p = pod("Running", "True", bad.clone());
            assert!(workers(&p, WorkerType::Prefill, 80).is_err(), "{bad}");
        }
    }
}
