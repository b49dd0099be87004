//! One attempt: picking a request's workers — the Prefill worker through admission (when it
//! is on), then the Decode worker and its load, or, in regular mode, one worker and its load —
//! then the backend's legs.
//!
//! Invariants: Decode load is taken only after the Prefill reservation succeeded, so a
//! waiting or rejected request never inflates Decode load; a Decode worker speaks its
//! Prefill's runtime (the same KV hand-over); a request naming a model no registered worker
//! of a needed type serves is refused with 404 before anything is sent.

use std::sync::Arc;

use pdrouter_policy::Policy;

use super::{Backend, Core, RequestCtx};
use crate::config::WorkerType;
use crate::error::ApiError;
use crate::registry::{LoadGuard, Worker};
use crate::request::ParsedRequest;
use crate::select::{Candidates, Wanted};
use crate::sizing::SizedPermit;

/// A PD attempt's workers and what it holds of them.
pub(crate) struct Pair {
    pub(crate) prefill: Arc<Worker>,
    /// The Prefill slot, when admission is on.
    pub(crate) permit: Option<SizedPermit>,
    pub(crate) prefill_load: LoadGuard,
    pub(crate) decode: Arc<Worker>,
    pub(crate) decode_load: LoadGuard,
}

/// The queue timeout of a request of `priority`, in seconds (a plain function: computed in the
/// attempt's future it would take room there for the whole wait).
fn timeout_secs(
    adm: &pdrouter_admission::Admission,
    priority: pdrouter_admission::Priority,
) -> u64 {
    adm.config().classes().get(priority).queue_timeout.as_secs()
}

impl Core {
    /// One PD attempt: picks the Prefill worker (through admission, charging the backend's
    /// prompt tokens to a token budget), then the Decode worker, then runs the backend's legs.
    pub(super) async fn pd_attempt<B: Backend>(
        &self,
        backend: &B,
        req: &ParsedRequest,
        ctx: &RequestCtx,
        prepared: &B::Prepared,
    ) -> Result<B::Answer, ApiError> {
        let units = req.sub_requests() as u64;
        let prefill_sel = || {
            let wanted = self.wanted(req, ctx, &self.prefill_policy);
            self.candidates(WorkerType::Prefill, &self.prefill_policy, wanted)
        };
        // The selector is built as a temporary moved straight into `acquire`: a named local
        // would keep a dead copy of it in this future for the whole wait.
        let (prefill, permit) = match &self.admission {
            Some(adm) => match crate::telemetry::in_admission_span(
                adm.acquire(
                    prefill_sel()
                        .with_prompt_tokens(backend.prompt_tokens(req, prepared))
                        .with_priority(ctx.priority)
                        .checked_target()?,
                ),
            )
            .await
            {
                Ok(admitted) => (
                    admitted.choice,
                    Some(match &self.sizer {
                        Some(sizer) => sizer.watch(admitted.permit),
                        None => SizedPermit::fixed(admitted.permit),
                    }),
                ),
                Err(r) => {
                    tracing::debug!(reason = r.reason.as_str(), "prefill admission rejected");
                    return Err(ApiError::admission(r, timeout_secs(adm, ctx.priority)));
                }
            },
            None => (prefill_sel().pick()?, None),
        };
        let prefill_load = LoadGuard::new(prefill.clone(), units);
        let wanted = Wanted {
            target: None,
            // Without a named model, Decode serves what the chosen Prefill serves.
            model: self
                .routed_model(req)
                .or_else(|| prefill.model().map(|m| Arc::from(m.id.as_str()))),
            ..self.wanted(req, ctx, &self.decode_policy)
        };
        let decode = self
            .candidates(WorkerType::Decode, &self.decode_policy, wanted)
            .with_runtime(prefill.runtime())
            .with_pairing(prefill.pairing())
            .pick()?;
        let decode_load = LoadGuard::new(decode.clone(), units);
        let pair = Pair {
            prefill,
            permit,
            prefill_load,
            decode,
            decode_load,
        };
        // Boxed so that a request parked in the admission queue above holds only the small
        // selection state, not room for every later stage (this future lives, per waiter,
        // for as long as it waits).
        Box::pin(backend.send_pd(self, req, ctx, prepared, pair)).await
    }

    /// One regular-mode attempt: picks the one worker, takes its load, runs the backend's leg.
    pub(super) async fn one_attempt<B: Backend>(
        &self,
        backend: &B,
        req: &ParsedRequest,
        ctx: &RequestCtx,
        prepared: &B::Prepared,
    ) -> Result<B::Answer, ApiError> {
        let wanted = self.wanted(req, ctx, &self.policy);
        let worker = self
            .candidates(WorkerType::Regular, &self.policy, wanted)
            .pick()?;
        let load = LoadGuard::new(worker.clone(), req.sub_requests() as u64);
        backend
            .send_one(self, req, ctx, prepared, worker, load)
            .await
    }

    /// A named model must be served by a registered worker of every type the request needs
    /// (a worker whose model is not known yet counts), or nothing is sent: 404. A type with
    /// no worker at all is left to selection (503, like any request).
    pub(crate) fn check_model(&self, req: &ParsedRequest) -> Result<(), ApiError> {
        let Some(model) = self.routed_model(req) else {
            return Ok(());
        };
        let model = &*model;
        // Encode workers serve no model of their own.
        let types: &[WorkerType] = if self.cfg.mode.is_pd() {
            &[WorkerType::Prefill, WorkerType::Decode]
        } else {
            &[WorkerType::Regular]
        };
        let snap = self.registry.snapshot();
        let unserved = types.iter().any(|t| {
            let ws = snap.of_type(*t);
            !ws.is_empty() && !ws.iter().any(|w| w.serves(model))
        });
        if unserved {
            return Err(ApiError::model_not_found(model));
        }
        Ok(())
    }

    /// The registered workers of type `t` that `policy` picks among for `wanted`.
    fn candidates(&self, t: WorkerType, policy: &Arc<Policy>, wanted: Wanted) -> Candidates {
        Candidates::new(self.registry.clone(), policy.clone(), t, wanted)
    }

    /// What selection with `policy` needs of the request.
    pub(crate) fn wanted(&self, req: &ParsedRequest, ctx: &RequestCtx, policy: &Policy) -> Wanted {
        Wanted {
            text: req.text.clone(),
            routing_key: ctx.routing_key.clone(),
            target: ctx.target.map(|t| t as usize),
            model: self.routed_model(req),
            prefix_tokens: (policy.kind() == pdrouter_policy::PolicyKind::PrefixHash)
                .then(|| self.prefix_tokens(req))
                .flatten(),
        }
    }

    /// The first `--prefix-token-count` token ids of the prompt, for prefix_hash in front of
    /// http:// workers when the router was given a tokenizer (gRPC requests carry their ids
    /// in the plan instead).
    fn prefix_tokens(&self, req: &ParsedRequest) -> Option<Arc<Vec<u32>>> {
        let tokenizer = self.prefix_tokenizer.as_ref()?;
        let count = self.cfg.prefix_hash.prefix_token_count;
        // A token is rarely longer than 16 characters: encoding that much of the text yields
        // the first `count` ids without tokenizing a long prompt whole.
        let chars = count.saturating_mul(16);
        let text = match req.text.char_indices().nth(chars) {
            Some((end, _)) => &req.text[..end],
            None => &req.text,
        };
        match tokenizer.encode(text) {
            Ok(mut ids) => {
                ids.truncate(count);
                // A thin pointer: the selector a queued request holds stays small.
                Some(Arc::new(ids))
            }
            Err(e) => {
                tracing::debug!(error = %e, "prefix_hash: could not tokenize; keying on text");
                None
            }
        }
    }

    /// The model the request is routed for: `--model-alias` names resolve to their model.
    pub(crate) fn routed_model(&self, req: &ParsedRequest) -> Option<Arc<str>> {
        let named = req.model.as_ref()?;
        let model = self.cfg.resolve_model(named);
        Some(if model == &**named {
            named.clone()
        } else {
            Arc::from(model)
        })
    }
}
