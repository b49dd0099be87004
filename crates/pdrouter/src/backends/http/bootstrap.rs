//! KV bootstrap ticket injection.
//!
//! Both legs of a PD pair receive the identical body: `bootstrap_host` (the Prefill worker's
//! host), `bootstrap_port` (its configured port or JSON null) and `bootstrap_room` (random,
//! below 2^63). For a batch or `n > 1` each becomes an array with one entry per sub-request,
//! rooms drawn independently.

use bytes::Bytes;
use serde_json::Value;

use crate::registry::Worker;
use crate::request::ParsedRequest;

/// A fresh random room id below 2^63.
pub fn random_room() -> u64 {
    rand::random::<u64>() >> 1
}

/// The bodies sent to the Prefill and Decode legs: identical bootstrap fields; with DP ranks
/// each leg also gets its own `routed_dp_rank`, and Decode gets `disagg_prefill_dp_rank`.
pub fn bodies(req: &ParsedRequest, prefill: &Worker, decode: &Worker) -> (Bytes, Bytes) {
    let mut p = ticket(req, prefill);
    if prefill.dp_rank().is_none() && decode.dp_rank().is_none() {
        let b = req.body_with(&p);
        return (b.clone(), b);
    }
    let mut d = p.clone();
    if let Some(rank) = prefill.dp_rank() {
        p.push(("routed_dp_rank", Value::from(rank)));
        d.push(("disagg_prefill_dp_rank", Value::from(rank)));
    }
    if let Some(rank) = decode.dp_rank() {
        d.push(("routed_dp_rank", Value::from(rank)));
    }
    (req.body_with(&p), req.body_with(&d))
}

/// The bootstrap fields, plus the Prefill worker's model when the client named none (the
/// Decode worker was chosen to serve the same one).
fn ticket(req: &ParsedRequest, prefill: &Worker) -> Vec<(&'static str, Value)> {
    let mut fields = bootstrap_fields(req, prefill);
    fields.extend(super::exchange::model_fill(req, prefill));
    fields
}

fn bootstrap_fields(req: &ParsedRequest, prefill: &Worker) -> Vec<(&'static str, Value)> {
    let host = Value::String(prefill.bootstrap_host().to_string());
    let port = prefill.bootstrap_port().map_or(Value::Null, Value::from);
    if req.is_batched() {
        let k = req.sub_requests();
        return vec![
            ("bootstrap_host", Value::Array(vec![host; k])),
            ("bootstrap_port", Value::Array(vec![port; k])),
            (
                "bootstrap_room",
                Value::Array((0..k).map(|_| Value::from(random_room())).collect()),
            ),
        ];
    }
    // Room for what `ticket` and `bodies` may add (the model, DP ranks) without growing.
    let mut fields = Vec::with_capacity(6);
    fields.extend([
        ("bootstrap_host", host),
        ("bootstrap_port", port),
        ("bootstrap_room", Value::from(random_room())),
    ]);
    fields
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use crate::config::{BreakerConfig, WorkerSpec, WorkerType};
    use crate::registry::{Registry, WorkerStatus};
    use crate::request::{Endpoint, parse};
    use std::sync::Arc;
    use std::time::Duration;

    /// Registers `url` as a `t` worker (one entry per rank with `ranks`), ready.
    pub(in crate::backends::http) fn register(
        url: &str,
        t: WorkerType,
        port: Option<u16>,
        ranks: Option<u32>,
    ) -> Vec<Arc<Worker>> {
        let breaker = BreakerConfig {
            enabled: false,
            failure_threshold: 1,
            success_threshold: 1,
            timeout: Duration::from_secs(1),
            window: Duration::from_secs(120),
        };
        let spec = WorkerSpec {
            bootstrap_port: port,
            ..WorkerSpec::new(url, t)
        };
        Registry::new(breaker, None)
            .register(&spec, ranks, WorkerStatus::Ready)
            .unwrap()
    }

    /// The Prefill leg's body against a plain Decode worker.
    fn inject(req: &ParsedRequest, prefill: &Worker) -> Bytes {
        let decode = register("http://d:1", WorkerType::Decode, None, None).remove(0);
        bodies(req, prefill, &decode).0
    }

    fn prefill(port: Option<u16>) -> Arc<Worker> {
        register("http://10.0.0.7:8000", WorkerType::Prefill, port, None).remove(0)
    }

    #[test]
    fn dp_ranks_go_to_their_legs() {
        let p = register("http://p:1", WorkerType::Prefill, None, Some(2));
        let d = register("http://d:1", WorkerType::Decode, None, Some(4));
        let req = parse(Endpoint::Generate, Bytes::from_static(br#"{"text":"hi"}"#)).unwrap();
        let (pb, db) = bodies(&req, &p[1], &d[3]);
        let pv: Value = serde_json::from_slice(&pb).unwrap();
        let dv: Value = serde_json::from_slice(&db).unwrap();
        assert_eq!(pv["routed_dp_rank"], 1);
        assert_eq!(dv["routed_dp_rank"], 3);
        assert_eq!(dv["disagg_prefill_dp_rank"], 1);
        assert_eq!(pv["bootstrap_room"], dv["bootstrap_room"]);
    }

    #[test]
    fn single_request_gets_scalars() {
        let req = parse(Endpoint::Generate, Bytes::from_static(br#"{"text":"hi"}"#)).unwrap();
        let v: Value = serde_json::from_slice(&inject(&req, &prefill(Some(9000)))).unwrap();
        assert_eq!(v["bootstrap_host"], "10.0.0.7");
        assert_eq!(v["bootstrap_port"], 9000);
        assert!(v["bootstrap_room"].as_u64().unwrap() < (1 << 63));
        assert_eq!(v["text"], "hi");
    }

    #[test]
    fn batch_and_n_get_arrays_with_independent_rooms() {
        let req = parse(
            Endpoint::Completions,
            Bytes::from_static(br#"{"prompt":["a","b"],"n":2}"#),
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&inject(&req, &prefill(None))).unwrap();
        assert_eq!(v["bootstrap_host"].as_array().unwrap().len(), 4);
        assert!(
            v["bootstrap_port"]
                .as_array()
                .unwrap()
                .iter()
                .all(Value::is_null)
        );
        let rooms: std::collections::HashSet<u64> = v["bootstrap_room"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_u64().unwrap())
            .collect();
        assert_eq!(rooms.len(), 4);
    }
}
