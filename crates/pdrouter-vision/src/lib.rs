//! Image inputs for vision models, with no I/O: everything between an `image_url` content
//! part's bytes and what an encode worker and the prompt need.
//!
//! - [`source`]: `data:` URLs decoded (media type and byte limit checked); `http(s)://` URLs
//!   handed back for the caller to fetch.
//! - [`decode`]: PNG, JPEG and WebP to 8-bit RGB ([`Rgb8`]) with pixel limits, converted as
//!   the reference processors convert (transparency over white).
//! - [`qwen2vl`], [`resize`]: Qwen2-VL / Qwen2.5-VL preprocessing, value for value as the
//!   reference `Qwen2VLImageProcessor`: smart resize (Pillow bicubic, reproduced exactly),
//!   rescale, CLIP normalisation, patch rows grouped in merge blocks.
//! - [`tensor`]: the result ([`ProcessedImage`]): little-endian bfloat16 (or float32) patch
//!   rows, `image_grid_thw`, placeholder count, content hash.
//! - [`model`]: recognising a vision model from its directory (`config.json` `model_type`,
//!   `preprocessor_config.json`).
//! - [`prompt`]: image parts in a request (at most [`MAX_IMAGES_PER_REQUEST`]), flattening for
//!   string-content chat templates, and expanding each image into its placeholder run.
//! - [`limits`]: every bound, in one place.
//!
//! Knows nothing of networking, HTTP or async runtimes: every call is synchronous, every type
//! `Send + Sync`. Decoding and preprocessing cost CPU in proportion to the pixels (a 12
//! megapixel photo is tens of millions of multiply-adds), so callers on an
//! async runtime run [`VisionModel::process`] off the reactor. Errors ([`error`]) say whose
//! fault they are; an image error never panics.
//!
//! ```
//! use pdrouter_vision::*;
//!
//! let model = VisionModel::new(VisionFamily::Qwen2Vl, Qwen2VlConfig::default(), 151655);
//! let mut png = std::io::Cursor::new(Vec::new());
//! image::RgbImage::from_pixel(67, 45, image::Rgb([200, 10, 10]))
//!     .write_to(&mut png, image::ImageFormat::Png)
//!     .unwrap();
//! let item = model
//!     .process(png.get_ref(), &DecodeLimits::default(), PixelDtype::Bf16)
//!     .unwrap();
//! assert_eq!(item.grid_thw, [1, 4, 4]); // resized to 56 x 56: 4 x 4 patches of 14
//! assert_eq!(item.shape, [16, 1176]);
//! assert_eq!(item.placeholders, 4); // one token per 2 x 2 merge block
//! assert_eq!(item.pixel_values.len(), 16 * 1176 * 2);
//! ```

pub mod decode;
pub mod error;
pub mod limits;
pub mod model;
pub mod pixels;
pub mod prompt;
pub mod qwen2vl;
pub mod resize;
pub mod source;
pub mod tensor;

/// The `image` crate, re-exported for callers and tests that build images.
pub use image;

pub use decode::decode;
pub use error::{ImageError, LoadError, PartPath, PromptError};
pub use limits::{
    DEFAULT_MAX_IMAGE_BYTES, DEFAULT_MAX_IMAGE_PIXELS, DecodeLimits, MAX_IMAGES_PER_REQUEST,
};
pub use model::{VisionFamily, VisionModel};
pub use pixels::Rgb8;
pub use prompt::{
    ExpandError, ExpandedPrompt, IMAGE_ANCHOR, ImagePart, Placeholder, expand_ids, expand_marked,
    flatten_content, image_parts,
};
pub use qwen2vl::{Qwen2VlConfig, Qwen2VlProcessor, smart_resize};
pub use source::{ImageSource, parse as parse_image_url};
pub use tensor::{ContentHash, PixelDtype, ProcessedImage};
