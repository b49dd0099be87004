//! Exactness against the reference Python processor.
//!
//! `tests/fixtures/qwen2vl/expected.json` and the images beside it were made once by
//! `make_fixtures.py` (same folder) with transformers' `Qwen2VLImageProcessor` (PIL/NumPy
//! implementation) and Pillow. What is compared, and with which tolerance:
//!
//! - From the reference's own decoded RGB (`*.decoded.png`, lossless): the resized 8-bit image
//!   must be **identical** (tolerance 0; its SHA-256 too), and every float32 patch value
//!   **bit-identical** (tolerance 0: the sampled values compare with `==`; the per-row sums,
//!   which Python adds in a different order, within 1e-9 relative). So the bicubic resize,
//!   rescale, normalisation and patch order reproduce the reference exactly; there is no
//!   bicubic rounding slack to allow for.
//! - From the original files: PNG (RGB, RGBA, palette with transparency, grey) and lossless
//!   WebP decode to the same pixels as Pillow, so the whole pipeline is exact as above. JPEG
//!   and lossy WebP decoders are allowed to differ from Pillow's libjpeg-turbo/libwebp by
//!   their IDCT and chroma upsampling rounding: at most [`LOSSY_DECODE_LEVELS`] levels per
//!   decoded 8-bit sample, which after normalisation bounds every patch value's difference by
//!   `LOSSY_DECODE_LEVELS / 255 / min(std)`.
//! - bfloat16 output: each value is the float32 value rounded to nearest even.

use std::path::{Path, PathBuf};

use pdrouter_vision::{DecodeLimits, PixelDtype, ProcessedImage, Qwen2VlConfig, Qwen2VlProcessor};
use pdrouter_vision::{Rgb8, decode};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Largest per-sample difference allowed between our JPEG/lossy-WebP decoders and Pillow's.
/// Measured when the fixtures were made: 3 for the JPEG (zune-jpeg against libjpeg-turbo),
/// 0 for the lossy WebP; one level of margin for another CPU's SIMD path.
const LOSSY_DECODE_LEVELS: u8 = 4;

fn dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/qwen2vl")
}

fn expected() -> Vec<Value> {
    let text = std::fs::read_to_string(dir().join("expected.json")).unwrap();
    let v: Value = serde_json::from_str(&text).unwrap();
    v["cases"].as_array().unwrap().clone()
}

fn load(file: &str) -> Rgb8 {
    let bytes = std::fs::read(dir().join(file)).unwrap();
    decode(&bytes, &DecodeLimits::default()).unwrap()
}

fn processor(case: &Value) -> Qwen2VlProcessor {
    let config = dir().join("config").join(case["config"].as_str().unwrap());
    Qwen2VlProcessor::new(Qwen2VlConfig::load(&config).unwrap())
}

fn dims(v: &Value) -> Vec<usize> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect()
}

fn max_diff(a: &[u8], b: &[u8]) -> u8 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0)
}

/// Checks shapes and values of `got` against the case; `tolerance` is the largest absolute
/// difference allowed per float32 value (0 = bit-identical).
fn check_patches(case: &Value, got: &ProcessedImage, tolerance: f32) {
    let name = case["case"].as_str().unwrap();
    assert_eq!(got.shape.to_vec(), dims(&case["shape"]), "{name}");
    let thw: Vec<usize> = got.grid_thw.iter().map(|&v| v as usize).collect();
    assert_eq!(thw, dims(&case["grid_thw"]), "{name}");
    assert_eq!(
        got.placeholders as u64,
        case["placeholders"].as_u64().unwrap(),
        "{name}"
    );
    let resized = dims(&case["resized"]);
    assert_eq!(
        (got.resized.0, got.resized.1),
        (resized[0], resized[1]),
        "{name}"
    );
    for s in case["samples"].as_array().unwrap() {
        let (r, c) = (
            s[0].as_u64().unwrap() as usize,
            s[1].as_u64().unwrap() as usize,
        );
        let want = s[2].as_f64().unwrap() as f32;
        let v = got.value(r, c);
        assert!(
            (v - want).abs() <= tolerance,
            "{name} [{r}, {c}]: {v} vs reference {want}"
        );
    }
    let cols = got.shape[1];
    for (r, (sum, weighted)) in case["row_sums"]
        .as_array()
        .unwrap()
        .iter()
        .zip(case["row_weighted_sums"].as_array().unwrap())
        .enumerate()
    {
        let (mut s, mut w) = (0f64, 0f64);
        for c in 0..cols {
            let v = f64::from(got.value(r, c));
            s += v;
            w += v * ((c % 13) + 1) as f64;
        }
        let close = |a: f64, b: f64, per_value: f64, weight: f64| {
            (a - b).abs() <= 1e-9 * b.abs().max(1.0) + per_value * cols as f64 * weight
        };
        let tol = f64::from(tolerance);
        assert!(
            close(s, sum.as_f64().unwrap(), tol, 1.0),
            "{name} row {r} sum {s} vs {sum}"
        );
        assert!(
            close(w, weighted.as_f64().unwrap(), tol, 13.0),
            "{name} row {r} weighted sum {w} vs {weighted}"
        );
    }
}

#[test]
fn from_the_reference_decoded_pixels_everything_is_exact() {
    let cases = expected();
    assert_eq!(cases.len(), 9);
    for case in &cases {
        let name = case["case"].as_str().unwrap();
        let p = processor(case);
        let rgb = load(case["decoded_image"].as_str().unwrap());
        assert_eq!(
            vec![rgb.height(), rgb.width()],
            dims(&case["decoded"]),
            "{name}"
        );
        let resized = p.resize(&rgb).unwrap();
        let reference = load(&format!("{name}.resized.png"));
        assert_eq!(
            resized, reference,
            "{name}: resized pixels differ from Pillow's"
        );
        let sha: String = Sha256::digest(resized.data())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        assert_eq!(sha, case["resized_rgb_sha256"].as_str().unwrap(), "{name}");
        check_patches(case, &p.patchify(&resized, PixelDtype::F32), 0.0);
    }
}

#[test]
fn from_the_original_files_lossless_formats_are_exact_and_lossy_ones_bounded() {
    let min_std = Qwen2VlConfig::default()
        .image_std
        .iter()
        .fold(f64::MAX, |a, &b| a.min(b));
    let lossy_tolerance = (f64::from(LOSSY_DECODE_LEVELS) / 255.0 / min_std) as f32;
    for case in &expected() {
        let name = case["case"].as_str().unwrap();
        let file = case["image"].as_str().unwrap();
        let lossy = file.ends_with(".jpg") || file == "lossy.webp";
        let p = processor(case);
        let ours = load(file);
        let pillow = load(case["decoded_image"].as_str().unwrap());
        let decode_diff = max_diff(ours.data(), pillow.data());
        let resized = p.resize(&ours).unwrap();
        let resized_diff = max_diff(resized.data(), load(&format!("{name}.resized.png")).data());
        eprintln!("{name}: decoded max diff {decode_diff}, resized max diff {resized_diff}");
        let got = p.process(&ours, PixelDtype::F32).unwrap();
        if lossy {
            assert!(decode_diff <= LOSSY_DECODE_LEVELS, "{name}: {decode_diff}");
            check_patches(case, &got, lossy_tolerance);
        } else {
            assert_eq!(
                decode_diff, 0,
                "{name}: decoded pixels differ from Pillow's"
            );
            check_patches(case, &got, 0.0);
            // Same pixels, same item: the hash does not depend on the container.
            let from_pillow = p.process(&pillow, PixelDtype::F32).unwrap();
            assert_eq!(got.hash, from_pillow.hash, "{name}");
        }
    }
}

#[test]
fn bfloat16_values_are_the_rounded_reference_values() {
    for case in &expected() {
        let name = case["case"].as_str().unwrap();
        let p = processor(case);
        let rgb = load(case["decoded_image"].as_str().unwrap());
        let got = p.process(&rgb, PixelDtype::Bf16).unwrap();
        assert_eq!(got.pixel_values.len(), got.shape[0] * got.shape[1] * 2);
        for s in case["samples"].as_array().unwrap() {
            let (r, c) = (
                s[0].as_u64().unwrap() as usize,
                s[1].as_u64().unwrap() as usize,
            );
            let want = s[2].as_f64().unwrap() as f32;
            let bits = pdrouter_vision::tensor::bf16_bits(want);
            assert_eq!(
                got.value(r, c),
                pdrouter_vision::tensor::bf16_to_f32(bits),
                "{name}"
            );
        }
    }
}
