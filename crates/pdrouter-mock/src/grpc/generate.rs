//! One `Generate` call: what it generates ([`Plan`]) and the response
//! stream ([`Generation`]).
//!
//! Generated token ids are the bytes of [`OUTPUT_TEXT`] (repeated), so a
//! router with the byte-level tokenizer detokenizes them to that text; a
//! generation that ends naturally ends with the EOS id, as a real model's.
//!
//! Invariants: the final `complete` repeats exactly the ids the chunks
//! carried (all of a sample's ids for `stream = false`); the in-flight guard
//! and the abort registration live as long as the stream.

use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::BoxStream;
use pdrouter_proto::scheduler::{
    GenerateComplete, GenerateRequest, GenerateResponse, GenerateStreamChunk, InputLogProbs,
    InputTokenLogProb, OutputLogProbs, SamplingParams, TopLogProbs, generate_complete,
    generate_response,
};
use pdrouter_tokenizer::bytelevel;
use tonic::Status;

use super::aborts::AbortHandle;
use crate::config::Role;
use crate::state::{InflightGuard, Shared};

/// The text whose bytes a worker generates, from its start, repeating.
pub const OUTPUT_TEXT: &str = "The quick brown fox jumps over the lazy dög. ";

/// The end-of-sequence id a natural end generates (the chat EOS).
pub(crate) const EOS: u32 = bytelevel::EOS_TOKEN_IDS[0];

/// Most samples (`n`) one request may ask for.
const MAX_SAMPLES: u32 = 64;

/// The `i`-th generated id before stop conditions.
fn text_id(i: usize) -> u32 {
    let text = OUTPUT_TEXT.as_bytes();
    u32::from(text[i % text.len()])
}

/// How long the model's own answer is, before the request's cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Length {
    /// `n` tokens, the last one EOS unless the request ignores EOS.
    Natural(u32),
    /// Exactly the request's `max_new_tokens` (no EOS) when it has one, as an engine-mode
    /// decode generates what it is asked for; `n` natural tokens otherwise.
    Asked(u32),
    /// EOS is the model's first token: the answer ends at once, finish `stop`, no token (a
    /// prefill that ends before its cap).
    EosFirst,
}

impl Length {
    /// The length a worker of `role` generates: `output_tokens` natural ones, or in engine
    /// mode a decode's asked ones.
    pub(crate) fn of(role: Role, output_tokens: u32, engine_mode: bool) -> Length {
        if engine_mode && role == Role::Decode {
            Length::Asked(output_tokens)
        } else {
            Length::Natural(output_tokens)
        }
    }
}

/// What one request generates; every sample (`n`) generates the same.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Plan {
    pub(crate) ids: Vec<u32>,
    pub(crate) finish_reason: &'static str,
    pub(crate) matched_token: Option<u32>,
    pub(crate) prompt_tokens: u32,
    pub(crate) samples: u32,
    /// Logprobs of the prompt (Prefill and Regular, when asked for).
    pub(crate) input_logprobs: Option<InputLogProbs>,
    /// `Some(top_n)` when output logprobs are asked for.
    pub(crate) output_logprobs: Option<usize>,
}

impl Plan {
    /// Validates `req` and decides the output of a worker of `role` whose model answers at
    /// `length`.
    pub(crate) fn new(role: Role, req: &GenerateRequest, length: Length) -> Result<Plan, Status> {
        let default = SamplingParams::default();
        let sp = req.sampling_params.as_ref().unwrap_or(&default);
        let input = req.tokenized.as_ref().map(|t| t.input_ids.as_slice());
        let input = input.unwrap_or_default();
        if input.is_empty() {
            return Err(Status::invalid_argument("tokenized.input_ids is empty"));
        }
        if let Some(bad) = input.iter().find(|&&id| id >= bytelevel::VOCAB_SIZE) {
            return Err(Status::invalid_argument(format!(
                "input id {bad} is outside the vocabulary (size {})",
                bytelevel::VOCAB_SIZE
            )));
        }
        let context = bytelevel::MAX_POSITION_EMBEDDINGS as usize;
        if input.len() >= context {
            return Err(Status::invalid_argument(format!(
                "the input ({} tokens) is longer than the model's context length ({context} tokens)",
                input.len()
            )));
        }
        let room = context - input.len();
        if let Some(max) = sp.max_new_tokens
            && max as usize > room
        {
            return Err(Status::invalid_argument(format!(
                "requested token count exceeds the model's context length: {} input + {max} new > {context}",
                input.len()
            )));
        }
        let samples = sp.n.max(1);
        if samples > MAX_SAMPLES {
            return Err(Status::invalid_argument(format!(
                "n = {samples} is more than {MAX_SAMPLES}"
            )));
        }
        if role.requires_bootstrap() && req.disaggregated_params.is_none() {
            return Err(Status::invalid_argument("missing disaggregated_params"));
        }
        if let Some(d) = &req.disaggregated_params
            && d.bootstrap_room < 0
        {
            return Err(Status::invalid_argument("bootstrap_room is negative"));
        }

        let mut cap = sp.max_new_tokens.map(|m| m as usize);
        if role == Role::Prefill {
            // A prefill engine computes the prompt and samples one token.
            cap = Some(cap.map_or(1, |c| c.min(1)));
        }
        let (ids, end) = generate(length, cap, room, sp);
        let prompt_tokens = u32::try_from(input.len()).unwrap_or(u32::MAX);
        let input_logprobs =
            (req.return_logprob && req.logprob_start_len >= 0 && role != Role::Decode)
                .then(|| input_logprobs(input, req.logprob_start_len as usize));
        Ok(Plan {
            ids,
            finish_reason: end.0,
            matched_token: end.1,
            prompt_tokens,
            samples,
            input_logprobs,
            output_logprobs: req
                .return_logprob
                .then_some(usize::try_from(req.top_logprobs_num.max(0)).unwrap_or(0)),
        })
    }
}

impl Plan {
    /// The output as `text`'s bytes (repeated) instead of [`OUTPUT_TEXT`]'s: every id but a
    /// final EOS (the byte-level tokenizer decodes them back to `text`).
    pub(crate) fn write_text(&mut self, text: &[u8]) {
        if text.is_empty() {
            return;
        }
        let eos = usize::from(self.matched_token == Some(EOS) && self.ids.last() == Some(&EOS));
        let end = self.ids.len() - eos;
        for (i, id) in self.ids[..end].iter_mut().enumerate() {
            *id = u32::from(text[i % text.len()]);
        }
    }
}

/// The ids a model answering at `length` generates under the request's `cap` (and `room`
/// left in the context), and how it ends (finish reason, matched stop token).
fn generate(
    length: Length,
    cap: Option<usize>,
    room: usize,
    sp: &SamplingParams,
) -> (Vec<u32>, (&'static str, Option<u32>)) {
    let (natural, eos) = match (length, cap) {
        (Length::EosFirst, _) => return (Vec::new(), ("stop", None)),
        (Length::Asked(_), Some(c)) => (c, None),
        (Length::Asked(n) | Length::Natural(n), _) => (n as usize, (!sp.ignore_eos).then_some(EOS)),
    };
    let natural = natural.min(room);
    let mut ids = Vec::new();
    let mut end = ("length", None);
    for i in 0..natural {
        if cap.is_some_and(|c| ids.len() >= c) {
            break;
        }
        let id = match eos {
            Some(eos) if i + 1 == natural => eos,
            _ => text_id(i),
        };
        ids.push(id);
        if sp.stop_token_ids.contains(&id) || Some(id) == eos {
            end = ("stop", Some(id));
            break;
        }
    }
    (ids, end)
}

/// Deterministic logprob of generated position `i`.
fn output_logprob(i: usize) -> f32 {
    -((i % 32) as f32 + 1.0) / 8.0
}

/// Prompt logprobs from `start`; the very first prompt token has none.
fn input_logprobs(input: &[u32], start: usize) -> InputLogProbs {
    let positions = start.min(input.len())..input.len();
    InputLogProbs {
        token_logprobs: positions
            .clone()
            .map(|j| InputTokenLogProb {
                value: (j > 0).then(|| -((j % 16) as f32 + 1.0) / 16.0),
            })
            .collect(),
        token_ids: input[positions].to_vec(),
        top_logprobs: Vec::new(),
    }
}

/// Logprobs of generated positions `range` of `ids`, with `top_n`
/// alternatives each (the chosen id first).
fn output_logprobs(ids: &[u32], range: std::ops::Range<usize>, top_n: usize) -> OutputLogProbs {
    OutputLogProbs {
        token_logprobs: range.clone().map(output_logprob).collect(),
        token_ids: ids[range.clone()].to_vec(),
        top_logprobs: if top_n == 0 {
            Vec::new()
        } else {
            range
                .map(|i| TopLogProbs {
                    values: (0..top_n).map(|k| output_logprob(i) - k as f32).collect(),
                    token_ids: (0..top_n as u32)
                        .map(|k| (ids[i] + k) % bytelevel::VOCAB_SIZE)
                        .collect(),
                })
                .collect()
        },
    }
}

/// A running generation: yields the chunks and completes of every sample.
#[derive(Debug)]
pub(crate) struct Generation {
    request_id: String,
    plan: Plan,
    stream: bool,
    interval: Duration,
    /// Positions already sent in chunks.
    sent: usize,
    /// Messages decided but not yet yielded.
    queue: std::collections::VecDeque<GenerateResponse>,
    finished: bool,
    abort: AbortHandle,
    shared: Arc<Shared>,
    _guard: InflightGuard,
}

impl Generation {
    pub(crate) fn new(
        req: &GenerateRequest,
        plan: Plan,
        interval: Duration,
        abort: AbortHandle,
        guard: InflightGuard,
        shared: Arc<Shared>,
    ) -> Self {
        Generation {
            request_id: req.request_id.clone(),
            plan,
            stream: req.stream,
            interval,
            sent: 0,
            queue: Default::default(),
            finished: false,
            abort,
            shared,
            _guard: guard,
        }
    }

    pub(crate) fn into_stream(self) -> BoxStream<'static, Result<GenerateResponse, Status>> {
        futures_util::stream::unfold(self, |mut g| async move {
            let msg = g.next().await?;
            Some((Ok(msg), g))
        })
        .boxed()
    }

    fn response(&self, r: generate_response::Response) -> GenerateResponse {
        GenerateResponse {
            request_id: self.request_id.clone(),
            response: Some(r),
        }
    }

    /// Sleeps `d` unless aborted first; `false` on abort.
    async fn pause(&mut self, d: Duration) -> bool {
        if self.abort.is_aborted() {
            return false;
        }
        if d.is_zero() {
            return true;
        }
        tokio::select! {
            () = tokio::time::sleep(d) => true,
            () = self.abort.aborted() => false,
        }
    }

    async fn next(&mut self) -> Option<GenerateResponse> {
        if let Some(m) = self.queue.pop_front() {
            return Some(m);
        }
        if self.finished {
            // The hold switch keeps the stream open after its last message, like an HTTP
            // body that never ends; the router dropping the stream ends it.
            if self.shared.controls.hold_body_open() {
                self.shared.controls.body_released().await;
            }
            return None;
        }
        let len = self.plan.ids.len();
        if self.stream && self.sent < len {
            let gap = if self.sent == 0 {
                Duration::ZERO
            } else {
                self.interval
            };
            if !self.pause(gap).await {
                self.finish(true);
                return self.queue.pop_front();
            }
            let i = self.sent;
            self.sent += 1;
            for index in 0..self.plan.samples {
                let chunk = self.chunk(i, index);
                self.queue.push_back(chunk);
            }
            return self.queue.pop_front();
        }
        if !self.stream {
            let gaps = u32::try_from(len.saturating_sub(1)).unwrap_or(u32::MAX);
            if !self.pause(self.interval.saturating_mul(gaps)).await {
                self.finish(true);
                return self.queue.pop_front();
            }
            self.sent = len;
        }
        self.finish(false);
        self.queue.pop_front()
    }

    fn chunk(&self, i: usize, index: u32) -> GenerateResponse {
        let p = &self.plan;
        self.response(generate_response::Response::Chunk(GenerateStreamChunk {
            token_ids: vec![p.ids[i]],
            prompt_tokens: p.prompt_tokens,
            completion_tokens: (i + 1) as u32,
            cached_tokens: 0,
            output_logprobs: p
                .output_logprobs
                .map(|top| output_logprobs(&p.ids, i..i + 1, top)),
            input_logprobs: if i == 0 {
                p.input_logprobs.clone()
            } else {
                None
            },
            index,
            ..Default::default()
        }))
    }

    /// Queues the completes of every sample: the ids sent so far, ended by
    /// an abort or by the plan's finish reason.
    fn finish(&mut self, aborted: bool) {
        self.finished = true;
        let p = &self.plan;
        let ids = &p.ids[..self.sent];
        let (reason, matched) = if aborted {
            ("abort", None)
        } else {
            (p.finish_reason, p.matched_token)
        };
        let completes: Vec<_> = (0..p.samples)
            .map(|index| {
                self.response(generate_response::Response::Complete(GenerateComplete {
                    output_ids: ids.to_vec(),
                    finish_reason: reason.to_owned(),
                    prompt_tokens: p.prompt_tokens,
                    completion_tokens: ids.len() as u32,
                    cached_tokens: 0,
                    output_logprobs: p
                        .output_logprobs
                        .map(|top| output_logprobs(ids, 0..ids.len(), top)),
                    matched_stop: matched.map(generate_complete::MatchedStop::MatchedTokenId),
                    input_logprobs: p.input_logprobs.clone(),
                    index,
                    ..Default::default()
                }))
            })
            .collect();
        self.shared.controls.record_output(ids);
        self.queue.extend(completes);
    }
}

#[cfg(test)]
mod tests {
    use pdrouter_proto::scheduler::{DisaggregatedParams, TokenizedInput};

    use super::*;

    fn req(sp: SamplingParams) -> GenerateRequest {
        GenerateRequest {
            request_id: "r".to_owned(),
            tokenized: Some(TokenizedInput {
                original_text: String::new(),
                input_ids: vec![1, 2, 3],
            }),
            sampling_params: Some(sp),
            disaggregated_params: Some(DisaggregatedParams::default()),
            ..Default::default()
        }
    }

    const N8: Length = Length::Natural(8);

    fn plan(role: Role, sp: SamplingParams, tokens: u32) -> Plan {
        Plan::new(role, &req(sp), Length::Natural(tokens)).unwrap()
    }

    #[test]
    fn natural_end_is_the_text_then_eos() {
        let p = plan(Role::Regular, SamplingParams::default(), 5);
        assert_eq!(p.ids, vec![84, 104, 101, 32, EOS]); // "The " + EOS
        assert_eq!((p.finish_reason, p.matched_token), ("stop", Some(EOS)));
        assert_eq!(p.prompt_tokens, 3);
        let ignore = SamplingParams {
            ignore_eos: true,
            ..Default::default()
        };
        let p = plan(Role::Decode, ignore, 4);
        assert_eq!(
            p.ids,
            OUTPUT_TEXT.as_bytes()[..4]
                .iter()
                .map(|&b| u32::from(b))
                .collect::<Vec<_>>()
        );
        assert_eq!((p.finish_reason, p.matched_token), ("length", None));
    }

    #[test]
    fn max_new_tokens_and_stop_token_ids_end_early() {
        let capped = SamplingParams {
            max_new_tokens: Some(2),
            ..Default::default()
        };
        let p = plan(Role::Regular, capped, 8);
        assert_eq!((p.ids.len(), p.finish_reason), (2, "length"));
        let stop_at_space = SamplingParams {
            stop_token_ids: vec![32],
            ..Default::default()
        };
        let p = plan(Role::Regular, stop_at_space, 8);
        assert_eq!(p.ids, vec![84, 104, 101, 32]);
        assert_eq!((p.finish_reason, p.matched_token), ("stop", Some(32)));
        let zero = SamplingParams {
            max_new_tokens: Some(0),
            ..Default::default()
        };
        assert!(plan(Role::Regular, zero, 8).ids.is_empty());
    }

    #[test]
    fn prefill_samples_one_token_and_engine_decode_follows_max_new_tokens() {
        let p = plan(Role::Prefill, SamplingParams::default(), 8);
        assert_eq!((p.ids.len(), p.finish_reason), (1, "length"));
        let sp = SamplingParams {
            max_new_tokens: Some(20),
            ..Default::default()
        };
        let p = Plan::new(Role::Decode, &req(sp), Length::of(Role::Decode, 8, true)).unwrap();
        assert_eq!((p.ids.len(), p.finish_reason), (20, "length"));
        let eos = Plan::new(
            Role::Regular,
            &req(SamplingParams::default()),
            Length::EosFirst,
        );
        let eos = eos.unwrap();
        assert_eq!((eos.ids.len(), eos.finish_reason), (0, "stop"));
    }

    #[test]
    fn bad_requests_are_invalid_argument() {
        let bad = |r: GenerateRequest, role: Role| Plan::new(role, &r, N8).unwrap_err().code();
        let mut empty = req(SamplingParams::default());
        empty.tokenized = None;
        assert_eq!(bad(empty, Role::Regular), tonic::Code::InvalidArgument);
        let mut no_ticket = req(SamplingParams::default());
        no_ticket.disaggregated_params = None;
        assert_eq!(
            bad(no_ticket.clone(), Role::Decode),
            tonic::Code::InvalidArgument
        );
        assert!(Plan::new(Role::Regular, &no_ticket, N8).is_ok());
        let huge = req(SamplingParams {
            max_new_tokens: Some(u32::MAX),
            ..Default::default()
        });
        assert_eq!(bad(huge, Role::Regular), tonic::Code::InvalidArgument);
        let many = req(SamplingParams {
            n: MAX_SAMPLES + 1,
            ..Default::default()
        });
        assert_eq!(bad(many, Role::Regular), tonic::Code::InvalidArgument);
        let mut out_of_vocab = req(SamplingParams::default());
        out_of_vocab.tokenized.as_mut().unwrap().input_ids = vec![bytelevel::VOCAB_SIZE];
        assert_eq!(
            bad(out_of_vocab, Role::Regular),
            tonic::Code::InvalidArgument
        );
    }

    #[test]
    fn logprobs_cover_the_prompt_from_start_and_every_output() {
        let mut r = req(SamplingParams::default());
        r.return_logprob = true;
        r.logprob_start_len = 1;
        r.top_logprobs_num = 2;
        let p = Plan::new(Role::Regular, &r, Length::Natural(3)).unwrap();
        let input = p.input_logprobs.unwrap();
        assert_eq!(input.token_ids, vec![2, 3]);
        assert!(input.token_logprobs.iter().all(|l| l.value.is_some()));
        assert_eq!(p.output_logprobs, Some(2));
        let out = output_logprobs(&p.ids, 0..p.ids.len(), 2);
        assert_eq!(out.token_ids, p.ids);
        assert_eq!(out.top_logprobs.len(), p.ids.len());
        assert_eq!(out.top_logprobs[0].token_ids[0], p.ids[0]);
        // Decode legs carry no prompt logprobs (the Prefill leg has them).
        assert!(
            Plan::new(Role::Decode, &r, Length::Natural(3))
                .unwrap()
                .input_logprobs
                .is_none()
        );
    }
}
