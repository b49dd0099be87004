//! Encoded image bytes to 8-bit RGB pixels, as the reference processors see them.
//!
//! Accepts PNG, JPEG and WebP, recognised by their signature (a declared media type is not
//! trusted). The header is read first: a zero-sized image or one over
//! [`DecodeLimits::max_pixels`] is refused before any pixel buffer exists, and the decoder's
//! own allocations are capped in proportion.
//!
//! Conversion to RGB follows the reference's `convert_to_rgb` on a Pillow image:
//! - an image with transparency (an alpha channel, or a PNG `tRNS` chunk, which the PNG
//!   decoder expands to alpha) is composited onto opaque white with Pillow's integer
//!   `alpha_composite` arithmetic;
//! - grey becomes three equal channels;
//! - 16-bit samples keep their high byte, except 16-bit grey without alpha, whose values
//!   Pillow clips to 255 (its `I;16` mode is converted by clamping, not scaling).
//!
//! EXIF orientation is not applied: the reference processor does not apply it either.

use std::io::Cursor;

use image::{DynamicImage, ImageDecoder, ImageFormat};

use crate::error::ImageError;
use crate::limits::DecodeLimits;
use crate::pixels::Rgb8;

/// Decodes `bytes` into RGB, within `limits`.
pub fn decode(bytes: &[u8], limits: &DecodeLimits) -> Result<Rgb8, ImageError> {
    if bytes.len() as u64 > limits.max_bytes {
        return Err(ImageError::TooManyBytes {
            size: bytes.len() as u64,
            limit: limits.max_bytes,
        });
    }
    let format = image::guess_format(bytes).map_err(|_| ImageError::UnsupportedFormat)?;
    if !matches!(
        format,
        ImageFormat::Png | ImageFormat::Jpeg | ImageFormat::WebP
    ) {
        return Err(ImageError::UnsupportedFormat);
    }
    let corrupt = |e: image::ImageError| ImageError::Corrupt(e.to_string());
    let mut reader = image::ImageReader::with_format(Cursor::new(bytes), format);
    let mut decoder_limits = image::Limits::default();
    // The largest buffer a decoder needs is the image at 16-bit RGBA (8 bytes a pixel); the
    // margin covers its row buffers and tables.
    decoder_limits.max_alloc = Some(limits.max_pixels.saturating_mul(8).saturating_add(1 << 24));
    reader.limits(decoder_limits);
    let decoder = reader.into_decoder().map_err(corrupt)?;
    let (width, height) = decoder.dimensions();
    if width == 0 || height == 0 {
        return Err(ImageError::Empty);
    }
    if u64::from(width) * u64::from(height) > limits.max_pixels {
        return Err(ImageError::TooManyPixels {
            width,
            height,
            limit: limits.max_pixels,
        });
    }
    let image = DynamicImage::from_decoder(decoder).map_err(corrupt)?;
    Ok(to_rgb(image))
}

/// `src` (with straight alpha `a`) over opaque white, as Pillow's `alpha_composite` computes
/// it: 7 extra fixed-point bits and rounded divisions by 255.
fn over_white(src: [u8; 3], a: u8) -> [u8; 3] {
    const BITS: u32 = 7;
    if a == 0 {
        return [255; 3];
    }
    let a = u32::from(a);
    let blend = 255 * (255 - a);
    let out_a255 = a * 255 + blend;
    let coef1 = a * 255 * 255 * (1 << BITS) / out_a255;
    let coef2 = 255 * (1 << BITS) - coef1;
    let div255 = |v: u32| ((v >> 8) + v) >> 8;
    src.map(|c| (div255(u32::from(c) * coef1 + 255 * coef2 + (0x80 << BITS)) >> BITS) as u8)
}

fn to_rgb(image: DynamicImage) -> Rgb8 {
    let (w, h) = (image.width() as usize, image.height() as usize);
    let data: Vec<u8> = match image {
        DynamicImage::ImageRgb8(buf) => buf.into_raw(),
        DynamicImage::ImageLuma8(buf) => buf.into_raw().into_iter().flat_map(|l| [l; 3]).collect(),
        DynamicImage::ImageRgba8(buf) => buf
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| over_white([p[0], p[1], p[2]], p[3]))
            .collect(),
        DynamicImage::ImageLumaA8(buf) => buf
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| over_white([p[0]; 3], p[1]))
            .collect(),
        DynamicImage::ImageRgb16(buf) => buf.into_raw().into_iter().map(high_byte).collect(),
        DynamicImage::ImageRgba16(buf) => buf
            .into_raw()
            .chunks_exact(4)
            .flat_map(|p| {
                over_white(
                    [high_byte(p[0]), high_byte(p[1]), high_byte(p[2])],
                    high_byte(p[3]),
                )
            })
            .collect(),
        DynamicImage::ImageLuma16(buf) => buf
            .into_raw()
            .into_iter()
            .flat_map(|l| [l.min(255) as u8; 3])
            .collect(),
        DynamicImage::ImageLumaA16(buf) => buf
            .into_raw()
            .chunks_exact(2)
            .flat_map(|p| over_white([high_byte(p[0]); 3], high_byte(p[1])))
            .collect(),
        // Float images come from none of the accepted formats' decoders.
        other => other.to_rgb8().into_raw(),
    };
    Rgb8::new(w, h, data)
}

fn high_byte(v: u16) -> u8 {
    (v >> 8) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(img: DynamicImage) -> Vec<u8> {
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, ImageFormat::Png).unwrap();
        out.into_inner()
    }

    #[test]
    fn compositing_matches_pillow_at_the_edges() {
        assert_eq!(over_white([0, 0, 0], 0), [255, 255, 255]);
        assert_eq!(over_white([0, 100, 200], 255), [0, 100, 200]);
        // Values Pillow 13 gives for these pixels over white.
        assert_eq!(over_white([0, 100, 200], 128), [127, 177, 227]);
        assert_eq!(over_white([0, 100, 200], 1), [254, 254, 255]);
        assert_eq!(over_white([0, 100, 200], 254), [1, 101, 200]);
        assert_eq!(over_white([0, 100, 200], 77), [178, 208, 238]);
    }

    #[test]
    fn grey_and_sixteen_bit_follow_pillow() {
        let grey = image::GrayImage::from_raw(2, 1, vec![7, 200]).unwrap();
        let rgb = decode(&png(grey.into()), &DecodeLimits::default()).unwrap();
        assert_eq!(rgb.data(), [7, 7, 7, 200, 200, 200]);

        let g16 =
            image::ImageBuffer::<image::Luma<u16>, _>::from_raw(3, 1, vec![200u16, 256, 65535])
                .unwrap();
        let rgb = decode(&png(g16.into()), &DecodeLimits::default()).unwrap();
        assert_eq!(rgb.data(), [200, 200, 200, 255, 255, 255, 255, 255, 255]);

        let rgb16 =
            image::ImageBuffer::<image::Rgb<u16>, _>::from_raw(1, 1, vec![0x03ff, 0xff00, 0x00ff])
                .unwrap();
        let rgb = decode(&png(rgb16.into()), &DecodeLimits::default()).unwrap();
        assert_eq!(rgb.data(), [3, 255, 0]);
    }

    #[test]
    fn limits_are_checked_before_decoding() {
        let img = image::RgbImage::from_pixel(40, 30, image::Rgb([1, 2, 3]));
        let bytes = png(img.into());
        let tight = DecodeLimits {
            max_bytes: 1 << 20,
            max_pixels: 1199,
        };
        assert_eq!(
            decode(&bytes, &tight),
            Err(ImageError::TooManyPixels {
                width: 40,
                height: 30,
                limit: 1199
            })
        );
        let exact = DecodeLimits {
            max_pixels: 1200,
            ..tight
        };
        assert_eq!(decode(&bytes, &exact).unwrap().width(), 40);
        let small = DecodeLimits {
            max_bytes: bytes.len() as u64 - 1,
            ..exact
        };
        assert!(matches!(
            decode(&bytes, &small),
            Err(ImageError::TooManyBytes { .. })
        ));
    }

    #[test]
    fn a_bomb_is_refused_from_its_header() {
        // A valid PNG header announcing 100000 x 100000 pixels, with no pixel data at all.
        let mut bytes = b"\x89PNG\r\n\x1a\n".to_vec();
        let mut ihdr = b"IHDR".to_vec();
        ihdr.extend(100_000u32.to_be_bytes());
        ihdr.extend(100_000u32.to_be_bytes());
        ihdr.extend([8, 2, 0, 0, 0]);
        bytes.extend(13u32.to_be_bytes());
        bytes.extend(&ihdr);
        bytes.extend(crc32(&ihdr).to_be_bytes());
        // One tiny IDAT (a zlib stream of nothing much) and the end: a few dozen bytes.
        let idat = b"IDAT\x78\x9c\x63\x00\x00\x00\x01\x00\x01";
        bytes.extend(((idat.len() - 4) as u32).to_be_bytes());
        bytes.extend(idat);
        bytes.extend(crc32(idat).to_be_bytes());
        bytes.extend(0u32.to_be_bytes());
        bytes.extend(b"IEND");
        bytes.extend(crc32(b"IEND").to_be_bytes());
        assert!(bytes.len() < 100);
        let err = decode(&bytes, &DecodeLimits::default()).unwrap_err();
        assert!(
            matches!(err, ImageError::TooManyPixels { width: 100_000, .. }),
            "{err}"
        );
    }

    #[test]
    fn other_formats_and_garbage_are_refused() {
        let limits = DecodeLimits::default();
        assert_eq!(
            decode(b"GIF89a....", &limits),
            Err(ImageError::UnsupportedFormat)
        );
        assert_eq!(
            decode(b"hello", &limits),
            Err(ImageError::UnsupportedFormat)
        );
        assert_eq!(decode(b"", &limits), Err(ImageError::UnsupportedFormat));
        // A PNG signature followed by nonsense.
        let err = decode(b"\x89PNG\r\n\x1a\nnonsense-here", &limits).unwrap_err();
        assert!(matches!(err, ImageError::Corrupt(_)), "{err}");
        // A JPEG cut short.
        let mut jpeg = Cursor::new(Vec::new());
        DynamicImage::from(image::RgbImage::from_pixel(16, 16, image::Rgb([9, 9, 9])))
            .write_to(&mut jpeg, ImageFormat::Jpeg)
            .unwrap();
        let jpeg = jpeg.into_inner();
        let err = decode(&jpeg[..jpeg.len() / 3], &limits).unwrap_err();
        assert!(matches!(err, ImageError::Corrupt(_)), "{err}");
    }

    fn crc32(data: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in data {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 != 0 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }
}
