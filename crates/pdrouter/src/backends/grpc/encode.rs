//! EPD's Encode calls: each image item of a request goes to an Encode worker chosen by
//! `--encode-policy` keyed by the item's content hash, under its own random room, before the
//! request's Prefill and Decode legs start.
//!
//! Invariants: an Encode call's failure is logged and counted
//! (`smg_pd_encode_failures_total{worker}`) and charged to the worker's breaker, never to the
//! request: the Prefill waits (bounded) for every item's embedding itself, and that wait
//! decides the request. Encode workers take no admission slot; each call holds one unit of
//! its worker's load, released when the call ends (the guard lives in the call's task).
//! Every worker is chosen before any call is sent, so a request refused for want of an Encode
//! worker sent nothing. The calls end with their attempt: [`EncodeCalls`] is held by the
//! attempt's Prefill answer, and dropping it (the client gone, the attempt failed or retried,
//! the Prefill over) cancels every call still running, which releases its load and the
//! request's pixels at once.

use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;

use tracing::Instrument as _;

use super::GrpcBackend;
use crate::config::WorkerType;
use crate::core::Core;
use crate::error::ApiError;
use crate::images::{EncodeTicket, PromptImages};
use crate::registry::LoadGuard;
use crate::select::{Candidates, Wanted};

/// An attempt's running Encode calls; dropping it cancels those still running.
#[derive(Debug, Default)]
pub(super) struct EncodeCalls(Vec<JoinHandle<()>>);

impl Drop for EncodeCalls {
    fn drop(&mut self) {
        for h in &self.0 {
            h.abort();
        }
    }
}

impl GrpcBackend {
    /// Chooses an Encode worker and a room for every item of `images`, starts one `Encode`
    /// per item (each bounded by `timeout`), and returns the tickets the Prefill needs, in
    /// item order, and the calls (to be held for as long as the attempt's Prefill may wait
    /// for them). Fails (503) only when an item finds no Encode worker.
    pub(super) fn start_encodes(
        &self,
        core: &Core,
        request_id: &str,
        images: &Arc<PromptImages>,
        timeout: Duration,
    ) -> Result<(Vec<EncodeTicket>, EncodeCalls), ApiError> {
        let mut chosen = Vec::with_capacity(images.items.len());
        for (i, item) in images.items.iter().enumerate() {
            let key: Arc<str> = item.image.hash.hex().into();
            let worker = Candidates::new(
                core.registry.clone(),
                self.encode_policy.clone(),
                WorkerType::Encode,
                Wanted {
                    text: key.clone(),
                    routing_key: Some(key),
                    target: None,
                    model: None,
                    prefix_tokens: None,
                },
            )
            .pick()?;
            let index = u32::try_from(i).unwrap_or(u32::MAX);
            let ticket =
                EncodeTicket::fresh(index, worker.bootstrap_host(), worker.bootstrap_port());
            chosen.push((worker, ticket));
        }
        let mut tickets = Vec::with_capacity(chosen.len());
        let mut calls = EncodeCalls(Vec::with_capacity(chosen.len()));
        for (i, (worker, ticket)) in chosen.into_iter().enumerate() {
            let id = format!("{request_id}-enc{i}-{:x}", ticket.at.room);
            let load = LoadGuard::new(worker.clone(), 1);
            core.metrics.encode_sent(&worker);
            let (registry, metrics) = (core.registry.clone(), core.metrics.clone());
            let (images, room) = (images.clone(), ticket.at.room);
            let span = tracing::debug_span!("encode", worker = %worker.url(), item = i, room);
            let call = tokio::spawn(
                async move {
                    let _load = load;
                    let outcome = match (worker.grpc(), images.encode_request(id, i, room)) {
                        (Some(ch), Some(req)) => match ch.encode(req, timeout).await {
                            Ok(true) => Ok(()),
                            Ok(false) => Err("the worker did not accept the item".to_owned()),
                            Err(s) => Err(format!("{:?}: {}", s.code(), s.message())),
                        },
                        _ => Err("no gRPC channel or no such item".to_owned()),
                    };
                    if let Err(error) = &outcome {
                        tracing::warn!(
                            worker = %worker.url(),
                            item = i,
                            room,
                            %error,
                            "Encode failed; the Prefill's wait for the item decides the request"
                        );
                        metrics.encode_failed(&worker);
                    }
                    registry.record_outcome(&worker, outcome.is_ok());
                }
                .instrument(span),
            );
            calls.0.push(call);
            tickets.push(ticket);
        }
        Ok((tickets, calls))
    }
}
