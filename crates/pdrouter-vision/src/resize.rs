//! Bicubic resampling of 8-bit RGB images, bit for bit as Pillow's `Image.resize(size,
//! BICUBIC)` does it (the reference processors resize with Pillow on uint8 RGB).
//!
//! Pillow's algorithm, restated:
//! - Separable: a horizontal pass over the source rows the vertical pass needs, then a vertical
//!   pass; a pass whose size does not change is skipped. The intermediate image is 8-bit, so it
//!   is rounded and clamped between the passes.
//! - Each output sample `i` is centred at `(i + 0.5) * scale` in source coordinates. When
//!   shrinking, the kernel is widened by the scale (it averages, so it does not alias); its
//!   support is `2 * max(scale, 1)` source samples either side.
//! - Weights are the Keys cubic with `a = -0.5`, computed in `f64`, normalised to sum to one,
//!   then rounded half away from zero to fixed point with 22 fractional bits. Sums start at one
//!   half (for rounding) and are shifted back and clamped to 0..=255.
//!
//! Invariant: the output depends only on the input pixels and the two sizes; equal sizes give
//! the input back unchanged.

use crate::pixels::Rgb8;

/// Fixed-point precision of the weights: 32 bits less 8 for the sample, less 2 for headroom.
const PRECISION_BITS: u32 = 32 - 8 - 2;

/// Support of the bicubic kernel, in source samples at scale 1.
const SUPPORT: f64 = 2.0;

/// The Keys cubic convolution kernel with `a = -0.5`.
fn bicubic(x: f64) -> f64 {
    const A: f64 = -0.5;
    let x = x.abs();
    if x < 1.0 {
        ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
    } else if x < 2.0 {
        (((x - 5.0) * x + 8.0) * x - 4.0) * A
    } else {
        0.0
    }
}

/// For each output sample: the first source sample it reads and its fixed-point weights.
#[derive(Debug)]
struct Taps {
    /// Weights per output sample, `ksize` slots each (unused slots are zero).
    weights: Vec<i32>,
    /// `(first source sample, number of weights used)` per output sample.
    bounds: Vec<(usize, usize)>,
    ksize: usize,
}

impl Taps {
    fn new(in_size: usize, out_size: usize) -> Self {
        let scale = in_size as f64 / out_size as f64;
        let filter_scale = scale.max(1.0);
        let support = SUPPORT * filter_scale;
        let ksize = support.ceil() as usize * 2 + 1;
        let mut weights = vec![0i32; out_size * ksize];
        let mut bounds = Vec::with_capacity(out_size);
        let mut k = vec![0f64; ksize];
        for (i, out) in weights.chunks_exact_mut(ksize).enumerate() {
            let center = (i as f64 + 0.5) * scale;
            // Truncation of a value that may be negative, as C's `(int)` does, then clamped.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64) as usize;
            let count = xmax.saturating_sub(xmin);
            let mut total = 0.0;
            for (x, w) in k.iter_mut().enumerate().take(count) {
                *w = bicubic((x as f64 + xmin as f64 - center + 0.5) / filter_scale);
                total += *w;
            }
            for (slot, w) in out.iter_mut().zip(&k).take(count) {
                let w = if total != 0.0 { w / total } else { *w };
                let fixed = w * f64::from(1u32 << PRECISION_BITS);
                // Rounded half away from zero, then truncated, as Pillow does.
                *slot = if w < 0.0 {
                    (fixed - 0.5) as i32
                } else {
                    (fixed + 0.5) as i32
                };
            }
            bounds.push((xmin, count));
        }
        Taps {
            weights,
            bounds,
            ksize,
        }
    }

    fn weights(&self, i: usize) -> &[i32] {
        let (_, count) = self.bounds[i];
        &self.weights[i * self.ksize..i * self.ksize + count]
    }
}

/// Back from fixed point to a sample: shifted and clamped to 0..=255.
fn clip8(sum: i32) -> u8 {
    (sum >> PRECISION_BITS).clamp(0, 255) as u8
}

/// Sums are 32-bit, as Pillow's: the weights of one sample add up to one (2^22) give or take
/// the negative lobes (their absolute values add up to less than 1.3), so a sum stays within
/// 255 x 1.3 x 2^22 < 2^31. Wrapping arithmetic keeps that argument from ever becoming a
/// panic.
const HALF: i32 = 1 << (PRECISION_BITS - 1);

fn mac(sum: i32, sample: u8, weight: i32) -> i32 {
    sum.wrapping_add(i32::from(sample).wrapping_mul(weight))
}

/// Resizes `src` to `width` x `height` with Pillow's bicubic filter.
///
/// Both target sizes must be at least 1 (callers compute them from non-zero sources).
pub fn bicubic_rgb(src: &Rgb8, width: usize, height: usize) -> Rgb8 {
    debug_assert!(width > 0 && height > 0);
    let (sw, sh) = (src.width(), src.height());
    let horizontal = width != sw;
    let vertical = height != sh;
    let vtaps = Taps::new(sh, height);
    // Only the source rows some output row reads are resized horizontally.
    let first_row = vtaps.bounds.first().map_or(0, |b| b.0);
    let last_row = vtaps.bounds.last().map_or(sh, |b| b.0 + b.1);

    let mid = if horizontal {
        let taps = Taps::new(sw, width);
        let rows = if vertical { first_row..last_row } else { 0..sh };
        let mut out = Vec::with_capacity(rows.len() * width * 3);
        for y in rows {
            let row = src.row(y);
            for x in 0..width {
                let (first, _) = taps.bounds[x];
                let mut sums = [HALF; 3];
                for (j, &w) in taps.weights(x).iter().enumerate() {
                    let px = &row[(first + j) * 3..(first + j) * 3 + 3];
                    for c in 0..3 {
                        sums[c] = mac(sums[c], px[c], w);
                    }
                }
                out.extend(sums.map(clip8));
            }
        }
        let rows = out.len() / (width * 3);
        Rgb8::new(width, rows, out)
    } else {
        src.clone()
    };
    if !vertical {
        return mid;
    }
    // Row offsets into `mid`, which starts at `first_row` when the horizontal pass ran.
    let base = if horizontal { first_row } else { 0 };
    let mut out = Vec::with_capacity(width * height * 3);
    for y in 0..height {
        let (first, _) = vtaps.bounds[y];
        let weights = vtaps.weights(y);
        let mut sums = vec![HALF; width * 3];
        for (j, &w) in weights.iter().enumerate() {
            let row = mid.row(first + j - base);
            for (s, &v) in sums.iter_mut().zip(row) {
                *s = mac(*s, v, w);
            }
        }
        out.extend(sums.into_iter().map(clip8));
    }
    Rgb8::new(width, height, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gradient(w: usize, h: usize) -> Rgb8 {
        let data = (0..w * h * 3)
            .map(|i| ((i * 37 + i / 7) % 256) as u8)
            .collect();
        Rgb8::new(w, h, data)
    }

    #[test]
    fn kernel_is_keys_cubic() {
        assert_eq!(bicubic(0.0), 1.0);
        assert_eq!(bicubic(1.0), 0.0);
        assert_eq!(bicubic(2.0), 0.0);
        assert_eq!(bicubic(0.5), 0.5625);
        assert_eq!(bicubic(-1.5), -0.0625);
    }

    #[test]
    fn weights_sum_to_one_in_fixed_point_give_or_take_rounding() {
        for (input, output) in [(13, 84), (67, 56), (200, 7), (5, 5), (1, 9)] {
            let taps = Taps::new(input, output);
            for i in 0..output {
                let sum: i64 = taps.weights(i).iter().map(|&w| i64::from(w)).sum();
                let magnitude: i64 = taps.weights(i).iter().map(|&w| i64::from(w).abs()).sum();
                assert!(
                    magnitude * 255 < i64::from(i32::MAX),
                    "{input}->{output} at {i}"
                );
                let one = 1i64 << PRECISION_BITS;
                assert!(
                    (sum - one).abs() <= taps.ksize as i64,
                    "{input}->{output} at {i}"
                );
            }
        }
    }

    #[test]
    fn equal_sizes_are_the_identity() {
        let img = gradient(9, 4);
        assert_eq!(bicubic_rgb(&img, 9, 4), img);
    }

    #[test]
    fn a_flat_image_stays_flat_at_any_size() {
        let img = Rgb8::new(7, 5, [10u8, 128, 250].repeat(35));
        for (w, h) in [(28, 56), (3, 2), (7, 11), (1, 1)] {
            let out = bicubic_rgb(&img, w, h);
            assert_eq!(out.width(), w);
            assert_eq!(out.height(), h);
            assert!(out.data().chunks(3).all(|p| p == [10, 128, 250]));
        }
    }

    #[test]
    fn one_pass_only_when_one_side_changes() {
        // Changing only the width must not disturb rows, and vice versa: compare with a
        // two-step resize through the intermediate size.
        let img = gradient(11, 6);
        let wide = bicubic_rgb(&img, 20, 6);
        let both = bicubic_rgb(&img, 20, 9);
        assert_eq!(bicubic_rgb(&wide, 20, 9), both);
    }
}
