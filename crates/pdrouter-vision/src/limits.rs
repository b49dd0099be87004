//! Every bound on image inputs, in one place.
//!
//! The byte and pixel limits are the operator's (`--max-image-bytes`, `--max-image-pixels`);
//! the defaults are here so that the router's flags and this crate's tests agree on them. The
//! per-request image count and the aspect-ratio bound are fixed.

/// Most images one request may carry; more is a client error.
pub const MAX_IMAGES_PER_REQUEST: usize = 10;

/// Default byte limit per image: 20 MiB, the size of a large phone photo several times over
/// and the limit OpenAI's API states for its own image inputs.
pub const DEFAULT_MAX_IMAGE_BYTES: u64 = 20 * 1024 * 1024;

/// Default limit on an image's decoded pixels: 2^25 (32 Mi; an 8K UHD frame is 33.2 M). It
/// bounds a decompression bomb: a few kilobytes of PNG can announce gigapixels, and the
/// limit is checked from the header before any pixel buffer is allocated.
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = 1 << 25;

/// Images more elongated than this are refused, as the reference Qwen2-VL processor does.
pub const MAX_ASPECT_RATIO: u32 = 200;

/// Limits applied while turning bytes into pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeLimits {
    /// Largest encoded image, in bytes (after base64 decoding for data URLs).
    pub max_bytes: u64,
    /// Largest decoded image, in pixels (width times height).
    pub max_pixels: u64,
}

impl Default for DecodeLimits {
    fn default() -> Self {
        DecodeLimits {
            max_bytes: DEFAULT_MAX_IMAGE_BYTES,
            max_pixels: DEFAULT_MAX_IMAGE_PIXELS,
        }
    }
}
