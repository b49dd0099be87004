//! vLLM engines over HTTP with the MooncakeConnector: both legs at once, one transfer id.
//!
//! The router mints a transfer id per attempt and sends it on both legs: the Prefill leg is
//! capped at one token (as for NIXL) and told `do_remote_decode` with that id; the Decode leg
//! is the client's body told `do_remote_prefill` with the id, the Prefill's bootstrap address
//! (`http://<host>:<bootstrap port>`, 8998 when none was given, as vLLM's own proxy assumes)
//! and the engine id of the Prefill's DP rank, which the router learns from that bootstrap
//! server's `GET /query` (`{"<rank>": {"engine_id": ...}}`) once per worker. The legs then
//! run as SGLang's do: the Decode engine pulls the blocks when the Prefill has them.
//!
//! Invariants:
//! - Both legs carry the same transfer id, fresh per attempt (a retried attempt never meets
//!   blocks an earlier attempt left held).
//! - The rank whose engine id Decode is given is the rank the Prefill leg is sent to (the
//!   `X-data-parallel-rank` header, whenever the worker has more than one rank).

use std::sync::Arc;

use http::{HeaderName, HeaderValue};
use serde_json::{Map, Value, json};

use super::legs::with_params;
use super::pd::Legs;
use crate::error::{ApiError, Leg};
use crate::proxy::client::UpstreamClient;
use crate::registry::Worker;

/// The bootstrap port vLLM's Mooncake connector listens on unless configured otherwise.
const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// The header naming the DP rank a vLLM request runs on.
const DP_RANK_HEADER: HeaderName = HeaderName::from_static("x-data-parallel-rank");

/// Most DP ranks read from a bootstrap server's answer.
const MAX_RANKS: usize = 1024;

/// The Prefill's bootstrap address, as Decode is given it.
fn bootstrap_addr(prefill: &Worker) -> String {
    let host = prefill.bootstrap_host();
    let port = prefill.bootstrap_port().unwrap_or(DEFAULT_BOOTSTRAP_PORT);
    // The bootstrap host is kept without brackets.
    if host.contains(':') {
        format!("http://[{host}]:{port}")
    } else {
        format!("http://{host}:{port}")
    }
}

/// The engine ids of `prefill`'s DP ranks, in rank order: learned once from its bootstrap
/// server, within `timeout`.
pub(super) async fn engine_ids(
    client: &UpstreamClient,
    prefill: &Worker,
    timeout: std::time::Duration,
) -> Result<Arc<Vec<String>>, ApiError> {
    if let Some(ids) = prefill.engine_ids() {
        return Ok(ids);
    }
    let addr = bootstrap_addr(prefill);
    let unreadable = || {
        ApiError::upstream_unreadable(
            Leg::Prefill,
            prefill.url(),
            &format!("engine id from its bootstrap server {addr}/query"),
        )
    };
    let (status, body) = client
        .get(&format!("{addr}/query"), None, timeout)
        .await
        .map_err(|_| ApiError::connect_failed(Leg::Prefill, &addr))?;
    if !status.is_success() {
        return Err(unreadable());
    }
    let ids = parse_query(&body).ok_or_else(unreadable)?;
    let ids = Arc::new(ids);
    prefill.set_engine_ids(ids.clone());
    Ok(ids)
}

/// A bootstrap server's `/query` answer as engine ids by rank: ranks 0..n all present, each
/// with a non-empty `engine_id`.
fn parse_query(body: &[u8]) -> Option<Vec<String>> {
    let v: Map<String, Value> = serde_json::from_slice(body).ok()?;
    if v.is_empty() || v.len() > MAX_RANKS {
        return None;
    }
    let mut ids = vec![String::new(); v.len()];
    for (rank, entry) in &v {
        let rank: usize = rank.parse().ok()?;
        let id = entry.get("engine_id")?.as_str().filter(|s| !s.is_empty())?;
        *ids.get_mut(rank)? = id.to_string();
    }
    ids.iter().all(|s| !s.is_empty()).then_some(ids)
}

/// The bodies and header of one attempt from the client's body and the capped Prefill body
/// (without params), its transfer id fresh.
pub(super) fn legs(
    body: Map<String, Value>,
    capped: Map<String, Value>,
    prefill: &Worker,
    ids: &[String],
    request_id: &str,
) -> Legs {
    let transfer_id = format!("xfer-{request_id}-{:016x}", rand::random::<u64>());
    let rank = match prefill.dp_rank() {
        Some(r) => r as usize,
        None if ids.len() > 1 => rand::random_range(0..ids.len()),
        None => 0,
    };
    let engine_id = ids.get(rank).or(ids.first()).cloned().unwrap_or_default();
    let mut prefill_headers = Vec::new();
    if ids.len() > 1 || prefill.dp_rank().is_some() {
        prefill_headers.push((DP_RANK_HEADER, HeaderValue::from(rank as u64)));
    }
    Legs {
        prefill: with_params(
            capped,
            json!({"do_remote_decode": true, "do_remote_prefill": false,
                "transfer_id": transfer_id}),
        ),
        decode: with_params(
            body,
            json!({"do_remote_decode": false, "do_remote_prefill": true,
                "remote_bootstrap_addr": bootstrap_addr(prefill),
                "remote_engine_id": engine_id, "transfer_id": transfer_id}),
        ),
        prefill_headers,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    #[test]
    fn query_answers_give_engine_ids_by_rank() {
        let ids = parse_query(br#"{"1": {"engine_id": "b"}, "0": {"engine_id": "a"}}"#);
        assert_eq!(ids.unwrap(), ["a", "b"]);
        assert!(parse_query(br#"{"0": {"engine_id": ""}}"#).is_none());
        assert!(
            parse_query(br#"{"1": {"engine_id": "b"}}"#).is_none(),
            "rank 0 missing"
        );
        assert!(parse_query(br#"{"x": {"engine_id": "b"}}"#).is_none());
        assert!(parse_query(b"{}").is_none());
        assert!(parse_query(b"[1]").is_none());
    }

    fn worker(url: &str, port: Option<u16>, dp_rank: Option<u32>) -> Arc<Worker> {
        use crate::config::WorkerType;
        let ws = super::super::bootstrap::tests::register(
            url,
            WorkerType::Prefill,
            port,
            dp_rank.map(|r| r + 1),
        );
        ws[dp_rank.unwrap_or(0) as usize].clone()
    }

    fn body(b: &Bytes) -> Value {
        serde_json::from_slice(b).unwrap()
    }

    #[test]
    fn both_legs_carry_one_fresh_transfer_id_and_decode_the_prefills_address() {
        let client = json!({"prompt": "hi", "max_tokens": 9, "stream": true});
        let Value::Object(client) = client else {
            unreachable!()
        };
        let capped = super::super::legs::capped(client.clone());
        let p = worker("http://10.0.0.7:8100", Some(9001), None);
        let ids = vec!["e0".to_string()];
        let first = legs(client.clone(), capped.clone(), &p, &ids, "req1");
        let (pb, db) = (body(&first.prefill), body(&first.decode));
        let (pk, dk) = (&pb["kv_transfer_params"], &db["kv_transfer_params"]);
        assert_eq!(pk["do_remote_decode"], true);
        assert_eq!(pk["do_remote_prefill"], false);
        assert_eq!(dk["do_remote_prefill"], true);
        assert_eq!(dk["do_remote_decode"], false);
        assert_eq!(pk["transfer_id"], dk["transfer_id"]);
        assert!(
            pk["transfer_id"]
                .as_str()
                .unwrap()
                .starts_with("xfer-req1-")
        );
        assert_eq!(dk["remote_bootstrap_addr"], "http://10.0.0.7:9001");
        assert_eq!(dk["remote_engine_id"], "e0");
        assert_eq!(pb["max_tokens"], 1);
        assert_eq!(pb["stream"], false);
        assert_eq!(db["max_tokens"], 9, "Decode gets the client's body");
        assert!(first.prefill_headers.is_empty(), "one rank: no header");
        let again = legs_of(&p, &ids, client.clone(), capped.clone());
        assert_ne!(again, pk["transfer_id"], "fresh per attempt");

        let none = worker("http://h:1", None, None);
        let l = legs(client.clone(), capped.clone(), &none, &ids, "r");
        assert_eq!(
            body(&l.decode)["kv_transfer_params"]["remote_bootstrap_addr"],
            "http://h:8998"
        );
        let ranked = worker("http://r:1", Some(5), Some(1));
        let two = vec!["a".to_string(), "b".to_string()];
        let l = legs(client, capped, &ranked, &two, "r");
        assert_eq!(
            body(&l.decode)["kv_transfer_params"]["remote_engine_id"],
            "b"
        );
        assert_eq!(
            l.prefill_headers,
            vec![(DP_RANK_HEADER, HeaderValue::from(1u64))]
        );
    }

    fn legs_of(p: &Worker, ids: &[String], b: Map<String, Value>, c: Map<String, Value>) -> Value {
        body(&legs(b, c, p, ids, "req1").prefill)["kv_transfer_params"]["transfer_id"].clone()
    }
}
