//! Image inputs of chat requests for vision models (EPD): `image_url` content parts fetched
//! or decoded, preprocessed for the model's encoder, and placed in the prompt.
//!
//! - [`ImageInputs`]: one vision model's image handling, built from `--max-image-bytes`,
//!   `--max-image-pixels`, `--image-fetch-timeout-secs`, `--allow-private-image-urls`
//!   ([`ImageConfig`]) and the model directory. [`ImageInputs::prepare`] turns a request's
//!   messages into [`ImageItem`]s; [`ImageInputs::chat_prompt`] renders and tokenizes the chat
//!   with each image's placeholder run in place.
//! - [`ImageSupport`]: what a router does with image parts — refuse them (no Encode workers,
//!   or not a vision model) or serve them with [`ImageInputs`]; [`ImageSupport::prompt`] is
//!   the whole path from a chat request's messages to its token ids and [`PromptImages`].
//! - [`wire`]: the images as TokenSpeed's messages (items without pixels for `Generate`, one
//!   `Encode` request per item with them, the Prefill's per-item encode tickets).
//! - [`fetch`]: the http(s) fetcher (time, size and redirect limits); [`address`]: which
//!   addresses it may reach.
//! - Decoding, preprocessing and prompt expansion are `pdrouter_vision`'s (no I/O there).
//!
//! Invariants: an image that cannot be used is a 400 naming its content part
//! (`messages[1].content[2]: ...`): [`ImageInputError::into_api_error`] says which
//! `error.rs` fault (and so which code) each error is; no image error panics. Decoding and preprocessing run on the low-priority CPU pool, one image of a
//! request at a time (so a request holds at most one decoded image besides its results);
//! remote images of a request are fetched concurrently, each within the fetch deadline.

pub mod address;
pub mod fetch;
pub mod wire;

use std::path::Path;
use std::sync::Arc;

use pdrouter_tokenizer::{ContentFormat, Tokenizer};
use pdrouter_vision::{
    DecodeLimits, ExpandError, ExpandedPrompt, ImageError, ImageSource, LoadError, PartPath,
    PixelDtype, ProcessedImage, PromptError, VisionModel, expand_ids, expand_marked,
    flatten_content, image_parts, parse_image_url,
};
use serde_json::Value;

use crate::chat_template::chat_input;
use crate::config::ImageConfig;
use crate::cpu_pool;
use crate::error::{ApiError, ImageFault};
pub use fetch::{FetchError, ImageFetcher};
pub use wire::{CallImages, EncodeTicket, PromptImages};

/// Why one image part could not be used: its data, or fetching it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageInputError {
    /// The bytes (or the data URL) are unusable.
    #[error(transparent)]
    Image(#[from] ImageError),
    /// The URL could not be fetched.
    #[error(transparent)]
    Fetch(#[from] FetchError),
}

impl ImageInputError {
    /// The client's 400 for this error in the content part at `part`: the message is the
    /// part's path, the error and, for a limit, the flag that sets it.
    pub fn into_api_error(self, part: PartPath) -> ApiError {
        use FetchError as F;
        use ImageError as I;
        let (fault, flag) = match &self {
            ImageInputError::Image(e) => match e {
                I::TooManyBytes { .. } => (ImageFault::TooLarge, " (--max-image-bytes)"),
                I::TooManyPixels { .. } => (ImageFault::TooLarge, " (--max-image-pixels)"),
                I::UnsupportedUrl | I::MediaType(_) | I::NotBase64 | I::Base64(_) => {
                    (ImageFault::InvalidUrl, "")
                }
                I::UnsupportedFormat | I::Empty | I::Corrupt(_) | I::AspectRatio { .. } => {
                    (ImageFault::Invalid, "")
                }
            },
            ImageInputError::Fetch(e) => match e {
                F::TooLarge { .. } => (ImageFault::TooLarge, ""),
                F::InvalidUrl(_) => (ImageFault::InvalidUrl, ""),
                F::PrivateAddress { .. } | F::Credentials | F::Scheme(_) => {
                    (ImageFault::Refused, "")
                }
                F::Resolve { .. }
                | F::Connect
                | F::Timeout { .. }
                | F::Status(_)
                | F::TooManyRedirects { .. }
                | F::BadRedirect
                | F::Broken => (ImageFault::FetchFailed, ""),
            },
        };
        ApiError::image(fault, part, format_args!("{self}{flag}"))
    }
}

/// One preprocessed image of a request, with the content part it came from.
#[derive(Debug, Clone)]
pub struct ImageItem {
    /// Where the image was in the request.
    pub part: PartPath,
    /// The tensor, grid, placeholder count and content hash.
    pub image: ProcessedImage,
}

/// The router's image handling for one vision model (cheap to clone).
#[derive(Debug, Clone)]
pub struct ImageInputs {
    model: Arc<VisionModel>,
    fetcher: ImageFetcher,
    limits: DecodeLimits,
    dtype: PixelDtype,
}

fn is_remote(url: &str) -> bool {
    let head = url
        .trim_start()
        .get(..8)
        .unwrap_or(url)
        .to_ascii_lowercase();
    head.starts_with("http://") || head.starts_with("https://")
}

impl ImageInputs {
    /// Image handling for `model` with `config`'s limits, sending bfloat16 tensors.
    pub fn new(config: &ImageConfig, model: VisionModel) -> Self {
        ImageInputs {
            model: Arc::new(model),
            fetcher: ImageFetcher::new(config),
            limits: DecodeLimits {
                max_bytes: config.max_bytes,
                max_pixels: config.max_pixels,
            },
            dtype: PixelDtype::Bf16,
        }
    }

    /// The model in `dir` (the model or tokenizer directory) with `config`'s limits, or `None`
    /// when it is not a vision model this router preprocesses for.
    pub fn load(config: &ImageConfig, dir: &Path) -> Result<Option<Self>, LoadError> {
        Ok(VisionModel::load(dir)?.map(|m| Self::new(config, m)))
    }

    /// The same, sending tensors of `dtype`.
    pub fn with_dtype(mut self, dtype: PixelDtype) -> Self {
        self.dtype = dtype;
        self
    }

    /// The model.
    pub fn model(&self) -> &VisionModel {
        &self.model
    }

    /// Finds the image parts of `messages` (at most ten), fetches or decodes each, and
    /// preprocesses it. The first unusable image ends the request with a 400 naming its part.
    pub async fn prepare(&self, messages: &Value) -> Result<Vec<ImageItem>, ApiError> {
        let parts = image_parts(messages).map_err(|e| ApiError::image_prompt(&e))?;
        let fetches = parts.iter().map(|p| {
            let (path, url) = (p.path, p.url.to_owned());
            async move {
                if is_remote(&url) {
                    match self.fetcher.fetch(url.trim()).await {
                        Ok(bytes) => Ok((path, Source::Fetched(bytes))),
                        Err(e) => Err(ImageInputError::from(e).into_api_error(path)),
                    }
                } else {
                    Ok((path, Source::Url(url)))
                }
            }
        });
        let loaded = futures_util::future::try_join_all(fetches).await?;
        let mut items = Vec::with_capacity(loaded.len());
        for (path, source) in loaded {
            let (model, limits, dtype) = (self.model.clone(), self.limits, self.dtype);
            let processed = cpu_pool::run(move || -> Result<ProcessedImage, ImageError> {
                let bytes = match &source {
                    Source::Fetched(bytes) => bytes.to_vec(),
                    Source::Url(url) => match parse_image_url(url, limits.max_bytes)? {
                        ImageSource::Inline(bytes) => bytes,
                        // `is_remote` sent every http(s) URL to the fetcher.
                        ImageSource::Remote(_) => return Err(ImageError::UnsupportedUrl),
                    },
                };
                model.process(&bytes, &limits, dtype)
            })
            .await
            .map_err(cpu_pool::PoolError::into_api_error)?
            .map_err(|e| ImageInputError::from(e).into_api_error(path))?;
            items.push(ImageItem {
                part: path,
                image: processed,
            });
        }
        Ok(items)
    }

    /// The chat prompt with every image's placeholder run in place: a template that takes
    /// string content gets each message's image anchors before its text, joined by newlines;
    /// one that takes OpenAI content parts places the images itself. `items` are
    /// [`ImageInputs::prepare`]'s, in order. CPU-bound like tokenization.
    pub(crate) fn chat_prompt(
        &self,
        tokenizer: &Tokenizer,
        messages: &Value,
        tools: Option<&Value>,
        vars: &crate::chat_template::TemplateVars,
        items: &[ImageItem],
    ) -> Result<(ExpandedPrompt, u32), ApiError> {
        let bad =
            |e: &dyn std::fmt::Display| ApiError::bad_request("invalid_request", e.to_string());
        let messages = &*crate::chat_template::template_messages(messages)?;
        let counts: Vec<usize> = items.iter().map(|i| i.image.placeholders).collect();
        let format = tokenizer
            .chat_template()
            .map_or(ContentFormat::String, |t| t.content_format());
        match format {
            ContentFormat::String => {
                let token = self.model.anchor_token_id();
                let flat = flatten_content(messages).map_err(|e| ApiError::image_prompt(&e))?;
                let text = tokenizer
                    .apply_chat_template(&chat_input(&flat, tools, vars))
                    .map_err(|e| bad(&e))?;
                let p =
                    expand_marked(&text, &counts, token, |s| tokenizer.encode(s)).map_err(|e| {
                        match e {
                            ExpandError::Prompt(p) => ApiError::image_prompt(&p),
                            ExpandError::Encode(e) => bad(&e),
                        }
                    })?;
                // The image token is a placeholder too: client text that encodes to it would
                // reach the engine as an image without one.
                let image = self.model.image_token_id();
                if image != token && p.ids.contains(&image) {
                    return Err(ApiError::image_prompt(&PromptError::PlaceholderInText));
                }
                Ok((p, token))
            }
            ContentFormat::OpenAi => {
                let token = self.model.image_token_id();
                let text = tokenizer
                    .apply_chat_template(&chat_input(messages, tools, vars))
                    .map_err(|e| bad(&e))?;
                let ids = tokenizer.encode(&text).map_err(|e| bad(&e))?;
                let p = expand_ids(text, &ids, &counts, token)
                    .map_err(|e| ApiError::image_prompt(&e))?;
                Ok((p, token))
            }
        }
    }
}

/// What the router does with a chat request's image parts.
#[derive(Debug, Clone)]
pub enum ImageSupport {
    /// Refused with 501: only EPD mode has Encode workers to run a vision encoder.
    NoEncoders,
    /// EPD over a model this router does not preprocess images for: refused with 400.
    NotVisionModel,
    /// Served for this vision model.
    Model(Box<ImageInputs>),
}

/// A chat request with image parts, before its prompt is built: the request's body, shared
/// rather than copied (its data URLs may be megabytes), whose `messages` the caller checked
/// is an array.
#[derive(Debug, Default)]
pub struct ImageChat {
    body: Arc<serde_json::Map<String, Value>>,
    tools: Option<Value>,
    vars: crate::chat_template::TemplateVars,
}

impl ImageChat {
    /// The chat of `body`, whose tools and template variables the caller read and checked.
    pub(crate) fn new(
        body: Arc<serde_json::Map<String, Value>>,
        tools: Option<Value>,
        vars: crate::chat_template::TemplateVars,
    ) -> Self {
        ImageChat { body, tools, vars }
    }

    fn messages(&self) -> &Value {
        self.body.get("messages").unwrap_or(&Value::Null)
    }

    fn tools(&self) -> Option<&Value> {
        self.tools.as_ref()
    }

    fn vars(&self) -> &crate::chat_template::TemplateVars {
        &self.vars
    }
}

impl ImageSupport {
    /// The refusal of a request with image parts, naming the first (a malformed or an
    /// eleventh part is the client's mistake first: 400).
    fn refuse(&self, messages: &Value) -> ApiError {
        let first = match image_parts(messages) {
            Ok(parts) => match parts.first() {
                Some(p) => p.path,
                None => return ApiError::internal("refusing images of a request without any"),
            },
            Err(e) => return ApiError::image_prompt(&e),
        };
        match self {
            ImageSupport::NoEncoders => ApiError::not_implemented(format!(
                "{first}: image inputs are served over gRPC only in EPD mode \
                 (--epd-disaggregation with --encode workers); send text only"
            )),
            _ => ApiError::bad_request(
                "invalid_request",
                format!(
                    "{first}: the served model takes no images here (image inputs are \
                     preprocessed for Qwen2-VL and Qwen2.5-VL, recognised from config.json's \
                     model_type in --model-path or --tokenizer-path); send text only"
                ),
            ),
        }
    }

    /// The prompt of a chat request with images: each image fetched or decoded and
    /// preprocessed ([`ImageInputs::prepare`]), then the chat rendered and tokenized with each
    /// image's placeholder run in place ([`ImageInputs::chat_prompt`], on the CPU pool for a
    /// large request of `size` bytes). Returns the prompt text and ids, and the images.
    pub async fn prompt(
        &self,
        tokenizer: &Arc<Tokenizer>,
        chat: ImageChat,
        size: usize,
    ) -> Result<(String, Vec<u32>, PromptImages), ApiError> {
        let ImageSupport::Model(inputs) = self else {
            return Err(self.refuse(chat.messages()));
        };
        let items = inputs.prepare(chat.messages()).await?;
        let (inputs, tok) = (inputs.clone(), tokenizer.clone());
        cpu_pool::offload(tokenizer.offload_threshold(), size, move || {
            let (p, token_id) =
                inputs.chat_prompt(&tok, chat.messages(), chat.tools(), chat.vars(), &items)?;
            let images = PromptImages {
                items,
                placeholders: p.placeholders,
                token_id,
            };
            Ok((p.text, p.ids, images))
        })
        .await?
    }
}

/// An image part's bytes before decoding.
enum Source {
    /// A non-http(s) URL (a data: URL, or one to refuse), decoded on the CPU pool.
    Url(String),
    /// A fetched body.
    Fetched(bytes::Bytes),
}

#[cfg(test)]
mod tests;
