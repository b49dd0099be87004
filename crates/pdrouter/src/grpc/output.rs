//! A leg's output turned into text: one [`Choice`] per prompt per sample, each with its own
//! detokenizer, stop conditions and logprobs.
//!
//! Invariants: a choice's text comes from the engine's chunks only (the final `Complete`
//! repeats those ids and counts only when no chunk came); once the router's stop conditions
//! end a choice, later ids of it are ignored; a choice index is `prompt * n + sample`, and a
//! message naming a sample beyond `n` is a broken answer, not a panic.

use std::ops::Range;
use std::sync::Arc;

use pdrouter_proto::scheduler::generate_complete::MatchedStop;
use pdrouter_proto::scheduler::generate_response::Response as Msg;
use pdrouter_proto::scheduler::{
    GenerateError, GenerateResponse, InputLogProbs, OutputLogProbs, TopLogProbs,
};
use pdrouter_tokenizer::{FinishReason, TextStream, Tokenizer};

use super::plan::Plan;
use crate::error::{ApiError, Leg};

/// The logprob of one generated token and its top alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    /// The token.
    pub id: u32,
    /// Its logprob.
    pub logprob: f32,
    /// The most likely tokens at this position, best first.
    pub top: Vec<(u32, f32)>,
}

/// The logprob of one prompt token (the first prompt token has none).
#[derive(Debug, Clone, PartialEq)]
pub struct InputLogprob {
    /// The token.
    pub id: u32,
    /// Its logprob, when the engine computed one.
    pub logprob: Option<f32>,
    /// The most likely tokens at this position, best first.
    pub top: Vec<(u32, f32)>,
}

/// Token counts of a finished sequence or answer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt: u32,
    /// Generated tokens.
    pub completion: u32,
    /// Prompt tokens served from cache.
    pub cached: u32,
}

/// The engine's finish reason, as the router's.
pub fn engine_finish(
    reason: &str,
    matched_token: Option<u32>,
    matched_text: Option<&str>,
) -> FinishReason {
    match (reason, matched_token, matched_text) {
        (_, Some(id), _) => FinishReason::StopToken(id),
        (_, _, Some(s)) => FinishReason::StopString(s.to_owned()),
        ("length", ..) => FinishReason::Length,
        ("abort", ..) => FinishReason::Abort,
        _ => FinishReason::Stop,
    }
}

fn top(t: Option<&TopLogProbs>) -> Vec<(u32, f32)> {
    t.map(|t| {
        t.token_ids
            .iter()
            .copied()
            .zip(t.values.iter().copied())
            .collect()
    })
    .unwrap_or_default()
}

fn output_logprobs(l: &OutputLogProbs) -> Vec<TokenLogprob> {
    l.token_ids
        .iter()
        .zip(&l.token_logprobs)
        .enumerate()
        .map(|(k, (&id, &logprob))| TokenLogprob {
            id,
            logprob,
            top: top(l.top_logprobs.get(k)),
        })
        .collect()
}

/// Prompt logprobs as the engine reports them.
pub fn input_logprobs(l: &InputLogProbs) -> Vec<InputLogprob> {
    l.token_ids
        .iter()
        .enumerate()
        .map(|(k, &id)| InputLogprob {
            id,
            logprob: l.token_logprobs.get(k).and_then(|v| v.value),
            top: top(l.top_logprobs.get(k)),
        })
        .collect()
}

/// One output sequence.
#[derive(Debug)]
pub struct Choice {
    /// Which prompt it answers.
    pub prompt: usize,
    text: TextStream,
    /// The ids the router kept (up to the one that ended it).
    pub ids: Vec<u32>,
    /// The text so far.
    pub full: String,
    /// Why it ended, once it has (by the router's stop conditions or the engine's end).
    pub finish: Option<FinishReason>,
    /// The engine sent its `Complete` (or the stream ended after the router's stop).
    pub ended: bool,
    /// Generated tokens, as counted for usage.
    pub completion: u32,
    /// Logprobs of the kept ids, when asked for.
    pub logprobs: Vec<TokenLogprob>,
    got_chunk: bool,
}

/// What one message added to one choice.
#[derive(Debug, Clone, PartialEq)]
pub struct Delta {
    /// The choice.
    pub index: usize,
    /// Text to send now (may be empty).
    pub text: String,
    /// The logprob entries added, as positions in the choice's `logprobs`.
    pub logprobs: Range<usize>,
    /// This message ended the choice.
    pub finished: bool,
}

/// All the choices of one answer.
#[derive(Debug)]
pub struct Output {
    /// One per prompt per sample, by index.
    pub choices: Vec<Choice>,
    /// The tokenizer of the text (logprob tokens are shown with it too).
    pub tokenizer: Arc<Tokenizer>,
    n: usize,
    logprobs: bool,
    prompt_tokens: Vec<u32>,
    cached: Vec<u32>,
    /// Prompt logprobs per prompt (Prefill's, then Decode's).
    input: Vec<Vec<InputLogprob>>,
    decode_input_seen: Vec<bool>,
}

fn broken(url: &str, why: &str) -> ApiError {
    tracing::warn!(url, why, "broken gRPC answer");
    ApiError::upstream_broken(Leg::Decode, url)
}

/// An engine's `error` message as the client's error.
pub fn engine_error(leg: Leg, url: &str, e: &GenerateError) -> ApiError {
    let status = e
        .http_status_code
        .parse::<u16>()
        .ok()
        .and_then(|c| http::StatusCode::from_u16(c).ok())
        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    ApiError::upstream_status(leg, url, status, &e.message)
}

fn count(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

impl Output {
    /// Empty choices for every prompt and sample of `plan`.
    pub fn new(tokenizer: Arc<Tokenizer>, plan: &Plan) -> Self {
        let prompts = plan.prompt_tokens.len();
        let choices = (0..prompts * plan.n)
            .map(|i| Choice {
                prompt: i / plan.n,
                text: TextStream::new(tokenizer.clone(), plan.decode, plan.stop.clone()),
                ids: Vec::new(),
                full: String::new(),
                finish: None,
                ended: false,
                completion: 0,
                logprobs: Vec::new(),
                got_chunk: false,
            })
            .collect();
        Self {
            choices,
            tokenizer,
            n: plan.n,
            logprobs: plan.logprobs.output,
            prompt_tokens: plan.prompt_tokens.clone(),
            cached: vec![0; prompts],
            input: vec![Vec::new(); prompts],
            decode_input_seen: vec![false; prompts],
        }
    }

    /// Whether every choice ended.
    pub fn done(&self) -> bool {
        self.choices.iter().all(|c| c.ended)
    }

    /// Token counts of the whole answer: each prompt counted once, every sample's output.
    pub fn usage(&self) -> Usage {
        Usage {
            prompt: self
                .prompt_tokens
                .iter()
                .fold(0, |a, &p| a.saturating_add(p)),
            completion: self
                .choices
                .iter()
                .fold(0, |a, c| a.saturating_add(c.completion)),
            cached: self.cached.iter().fold(0, |a, &p| a.saturating_add(p)),
        }
    }

    /// Token counts of one choice.
    pub fn choice_usage(&self, index: usize) -> Usage {
        let c = &self.choices[index];
        Usage {
            prompt: self.prompt_tokens[c.prompt],
            completion: c.completion,
            cached: self.cached[c.prompt],
        }
    }

    /// Prompt logprobs of `prompt`.
    pub fn input_logprobs(&self, prompt: usize) -> &[InputLogprob] {
        &self.input[prompt]
    }

    /// Puts Prefill's prompt logprobs of `prompt` ahead of Decode's.
    pub fn prepend_input_logprobs(&mut self, prompt: usize, mut lps: Vec<InputLogprob>) {
        if let Some(slot) = self.input.get_mut(prompt) {
            lps.append(slot);
            *slot = lps;
        }
    }

    fn push_ids(
        c: &mut Choice,
        ids: &[u32],
        lps: &[TokenLogprob],
        keep_lps: bool,
    ) -> Result<String, ApiError> {
        let mut delta = String::new();
        for (k, &id) in ids.iter().enumerate() {
            if c.finish.is_some() {
                break;
            }
            c.ids.push(id);
            if keep_lps && let Some(lp) = lps.get(k) {
                c.logprobs.push(lp.clone());
            }
            let step = c
                .text
                .push(id)
                .map_err(|e| ApiError::internal(format!("detokenizing: {e}")))?;
            delta.push_str(&step.text);
            if let Some(f) = step.finish {
                c.completion = count(c.ids.len());
                c.finish = Some(f);
            }
        }
        Ok(delta)
    }

    fn choice_index(&self, prompt: usize, sample: u32, url: &str) -> Result<usize, ApiError> {
        let sample = sample as usize;
        if prompt >= self.prompt_tokens.len() || sample >= self.n {
            return Err(broken(url, "a sample index beyond n"));
        }
        Ok(prompt * self.n + sample)
    }

    fn note_input(&mut self, prompt: usize, l: Option<&InputLogProbs>) {
        if let Some(l) = l
            && !self.decode_input_seen[prompt]
        {
            self.decode_input_seen[prompt] = true;
            self.input[prompt].extend(input_logprobs(l));
        }
    }

    /// Takes one Decode message of `prompt`'s stream.
    pub fn absorb(
        &mut self,
        prompt: usize,
        m: GenerateResponse,
        url: &str,
    ) -> Result<Delta, ApiError> {
        let keep = self.logprobs;
        match m.response {
            Some(Msg::Chunk(c)) => {
                let index = self.choice_index(prompt, c.index, url)?;
                if c.prompt_tokens > 0 {
                    self.prompt_tokens[prompt] = c.prompt_tokens;
                }
                self.cached[prompt] = c.cached_tokens;
                self.note_input(prompt, c.input_logprobs.as_ref());
                let lps = c
                    .output_logprobs
                    .as_ref()
                    .map(output_logprobs)
                    .unwrap_or_default();
                let ch = &mut self.choices[index];
                ch.got_chunk = true;
                let before = ch.logprobs.len();
                let text = Self::push_ids(ch, &c.token_ids, &lps, keep)?;
                ch.full.push_str(&text);
                Ok(Delta {
                    index,
                    text,
                    logprobs: before..ch.logprobs.len(),
                    finished: false,
                })
            }
            Some(Msg::Complete(c)) => {
                let index = self.choice_index(prompt, c.index, url)?;
                if c.prompt_tokens > 0 {
                    self.prompt_tokens[prompt] = c.prompt_tokens;
                }
                self.cached[prompt] = c.cached_tokens;
                self.note_input(prompt, c.input_logprobs.as_ref());
                let ch = &mut self.choices[index];
                if ch.ended {
                    return Err(broken(url, "a second Complete for one sample"));
                }
                ch.ended = true;
                let before = ch.logprobs.len();
                // The final ids repeat what the chunks carried; they count only when no
                // chunk came at all.
                let mut text = if ch.got_chunk {
                    String::new()
                } else {
                    let lps = c
                        .output_logprobs
                        .as_ref()
                        .map(output_logprobs)
                        .unwrap_or_default();
                    Self::push_ids(ch, &c.output_ids, &lps, keep)?
                };
                if ch.finish.is_none() {
                    let (tok, stop) = match &c.matched_stop {
                        Some(MatchedStop::MatchedTokenId(id)) => (Some(*id), None),
                        Some(MatchedStop::MatchedStopStr(s)) => (None, Some(s.as_str())),
                        None => (None, None),
                    };
                    let reason = engine_finish(&c.finish_reason, tok, stop);
                    let step = ch
                        .text
                        .finish(reason.clone())
                        .map_err(|e| ApiError::internal(format!("detokenizing: {e}")))?;
                    text.push_str(&step.text);
                    ch.finish = Some(step.finish.unwrap_or(reason));
                    ch.completion = c.completion_tokens.max(count(ch.ids.len()));
                }
                ch.full.push_str(&text);
                Ok(Delta {
                    index,
                    text,
                    logprobs: before..ch.logprobs.len(),
                    finished: true,
                })
            }
            Some(Msg::Error(e)) => Err(engine_error(Leg::Decode, url, &e)),
            None => Err(broken(url, "an empty message")),
        }
    }

    /// Every stream ended: choices the router's stop conditions had ended are done; any
    /// other is a broken answer.
    pub fn eof(&mut self, url: &str) -> Result<Vec<Delta>, ApiError> {
        let mut out = Vec::new();
        for (index, c) in self.choices.iter_mut().enumerate() {
            if c.ended {
                continue;
            }
            if c.finish.is_none() {
                return Err(broken(url, "a stream ended without its Complete"));
            }
            c.ended = true;
            out.push(Delta {
                index,
                text: String::new(),
                logprobs: c.logprobs.len()..c.logprobs.len(),
                finished: true,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use pdrouter_proto::scheduler::{GenerateComplete, GenerateStreamChunk};
    use pdrouter_tokenizer::bytelevel;

    use super::*;
    use crate::grpc::translate;
    use crate::request::{Endpoint, parse};

    async fn output(body: &str) -> (Output, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        for (name, data) in bytelevel::files() {
            std::fs::write(dir.path().join(name), data).unwrap();
        }
        let tok = Arc::new(Tokenizer::load(dir.path(), None).unwrap());
        let req = parse(Endpoint::Completions, bytes::Bytes::from(body.to_owned())).unwrap();
        let plan = translate::plan(&req, &tok).await.unwrap();
        (Output::new(tok, &plan), dir)
    }

    fn chunk(index: u32, ids: &[u32]) -> GenerateResponse {
        GenerateResponse {
            request_id: "r".to_owned(),
            response: Some(Msg::Chunk(GenerateStreamChunk {
                token_ids: ids.to_vec(),
                prompt_tokens: 1,
                index,
                ..Default::default()
            })),
        }
    }

    fn complete(index: u32, ids: &[u32], reason: &str) -> GenerateResponse {
        GenerateResponse {
            request_id: "r".to_owned(),
            response: Some(Msg::Complete(GenerateComplete {
                output_ids: ids.to_vec(),
                finish_reason: reason.to_owned(),
                completion_tokens: u32::try_from(ids.len()).unwrap(),
                index,
                ..Default::default()
            })),
        }
    }

    #[tokio::test]
    async fn samples_and_prompts_land_on_their_choices() {
        let (mut out, _dir) = output(r#"{"prompt":["a","b"],"n":2}"#).await;
        assert_eq!(out.choices.len(), 4);
        let d = out.absorb(1, chunk(1, &[72, 105]), "u").unwrap();
        assert_eq!((d.index, d.text.as_str(), d.finished), (3, "Hi", false));
        let d = out
            .absorb(1, complete(1, &[72, 105], "length"), "u")
            .unwrap();
        assert!(
            d.finished && d.text.is_empty(),
            "the final ids repeat the chunks"
        );
        assert_eq!(out.choices[3].full, "Hi");
        assert_eq!(out.choices[3].finish, Some(FinishReason::Length));
        // No chunk at all: the Complete's ids are the text.
        let d = out.absorb(0, complete(0, &[79, 75], "stop"), "u").unwrap();
        assert_eq!((d.index, d.text.as_str()), (0, "OK"));
        assert!(!out.done());
        assert!(out.eof("u").is_err(), "two samples never ended");
    }

    #[tokio::test]
    async fn a_misbehaving_engine_is_a_broken_answer_not_a_panic() {
        let (mut out, _dir) = output(r#"{"prompt":"a","n":2}"#).await;
        assert!(
            out.absorb(0, chunk(2, &[65]), "u").is_err(),
            "sample beyond n"
        );
        assert!(
            out.absorb(5, chunk(0, &[65]), "u").is_err(),
            "prompt beyond the list"
        );
        out.absorb(0, complete(0, &[65], "stop"), "u").unwrap();
        assert!(out.absorb(0, complete(0, &[65], "stop"), "u").is_err());
        let empty = GenerateResponse {
            request_id: "r".to_owned(),
            response: None,
        };
        assert!(out.absorb(0, empty, "u").is_err());
    }
}
