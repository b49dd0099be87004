//! A `/v1/responses` answer's output items, whole or streamed: a `reasoning` item (when the
//! reasoning is parsed), a `message` item with the text, and one `function_call` item per
//! parsed call (`id` `fc_…`, `call_id` the call's id, `arguments` JSON text).
//!
//! Streamed, items come one after another, each opened (`response.output_item.added`), fed
//! (`response.reasoning_text.delta`, `response.output_text.delta`,
//! `response.function_call_arguments.delta`) and closed (`….done`, then
//! `response.output_item.done`) before the next opens, as OpenAI streams them; the final
//! `response.completed` carries the items as streamed (their ids included).
//!
//! Invariants: without parsing, the message item opens before the first token, as it always
//! has; with parsing it opens with the first text; an answer without any output still has
//! one (empty) message item, as the whole answer does.

use bytes::Bytes;
use serde_json::{Value, json};

use super::{event, part};
use crate::grpc::chat_parse::{ChatDelta, ChatParsing, ChoiceParser};
use crate::grpc::translate::Answer;

/// The `message` item.
pub(super) fn message(id: &str, status: &str, content: Value) -> Value {
    json!({
        "type": "message",
        "id": id,
        "status": status,
        "role": "assistant",
        "content": content,
    })
}

/// The id of the answer's reasoning item.
fn reasoning_id(a: &Answer<'_>) -> String {
    format!("rs_{}", a.id)
}

/// The id of the `index`-th call's item.
fn call_item_id(a: &Answer<'_>, index: usize) -> String {
    format!("fc_{}_{index}", a.id)
}

fn reasoning(a: &Answer<'_>, text: &str) -> Value {
    json!({
        "type": "reasoning",
        "id": reasoning_id(a),
        "summary": [],
        "content": [{"type": "reasoning_text", "text": text}],
    })
}

fn call(
    a: &Answer<'_>,
    index: usize,
    call_id: &str,
    name: &str,
    args: &str,
    status: &str,
) -> Value {
    json!({
        "type": "function_call",
        "id": call_item_id(a, index),
        "call_id": call_id,
        "name": name,
        "arguments": args,
        "status": status,
    })
}

/// The status of a finished message item.
fn item_status(a: &Answer<'_>) -> &'static str {
    match super::status(a.out.choices[0].finish.as_ref()).0 {
        "completed" => "completed",
        _ => "incomplete",
    }
}

/// The items of a whole answer, with its reasoning (for the usage).
pub(super) fn whole(a: &Answer<'_>) -> (Vec<Value>, String) {
    let c = &a.out.choices[0];
    let status = item_status(a);
    let msg_id = super::item_id(a);
    let Some(p) = a.plan.chat.as_deref() else {
        return (
            vec![message(&msg_id, status, json!([part(&c.full)]))],
            String::new(),
        );
    };
    let parsed = p.parse_whole(&c.full);
    let mut items = Vec::new();
    if !parsed.reasoning.is_empty() {
        items.push(reasoning(a, &parsed.reasoning));
    }
    if !parsed.content.is_empty() || parsed.calls.is_empty() && parsed.reasoning.is_empty() {
        items.push(message(&msg_id, status, json!([part(&parsed.content)])));
    }
    for (i, (id, tc)) in parsed.calls.iter().enumerate() {
        items.push(call(a, i, id, &tc.name, &tc.arguments, "completed"));
    }
    (items, parsed.reasoning)
}

/// The item being streamed.
#[derive(Debug)]
enum Open {
    Reasoning(String),
    Message {
        id: String,
        text: String,
    },
    Call {
        index: usize,
        call_id: String,
        name: String,
        args: String,
    },
}

/// The streaming state of one `/v1/responses` answer.
#[derive(Debug, Default)]
pub(crate) struct Stream {
    parser: Option<ChoiceParser>,
    open: Option<Open>,
    /// Items closed so far, in output order.
    done: Vec<Value>,
    reasoning: String,
    messages: usize,
}

impl Stream {
    /// The items streamed, once [`Stream::finish`] closed the last.
    pub(super) fn items(&self) -> (&[Value], &str) {
        (&self.done, &self.reasoning)
    }

    fn index(&self) -> usize {
        self.done.len()
    }

    /// The events before the first token: without parsing, the message opens.
    pub(super) fn start(&mut self, a: &Answer<'_>, seq: &mut u64) -> Vec<Bytes> {
        let mut out = Vec::new();
        if a.plan.chat.is_none() {
            self.open_message(a, seq, &mut out);
        }
        out
    }

    fn open_message(&mut self, a: &Answer<'_>, seq: &mut u64, out: &mut Vec<Bytes>) {
        let id = match self.messages {
            0 => super::item_id(a),
            n => format!("{}_{n}", super::item_id(a)),
        };
        self.messages += 1;
        let i = self.index();
        out.push(event(
            "response.output_item.added",
            json!({"output_index": i, "item": message(&id, "in_progress", json!([]))}),
            seq,
        ));
        out.push(event(
            "response.content_part.added",
            json!({"item_id": id, "output_index": i, "content_index": 0, "part": part("")}),
            seq,
        ));
        self.open = Some(Open::Message {
            id,
            text: String::new(),
        });
    }

    /// Closes the open item, if any.
    fn close(&mut self, a: &Answer<'_>, seq: &mut u64, out: &mut Vec<Bytes>) {
        let i = self.index();
        let item = match self.open.take() {
            None => return,
            Some(Open::Reasoning(text)) => {
                let item_id = reasoning_id(a);
                let part = json!({"type": "reasoning_text", "text": text});
                out.push(event(
                    "response.reasoning_text.done",
                    json!({"item_id": item_id, "output_index": i, "content_index": 0, "text": text}),
                    seq,
                ));
                out.push(event(
                    "response.content_part.done",
                    json!({"item_id": item_id, "output_index": i, "content_index": 0, "part": part}),
                    seq,
                ));
                reasoning(a, &text)
            }
            Some(Open::Message { id, text }) => {
                out.push(event(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "text": text,
                        "logprobs": []}),
                    seq,
                ));
                out.push(event(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0,
                        "part": part(&text)}),
                    seq,
                ));
                message(&id, item_status(a), json!([part(&text)]))
            }
            Some(Open::Call {
                index,
                call_id,
                name,
                args,
            }) => {
                out.push(event(
                    "response.function_call_arguments.done",
                    json!({"item_id": call_item_id(a, index), "output_index": i,
                        "arguments": args}),
                    seq,
                ));
                call(a, index, &call_id, &name, &args, "completed")
            }
        };
        out.push(event(
            "response.output_item.done",
            json!({"output_index": i, "item": item}),
            seq,
        ));
        self.done.push(item);
    }

    /// The events of one piece of the answer.
    fn piece(&mut self, a: &Answer<'_>, d: ChatDelta, seq: &mut u64, out: &mut Vec<Bytes>) {
        match d {
            ChatDelta::Reasoning(s) => {
                if !matches!(self.open, Some(Open::Reasoning(_))) {
                    self.close(a, seq, out);
                    let i = self.index();
                    let item = json!({"type": "reasoning", "id": reasoning_id(a),
                        "summary": [], "content": []});
                    out.push(event(
                        "response.output_item.added",
                        json!({"output_index": i, "item": item}),
                        seq,
                    ));
                    out.push(event(
                        "response.content_part.added",
                        json!({"item_id": reasoning_id(a), "output_index": i,
                            "content_index": 0, "part": {"type": "reasoning_text", "text": ""}}),
                        seq,
                    ));
                    self.open = Some(Open::Reasoning(String::new()));
                }
                out.push(event(
                    "response.reasoning_text.delta",
                    json!({"item_id": reasoning_id(a), "output_index": self.index(),
                        "content_index": 0, "delta": s}),
                    seq,
                ));
                self.reasoning.push_str(&s);
                if let Some(Open::Reasoning(text)) = &mut self.open {
                    text.push_str(&s);
                }
            }
            ChatDelta::Content(s) => {
                if !matches!(self.open, Some(Open::Message { .. })) {
                    self.close(a, seq, out);
                    self.open_message(a, seq, out);
                }
                if let Some(Open::Message { id, text }) = &mut self.open {
                    out.push(event(
                        "response.output_text.delta",
                        json!({"item_id": id, "output_index": self.done.len(),
                            "content_index": 0, "delta": s, "logprobs": []}),
                        seq,
                    ));
                    text.push_str(&s);
                }
            }
            ChatDelta::Call { index, id, name } => {
                self.close(a, seq, out);
                out.push(event(
                    "response.output_item.added",
                    json!({"output_index": self.index(),
                        "item": call(a, index, &id, &name, "", "in_progress")}),
                    seq,
                ));
                self.open = Some(Open::Call {
                    index,
                    call_id: id,
                    name,
                    args: String::new(),
                });
            }
            ChatDelta::Args { index, fragment } => {
                if let Some(Open::Call { args, .. }) = &mut self.open {
                    out.push(event(
                        "response.function_call_arguments.delta",
                        json!({"item_id": call_item_id(a, index),
                            "output_index": self.done.len(), "delta": fragment}),
                        seq,
                    ));
                    args.push_str(&fragment);
                }
            }
        }
    }

    /// The events of what one message added (`finished`: the answer ended with it).
    pub(super) fn delta(
        &mut self,
        a: &Answer<'_>,
        text: &str,
        finished: bool,
        seq: &mut u64,
    ) -> Vec<Bytes> {
        let pieces = match a.plan.chat.as_deref() {
            Some(p) => self.parser_of(p).push(p, text, finished),
            None if text.is_empty() => Vec::new(),
            None => vec![ChatDelta::Content(text.to_owned())],
        };
        let mut out = Vec::new();
        for d in pieces {
            self.piece(a, d, seq, &mut out);
        }
        out
    }

    fn parser_of(&mut self, p: &ChatParsing) -> &mut ChoiceParser {
        self.parser.get_or_insert_with(|| p.choice())
    }

    /// Closes the last item (an answer without output gets its empty message).
    pub(super) fn finish(&mut self, a: &Answer<'_>, seq: &mut u64) -> Vec<Bytes> {
        let mut out = Vec::new();
        if self.open.is_none() && self.done.is_empty() {
            self.open_message(a, seq, &mut out);
        }
        self.close(a, seq, &mut out);
        out
    }
}
