//! Prompt logprobs in PD: the Prefill worker computes the prompt, so its answer carries the
//! prompt's `meta_info.input_token_logprobs`; the client must see them in front of Decode's
//! own list, as one engine would answer.
//!
//! [`PromptLogprobs`] reads them from the Prefill body (JSON, a JSON batch array, or SSE);
//! [`PromptLogprobs::merge_json`] puts them in front of Decode's list in a whole answer and
//! [`SseMerge`] in each Decode event that carries one. Items are matched by their `index`
//! field (batches), else by position (a JSON array) or as item 0.
//!
//! Invariants: a Decode event or answer without `meta_info.input_token_logprobs` passes
//! unchanged, byte for byte; events leave [`SseMerge`] in the order they came; everything
//! held back is bounded by [`SseMerge::HOLD_LIMIT`] (reading stops) and one event by
//! [`SseMerge::EVENT_LIMIT`] (an error).

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use serde_json::Value;

/// The key whose list is merged.
const KEY: &str = "input_token_logprobs";

/// The Prefill's prompt logprobs, per batch item.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct PromptLogprobs {
    /// `(index, list)`, at most one entry per index (a later event replaces an earlier one).
    items: Vec<(u64, Vec<Value>)>,
}

impl PromptLogprobs {
    /// Reads a whole Prefill body: JSON (an object or a batch array) or SSE events.
    pub fn from_body(body: &[u8]) -> PromptLogprobs {
        let mut out = PromptLogprobs::default();
        let first = body.iter().find(|b| !b.is_ascii_whitespace());
        if matches!(first, Some(b'{' | b'[')) {
            if let Ok(v) = serde_json::from_slice::<Value>(body) {
                out.take_from(v);
            }
            return out;
        }
        for line in body.split(|&b| b == b'\n') {
            if let Some(v) = data_json(line) {
                out.take_from(v);
            }
        }
        out
    }

    fn take_from(&mut self, v: Value) {
        match v {
            Value::Array(items) => {
                for (pos, item) in items.into_iter().enumerate() {
                    self.take_item(item, pos as u64);
                }
            }
            item => self.take_item(item, 0),
        }
    }

    fn take_item(&mut self, mut item: Value, default_index: u64) {
        let index = item_index(&item, default_index);
        let Some(Value::Array(list)) = item
            .get_mut("meta_info")
            .and_then(|m| m.get_mut(KEY))
            .map(Value::take)
        else {
            return;
        };
        match self.items.iter_mut().find(|(i, _)| *i == index) {
            Some(slot) => slot.1 = list,
            None => self.items.push((index, list)),
        }
    }

    fn list(&self, index: u64) -> Option<&[Value]> {
        self.items
            .iter()
            .find(|(i, _)| *i == index)
            .map(|(_, l)| l.as_slice())
    }

    /// Puts the Prefill's list in front of Decode's in `decode` (an object or a batch
    /// array). Returns whether anything changed.
    pub fn merge_json(&self, decode: &mut Value) -> bool {
        match decode {
            Value::Array(items) => {
                let mut changed = false;
                for (pos, item) in items.iter_mut().enumerate() {
                    changed |= self.merge_item(item, pos as u64);
                }
                changed
            }
            item => self.merge_item(item, 0),
        }
    }

    fn merge_item(&self, item: &mut Value, default_index: u64) -> bool {
        let index = item_index(item, default_index);
        let Some(prefill) = self.list(index) else {
            return false;
        };
        let Some(Value::Array(decode)) = item.get_mut("meta_info").and_then(|m| m.get_mut(KEY))
        else {
            return false;
        };
        decode.splice(0..0, prefill.iter().cloned());
        true
    }

    /// The whole Decode answer `body` with the Prefill's lists merged in; unchanged when it
    /// is not JSON or carries no list.
    pub fn merge_body(&self, body: Bytes) -> Bytes {
        let Ok(mut v) = serde_json::from_slice::<Value>(&body) else {
            return body;
        };
        if !self.merge_json(&mut v) {
            return body;
        }
        serde_json::to_vec(&v).map_or(body, Bytes::from)
    }
}

fn item_index(item: &Value, default_index: u64) -> u64 {
    item.get("index")
        .and_then(Value::as_u64)
        .unwrap_or(default_index)
}

/// The JSON of an SSE `data:` line, if it is one.
fn data_json(line: &[u8]) -> Option<Value> {
    let payload = line.strip_prefix(b"data:")?;
    let payload = payload.strip_prefix(b" ").unwrap_or(payload);
    serde_json::from_slice(payload.trim_ascii()).ok()
}

/// Decode's SSE stream with the Prefill's prompt logprobs merged into each event; see the
/// module docs. Events that carry a list wait until the Prefill's lists are known (and so do
/// all events after them).
#[derive(Debug, Default)]
pub struct SseMerge {
    /// `None` until the Prefill's answer is known.
    known: Option<PromptLogprobs>,
    /// Bytes of an event not yet complete.
    partial: BytesMut,
    /// Complete events waiting for the Prefill's lists.
    held: VecDeque<Bytes>,
    held_bytes: usize,
    /// Events ready for the client.
    ready: VecDeque<Bytes>,
}

/// An event of Decode's stream was larger than [`SseMerge::EVENT_LIMIT`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventTooLarge;

impl SseMerge {
    /// Most bytes held back waiting for the Prefill's answer before reading Decode stops.
    pub const HOLD_LIMIT: usize = 4 << 20;
    /// Largest single event.
    pub const EVENT_LIMIT: usize = 16 << 20;

    /// Feeds bytes of Decode's stream.
    pub fn push(&mut self, data: &[u8]) -> Result<(), EventTooLarge> {
        self.partial.extend_from_slice(data);
        while let Some(end) = event_end(&self.partial) {
            let event = self.partial.split_to(end).freeze();
            self.event(event);
        }
        if self.partial.len() > Self::EVENT_LIMIT {
            return Err(EventTooLarge);
        }
        Ok(())
    }

    /// Decode's stream ended: an unterminated last event is passed on as it is.
    pub fn finish(&mut self) {
        if !self.partial.is_empty() {
            let rest = self.partial.split().freeze();
            self.event(rest);
        }
    }

    fn event(&mut self, event: Bytes) {
        match &self.known {
            Some(lp) if self.held.is_empty() => self.ready.push_back(rewrite(lp, event)),
            None if self.held.is_empty() && !mentions_key(&event) => self.ready.push_back(event),
            _ => {
                self.held_bytes += event.len();
                self.held.push_back(event);
            }
        }
    }

    /// The Prefill's lists are known (`None`: the Prefill answered none).
    pub fn set_prefill(&mut self, lp: Option<PromptLogprobs>) {
        let lp = self.known.insert(lp.unwrap_or_default());
        for event in self.held.drain(..) {
            self.ready.push_back(rewrite(lp, event));
        }
        self.held_bytes = 0;
    }

    /// Whether the Prefill's lists are still awaited.
    pub fn waiting(&self) -> bool {
        self.known.is_none()
    }

    /// Whether events are held back for the Prefill's lists.
    pub fn holding(&self) -> bool {
        !self.held.is_empty()
    }

    /// Whether reading more of Decode's stream should wait for the Prefill's lists.
    pub fn full(&self) -> bool {
        self.held_bytes >= Self::HOLD_LIMIT
    }

    /// The next event for the client.
    pub fn pop(&mut self) -> Option<Bytes> {
        self.ready.pop_front()
    }
}

/// End (exclusive) of the first complete event in `buf`: after a blank line.
fn event_end(buf: &[u8]) -> Option<usize> {
    let mut i = buf.iter().position(|&b| b == b'\n')?;
    loop {
        match buf.get(i + 1..) {
            Some([b'\n', ..]) => return Some(i + 2),
            Some([b'\r', b'\n', ..]) => return Some(i + 3),
            _ => {}
        }
        i += 1 + buf.get(i + 1..)?.iter().position(|&b| b == b'\n')?;
    }
}

fn mentions_key(event: &[u8]) -> bool {
    event.windows(KEY.len()).any(|w| w == KEY.as_bytes())
}

/// `event` with its `data:` JSON merged; byte for byte the same when nothing changes.
fn rewrite(lp: &PromptLogprobs, event: Bytes) -> Bytes {
    if lp.items.is_empty() || !mentions_key(&event) {
        return event;
    }
    let mut out = Vec::with_capacity(event.len() + 64);
    let mut changed = false;
    for line in event.split_inclusive(|&b| b == b'\n') {
        if let Some(mut v) = data_json(line)
            && lp.merge_json(&mut v)
        {
            out.extend_from_slice(b"data: ");
            // Serialising a `Value` into a Vec cannot fail.
            let _ = serde_json::to_writer(&mut out, &v);
            out.push(b'\n');
            changed = true;
        } else {
            out.extend_from_slice(line);
        }
    }
    if changed { Bytes::from(out) } else { event }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lp(index: Option<u64>, list: Value) -> Value {
        let mut v = json!({"text": "x", "meta_info": {KEY: list}});
        if let Some(i) = index {
            v["index"] = json!(i);
        }
        v
    }

    #[test]
    fn json_object_and_batch_are_merged_prefill_first() {
        let p = PromptLogprobs::from_body(
            lp(None, json!([[null, 1, null], [-0.5, 2, null]]))
                .to_string()
                .as_bytes(),
        );
        let mut d = lp(None, json!([[-0.25, 3, null]]));
        assert!(p.merge_json(&mut d));
        assert_eq!(
            d["meta_info"][KEY],
            json!([[null, 1, null], [-0.5, 2, null], [-0.25, 3, null]])
        );

        let batch = json!([lp(Some(0), json!([["a"]])), lp(Some(1), json!([["b"]]))]);
        let p = PromptLogprobs::from_body(batch.to_string().as_bytes());
        // Matched by index, not by position.
        let mut d = json!([lp(Some(1), json!([["d1"]])), lp(Some(0), json!([["d0"]]))]);
        assert!(p.merge_json(&mut d));
        assert_eq!(d[0]["meta_info"][KEY], json!([["b"], ["d1"]]));
        assert_eq!(d[1]["meta_info"][KEY], json!([["a"], ["d0"]]));
    }

    #[test]
    fn sse_prefill_bodies_keep_the_last_list_per_index() {
        let body = format!(
            "data: {}\n\ndata: {}\n\ndata: {}\n\ndata: [DONE]\n\n",
            lp(Some(0), json!([["old"]])),
            lp(Some(1), json!([["one"]])),
            lp(Some(0), json!([["zero"]]))
        );
        let p = PromptLogprobs::from_body(body.as_bytes());
        assert_eq!(p.list(0), Some(&[json!(["zero"])][..]));
        assert_eq!(p.list(1), Some(&[json!(["one"])][..]));
        assert_eq!(p.list(2), None);
    }

    #[test]
    fn answers_without_the_key_pass_unchanged() {
        let p = PromptLogprobs::from_body(lp(None, json!([[1]])).to_string().as_bytes());
        let body = Bytes::from_static(b"{\"text\":\"x\",  \"meta_info\":{}}");
        assert_eq!(p.merge_body(body.clone()), body);
        let garbage = Bytes::from_static(b"not json");
        assert_eq!(p.merge_body(garbage.clone()), garbage);
        assert_eq!(
            PromptLogprobs::from_body(b"not json"),
            PromptLogprobs::default()
        );
    }

    #[test]
    fn sse_events_wait_for_the_prefill_and_keep_their_order() {
        let mut m = SseMerge::default();
        let ev = format!("data: {}\n\n", lp(None, json!([["d"]])));
        // An event without the key passes while nothing is held.
        m.push(b": keepalive\n\n").unwrap();
        assert_eq!(m.pop().as_deref(), Some(&b": keepalive\n\n"[..]));
        // Split across pushes, then held with everything after it.
        let (a, b) = ev.as_bytes().split_at(7);
        m.push(a).unwrap();
        assert!(m.pop().is_none());
        m.push(b).unwrap();
        m.push(b"data: [DONE]\n\n").unwrap();
        assert!(m.holding() && m.waiting());
        assert!(m.pop().is_none());
        m.set_prefill(Some(PromptLogprobs::from_body(
            lp(None, json!([["p"]])).to_string().as_bytes(),
        )));
        let merged: Value = serde_json::from_slice(
            m.pop()
                .unwrap()
                .strip_prefix(b"data: ")
                .unwrap()
                .trim_ascii(),
        )
        .unwrap();
        assert_eq!(merged["meta_info"][KEY], json!([["p"], ["d"]]));
        assert_eq!(m.pop().as_deref(), Some(&b"data: [DONE]\n\n"[..]));
        // Known now: later events are merged at once.
        m.push(ev.replace("\n\n", "\r\n\r\n").as_bytes()).unwrap();
        assert!(
            m.pop()
                .is_some_and(|e| e.ends_with(b"\n") && e.windows(5).any(|w| w == b"[\"p\"]"))
        );
    }

    #[test]
    fn a_prefill_without_lists_releases_events_unchanged() {
        let mut m = SseMerge::default();
        let ev = format!("data: {}\n\n", lp(None, json!([["d"]])));
        m.push(ev.as_bytes()).unwrap();
        m.set_prefill(None);
        assert_eq!(m.pop().unwrap(), Bytes::from(ev));
        m.push(b"data: tail").unwrap();
        m.finish();
        assert_eq!(m.pop().as_deref(), Some(&b"data: tail"[..]));
    }

    #[test]
    fn limits_are_enforced() {
        let mut m = SseMerge::default();
        let big = vec![b'x'; SseMerge::EVENT_LIMIT + 1];
        assert_eq!(m.push(&big), Err(EventTooLarge));
        let mut m = SseMerge::default();
        let ev = format!(
            "data: {{\"meta_info\":{{\"{KEY}\":[]}},\"pad\":\"{}\"}}\n\n",
            "y".repeat(1 << 20)
        );
        for _ in 0..4 {
            assert!(!m.full());
            m.push(ev.as_bytes()).unwrap();
        }
        assert!(m.full());
    }
}
