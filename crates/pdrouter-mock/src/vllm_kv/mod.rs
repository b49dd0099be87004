//! vLLM mode's KV hand-over, the same for both fronts (`crate::http`'s vLLM server and
//! `crate::grpc`'s vLLM engine service): which leg a request is ([`params`]), the work a leg
//! does before its first token ([`prepare`]: a consumer's pull, an LMCache push, a producer's
//! prefill), a producer's hold once its answer is ready ([`hold`]), the transfers' client
//! side ([`transfer`]) and the `/mock/stats` fields of the KV table ([`insert_stats`]).
//!
//! A front reads its request into a [`KvLeg`] and [`LegFacts`], gates it (hang switch,
//! injected failure), calls [`prepare`], and answers: a consumer or plain leg reports
//! [`Prepared::cached`] as its cached prompt tokens after the rest of the delay; a producer
//! calls [`hold`] when its answer is ready and names what it returns.
//!
//! Invariants: blocks are held only by [`hold`], which a front calls only once the producer's
//! answer is ready, so a request that fails or whose client goes away first holds nothing;
//! every leg counts once in the KV counters (relayed, recomputed, pulled-failed, early end,
//! pushed) exactly as the HTTP front always has, whichever front serves it.

pub(crate) mod params;
pub(crate) mod transfer;

use std::time::Duration;

use serde_json::{Map, Value, json};

pub(crate) use params::{Body, KvLeg};

use crate::config::KvConnectorKind;
use crate::kv::{self, TableFull, Taken};
use crate::state::{MockStats, Shared};

/// What a leg's work needs to know of its request besides its [`KvLeg`].
#[derive(Debug, Clone, Default)]
pub(crate) struct LegFacts {
    /// The request's prompt tokens (what a transfer carries).
    pub(crate) prompt_tokens: u64,
    /// The prompt's size in the engine's units of prefill work (HTTP: its words; gRPC: its
    /// token ids); only a producer's engine-mode prefill reads it.
    pub(crate) compute_tokens: u64,
    /// LMCache: the prompt's key ([`transfer::prompt_key`]), `None` when it has none.
    pub(crate) prompt_key: Option<String>,
    /// Whether the request caps its output at exactly one token (LMCache's Prefill leg).
    pub(crate) one_token: bool,
    /// Whether its answer ends at its token cap; `false` when the model stops first (the
    /// prefill "ended early": nothing to hold or push).
    pub(crate) capped: bool,
}

/// What a leg's work before its first token left to its front.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Prepared {
    /// Prompt tokens that came from a transfer (the answer's cached tokens).
    pub(crate) cached: u64,
    /// The part of the configured delay still to wait before the first token.
    pub(crate) delay: Duration,
}

/// The leg's work before its first token, once the front let it through the hang switch and
/// the injected failure (an engine-mode producer waits out the hang inside the engine, here):
/// - produce: the prefill (the delay, or the engine's queue and compute time); nothing cached;
/// - consume / fetch: the pull from the producer; cached is what moved, 0 when it failed;
/// - plain, LMCache: what was pushed for the prompt (cached, used once) and, with a peer, a
///   one-token request's push of its prompt's KV after the delay;
/// - plain: nothing moves (cached 0).
pub(crate) async fn prepare(s: &Shared, leg: &KvLeg, facts: &LegFacts) -> Prepared {
    let delay = s.controls.delay();
    let cached = match leg {
        KvLeg::Produce | KvLeg::ProduceTransfer { .. } => {
            match &s.engine {
                Some(engine) => {
                    let hold = s.controls.wait_while_hung();
                    engine.prefill(facts.compute_tokens, delay, &[], hold).await;
                }
                None => sleep(delay).await,
            }
            return Prepared {
                cached: 0,
                delay: Duration::ZERO,
            };
        }
        KvLeg::Consume(remote) => {
            let pulled = transfer::nixl_pull(remote).await;
            let tokens = kv::transferred_tokens(facts.prompt_tokens, remote.block_ids.len());
            pulled_or_recomputed(s, pulled, tokens)
        }
        KvLeg::Fetch(src) => {
            let pulled = transfer::mooncake_pull(src).await;
            pulled_or_recomputed(s, pulled, kv::whole_blocks(facts.prompt_tokens))
        }
        KvLeg::Plain if s.kv_connector == KvConnectorKind::LmCache => {
            return lmcache(s, facts, delay).await;
        }
        KvLeg::Plain => {
            s.kv.record_recomputed(false);
            0
        }
    };
    Prepared { cached, delay }
}

/// A consumer's pull ended: `tokens` cached when it got the blocks, else 0 (recompute).
fn pulled_or_recomputed(s: &Shared, pulled: Result<(), String>, tokens: u64) -> u64 {
    match pulled {
        Ok(()) => {
            s.kv.record_relayed();
            tokens
        }
        Err(e) => {
            tracing::debug!(error = %e, "KV pull failed; recomputing the prompt");
            s.kv.record_recomputed(true);
            0
        }
    }
}

/// An LMCache request: use what was pushed for the prompt, and with a peer push a one-token
/// request's KV to it once the prompt is computed (after the delay), before answering.
async fn lmcache(s: &Shared, facts: &LegFacts, delay: Duration) -> Prepared {
    let prompt = facts.prompt_tokens;
    let key = facts.prompt_key.as_deref();
    let cached = match key.map(|k| s.kv.take_key(None, k)) {
        Some(Taken::Tokens(tokens)) => {
            s.kv.record_relayed();
            kv::whole_blocks(prompt.min(tokens))
        }
        _ => {
            s.kv.record_recomputed(false);
            0
        }
    };
    let (Some(peer), Some(key), true) = (&s.lmcache_peer, key, facts.one_token) else {
        return Prepared { cached, delay };
    };
    sleep(delay).await;
    if !facts.capped {
        s.kv.record_early_end();
    } else if let Err(e) = transfer::lmcache_push(peer, key, prompt).await {
        tracing::debug!(error = %e, "KV push failed; answering anyway");
        s.kv.record_push(false);
    } else {
        s.kv.record_push(true);
    }
    Prepared {
        cached,
        delay: Duration::ZERO,
    }
}

/// Where a producer holds its blocks.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Holder<'a> {
    /// NIXL: under the request id, named in the answer.
    Nixl(&'a str),
    /// Mooncake: under the transfer id, for the engine id of that DP rank.
    Mooncake(u32, &'a str),
}

/// A producer's answer is ready: when its prefill reached its cap (`capped`), holds the
/// blocks of its `prompt_tokens`-token prompt for the consumer and returns what the answer
/// names (NIXL: the consumer's `kv_transfer_params`; Mooncake: nothing, the consumer has its
/// own); otherwise counts an early end and holds nothing. Refused when the table is full.
pub(crate) fn hold(
    s: &Shared,
    holder: Holder<'_>,
    prompt_tokens: u64,
    capped: bool,
) -> Result<Option<Value>, TableFull> {
    if !capped {
        s.kv.record_early_end();
        return Ok(None);
    }
    match holder {
        Holder::Nixl(rid) => {
            let ids = s.kv.hold(rid, kv::blocks_for(prompt_tokens))?;
            let (host, port) = advertised(s);
            let engine = s.kv.engine_id();
            Ok(Some(params::producer_params(
                engine, rid, &ids, &host, port,
            )))
        }
        Holder::Mooncake(rank, id) => {
            s.kv.hold_for_rank(rank, id, prompt_tokens)?;
            Ok(None)
        }
    }
}

/// The host and port a consumer pulls from: the bound address (loopback when bound on
/// every address, which names no host to connect to).
fn advertised(s: &Shared) -> (String, u16) {
    let ip = s.addr.ip();
    let host = if ip.is_unspecified() {
        "127.0.0.1".to_owned()
    } else {
        ip.to_string()
    };
    (host, s.addr.port())
}

/// The engine id a worker reports as its own: its table's, or under Mooncake rank 0's (the
/// one `GET /query` names first).
pub(crate) fn reported_engine_id(s: &Shared) -> &str {
    match s.kv_connector {
        KvConnectorKind::Mooncake => s.kv.rank_engine_ids().next().unwrap_or(s.kv.engine_id()),
        _ => s.kv.engine_id(),
    }
}

/// The `/mock/stats` fields of vLLM mode (either front): the abort count, the KV counters,
/// `runtime: "vllm"`, `engine_id`, `kv_connector` and, for Mooncake, every rank's `engine_ids`.
pub(crate) fn insert_stats(map: &mut Map<String, Value>, s: &Shared, st: &MockStats) {
    for (name, n) in [
        ("aborts_total", st.aborts_total),
        ("kv_held_requests", st.kv_held_requests),
        ("kv_held_blocks", st.kv_held_blocks),
        ("kv_produced_total", st.kv_produced_total),
        ("kv_pulled_total", st.kv_pulled_total),
        ("kv_expired_total", st.kv_expired_total),
        ("kv_relayed_total", st.kv_relayed_total),
        ("kv_recomputed_total", st.kv_recomputed_total),
        ("kv_pull_failed_total", st.kv_pull_failed_total),
        ("prefill_early_end_total", st.prefill_early_end_total),
        ("kv_pushed_total", st.kv_pushed_total),
        ("kv_push_failed_total", st.kv_push_failed_total),
    ] {
        map.insert(name.to_owned(), json!(n));
    }
    map.insert("runtime".to_owned(), json!("vllm"));
    map.insert("engine_id".to_owned(), json!(s.kv.engine_id()));
    map.insert("kv_connector".to_owned(), json!(s.kv_connector.as_str()));
    if s.kv_connector == KvConnectorKind::Mooncake {
        let ids: Vec<&str> = s.kv.rank_engine_ids().collect();
        map.insert("engine_ids".to_owned(), json!(ids));
    }
}

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}
