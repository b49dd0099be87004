//! What the router needs to read requests itself: the tokenizer source (gRPC workers take
//! token ids; prefix_hash counts tokens) and the limits on image inputs.

use std::time::Duration;

/// Where the router gets its tokenizer when workers take token ids (gRPC).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TokenizerSource {
    /// `--tokenizer-path`: a `tokenizer.json` or the directory holding it.
    pub tokenizer_path: Option<std::path::PathBuf>,
    /// `--model-path`: the model directory.
    pub model_path: Option<std::path::PathBuf>,
    /// `--chat-template`: a Jinja file overriding the tokenizer's template.
    pub chat_template: Option<std::path::PathBuf>,
}

/// `--tool-call-parser` and `--reasoning-parser`: how gRPC chat answers are parsed (absent:
/// chosen from the model's name, or none).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ChatParsers {
    /// The tool-call format the model writes.
    pub tool: Option<pdrouter_parsers::ToolKind>,
    /// How the model marks its reasoning.
    pub reasoning: Option<pdrouter_parsers::ReasoningKind>,
}

impl ChatParsers {
    /// Whether either was given.
    pub fn given(&self) -> bool {
        self.tool.is_some() || self.reasoning.is_some()
    }
}

/// Default `--image-fetch-timeout-secs`: an image server that has not delivered a 20 MiB
/// image in 10 s is better refused than waited for while the client waits too.
pub const DEFAULT_IMAGE_FETCH_TIMEOUT_SECS: u64 = 10;

/// Image inputs (`image_url` content parts) for vision models.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageConfig {
    /// `--max-image-bytes`: largest encoded image (data URL payload or fetched body).
    pub max_bytes: u64,
    /// `--max-image-pixels`: largest decoded image, width times height.
    pub max_pixels: u64,
    /// `--image-fetch-timeout-secs`: the whole fetch of an http(s) image, redirects included.
    pub fetch_timeout: Duration,
    /// `--allow-private-image-urls`: image URLs may reach loopback, private, link-local and
    /// unique-local addresses.
    pub allow_private_urls: bool,
}

impl Default for ImageConfig {
    fn default() -> Self {
        ImageConfig {
            max_bytes: pdrouter_vision::DEFAULT_MAX_IMAGE_BYTES,
            max_pixels: pdrouter_vision::DEFAULT_MAX_IMAGE_PIXELS,
            fetch_timeout: Duration::from_secs(DEFAULT_IMAGE_FETCH_TIMEOUT_SECS),
            allow_private_urls: false,
        }
    }
}
