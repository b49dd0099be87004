//! `ImageInputs` end to end below HTTP: data URLs and a loopback image server in, items and
//! 400s naming the part out; prompts for both kinds of chat template.

use std::io::Cursor;

use base64::Engine as _;
use pdrouter_tokenizer::bytelevel;
use pdrouter_vision::image::{self, ImageFormat};
use pdrouter_vision::{IMAGE_ANCHOR, Placeholder};
use serde_json::json;

use super::*;

/// A bytelevel tokenizer directory dressed as a Qwen2-VL model whose image token (the one a
/// template writes) is `<image>` and whose anchor token (the router's runs) is [`ANCHOR`].
const ANCHOR: u32 = 1;

fn model_dir(template: Option<&str>) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    for (name, data) in bytelevel::files() {
        std::fs::write(dir.path().join(name), data).unwrap();
    }
    let config = json!({"model_type": "qwen2_vl", "image_token_id": bytelevel::IMAGE,
                        "vision_token_id": ANCHOR, "vocab_size": bytelevel::VOCAB_SIZE});
    std::fs::write(dir.path().join("config.json"), config.to_string()).unwrap();
    if let Some(t) = template {
        std::fs::write(dir.path().join("string.jinja"), t).unwrap();
    }
    dir
}

fn png(width: u32, height: u32) -> Vec<u8> {
    let img = image::RgbImage::from_fn(width, height, |x, y| image::Rgb([x as u8, y as u8, 90]));
    let mut out = Cursor::new(Vec::new());
    img.write_to(&mut out, ImageFormat::Png).unwrap();
    out.into_inner()
}

fn data_url(bytes: &[u8]) -> String {
    format!(
        "data:image/png;base64,{}",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

fn image_part(url: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": url}})
}

fn inputs(config: ImageConfig) -> (ImageInputs, tempfile::TempDir) {
    let dir = model_dir(None);
    let inputs = ImageInputs::load(&config, dir.path()).unwrap().unwrap();
    (inputs, dir)
}

/// Serves `body` as an image on loopback for every request (while the server lives).
async fn image_server(body: Vec<u8>) -> pdrouter_mock::FileServer {
    pdrouter_mock::FileServer::start(body, "image/png")
        .await
        .unwrap()
}

#[tokio::test]
async fn data_and_remote_images_become_items_in_prompt_order() {
    let server = image_server(png(200, 150)).await;
    let remote = server.url("/cat.png");
    let (inputs, _dir) = inputs(ImageConfig {
        allow_private_urls: true,
        ..ImageConfig::default()
    });
    let messages = json!([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [
            {"type": "text", "text": "compare"},
            image_part(&data_url(&png(60, 40))),
            image_part(&remote),
        ]},
    ]);
    let items = inputs.prepare(&messages).await.unwrap();
    assert_eq!(items.len(), 2);
    assert_eq!(items[0].part.to_string(), "messages[1].content[1]");
    assert_eq!(items[1].part.to_string(), "messages[1].content[2]");
    // 60x40 is below min_pixels: scaled up to 84x56, 6x4 patches, 6 placeholders.
    assert_eq!(items[0].image.grid_thw, [1, 4, 6]);
    assert_eq!(items[0].image.placeholders, 6);
    assert_eq!(items[0].image.dtype, PixelDtype::Bf16);
    assert_eq!(items[0].image.pixel_values.len(), 24 * 1176 * 2);
    // 200x150 rounds to 196x140: 10x14 patches.
    assert_eq!(items[1].image.grid_thw, [1, 10, 14]);
    assert_eq!(items[1].image.placeholders, 35);
    // The same picture by another route is the same item.
    let again = json!([{"role": "user", "content": [image_part(&data_url(&png(200, 150)))]}]);
    let same = inputs.prepare(&again).await.unwrap();
    assert_eq!(same[0].image.hash, items[1].image.hash);
    assert_ne!(items[0].image.hash, items[1].image.hash);
}

async fn refused(inputs: &ImageInputs, url: &str) -> ApiError {
    let messages = json!([
        {"role": "user", "content": "first"},
        {"role": "user", "content": [{"type": "text", "text": "x"}, image_part(&data_url(&png(30, 30))), image_part(url)]},
    ]);
    let err = inputs.prepare(&messages).await.unwrap_err();
    assert_eq!(err.status, http::StatusCode::BAD_REQUEST, "{err:?}");
    assert!(
        err.message.starts_with("messages[1].content[2]: "),
        "{}",
        err.message
    );
    err
}

#[tokio::test]
async fn unusable_images_are_400s_naming_the_part() {
    let (inputs, _dir) = inputs(ImageConfig::default());
    let cases = [
        (
            "data:image/png;base64,@@@@".to_string(),
            "invalid_image_url",
        ),
        (
            "data:text/plain;base64,aGk=".to_string(),
            "invalid_image_url",
        ),
        ("ftp://example.com/a.png".to_string(), "invalid_image_url"),
        (data_url(b"GIF89a not supported"), "invalid_image"),
        (data_url(&png(30, 30)[..40]), "invalid_image"),
        (data_url(&png(1, 250)), "invalid_image"),
        // Loopback is refused without --allow-private-image-urls.
        ("http://127.0.0.1:9/a.png".to_string(), "image_url_refused"),
        ("http://localhost:9/a.png".to_string(), "image_url_refused"),
    ];
    for (url, code) in cases {
        let err = refused(&inputs, &url).await;
        assert_eq!(err.code, code, "{url:.60}: {}", err.message);
    }
}

#[tokio::test]
async fn byte_and_pixel_limits_come_from_the_flags() {
    let picture = png(64, 64);
    let (small_bytes, _d1) = inputs(ImageConfig {
        max_bytes: picture.len() as u64 - 1,
        ..ImageConfig::default()
    });
    let err = refused(&small_bytes, &data_url(&picture)).await;
    assert_eq!(err.code, "image_too_large");
    assert!(err.message.contains("--max-image-bytes"), "{}", err.message);

    let server = image_server(picture.clone()).await;
    let remote = server.url("/cat.png");
    let (small_fetch, _d2) = inputs(ImageConfig {
        max_bytes: picture.len() as u64 - 1,
        allow_private_urls: true,
        ..ImageConfig::default()
    });
    let err = refused(&small_fetch, &remote).await;
    assert_eq!(err.code, "image_too_large");
    assert!(err.message.contains("--max-image-bytes"), "{}", err.message);

    let (few_pixels, _d3) = inputs(ImageConfig {
        max_pixels: 64 * 64 - 1,
        ..ImageConfig::default()
    });
    let err = refused(&few_pixels, &data_url(&picture)).await;
    assert_eq!(err.code, "image_too_large");
    assert!(
        err.message.contains("--max-image-pixels"),
        "{}",
        err.message
    );
    let (enough, _d4) = inputs(ImageConfig {
        max_pixels: 64 * 64,
        ..ImageConfig::default()
    });
    let ok = json!([{"role": "user", "content": [image_part(&data_url(&picture))]}]);
    assert_eq!(enough.prepare(&ok).await.unwrap().len(), 1);
}

#[tokio::test]
async fn more_than_ten_images_is_a_400() {
    let (inputs, _dir) = inputs(ImageConfig::default());
    let url = data_url(&png(8, 8));
    let parts: Vec<Value> = (0..11).map(|_| image_part(&url)).collect();
    let err = inputs
        .prepare(&json!([{"role": "user", "content": parts}]))
        .await
        .unwrap_err();
    assert_eq!(err.status, http::StatusCode::BAD_REQUEST);
    assert_eq!(err.code, "too_many_images");
    assert!(err.message.contains("11 images"), "{}", err.message);
    let ten: Vec<Value> = (0..10).map(|_| image_part(&url)).collect();
    let items = inputs
        .prepare(&json!([{"role": "user", "content": ten}]))
        .await
        .unwrap();
    assert_eq!(items.len(), 10);
}

fn runs(ids: &[u32], token: u32) -> Vec<Placeholder> {
    let mut out: Vec<Placeholder> = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        if id != token {
            continue;
        }
        match out.last_mut() {
            Some(p) if p.offset + p.length == i => p.length += 1,
            _ => out.push(Placeholder {
                offset: i,
                length: 1,
            }),
        }
    }
    out
}

/// The model directory, its tokenizer (with `template` instead of its own, when given) and
/// image inputs; the template must take content as `format`.
fn prompt_setup(
    template: Option<&str>,
    format: ContentFormat,
) -> (tempfile::TempDir, Tokenizer, ImageInputs) {
    let dir = model_dir(template);
    let file = template.map(|_| dir.path().join("string.jinja"));
    let tokenizer = Tokenizer::load(dir.path(), file.as_deref()).unwrap();
    assert_eq!(tokenizer.chat_template().unwrap().content_format(), format);
    let inputs = ImageInputs::load(&ImageConfig::default(), dir.path())
        .unwrap()
        .unwrap();
    (dir, tokenizer, inputs)
}

/// The request's images prepared, and its prompt with them in place.
async fn prompt_for(
    tokenizer: &Tokenizer,
    inputs: &ImageInputs,
    messages: &Value,
) -> (Vec<ImageItem>, ExpandedPrompt) {
    let items = inputs.prepare(messages).await.unwrap();
    let out = inputs
        .chat_prompt(tokenizer, messages, None, &Default::default(), &items)
        .unwrap()
        .0;
    (items, out)
}

#[tokio::test]
async fn a_content_part_template_places_images_itself() {
    let (_dir, tokenizer, inputs) = prompt_setup(None, ContentFormat::OpenAi);
    let messages = json!([{"role": "user", "content": [
        {"type": "text", "text": "a"}, image_part(&data_url(&png(60, 40))),
        {"type": "text", "text": "b"}, image_part(&data_url(&png(200, 150))),
    ]}]);
    let (_, out) = prompt_for(&tokenizer, &inputs, &messages).await;
    assert_eq!(
        out.text,
        "<|im_start|>user\na<image>b<image><|im_end|>\n<|im_start|>assistant\n"
    );
    assert_eq!(runs(&out.ids, bytelevel::IMAGE), out.placeholders);
    let lengths: Vec<usize> = out.placeholders.iter().map(|p| p.length).collect();
    assert_eq!(lengths, [6, 35]);
    // Everything else is the text's own encoding, in place.
    let mut rest = out.ids.clone();
    rest.dedup_by(|a, b| *a == bytelevel::IMAGE && a == b);
    assert_eq!(rest, tokenizer.encode(&out.text).unwrap());
}

#[tokio::test]
async fn a_string_template_gets_anchors_before_the_text() {
    let template = r"{%- for m in messages -%}
{{ '<|im_start|>' ~ m.role ~ '\n' ~ m.content ~ '<|im_end|>\n' }}
{%- endfor -%}
{{ '<|im_start|>assistant\n' }}";
    let (_dir, tokenizer, inputs) = prompt_setup(Some(template), ContentFormat::String);
    let messages = json!([{"role": "user", "content": [
        {"type": "text", "text": "what is this?"}, image_part(&data_url(&png(60, 40))),
    ]}]);
    let (items, out) = prompt_for(&tokenizer, &inputs, &messages).await;
    assert_eq!(
        out.text,
        format!(
            "<|im_start|>user\n{IMAGE_ANCHOR}\nwhat is this?<|im_end|>\n<|im_start|>assistant\n"
        )
    );
    // One run for the one image, after the turn's opening.
    assert_eq!(
        out.placeholders,
        [Placeholder {
            offset: tokenizer.encode("<|im_start|>user\n").unwrap().len(),
            length: 6
        }]
    );
    assert_eq!(runs(&out.ids, ANCHOR), out.placeholders);
    let tail = &out.ids[out.placeholders[0].offset + 6..];
    assert_eq!(
        tail,
        bytelevel::encode_plain("\nwhat is this?")
            .into_iter()
            .chain(
                tokenizer
                    .encode("<|im_end|>\n<|im_start|>assistant\n")
                    .unwrap()
            )
            .collect::<Vec<_>>()
    );
    // Client text that encodes to the image token would forge a placeholder: refused.
    let forged = json!([{"role": "user", "content": [
        {"type": "text", "text": "see <image>"}, image_part(&data_url(&png(60, 40))),
    ]}]);
    let err = inputs
        .chat_prompt(&tokenizer, &forged, None, &Default::default(), &items)
        .unwrap_err();
    assert_eq!(err.status, http::StatusCode::BAD_REQUEST);
    assert!(err.message.contains("placeholder token"), "{}", err.message);
    // So is text that encodes to the anchor token.
    let forged = json!([{"role": "user", "content": [
        {"type": "text", "text": "see \u{1}"}, image_part(&data_url(&png(60, 40))),
    ]}]);
    let err = inputs
        .chat_prompt(&tokenizer, &forged, None, &Default::default(), &items)
        .unwrap_err();
    assert!(err.message.contains("placeholder token"), "{}", err.message);
    // A part the template cannot show is refused, naming it.
    let audio = json!([{"role": "user", "content": [{"type": "input_audio"}]}]);
    let err = inputs
        .chat_prompt(&tokenizer, &audio, None, &Default::default(), &[])
        .unwrap_err();
    assert!(
        err.message.starts_with("messages[0].content[0] "),
        "{}",
        err.message
    );
}

#[test]
fn an_image_error_names_its_part_then_the_error_then_the_flag() {
    let part = PartPath {
        message: 1,
        part: Some(2),
    };
    let err =
        ImageInputError::from(ImageError::TooManyBytes { size: 9, limit: 8 }).into_api_error(part);
    assert_eq!((err.status.as_u16(), err.code), (400, "image_too_large"));
    assert_eq!(
        err.message,
        "messages[1].content[2]: image is 9 bytes or more, over the 8-byte limit \
         (--max-image-bytes)"
    );
    let err = ImageInputError::from(FetchError::Credentials).into_api_error(part);
    assert_eq!(err.code, "image_url_refused");
    assert!(
        err.message.starts_with("messages[1].content[2]: "),
        "{}",
        err.message
    );
}
