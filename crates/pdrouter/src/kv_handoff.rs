//! What vLLM's KV connectors are told, for every transport: NIXL's Prefill marker, Mooncake's
//! transfer ids and rendezvous (the Prefill's bootstrap address and the engine id of its DP
//! rank, learned from its bootstrap server), and the check of a Prefill's returned params.
//!
//! Invariants:
//! - Both Mooncake legs of an attempt carry the same transfer id, fresh per attempt (a retried
//!   attempt never meets blocks an earlier attempt left held).
//! - The rank whose engine id Decode is given is the rank the Prefill leg is sent to
//!   ([`MooncakeHandoff::rank`], sent whenever the worker has more than one rank).
//! - A Prefill's params are relayed verbatim when they are a JSON object; `null` or none means
//!   nothing is held (Decode recomputes); anything else is the Prefill worker's malformed
//!   answer.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use crate::error::{ApiError, Leg};
use crate::proxy::client::UpstreamClient;
use crate::registry::Worker;

/// The bootstrap port vLLM's Mooncake connector listens on unless configured otherwise.
const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// Most DP ranks read from a bootstrap server's answer.
const MAX_RANKS: usize = 1024;

/// What a NIXL Prefill leg is told: compute the prompt for a Decode elsewhere.
pub(crate) fn nixl_prefill_params() -> Value {
    json!({"do_remote_decode": true, "do_remote_prefill": false})
}

/// The Prefill's bootstrap address, as Decode is given it.
pub(crate) fn bootstrap_addr(prefill: &Worker) -> String {
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
pub(crate) async fn engine_ids(
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

/// One Mooncake attempt's params for both legs and the Prefill's DP rank.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct MooncakeHandoff {
    pub(crate) prefill: Value,
    pub(crate) decode: Value,
    /// The rank the Prefill leg must run on, when the worker has more than one.
    pub(crate) rank: Option<u32>,
}

/// A fresh Mooncake handoff for `request_id` through `prefill`, whose ranks' engine ids are
/// `ids`.
pub(crate) fn mooncake(prefill: &Worker, ids: &[String], request_id: &str) -> MooncakeHandoff {
    let transfer_id = format!("xfer-{request_id}-{:016x}", rand::random::<u64>());
    let rank = match prefill.dp_rank() {
        Some(r) => r as usize,
        None if ids.len() > 1 => rand::random_range(0..ids.len()),
        None => 0,
    };
    let engine_id = ids.get(rank).or(ids.first()).cloned().unwrap_or_default();
    let ranked = ids.len() > 1 || prefill.dp_rank().is_some();
    MooncakeHandoff {
        prefill: json!({"do_remote_decode": true, "do_remote_prefill": false,
            "transfer_id": transfer_id}),
        decode: json!({"do_remote_decode": false, "do_remote_prefill": true,
            "remote_bootstrap_addr": bootstrap_addr(prefill),
            "remote_engine_id": engine_id, "transfer_id": transfer_id}),
        rank: ranked.then(|| u32::try_from(rank).unwrap_or(u32::MAX)),
    }
}

/// A Prefill's returned params as Decode is to get them: an object, or null when nothing
/// is held (a missing field counts as null).
pub(crate) fn returned_params(p: Option<&Value>, url: &str) -> Result<Value, ApiError> {
    match p {
        None | Some(Value::Null) => Ok(Value::Null),
        Some(p @ Value::Object(_)) => Ok(p.clone()),
        Some(_) => Err(ApiError::upstream_unreadable(
            Leg::Prefill,
            url,
            "kv_transfer_params",
        )),
    }
}

/// A Prefill's returned params as JSON text (vLLM's gRPC answer): the text verbatim when it
/// is an object, `None` when absent or null.
pub(crate) fn returned_params_text(
    text: Option<String>,
    url: &str,
) -> Result<Option<String>, ApiError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let v: Value = serde_json::from_str(&text)
        .map_err(|_| ApiError::upstream_unreadable(Leg::Prefill, url, "kv_transfer_params_json"))?;
    match returned_params(Some(&v), url)? {
        Value::Null => Ok(None),
        _ => Ok(Some(text)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn returned_params_are_objects_or_nothing() {
        assert_eq!(returned_params_text(None, "u").unwrap(), None);
        assert_eq!(
            returned_params_text(Some("null".into()), "u").unwrap(),
            None
        );
        let obj = r#"{"remote_engine_id": "e"}"#.to_owned();
        assert_eq!(
            returned_params_text(Some(obj.clone()), "u").unwrap(),
            Some(obj)
        );
        assert!(returned_params_text(Some("[1]".into()), "u").is_err());
        assert!(returned_params_text(Some("{".into()), "u").is_err());
    }
}
