//! Where an `image_url` part's bytes come from: a `data:` URL carries them (base64), an
//! `http://`/`https://` URL names them for the caller to fetch (this crate does no I/O).
//!
//! A data URL must declare an accepted image media type and `;base64`; its payload is
//! checked against the byte limit before it is decoded, so an oversized one costs no
//! allocation. Line breaks and spaces inside the payload are tolerated (some clients wrap it);
//! padding is optional.

use base64::Engine as _;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};

use crate::error::ImageError;

/// Media types a data URL may declare (lower case; `image/jpg` is a common misspelling).
pub const ACCEPTED_MEDIA_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/jpg", "image/webp"];

/// An image's origin.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageSource<'a> {
    /// The bytes, decoded from a `data:` URL.
    Inline(Vec<u8>),
    /// An `http://` or `https://` URL, as given.
    Remote(&'a str),
}

const BASE64: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    GeneralPurposeConfig::new().with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

fn has_prefix(s: &str, prefix: &str) -> bool {
    s.len() >= prefix.len() && s.as_bytes()[..prefix.len()].eq_ignore_ascii_case(prefix.as_bytes())
}

/// Classifies `url`, decoding a data URL's payload (at most `max_bytes` bytes).
pub fn parse(url: &str, max_bytes: u64) -> Result<ImageSource<'_>, ImageError> {
    let url = url.trim();
    if has_prefix(url, "http://") || has_prefix(url, "https://") {
        return Ok(ImageSource::Remote(url));
    }
    if !has_prefix(url, "data:") {
        return Err(ImageError::UnsupportedUrl);
    }
    let (header, payload) = url[5..].split_once(',').ok_or(ImageError::NotBase64)?;
    let mut params = header.split(';').map(str::trim);
    let media_type = params.next().unwrap_or_default().to_ascii_lowercase();
    let base64 = params.any(|p| p.eq_ignore_ascii_case("base64"));
    if !ACCEPTED_MEDIA_TYPES.contains(&media_type.as_str()) {
        let shown = if media_type.is_empty() {
            "(none)".to_string()
        } else {
            media_type.chars().take(64).collect()
        };
        return Err(ImageError::MediaType(shown));
    }
    if !base64 {
        return Err(ImageError::NotBase64);
    }
    // Four base64 characters carry three bytes: refuse before decoding what cannot fit.
    let significant = payload
        .bytes()
        .filter(|b| !b.is_ascii_whitespace() && *b != b'=')
        .count() as u64;
    let at_least = significant * 3 / 4;
    if at_least > max_bytes {
        return Err(ImageError::TooManyBytes {
            size: at_least,
            limit: max_bytes,
        });
    }
    let bytes = if payload.bytes().any(|b| b.is_ascii_whitespace()) {
        let compact: Vec<u8> = payload
            .bytes()
            .filter(|b| !b.is_ascii_whitespace())
            .collect();
        BASE64.decode(compact)
    } else {
        BASE64.decode(payload)
    }
    .map_err(|e| ImageError::Base64(e.to_string()))?;
    Ok(ImageSource::Inline(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_urls_decode_and_remote_urls_pass_through() {
        assert_eq!(
            parse("data:image/png;base64,aGVsbG8=", 100),
            Ok(ImageSource::Inline(b"hello".to_vec()))
        );
        // Case, parameters, missing padding and wrapped lines are all accepted.
        assert_eq!(
            parse("DATA:Image/JPEG;name=x.jpg;BASE64,aGVs\r\nbG8", 100),
            Ok(ImageSource::Inline(b"hello".to_vec()))
        );
        assert_eq!(
            parse(" https://example.com/a.png ", 100),
            Ok(ImageSource::Remote("https://example.com/a.png"))
        );
        assert_eq!(
            parse("HTTP://example.com/a.png", 100),
            Ok(ImageSource::Remote("HTTP://example.com/a.png"))
        );
    }

    #[test]
    fn bad_data_urls_say_what_is_wrong() {
        assert_eq!(parse("ftp://x/y.png", 9), Err(ImageError::UnsupportedUrl));
        assert_eq!(
            parse("file:///etc/passwd", 9),
            Err(ImageError::UnsupportedUrl)
        );
        assert_eq!(parse("/a/b.png", 9), Err(ImageError::UnsupportedUrl));
        assert_eq!(
            parse("data:text/plain;base64,aGVsbG8=", 9),
            Err(ImageError::MediaType("text/plain".into()))
        );
        assert_eq!(
            parse("data:;base64,aGVsbG8=", 9),
            Err(ImageError::MediaType("(none)".into()))
        );
        assert_eq!(
            parse("data:image/png,rawbytes", 9),
            Err(ImageError::NotBase64)
        );
        assert_eq!(
            parse("data:image/png;base64", 9),
            Err(ImageError::NotBase64)
        );
        assert!(matches!(
            parse("data:image/png;base64,a$b%", 9),
            Err(ImageError::Base64(_))
        ));
    }

    #[test]
    fn the_byte_limit_holds_before_and_after_decoding() {
        // 8 characters carry 6 bytes.
        assert!(parse("data:image/webp;base64,AAAAAAAA", 6).is_ok());
        assert_eq!(
            parse("data:image/webp;base64,AAAAAAAA", 5),
            Err(ImageError::TooManyBytes { size: 6, limit: 5 })
        );
        // A huge payload is refused without decoding it.
        let huge = format!("data:image/png;base64,{}", "A".repeat(4_000_000));
        assert!(matches!(
            parse(&huge, 1 << 20),
            Err(ImageError::TooManyBytes {
                size: 3_000_000,
                ..
            })
        ));
    }
}
