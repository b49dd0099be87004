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
//! The params and the engine ids are `crate::kv_handoff`'s (gRPC vLLM workers get the same);
//! here they become bodies, and the Prefill's rank the `X-data-parallel-rank` header whenever
//! the worker has more than one rank.

use http::{HeaderName, HeaderValue};
use serde_json::{Map, Value};

use super::legs::with_params;
use super::pd::Legs;
use crate::registry::Worker;

pub(super) use crate::kv_handoff::engine_ids;

/// The header naming the DP rank a vLLM request runs on.
const DP_RANK_HEADER: HeaderName = HeaderName::from_static("x-data-parallel-rank");

/// The bodies and header of one attempt from the client's body and the capped Prefill body
/// (without params), its transfer id fresh.
pub(super) fn legs(
    body: Map<String, Value>,
    capped: Map<String, Value>,
    prefill: &Worker,
    ids: &[String],
    request_id: &str,
) -> Legs {
    let h = crate::kv_handoff::mooncake(prefill, ids, request_id);
    Legs {
        prefill: with_params(capped, h.prefill),
        decode: with_params(body, h.decode),
        prefill_headers: h
            .rank
            .map(|r| (DP_RANK_HEADER, HeaderValue::from(r)))
            .into_iter()
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use bytes::Bytes;
    use serde_json::json;

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
