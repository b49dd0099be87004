//! A gRPC Prefill leg's answer as the leg task reads it: its streams drained to their end,
//! keeping (when asked) each prompt's prompt logprobs and a vLLM Prefill's returned
//! connector parameters.
//!
//! Invariant: dropping a [`GrpcPrefill`] drops its streams (which sends `Abort`) and its
//! EPD Encode calls.

use std::sync::Arc;

use pdrouter_proto::scheduler::generate_response::Response as Msg;

use super::calls::status_error;
use super::encode::EncodeCalls;
use crate::core::leg::PrefillAnswer;
use crate::error::{ApiError, Leg};
use crate::grpc::client::Legs;
use crate::grpc::output::{self, InputLogprob};
use crate::registry::Worker;

/// A Prefill worker's started streams, drained by the leg task.
pub(super) struct GrpcPrefill {
    pub(super) streams: Legs,
    pub(super) worker: Arc<Worker>,
    pub(super) prompts: usize,
    /// EPD: the attempt's Encode calls, which this Prefill waits for; cancelled with it.
    pub(super) _encodes: EncodeCalls,
}

/// What a gRPC Prefill leg keeps of its answer.
#[derive(Debug, Default)]
pub(crate) struct PrefillKept {
    /// Each prompt's prompt logprobs.
    pub(crate) inputs: Vec<Vec<InputLogprob>>,
    /// vLLM: the connector parameters its `Complete` returned (JSON text).
    pub(crate) kv_params: Option<String>,
}

impl PrefillAnswer for GrpcPrefill {
    type Kept = PrefillKept;

    async fn drain(&mut self, keep: bool) -> Result<Option<Self::Kept>, ApiError> {
        let url = self.worker.url();
        let mut inputs: Vec<Option<Vec<InputLogprob>>> = vec![None; self.prompts];
        loop {
            let (i, m) = match self.streams.next().await {
                Ok(Some(m)) => m,
                Ok(None) => break,
                Err(s) => return Err(status_error(Leg::Prefill, url, &s)),
            };
            let lps = match &m.response {
                Some(Msg::Error(e)) => return Err(output::engine_error(Leg::Prefill, url, e)),
                Some(Msg::Chunk(c)) => c.input_logprobs.as_ref(),
                Some(Msg::Complete(c)) => c.input_logprobs.as_ref(),
                None => None,
            };
            // The first report of a prompt's logprobs is kept (every sample repeats it, and
            // the `Complete` repeats the first chunk's).
            if keep && let (Some(l), Some(slot @ None)) = (lps, inputs.get_mut(i)) {
                *slot = Some(output::input_logprobs(l));
            }
        }
        Ok(keep.then(|| PrefillKept {
            inputs: inputs.into_iter().map(Option::unwrap_or_default).collect(),
            kv_params: self.streams.take_kv_params(),
        }))
    }
}
