//! Flags for what the router reads in requests itself: the tokenizer (gRPC workers take token
//! ids; prefix_hash counts tokens) and the limits on image inputs.

use std::time::Duration;

use clap::Args;

use crate::config::{DEFAULT_IMAGE_FETCH_TIMEOUT_SECS, ImageConfig, TokenizerSource};

/// `launch` flags under "Tokenizer".
#[derive(Debug, Args)]
pub struct TokenizerArgs {
    /// Tokenizer the router uses: a tokenizer.json file or the directory holding it (default:
    /// from --model-path; for grpc:// workers, else the workers' own). grpc:// workers get
    /// token ids from it; with http:// workers, prefix_hash hashes the first
    /// --prefix-token-count tokens of the prompt instead of 4 characters per token.
    #[arg(long, value_name = "PATH", help_heading = "Tokenizer")]
    pub tokenizer_path: Option<std::path::PathBuf>,
    /// Model directory whose tokenizer files the router uses (see --tokenizer-path).
    #[arg(long, value_name = "DIR", help_heading = "Tokenizer")]
    pub model_path: Option<std::path::PathBuf>,
    /// Jinja chat template file overriding the tokenizer's own (grpc:// workers).
    #[arg(long, value_name = "FILE", help_heading = "Tokenizer")]
    pub chat_template: Option<std::path::PathBuf>,
    /// The tool-call format of the model behind grpc:// workers, turned into tool_calls by the
    /// router: json, qwen, qwen_xml, llama, pythonic, mistral, deepseek, deepseek31, kimik2,
    /// glm45_moe, glm47_moe, minimax_m2, step3, harmony [default: chosen from the model's
    /// name, else none].
    #[arg(long, value_name = "PARSER", value_parser = tool_parser, help_heading = "Tokenizer")]
    pub tool_call_parser: Option<pdrouter_parsers::ToolKind>,
    /// How the model behind grpc:// workers marks its reasoning, split into reasoning_content
    /// by the router: deepseek_r1, qwen3, qwen3_thinking, kimi, kimi_thinking, glm45, step3,
    /// minimax, deepseek_v31, harmony [default: chosen from the model's name, else none].
    #[arg(long, value_name = "PARSER", value_parser = reasoning_parser, help_heading = "Tokenizer")]
    pub reasoning_parser: Option<pdrouter_parsers::ReasoningKind>,
}

fn tool_parser(s: &str) -> Result<pdrouter_parsers::ToolKind, String> {
    pdrouter_parsers::ToolKind::parse(s).ok_or_else(|| {
        let names: Vec<_> = pdrouter_parsers::ToolKind::ALL
            .iter()
            .map(|k| k.name())
            .collect();
        format!("unknown tool-call parser; one of {}", names.join(", "))
    })
}

fn reasoning_parser(s: &str) -> Result<pdrouter_parsers::ReasoningKind, String> {
    pdrouter_parsers::ReasoningKind::parse(s).ok_or_else(|| {
        let names: Vec<_> = pdrouter_parsers::ReasoningKind::ALL
            .iter()
            .map(|k| k.name())
            .collect();
        format!("unknown reasoning parser; one of {}", names.join(", "))
    })
}

impl TokenizerArgs {
    /// The tokenizer source. Whether a chat template suits the workers is
    /// `Config::validate`'s (it depends on the mode).
    pub(super) fn resolve(self) -> (TokenizerSource, crate::config::ChatParsers) {
        let parsers = crate::config::ChatParsers {
            tool: self.tool_call_parser,
            reasoning: self.reasoning_parser,
        };
        let source = TokenizerSource {
            tokenizer_path: self.tokenizer_path,
            model_path: self.model_path,
            chat_template: self.chat_template,
        };
        (source, parsers)
    }
}

/// `launch` flags under "Image inputs".
#[derive(Debug, Args)]
pub struct ImageArgs {
    /// Largest image accepted per image_url content part, in bytes, 1-1073741824: a data: URL's
    /// decoded payload or an http(s) image's body (a larger one is a 400 naming the part).
    #[arg(long, default_value_t = pdrouter_vision::DEFAULT_MAX_IMAGE_BYTES, help_heading = "Image inputs")]
    pub max_image_bytes: u64,
    /// Largest decoded image, in pixels (width x height), 1-268435456; read from the image's
    /// header before it is decoded.
    #[arg(long, default_value_t = pdrouter_vision::DEFAULT_MAX_IMAGE_PIXELS, help_heading = "Image inputs")]
    pub max_image_pixels: u64,
    /// Longest the router spends fetching one http(s) image, redirects and body included, in
    /// seconds, 1-300.
    #[arg(long, default_value_t = DEFAULT_IMAGE_FETCH_TIMEOUT_SECS, help_heading = "Image inputs")]
    pub image_fetch_timeout_secs: u64,
    /// Let image URLs (and their redirects) reach loopback, private, link-local, unique-local
    /// and other non-public addresses; without it such URLs are refused.
    #[arg(long, help_heading = "Image inputs")]
    pub allow_private_image_urls: bool,
}

impl ImageArgs {
    /// The image limits (their ranges are checked with the whole configuration).
    pub(super) fn resolve(self) -> ImageConfig {
        ImageConfig {
            max_bytes: self.max_image_bytes,
            max_pixels: self.max_image_pixels,
            fetch_timeout: Duration::from_secs(self.image_fetch_timeout_secs),
            allow_private_urls: self.allow_private_image_urls,
        }
    }
}
