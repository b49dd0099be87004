//! Cost of one image's preprocessing: decoding (PNG, JPEG), and resize + normalise + patchify
//! to bfloat16, at a phone-photo size under Qwen2-VL-7B's limits and at a typical web size
//! under the processor defaults. The router runs this on its CPU pool; these figures size it.

use std::hint::black_box;
use std::io::Cursor;

use criterion::{Criterion, criterion_group, criterion_main};
use pdrouter_vision::image::{self, ImageFormat};
use pdrouter_vision::{DecodeLimits, PixelDtype, Qwen2VlConfig, Qwen2VlProcessor, Rgb8, decode};

/// A photo-like test image: smooth gradients with fine texture (compresses like a photo).
fn picture(width: u32, height: u32) -> image::RgbImage {
    image::RgbImage::from_fn(width, height, |x, y| {
        let t = ((x * 7 + y * 13) % 17) as u8;
        image::Rgb([
            (x * 255 / width) as u8 ^ t,
            (y * 255 / height) as u8,
            ((x + y) % 256) as u8 / 2 + t,
        ])
    })
}

fn encoded(img: &image::RgbImage, format: ImageFormat) -> Vec<u8> {
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, format).unwrap();
    out.into_inner()
}

fn rgb(img: &image::RgbImage) -> Rgb8 {
    Rgb8::new(
        img.width() as usize,
        img.height() as usize,
        img.as_raw().clone(),
    )
}

fn bench(c: &mut Criterion) {
    let web = picture(1024, 768);
    let limits = DecodeLimits::default();
    let mut g = c.benchmark_group("decode");
    g.sample_size(20);
    for (name, format) in [("png", ImageFormat::Png), ("jpeg", ImageFormat::Jpeg)] {
        let bytes = encoded(&web, format);
        g.bench_function(format!("{name}/1024x768"), |b| {
            b.iter(|| decode(black_box(&bytes), &limits).unwrap())
        });
    }
    g.finish();

    let mut g = c.benchmark_group("preprocess_bf16");
    g.sample_size(10);
    let defaults = Qwen2VlProcessor::new(Qwen2VlConfig::default());
    let web = rgb(&web);
    g.bench_function("1024x768/defaults", |b| {
        b.iter(|| defaults.process(black_box(&web), PixelDtype::Bf16).unwrap())
    });
    let qwen7b = Qwen2VlProcessor::new(Qwen2VlConfig {
        max_pixels: 12_845_056,
        ..Qwen2VlConfig::default()
    });
    let photo = rgb(&picture(4000, 3000));
    let resized = qwen7b.resize(&photo).unwrap();
    g.bench_function("4000x3000/qwen2-vl-7b/resize_only", |b| {
        b.iter(|| qwen7b.resize(black_box(&photo)).unwrap())
    });
    g.bench_function("4000x3000/qwen2-vl-7b/patchify_only", |b| {
        b.iter(|| qwen7b.patchify(black_box(&resized), PixelDtype::Bf16))
    });
    g.bench_function("4000x3000/qwen2-vl-7b", |b| {
        b.iter(|| qwen7b.process(black_box(&photo), PixelDtype::Bf16).unwrap())
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
