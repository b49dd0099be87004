//! Images in the prompt: finding a request's image parts, rendering them for the chat
//! template, and expanding each into its run of placeholder tokens.
//!
//! OpenAI chat messages carry images as content parts
//! (`{"type": "image_url", "image_url": {"url": ...}}`; a bare string `image_url` is accepted
//! too). Images are numbered in prompt order: message by message, part by part.
//!
//! Two kinds of chat template:
//! - A template that takes **string content** sees each message's parts flattened
//!   ([`flatten_content`]): one image anchor per image part, placed before the message's text
//!   parts, everything joined by `\n`. The anchor is written as [`IMAGE_ANCHOR`] (`<image>`)
//!   in the prompt text; while rendering it is a private-use marker, so the rendered prompt
//!   is cut exactly at the images and a client's literal `<image>` stays text.
//!   [`expand_marked`] encodes the text between markers and puts each image's placeholder run
//!   where its marker was; an anchor therefore becomes the run and nothing else.
//! - A template that takes **OpenAI content parts** places images itself (Qwen2-VL's own
//!   writes `<|vision_start|><|image_pad|><|vision_end|>`); the rendered prompt is encoded
//!   whole and [`expand_ids`] widens each occurrence of the image token into the image's run.
//!
//! Either way each image `i` ends up as `counts[i]` consecutive copies of the model's image
//! token, and [`Placeholder`] says where. Text that would forge a placeholder (the image token
//! inside the client's text) is refused rather than silently shifting every image.

use serde_json::{Map, Value};

// The errors name content parts too, so the path type is `error`'s; re-exported where parts
// are found.
pub use crate::error::PartPath;
use crate::error::PromptError;
use crate::limits::MAX_IMAGES_PER_REQUEST;

/// The image anchor as it reads in the prompt text of a string-content template.
pub const IMAGE_ANCHOR: &str = "<image>";

/// Stands for an image while a string-content template renders (U+F8FF is a private-use
/// character: no client text carries it, and [`flatten_content`] refuses text that does).
const MARKER: &str = "\u{F8FF}image\u{F8FF}";
const RESERVED: char = '\u{F8FF}';

/// An image part of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImagePart<'a> {
    /// Where it is.
    pub path: PartPath,
    /// Its URL (`data:` or `http(s)://`), as given.
    pub url: &'a str,
}

/// Where one image's placeholder run sits in the token ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placeholder {
    /// Index of the run's first token.
    pub offset: usize,
    /// Tokens in the run.
    pub length: usize,
}

/// A prompt with its images expanded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExpandedPrompt {
    /// The prompt text (anchors as the template or [`IMAGE_ANCHOR`] wrote them).
    pub text: String,
    /// Token ids, each image's run in place.
    pub ids: Vec<u32>,
    /// One per image, in order.
    pub placeholders: Vec<Placeholder>,
}

/// An expansion failure: the request's (a [`PromptError`]) or the encoder's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExpandError<E> {
    /// The prompt and the images do not fit together.
    Prompt(PromptError),
    /// Encoding a text segment failed.
    Encode(E),
}

fn parts(message: &Value) -> Option<&Vec<Value>> {
    message.get("content").and_then(Value::as_array)
}

fn bad(path: PartPath, what: impl Into<String>) -> PromptError {
    PromptError::BadPart {
        part: path,
        what: what.into(),
    }
}

fn image_url(part: &Map<String, Value>, path: PartPath) -> Result<&str, PromptError> {
    match part.get("image_url") {
        Some(Value::String(url)) => Ok(url),
        Some(Value::Object(o)) => o
            .get("url")
            .and_then(Value::as_str)
            .ok_or_else(|| bad(path, "needs 'image_url': {\"url\": \"...\"}")),
        _ => Err(bad(path, "needs 'image_url': {\"url\": \"...\"}")),
    }
}

fn is_image(part: &Map<String, Value>) -> bool {
    part.get("type").and_then(Value::as_str) == Some("image_url")
}

/// The request's image parts in prompt order; more than [`MAX_IMAGES_PER_REQUEST`] is an
/// error. Messages or contents that are not arrays hold no images.
pub fn image_parts(messages: &Value) -> Result<Vec<ImagePart<'_>>, PromptError> {
    let mut found = Vec::new();
    let mut count = 0;
    for (m, message) in messages.as_array().into_iter().flatten().enumerate() {
        for (p, part) in parts(message).into_iter().flatten().enumerate() {
            let Some(part) = part.as_object().filter(|o| is_image(o)) else {
                continue;
            };
            count += 1;
            if found.len() < MAX_IMAGES_PER_REQUEST {
                let path = PartPath {
                    message: m,
                    part: Some(p),
                };
                found.push(ImagePart {
                    path,
                    url: image_url(part, path)?,
                });
            }
        }
    }
    if count > MAX_IMAGES_PER_REQUEST {
        return Err(PromptError::TooManyImages {
            count,
            max: MAX_IMAGES_PER_REQUEST,
        });
    }
    Ok(found)
}

fn checked_text(text: &str, path: PartPath) -> Result<&str, PromptError> {
    if text.contains(RESERVED) {
        return Err(PromptError::ReservedText { part: path });
    }
    Ok(text)
}

/// `messages` for a string-content template: every array `content` becomes a string of its
/// image anchors (one per image part, as the rendering marker), then its text parts, joined
/// by `\n`. Other message fields are kept. Parts other than `text` and `image_url` are
/// refused, naming the part.
pub fn flatten_content(messages: &Value) -> Result<Value, PromptError> {
    let Some(list) = messages.as_array() else {
        return Ok(messages.clone());
    };
    let mut out = Vec::with_capacity(list.len());
    for (m, message) in list.iter().enumerate() {
        let Some(parts) = parts(message) else {
            if let Some(text) = message.get("content").and_then(Value::as_str) {
                checked_text(
                    text,
                    PartPath {
                        message: m,
                        part: None,
                    },
                )?;
            }
            out.push(message.clone());
            continue;
        };
        let mut anchors = Vec::new();
        let mut texts = Vec::new();
        for (p, part) in parts.iter().enumerate() {
            let path = PartPath {
                message: m,
                part: Some(p),
            };
            let obj = part
                .as_object()
                .ok_or_else(|| bad(path, "must be an object with a 'type'"))?;
            match obj.get("type").and_then(Value::as_str) {
                Some("image_url") => {
                    image_url(obj, path)?;
                    anchors.push(MARKER);
                }
                Some("text") => {
                    let text = obj
                        .get("text")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad(path, "needs a string 'text'"))?;
                    texts.push(checked_text(text, path)?);
                }
                Some(other) => {
                    let other: String = other.chars().take(64).collect();
                    return Err(bad(
                        path,
                        format!("has type '{other}'; only 'text' and 'image_url' are supported"),
                    ));
                }
                None => return Err(bad(path, "needs a 'type'")),
            }
        }
        let mut flat = message.clone();
        flat["content"] = Value::String(
            anchors
                .into_iter()
                .chain(texts)
                .collect::<Vec<_>>()
                .join("\n"),
        );
        out.push(flat);
    }
    Ok(Value::Array(out))
}

fn too_long<E>() -> ExpandError<E> {
    ExpandError::Prompt(PromptError::TooLong)
}

/// Expands a prompt rendered from [`flatten_content`]'s messages: the text between image
/// markers is encoded piece by piece, and image `i`'s marker becomes `counts[i]` copies of
/// `token_id`. The rendered markers must be exactly `counts.len()` (a template that drops or
/// repeats a message's content cannot be used with images).
pub fn expand_marked<E>(
    rendered: &str,
    counts: &[usize],
    token_id: u32,
    mut encode: impl FnMut(&str) -> Result<Vec<u32>, E>,
) -> Result<ExpandedPrompt, ExpandError<E>> {
    let segments: Vec<&str> = rendered.split(MARKER).collect();
    if segments.len() != counts.len() + 1 {
        return Err(ExpandError::Prompt(PromptError::TemplateMismatch {
            found: segments.len() - 1,
            expected: counts.len(),
        }));
    }
    let mut ids = Vec::new();
    let mut placeholders = Vec::with_capacity(counts.len());
    for (i, segment) in segments.iter().enumerate() {
        let piece = encode(segment).map_err(ExpandError::Encode)?;
        if piece.contains(&token_id) {
            return Err(ExpandError::Prompt(PromptError::PlaceholderInText));
        }
        ids.extend(piece);
        if let Some(&n) = counts.get(i) {
            let total = ids.len().checked_add(n).ok_or_else(too_long)?;
            if total > u32::MAX as usize {
                return Err(too_long());
            }
            placeholders.push(Placeholder {
                offset: ids.len(),
                length: n,
            });
            ids.resize(total, token_id);
        }
    }
    Ok(ExpandedPrompt {
        text: segments.join(IMAGE_ANCHOR),
        ids,
        placeholders,
    })
}

/// Expands a prompt whose template placed the images itself: each occurrence of `token_id`
/// in `ids` (one per image, in order) becomes `counts[i]` copies of it.
pub fn expand_ids(
    text: String,
    ids: &[u32],
    counts: &[usize],
    token_id: u32,
) -> Result<ExpandedPrompt, PromptError> {
    let found = ids.iter().filter(|&&id| id == token_id).count();
    if found != counts.len() {
        return Err(PromptError::TemplateMismatch {
            found,
            expected: counts.len(),
        });
    }
    let extra: usize = counts.iter().sum::<usize>().saturating_sub(found);
    let total = ids.len().checked_add(extra).ok_or(PromptError::TooLong)?;
    if total > u32::MAX as usize {
        return Err(PromptError::TooLong);
    }
    let mut out = Vec::with_capacity(total);
    let mut placeholders = Vec::with_capacity(counts.len());
    let mut next = counts.iter();
    for &id in ids {
        if id == token_id {
            let n = *next.next().unwrap_or(&1);
            placeholders.push(Placeholder {
                offset: out.len(),
                length: n,
            });
            out.resize(out.len() + n, token_id);
        } else {
            out.push(id);
        }
    }
    Ok(ExpandedPrompt {
        text,
        ids: out,
        placeholders,
    })
}

#[cfg(test)]
mod tests;
