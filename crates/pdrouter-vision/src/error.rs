//! The crate's errors, one type per concern, each saying whose fault it is.
//!
//! - [`ImageError`]: an image the client sent that cannot be used (bad data URL, over a limit,
//!   not PNG/JPEG/WebP, undecodable, unusable shape). Always the client's; the caller names the
//!   content part it came from.
//! - [`PromptError`]: the request's messages and the chat template do not fit together (too
//!   many images, a malformed part, a template that did not place every image). The client's,
//!   apart from [`PromptError::TemplateMismatch`] with a template the operator chose.
//! - [`LoadError`]: the model directory's vision configuration is unusable; the operator's, at
//!   startup.
//!
//! [`PartPath`], the content part a client's error names, is here too, so that every module
//! (the prompt's included) uses this one and this one none.

use std::path::PathBuf;

/// Where a content part is: `messages[i].content[j]`, or `messages[i].content` for string
/// content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PartPath {
    /// Index in `messages`.
    pub message: usize,
    /// Index in the message's `content` array (`None`: the content is a string).
    pub part: Option<usize>,
}

impl std::fmt::Display for PartPath {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.part {
            Some(p) => write!(f, "messages[{}].content[{p}]", self.message),
            None => write!(f, "messages[{}].content", self.message),
        }
    }
}

/// Why an image cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ImageError {
    /// Neither a `data:` URL nor `http://`/`https://`.
    #[error("image_url must be a data: URL (base64) or an http:// or https:// URL")]
    UnsupportedUrl,
    /// A `data:` URL whose media type is not an accepted image type.
    #[error("data URL media type '{0}' is not image/png, image/jpeg or image/webp")]
    MediaType(String),
    /// A `data:` URL without `;base64`.
    #[error("data URL must carry base64 data ('data:image/png;base64,...')")]
    NotBase64,
    /// A `data:` URL whose payload is not valid base64.
    #[error("data URL holds invalid base64: {0}")]
    Base64(String),
    /// More bytes than the limit (`size` may be a lower bound when the rest was not read).
    #[error("image is {size} bytes or more, over the {limit}-byte limit")]
    TooManyBytes {
        /// Bytes seen (or announced).
        size: u64,
        /// The limit.
        limit: u64,
    },
    /// Not PNG, JPEG or WebP.
    #[error("image is not PNG, JPEG or WebP")]
    UnsupportedFormat,
    /// More pixels than the limit.
    #[error("image is {width}x{height} pixels, over the {limit}-pixel limit")]
    TooManyPixels {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
        /// The limit.
        limit: u64,
    },
    /// A zero-sized image.
    #[error("image has no pixels")]
    Empty,
    /// The decoder refused the data.
    #[error("image cannot be decoded: {0}")]
    Corrupt(String),
    /// The model's processor refuses images this elongated.
    #[error("image is {width}x{height}; its aspect ratio must be below {max}")]
    AspectRatio {
        /// Width in pixels.
        width: u32,
        /// Height in pixels.
        height: u32,
        /// Largest ratio accepted.
        max: u32,
    },
}

/// Why a request's images and its prompt do not fit together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromptError {
    /// More image parts than a request may carry.
    #[error("the request has {count} images; at most {max} are accepted")]
    TooManyImages {
        /// Image parts found.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A content part of the wrong shape.
    #[error("{part} {what}")]
    BadPart {
        /// Where it is.
        part: PartPath,
        /// What is wrong, as a phrase following the part's path.
        what: String,
    },
    /// Text that contains the router's internal image marker (a private-use sequence no
    /// client text should hold).
    #[error("{part} contains reserved characters (U+F8FF)")]
    ReservedText {
        /// Where it is.
        part: PartPath,
    },
    /// The rendered prompt places a different number of images than the request has.
    #[error(
        "the chat template placed {found} image placeholders for {expected} images; \
         each image must appear exactly once"
    )]
    TemplateMismatch {
        /// Placeholders found.
        found: usize,
        /// Images in the request.
        expected: usize,
    },
    /// The client's text encodes to the image placeholder token.
    #[error(
        "the message text contains the image placeholder token; send images as image_url parts"
    )]
    PlaceholderInText,
    /// The prompt with its images expanded is longer than a token position can address.
    #[error("the prompt with its images is too long")]
    TooLong,
}

/// Why a model directory's vision configuration cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// A file exists but cannot be read or parsed.
    #[error("cannot read {file}: {detail}")]
    Read {
        /// The file.
        file: PathBuf,
        /// What went wrong.
        detail: String,
    },
    /// A setting the preprocessing does not support.
    #[error("{file}: {detail}")]
    Unsupported {
        /// The file.
        file: PathBuf,
        /// Which setting and why.
        detail: String,
    },
}
