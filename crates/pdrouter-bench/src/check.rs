//! Whether a response body is a complete answer.
//!
//! A request is OK only when its status is 2xx **and** its body is a whole
//! answer: a plain body that arrived completely, or a server-sent event
//! stream that ended with `data: [DONE]` (or a Responses API
//! `response.completed` event) and carried no error event. A router that
//! fails after the response head can only say so inside the stream (`data:
//! {"error":…}`), so counting every 200 as a success would hide exactly the
//! failures that happen mid-stream.

/// Incremental judge of one response body, fed frame by frame.
#[derive(Debug)]
pub(crate) struct BodyCheck {
    stream: bool,
    /// The unfinished last line of a stream.
    line: Vec<u8>,
    /// A terminal event (`[DONE]` or `response.completed`) was seen.
    done: bool,
    /// An error event was seen.
    error: bool,
}

/// Longest SSE line kept while looking for its end; anything longer is
/// judged by its first bytes (error events are short).
const MAX_LINE: usize = 64 * 1024;

impl BodyCheck {
    /// A judge for a body that is (`stream`) or is not an event stream.
    pub(crate) fn new(stream: bool) -> Self {
        BodyCheck {
            stream,
            line: Vec::new(),
            done: false,
            error: false,
        }
    }

    /// Takes the next chunk of the body.
    pub(crate) fn feed(&mut self, mut data: &[u8]) {
        if !self.stream {
            return;
        }
        while let Some(end) = data.iter().position(|&b| b == b'\n') {
            if self.line.len() < MAX_LINE {
                let room = MAX_LINE - self.line.len();
                self.line.extend_from_slice(&data[..end.min(room)]);
            }
            let line = std::mem::take(&mut self.line);
            self.judge_line(&line);
            data = &data[end + 1..];
        }
        let room = MAX_LINE.saturating_sub(self.line.len());
        self.line.extend_from_slice(&data[..data.len().min(room)]);
    }

    /// Whether the body, now ended without a transport error, was a
    /// complete answer without an error event.
    pub(crate) fn complete(mut self) -> bool {
        if !self.stream {
            return true;
        }
        let rest = std::mem::take(&mut self.line);
        self.judge_line(&rest);
        self.done && !self.error
    }

    fn judge_line(&mut self, line: &[u8]) {
        let Some(payload) = line.strip_prefix(b"data:") else {
            return;
        };
        let payload = payload.trim_ascii();
        if payload == b"[DONE]" {
            self.done = true;
            return;
        }
        // Only events that may be errors or completions are parsed.
        let maybe = |needle: &[u8]| payload.windows(needle.len()).any(|w| w == needle);
        if !(maybe(b"\"error\"") || maybe(b"response.")) {
            return;
        }
        let Ok(serde_json::Value::Object(event)) = serde_json::from_slice(payload) else {
            return;
        };
        if event.get("error").is_some_and(|e| !e.is_null()) {
            self.error = true;
        }
        match event.get("type").and_then(serde_json::Value::as_str) {
            Some("error" | "response.failed" | "response.incomplete") => self.error = true,
            Some("response.completed") => self.done = true,
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn judge(stream: bool, chunks: &[&str]) -> bool {
        let mut c = BodyCheck::new(stream);
        for chunk in chunks {
            c.feed(chunk.as_bytes());
        }
        c.complete()
    }

    #[test]
    fn a_plain_body_that_arrived_is_complete() {
        assert!(judge(false, &[r#"{"text":"hi"}"#]));
        assert!(judge(false, &[]));
    }

    #[test]
    fn a_stream_must_end_with_done_or_completion() {
        let ok = ["data: {\"text\":\"a\"}\n\n", "data: [DONE]\n\n"];
        assert!(judge(true, &ok));
        // Split anywhere, even inside the terminal line.
        assert!(judge(
            true,
            &["data: {\"text\":\"a\"}\n\nda", "ta: [DO", "NE]"]
        ));
        assert!(!judge(true, &["data: {\"text\":\"a\"}\n\n"]), "cut off");
        assert!(!judge(true, &[]), "empty");
        let responses = "event: response.completed\ndata: {\"type\":\"response.completed\"}\n\n";
        assert!(judge(true, &[responses]));
    }

    #[test]
    fn an_error_event_spoils_the_stream() {
        let err = "data: {\"error\":{\"code\":\"prefill_worker_error\",\"message\":\"x\"}}\n\n";
        assert!(!judge(
            true,
            &["data: {\"text\":\"a\"}\n\n", err, "data: [DONE]\n\n"]
        ));
        let failed = "data: {\"type\":\"response.failed\"}\n\ndata: [DONE]\n\n";
        assert!(!judge(true, &[failed]));
        // The word "error" in generated text is not an error event.
        let text = "data: {\"text\":\"an \\\"error\\\" here\",\"error\":null}\n\ndata: [DONE]\n\n";
        assert!(judge(true, &[text]));
    }
}
