//! Qwen2-VL / Qwen2.5-VL image preprocessing, value for value as the reference
//! `Qwen2VLImageProcessor` computes it (its PIL/NumPy implementation):
//!
//! 1. [`smart_resize`]: the target size, multiples of `patch_size * merge_size` (28) with
//!    `min_pixels <= h * w <= max_pixels` as closely as the aspect ratio allows;
//! 2. Pillow bicubic resize of the 8-bit RGB image ([`crate::resize`]);
//! 3. rescale (`x as f64 * rescale_factor`, stored as f32) and normalise
//!    (`(x - mean) / std` in f32 per channel);
//! 4. patchify: rows of `channels x temporal_patch_size x patch x patch` values, ordered by
//!    2x2 merge block (block row, block column, then the four patches in the block), each row
//!    channel by channel, one temporal frame after the other (a still image repeats itself
//!    `temporal_patch_size` times), then the patch's pixels row by row.
//!
//! Steps 3 and 4 touch each resized pixel once: the normalised value of every (channel, byte)
//! pair is computed once into a table, which gives the same float as computing it per pixel.

use std::path::Path;

use serde::Deserialize;

use crate::error::{ImageError, LoadError};
use crate::limits::MAX_ASPECT_RATIO;
use crate::pixels::Rgb8;
use crate::resize::bicubic_rgb;
use crate::tensor::{ContentHash, PixelDtype, ProcessedImage, bf16_bits};

/// CLIP's per-channel mean, the reference's default.
pub const CLIP_MEAN: [f64; 3] = [0.48145466, 0.4578275, 0.40821073];
/// CLIP's per-channel standard deviation, the reference's default.
pub const CLIP_STD: [f64; 3] = [0.26862954, 0.26130258, 0.27577711];
/// The reference's default `min_pixels` (56 x 56).
pub const DEFAULT_MIN_PIXELS: u64 = 56 * 56;
/// The reference's default `max_pixels` (28 x 28 x 1280).
pub const DEFAULT_MAX_PIXELS: u64 = 28 * 28 * 1280;
/// Largest `max_pixels` accepted from a configuration (2^28): a bound on the tensor one image
/// can produce.
pub const MAX_CONFIG_PIXELS: u64 = 1 << 28;

/// The preprocessing settings of a Qwen2-VL-family model (`preprocessor_config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct Qwen2VlConfig {
    /// Smallest resized area, in pixels.
    pub min_pixels: u64,
    /// Largest resized area, in pixels.
    pub max_pixels: u64,
    /// Side of a vision patch (14).
    pub patch_size: usize,
    /// Patches merged along each side into one placeholder token (2).
    pub merge_size: usize,
    /// Frames per temporal patch (2).
    pub temporal_patch_size: usize,
    /// Per-channel mean subtracted after rescaling.
    pub image_mean: [f64; 3],
    /// Per-channel standard deviation divided by.
    pub image_std: [f64; 3],
    /// Factor taking 0..=255 to 0..=1.
    pub rescale_factor: f64,
    /// Whether to rescale at all.
    pub do_rescale: bool,
    /// Whether to normalise at all.
    pub do_normalize: bool,
}

impl Default for Qwen2VlConfig {
    /// The reference processor's defaults.
    fn default() -> Self {
        Qwen2VlConfig {
            min_pixels: DEFAULT_MIN_PIXELS,
            max_pixels: DEFAULT_MAX_PIXELS,
            patch_size: 14,
            merge_size: 2,
            temporal_patch_size: 2,
            image_mean: CLIP_MEAN,
            image_std: CLIP_STD,
            rescale_factor: 1.0 / 255.0,
            do_rescale: true,
            do_normalize: true,
        }
    }
}

/// `preprocessor_config.json` as written; absent keys take the reference's defaults.
#[derive(Debug, Default, Deserialize)]
struct RawConfig {
    min_pixels: Option<u64>,
    max_pixels: Option<u64>,
    size: Option<RawSize>,
    patch_size: Option<usize>,
    merge_size: Option<usize>,
    temporal_patch_size: Option<usize>,
    image_mean: Option<Vec<f64>>,
    image_std: Option<Vec<f64>>,
    rescale_factor: Option<f64>,
    do_rescale: Option<bool>,
    do_normalize: Option<bool>,
    do_resize: Option<bool>,
    do_convert_rgb: Option<bool>,
    resample: Option<u32>,
}

#[derive(Debug, Default, Deserialize)]
struct RawSize {
    shortest_edge: Option<u64>,
    longest_edge: Option<u64>,
}

/// Pillow's number for bicubic resampling, as configurations name it.
const PIL_BICUBIC: u32 = 3;

impl Qwen2VlConfig {
    /// Reads `preprocessor_config.json` from `dir`; the reference's defaults when the file is
    /// absent.
    pub fn load(dir: &Path) -> Result<Self, LoadError> {
        let file = dir.join("preprocessor_config.json");
        match std::fs::read_to_string(&file) {
            Ok(text) => Self::parse(&text, &file),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(e) => Err(LoadError::Read {
                file,
                detail: e.to_string(),
            }),
        }
    }

    /// Parses and checks a `preprocessor_config.json`'s text (`file` names it in errors).
    pub fn parse(text: &str, file: &Path) -> Result<Self, LoadError> {
        let raw: RawConfig = serde_json::from_str(text).map_err(|e| LoadError::Read {
            file: file.to_owned(),
            detail: e.to_string(),
        })?;
        let unsupported = |detail: String| LoadError::Unsupported {
            file: file.to_owned(),
            detail,
        };
        if raw.do_resize == Some(false) {
            return Err(unsupported("do_resize false is not supported".into()));
        }
        if raw.do_convert_rgb == Some(false) {
            return Err(unsupported("do_convert_rgb false is not supported".into()));
        }
        if let Some(r) = raw.resample.filter(|&r| r != PIL_BICUBIC) {
            return Err(unsupported(format!(
                "resample {r} is not supported; only bicubic (3)"
            )));
        }
        let d = Self::default();
        let size = raw.size.unwrap_or_default();
        let triple = |name: &str, v: Option<Vec<f64>>, default: [f64; 3]| match v {
            None => Ok(default),
            Some(v) => <[f64; 3]>::try_from(v.as_slice())
                .map_err(|_| unsupported(format!("{name} must have 3 values"))),
        };
        let config = Qwen2VlConfig {
            min_pixels: raw
                .min_pixels
                .or(size.shortest_edge)
                .unwrap_or(d.min_pixels),
            max_pixels: raw.max_pixels.or(size.longest_edge).unwrap_or(d.max_pixels),
            patch_size: raw.patch_size.unwrap_or(d.patch_size),
            merge_size: raw.merge_size.unwrap_or(d.merge_size),
            temporal_patch_size: raw.temporal_patch_size.unwrap_or(d.temporal_patch_size),
            image_mean: triple("image_mean", raw.image_mean, d.image_mean)?,
            image_std: triple("image_std", raw.image_std, d.image_std)?,
            rescale_factor: raw.rescale_factor.unwrap_or(d.rescale_factor),
            do_rescale: raw.do_rescale.unwrap_or(true),
            do_normalize: raw.do_normalize.unwrap_or(true),
        };
        config.check().map_err(unsupported)?;
        Ok(config)
    }

    fn check(&self) -> Result<(), String> {
        if !(1..=128).contains(&self.patch_size) {
            return Err(format!("patch_size {} must be 1-128", self.patch_size));
        }
        if !(1..=8).contains(&self.merge_size) {
            return Err(format!("merge_size {} must be 1-8", self.merge_size));
        }
        if !(1..=8).contains(&self.temporal_patch_size) {
            return Err(format!(
                "temporal_patch_size {} must be 1-8",
                self.temporal_patch_size
            ));
        }
        if self.min_pixels == 0 || self.min_pixels > self.max_pixels {
            return Err(format!(
                "min_pixels {} must be positive and at most max_pixels {}",
                self.min_pixels, self.max_pixels
            ));
        }
        if self.max_pixels > MAX_CONFIG_PIXELS {
            return Err(format!(
                "max_pixels {} is over {MAX_CONFIG_PIXELS}",
                self.max_pixels
            ));
        }
        if self
            .image_std
            .iter()
            .chain(&self.image_mean)
            .any(|v| !v.is_finite())
            || self.image_std.contains(&0.0)
        {
            return Err("image_mean and image_std must be finite, image_std non-zero".into());
        }
        if !(self.rescale_factor.is_finite() && self.rescale_factor > 0.0) {
            return Err(format!(
                "rescale_factor {} must be positive",
                self.rescale_factor
            ));
        }
        Ok(())
    }

    /// Side of the resize grid: `patch_size * merge_size` (28).
    pub fn factor(&self) -> usize {
        self.patch_size * self.merge_size
    }

    /// The settings the content hash covers, as one string.
    fn fingerprint(&self, dtype: PixelDtype) -> String {
        format!(
            "qwen2-vl;patch={};merge={};t={};mean={:?};std={:?};rescale={:?};flags={},{};{}",
            self.patch_size,
            self.merge_size,
            self.temporal_patch_size,
            self.image_mean,
            self.image_std,
            self.rescale_factor,
            self.do_rescale,
            self.do_normalize,
            dtype.as_str()
        )
    }
}

/// Python's `round` on a float: halves go to the even neighbour.
fn round_half_even(x: f64) -> f64 {
    x.round_ties_even()
}

/// The resized `(height, width)` for an image of `height` x `width`, as the reference's
/// `smart_resize` computes it (same float operations, same rounding).
pub fn smart_resize(
    height: usize,
    width: usize,
    factor: usize,
    min_pixels: u64,
    max_pixels: u64,
) -> Result<(usize, usize), ImageError> {
    let (h, w, f) = (height as f64, width as f64, factor as f64);
    if height == 0 || width == 0 {
        return Err(ImageError::Empty);
    }
    if h.max(w) / h.min(w) > f64::from(MAX_ASPECT_RATIO) {
        return Err(ImageError::AspectRatio {
            width: width as u32,
            height: height as u32,
            max: MAX_ASPECT_RATIO,
        });
    }
    let mut h_bar = round_half_even(h / f) * f;
    let mut w_bar = round_half_even(w / f) * f;
    if h_bar * w_bar > max_pixels as f64 {
        let beta = ((h * w) / max_pixels as f64).sqrt();
        h_bar = f.max((h / beta / f).floor() * f);
        w_bar = f.max((w / beta / f).floor() * f);
    } else if h_bar * w_bar < min_pixels as f64 {
        let beta = (min_pixels as f64 / (h * w)).sqrt();
        h_bar = (h * beta / f).ceil() * f;
        w_bar = (w * beta / f).ceil() * f;
    }
    Ok((h_bar as usize, w_bar as usize))
}

/// The preprocessing of one Qwen2-VL-family model.
#[derive(Debug, Clone)]
pub struct Qwen2VlProcessor {
    config: Qwen2VlConfig,
}

impl Qwen2VlProcessor {
    /// A processor with `config`'s settings.
    pub fn new(config: Qwen2VlConfig) -> Self {
        Qwen2VlProcessor { config }
    }

    /// Its settings.
    pub fn config(&self) -> &Qwen2VlConfig {
        &self.config
    }

    /// Placeholder tokens an image of `height` x `width` takes, without processing it.
    pub fn placeholders_for(&self, height: usize, width: usize) -> Result<usize, ImageError> {
        let c = &self.config;
        let (h, w) = smart_resize(height, width, c.factor(), c.min_pixels, c.max_pixels)?;
        Ok((h / c.patch_size) * (w / c.patch_size) / (c.merge_size * c.merge_size))
    }

    /// Step 1 and 2: the image resized as the reference resizes it.
    pub fn resize(&self, image: &Rgb8) -> Result<Rgb8, ImageError> {
        let c = &self.config;
        let (h, w) = smart_resize(
            image.height(),
            image.width(),
            c.factor(),
            c.min_pixels,
            c.max_pixels,
        )?;
        Ok(bicubic_rgb(image, w, h))
    }

    /// All steps: `image` to its patch tensor.
    pub fn process(&self, image: &Rgb8, dtype: PixelDtype) -> Result<ProcessedImage, ImageError> {
        Ok(self.patchify(&self.resize(image)?, dtype))
    }

    /// Steps 3 and 4 on an already resized image (both sides multiples of
    /// [`Qwen2VlConfig::factor`]).
    ///
    /// # Panics
    /// If `resized` is not a multiple of the factor on both sides (a caller's bug).
    pub fn patchify(&self, resized: &Rgb8, dtype: PixelDtype) -> ProcessedImage {
        match dtype {
            PixelDtype::Bf16 => self.patchify_as(resized, dtype, |v| bf16_bits(v).to_le_bytes()),
            PixelDtype::F32 => self.patchify_as(resized, dtype, f32::to_le_bytes),
        }
    }

    /// Normalised value of byte `v` in channel `c`, with the reference's float operations:
    /// the rescale in f64 stored as f32, the normalisation in f32.
    fn normalised(&self, c: usize, v: u8) -> f32 {
        let cfg = &self.config;
        let x = if cfg.do_rescale {
            (f64::from(v) * cfg.rescale_factor) as f32
        } else {
            f32::from(v)
        };
        if cfg.do_normalize {
            (x - cfg.image_mean[c] as f32) / cfg.image_std[c] as f32
        } else {
            x
        }
    }

    fn patchify_as<const N: usize>(
        &self,
        resized: &Rgb8,
        dtype: PixelDtype,
        encode: impl Fn(f32) -> [u8; N],
    ) -> ProcessedImage {
        let c = &self.config;
        let (p, m, t) = (c.patch_size, c.merge_size, c.temporal_patch_size);
        let (height, width) = (resized.height(), resized.width());
        assert!(
            height % c.factor() == 0 && width % c.factor() == 0,
            "resized image must be a multiple of the factor"
        );
        let table: Vec<[u8; N]> = (0..3)
            .flat_map(|ch| (0..=255u8).map(move |v| (ch, v)))
            .map(|(ch, v)| encode(self.normalised(ch, v)))
            .collect();
        let (grid_h, grid_w) = (height / p, width / p);
        let rows = grid_h * grid_w;
        let row_len = 3 * t * p * p;
        // Filled in place: each patch row is written where it belongs, one channel's frame at a
        // time, and the frame is then copied for the other temporal slots.
        let mut out = vec![0u8; rows * row_len * N];
        let frame_bytes = p * p * N;
        let mut row_start = 0;
        for block_y in 0..grid_h / m {
            for block_x in 0..grid_w / m {
                for in_y in 0..m {
                    for in_x in 0..m {
                        let top = (block_y * m + in_y) * p;
                        let left = (block_x * m + in_x) * p;
                        for ch in 0..3 {
                            let frame = row_start + ch * t * frame_bytes;
                            let channel = &table[ch * 256..(ch + 1) * 256];
                            let dst = &mut out[frame..frame + frame_bytes];
                            for (y, line) in dst.chunks_exact_mut(p * N).enumerate() {
                                let src = &resized.row(top + y)[left * 3..(left + p) * 3];
                                for (d, px) in line.chunks_exact_mut(N).zip(src.chunks_exact(3)) {
                                    d.copy_from_slice(&channel[px[ch] as usize]);
                                }
                            }
                            for k in 1..t {
                                out.copy_within(
                                    frame..frame + frame_bytes,
                                    frame + k * frame_bytes,
                                );
                            }
                        }
                        row_start += row_len * N;
                    }
                }
            }
        }
        debug_assert_eq!(row_start, out.len());
        ProcessedImage {
            pixel_values: out,
            dtype,
            shape: [rows, row_len],
            grid_thw: [1, grid_h as u32, grid_w as u32],
            placeholders: rows / (m * m),
            hash: ContentHash::of(&c.fingerprint(dtype), height, width, resized.data()),
            resized: (height, width),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smart_resize_follows_the_reference() {
        let r = |h, w| smart_resize(h, w, 28, 3136, 12_845_056).unwrap();
        assert_eq!(r(45, 67), (56, 56));
        // Halves round to even: 42/28 = 1.5 -> 2, 70/28 = 2.5 -> 2.
        assert_eq!(r(42, 70), (56, 56));
        // Too small: scaled up to min_pixels.
        assert_eq!(r(13, 9), (84, 56));
        assert_eq!(r(1, 1), (56, 56));
        // Too large: scaled down under max_pixels.
        assert_eq!(smart_resize(70, 130, 28, 3136, 6272).unwrap(), (56, 84));
        let (h, w) = r(8000, 6000);
        assert!(h * w <= 12_845_056 && h % 28 == 0 && w % 28 == 0, "{h}x{w}");
        assert_eq!(
            smart_resize(1, 201, 28, 3136, 6272),
            Err(ImageError::AspectRatio {
                width: 201,
                height: 1,
                max: 200
            })
        );
        assert!(smart_resize(1, 200, 28, 3136, 12_845_056).is_ok());
    }

    #[test]
    fn config_reads_the_file_and_refuses_what_it_cannot_do() {
        let f = Path::new("preprocessor_config.json");
        let c = Qwen2VlConfig::parse(r#"{"min_pixels": 100, "max_pixels": 5000}"#, f).unwrap();
        assert_eq!((c.min_pixels, c.max_pixels, c.patch_size), (100, 5000, 14));
        // The size dict is the newer spelling; explicit keys win over it.
        let c = Qwen2VlConfig::parse(
            r#"{"size": {"shortest_edge": 10, "longest_edge": 20}, "max_pixels": 30}"#,
            f,
        )
        .unwrap();
        assert_eq!((c.min_pixels, c.max_pixels), (10, 30));
        assert_eq!(
            Qwen2VlConfig::parse("{}", f).unwrap(),
            Qwen2VlConfig::default()
        );
        for bad in [
            r#"{"resample": 2}"#,
            r#"{"do_resize": false}"#,
            r#"{"do_convert_rgb": false}"#,
            r#"{"image_mean": [0.5, 0.5]}"#,
            r#"{"image_std": [0.5, 0.0, 0.5]}"#,
            r#"{"min_pixels": 10, "max_pixels": 5}"#,
            r#"{"max_pixels": 1e12}"#,
            r#"{"patch_size": 0}"#,
            r#"{"rescale_factor": -1}"#,
            "not json",
        ] {
            assert!(Qwen2VlConfig::parse(bad, f).is_err(), "{bad}");
        }
    }

    #[test]
    fn patches_are_ordered_by_merge_block_channel_time_then_pixel() {
        // Each pixel's red byte is its x, green its y, blue its block-local tag; with
        // rescale/normalise off the values are the bytes themselves.
        let config = Qwen2VlConfig {
            patch_size: 2,
            merge_size: 2,
            temporal_patch_size: 2,
            do_rescale: false,
            do_normalize: false,
            ..Qwen2VlConfig::default()
        };
        let (w, h) = (8, 4);
        let data = (0..h)
            .flat_map(|y| (0..w).flat_map(move |x| [x as u8, y as u8, (x * 10 + y) as u8]))
            .collect();
        let p = Qwen2VlProcessor::new(config).patchify(&Rgb8::new(w, h, data), PixelDtype::F32);
        assert_eq!(p.grid_thw, [1, 2, 4]);
        assert_eq!(p.shape, [8, 3 * 2 * 2 * 2]);
        assert_eq!(p.placeholders, 2);
        let row = |r: usize| (0..p.shape[1]).map(|c| p.value(r, c)).collect::<Vec<_>>();
        // Row 0: block (0,0), patch (0,0): pixels x 0..2, y 0..2.
        #[rustfmt::skip]
        assert_eq!(row(0), [
            0., 1., 0., 1.,  0., 1., 0., 1.,       // red, frame 0 then 1
            0., 0., 1., 1.,  0., 0., 1., 1.,       // green
            0., 10., 1., 11.,  0., 10., 1., 11.,   // blue
        ]);
        // Row 1: same block, patch to the right (x 2..4); row 2: the patch below (y 2..4).
        assert_eq!(row(1)[..4], [2., 3., 2., 3.]);
        assert_eq!(row(2)[8..12], [2., 2., 3., 3.]);
        // Row 4: the next block to the right starts at x 4.
        assert_eq!(row(4)[..4], [4., 5., 4., 5.]);
    }

    #[test]
    fn bf16_output_is_the_rounded_f32_output() {
        let p = Qwen2VlProcessor::new(Qwen2VlConfig::default());
        let img = Rgb8::new(
            56,
            56,
            (0..56 * 56 * 3).map(|i| (i * 7 % 256) as u8).collect(),
        );
        let f = p.patchify(&img, PixelDtype::F32);
        let b = p.patchify(&img, PixelDtype::Bf16);
        assert_eq!(b.pixel_values.len() * 2, f.pixel_values.len());
        for r in 0..f.shape[0] {
            for c in (0..f.shape[1]).step_by(37) {
                let exact = f.value(r, c);
                assert_eq!(b.value(r, c), crate::tensor::bf16_to_f32(bf16_bits(exact)));
            }
        }
        assert_ne!(
            f.hash, b.hash,
            "the dtype is part of what the encoder receives"
        );
        assert_eq!(p.placeholders_for(56, 56).unwrap(), f.placeholders);
    }
}
