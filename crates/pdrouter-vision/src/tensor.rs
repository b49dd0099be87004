//! What preprocessing hands to an encode worker: the pixel tensor as little-endian bytes, its
//! shape and grid, the placeholder count, and a content hash.

use sha2::{Digest, Sha256};

/// Element type of the pixel tensor sent inline.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PixelDtype {
    /// bfloat16, rounded to nearest even from the float32 value (the models run in bf16).
    #[default]
    Bf16,
    /// float32, exactly the reference processor's values.
    F32,
}

impl PixelDtype {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            PixelDtype::Bf16 => 2,
            PixelDtype::F32 => 4,
        }
    }

    /// The name tensors are labelled with (`"bfloat16"`, `"float32"`).
    pub fn as_str(self) -> &'static str {
        match self {
            PixelDtype::Bf16 => "bfloat16",
            PixelDtype::F32 => "float32",
        }
    }
}

/// The bfloat16 bit pattern nearest to `x` (ties to even); NaN stays a quiet NaN.
pub fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) as u16) | 0x0040;
    }
    let round = 0x7FFF + ((bits >> 16) & 1);
    (bits.wrapping_add(round) >> 16) as u16
}

/// The float32 value of a bfloat16 bit pattern (exact).
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// SHA-256 identifying an image item by what the encoder receives: the preprocessing
/// settings, the resized size and its pixels. The same picture sent twice, in any container
/// or URL, hashes the same; so do its re-encodings that decode to the same pixels.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContentHash(pub [u8; 32]);

impl ContentHash {
    pub(crate) fn of(settings: &str, height: usize, width: usize, rgb: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update((settings.len() as u64).to_le_bytes());
        h.update(settings.as_bytes());
        h.update((height as u64).to_le_bytes());
        h.update((width as u64).to_le_bytes());
        h.update(rgb);
        ContentHash(h.finalize().into())
    }

    /// Lower-case hex, 64 characters.
    pub fn hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The first eight bytes as a big-endian integer (for keys that must be a number).
    pub fn prefix_u64(&self) -> u64 {
        let mut first = [0u8; 8];
        first.copy_from_slice(&self.0[..8]);
        u64::from_be_bytes(first)
    }
}

impl std::fmt::Debug for ContentHash {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ContentHash({})", self.hex())
    }
}

/// One preprocessed image, ready to send.
#[derive(Clone, PartialEq, Eq)]
pub struct ProcessedImage {
    /// The patch rows, row-major, each element little-endian in `dtype`.
    pub pixel_values: Vec<u8>,
    /// Element type of `pixel_values`.
    pub dtype: PixelDtype,
    /// `[rows, row_len]`: rows = `grid_t * grid_h * grid_w`, row_len = channels x temporal
    /// patch x patch x patch (1176 for Qwen2-VL).
    pub shape: [usize; 2],
    /// `image_grid_thw`: patches along time, height and width.
    pub grid_thw: [u32; 3],
    /// Placeholder tokens the image takes in the prompt: `grid_t * grid_h * grid_w / merge²`.
    pub placeholders: usize,
    /// Identity of the item (see [`ContentHash`]).
    pub hash: ContentHash,
    /// The size the image was resized to, `(height, width)`.
    pub resized: (usize, usize),
}

impl std::fmt::Debug for ProcessedImage {
    /// Shapes and hash only: the pixels would fill a log.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessedImage")
            .field("dtype", &self.dtype)
            .field("shape", &self.shape)
            .field("grid_thw", &self.grid_thw)
            .field("placeholders", &self.placeholders)
            .field("hash", &self.hash)
            .finish_non_exhaustive()
    }
}

impl ProcessedImage {
    /// Element `(row, col)` as float32 (exact for both dtypes).
    ///
    /// # Panics
    /// If the position is outside [`ProcessedImage::shape`].
    pub fn value(&self, row: usize, col: usize) -> f32 {
        assert!(
            row < self.shape[0] && col < self.shape[1],
            "outside the tensor"
        );
        let i = (row * self.shape[1] + col) * self.dtype.size();
        let b = &self.pixel_values[i..i + self.dtype.size()];
        match self.dtype {
            PixelDtype::Bf16 => bf16_to_f32(u16::from_le_bytes([b[0], b[1]])),
            PixelDtype::F32 => f32::from_le_bytes([b[0], b[1], b[2], b[3]]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_rounds_to_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3F80);
        assert_eq!(bf16_bits(-2.0), 0xC000);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: ties go to the even pattern (1.0).
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3F80);
        // 1 + 3·2^-8 lies halfway between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
        assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3F82);
        // Just above halfway rounds up.
        assert_eq!(bf16_bits(f32::from_bits(0x3F80_8001)), 0x3F81);
        assert_eq!(bf16_bits(f32::INFINITY), 0x7F80);
        assert!(bf16_to_f32(bf16_bits(f32::NAN)).is_nan());
        assert_eq!(bf16_to_f32(0x3F81), 1.0078125);
    }

    #[test]
    fn hashes_separate_settings_sizes_and_pixels() {
        let a = ContentHash::of("s", 1, 2, &[0; 6]);
        assert_eq!(a, ContentHash::of("s", 1, 2, &[0; 6]));
        assert_ne!(a, ContentHash::of("t", 1, 2, &[0; 6]));
        assert_ne!(a, ContentHash::of("s", 2, 1, &[0; 6]));
        assert_ne!(a, ContentHash::of("s", 1, 2, &[0, 0, 0, 0, 0, 1]));
        assert_eq!(a.hex().len(), 64);
        assert_eq!(a.prefix_u64().to_be_bytes(), a.0[..8]);
    }
}
