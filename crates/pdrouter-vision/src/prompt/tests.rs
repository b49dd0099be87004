use serde_json::json;

use super::*;

fn image(url: &str) -> Value {
    json!({"type": "image_url", "image_url": {"url": url}})
}

fn text(t: &str) -> Value {
    json!({"type": "text", "text": t})
}

fn path(message: usize, part: usize) -> PartPath {
    PartPath {
        message,
        part: Some(part),
    }
}

/// One id per byte: every expected id is readable.
fn bytes(s: &str) -> Result<Vec<u32>, String> {
    Ok(s.bytes().map(u32::from).collect())
}

#[test]
fn image_parts_are_found_in_prompt_order_with_their_paths() {
    let messages = json!([
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [text("a"), image("data:x"), {"type": "image_url", "image_url": "https://h/b.png"}]},
        {"role": "assistant", "content": "ok"},
        {"role": "user", "content": [image("https://h/c.png")]},
    ]);
    let found = image_parts(&messages).unwrap();
    let got: Vec<(String, &str)> = found.iter().map(|p| (p.path.to_string(), p.url)).collect();
    assert_eq!(
        got,
        [
            ("messages[1].content[1]".to_string(), "data:x"),
            ("messages[1].content[2]".to_string(), "https://h/b.png"),
            ("messages[3].content[0]".to_string(), "https://h/c.png"),
        ]
    );
    assert!(image_parts(&json!("not a list")).unwrap().is_empty());
    assert!(
        image_parts(&json!([{"role": "user", "content": "hi"}]))
            .unwrap()
            .is_empty()
    );
}

#[test]
fn at_most_ten_images_and_each_needs_a_url() {
    let ten: Vec<Value> = (0..10).map(|i| image(&format!("data:{i}"))).collect();
    assert_eq!(image_parts(&json!([{"content": ten}])).unwrap().len(), 10);
    let eleven = json!([{"content": ten}, {"content": [image("data:x")]}]);
    assert_eq!(
        image_parts(&eleven),
        Err(PromptError::TooManyImages { count: 11, max: 10 })
    );
    let no_url = json!([{"content": [text("x")]}, {"content": [text("y"), {"type": "image_url", "image_url": {"detail": "low"}}]}]);
    let err = image_parts(&no_url).unwrap_err();
    assert_eq!(
        err,
        PromptError::BadPart {
            part: path(1, 1),
            what: "needs 'image_url': {\"url\": \"...\"}".into()
        }
    );
    assert!(
        err.to_string().starts_with("messages[1].content[1] needs"),
        "{err}"
    );
}

#[test]
fn flattening_puts_anchors_before_text_joined_by_newlines() {
    let messages = json!([
        {"role": "system", "content": "sys"},
        {"role": "user", "name": "u", "content": [text("What is this?"), image("data:a"), text("And that?"), image("data:b")]},
        {"role": "user", "content": [text("only text")]},
    ]);
    let flat = flatten_content(&messages).unwrap();
    assert_eq!(flat[0], messages[0]);
    assert_eq!(flat[1]["name"], "u");
    assert_eq!(
        flat[1]["content"],
        format!("{MARKER}\n{MARKER}\nWhat is this?\nAnd that?")
    );
    assert_eq!(flat[2]["content"], "only text");
}

#[test]
fn flattening_refuses_parts_it_cannot_place() {
    let audio = json!([{"content": [text("x"), {"type": "input_audio", "input_audio": {}}]}]);
    assert_eq!(
        flatten_content(&audio),
        Err(PromptError::BadPart {
            part: path(0, 1),
            what: "has type 'input_audio'; only 'text' and 'image_url' are supported".into()
        })
    );
    let untyped = json!([{"content": [{"text": "x"}]}]);
    assert!(matches!(
        flatten_content(&untyped),
        Err(PromptError::BadPart { .. })
    ));
    let not_text = json!([{"content": [{"type": "text", "text": 5}]}]);
    assert!(matches!(
        flatten_content(&not_text),
        Err(PromptError::BadPart { .. })
    ));
    let reserved = json!([{"content": "a\u{F8FF}b"}]);
    assert_eq!(
        flatten_content(&reserved),
        Err(PromptError::ReservedText {
            part: PartPath {
                message: 0,
                part: None
            }
        })
    );
    let reserved_part = json!([{"content": [text("\u{F8FF}")]}]);
    assert!(matches!(
        flatten_content(&reserved_part),
        Err(PromptError::ReservedText { .. })
    ));
}

#[test]
fn marked_prompts_expand_each_anchor_into_its_run() {
    const IMG: u32 = 1000;
    let rendered = format!("<u>{MARKER}\n{MARKER}\nhi <image></u>");
    let out = expand_marked(&rendered, &[3, 2], IMG, bytes).unwrap();
    let mut want = bytes("<u>").unwrap();
    want.extend([IMG; 3]);
    want.extend(bytes("\n").unwrap());
    want.extend([IMG; 2]);
    // The client's literal "<image>" is text, not an image.
    want.extend(bytes("\nhi <image></u>").unwrap());
    assert_eq!(out.ids, want);
    assert_eq!(
        out.placeholders,
        [
            Placeholder {
                offset: 3,
                length: 3
            },
            Placeholder {
                offset: 7,
                length: 2
            }
        ]
    );
    assert_eq!(out.text, "<u><image>\n<image>\nhi <image></u>");
    for p in &out.placeholders {
        assert!(
            out.ids[p.offset..p.offset + p.length]
                .iter()
                .all(|&id| id == IMG)
        );
    }
}

#[test]
fn marked_prompts_must_hold_every_image_once() {
    let one = format!("a{MARKER}b");
    assert_eq!(
        expand_marked(&one, &[4, 4], 1000, bytes),
        Err(ExpandError::Prompt(PromptError::TemplateMismatch {
            found: 1,
            expected: 2
        }))
    );
    assert_eq!(
        expand_marked("no images", &[4], 1000, bytes),
        Err(ExpandError::Prompt(PromptError::TemplateMismatch {
            found: 0,
            expected: 1
        }))
    );
    // Text that encodes to the image token would forge a placeholder.
    assert_eq!(
        expand_marked(&one, &[4], u32::from(b'b'), bytes),
        Err(ExpandError::Prompt(PromptError::PlaceholderInText))
    );
    let failing = |_: &str| -> Result<Vec<u32>, String> { Err("no".into()) };
    assert_eq!(
        expand_marked(&one, &[4], 1000, failing),
        Err(ExpandError::Encode("no".to_string()))
    );
    // No images: the prompt is encoded whole.
    let plain = expand_marked("plain", &[], 1000, bytes).unwrap();
    assert_eq!(plain.ids, bytes("plain").unwrap());
    assert!(plain.placeholders.is_empty());
}

#[test]
fn template_placed_images_widen_in_place() {
    let out = expand_ids("t".into(), &[1, 9, 2, 9, 3], &[2, 3], 9).unwrap();
    assert_eq!(out.ids, [1, 9, 9, 2, 9, 9, 9, 3]);
    assert_eq!(
        out.placeholders,
        [
            Placeholder {
                offset: 1,
                length: 2
            },
            Placeholder {
                offset: 4,
                length: 3
            }
        ]
    );
    assert_eq!(
        expand_ids("t".into(), &[1, 9, 9], &[2], 9),
        Err(PromptError::TemplateMismatch {
            found: 2,
            expected: 1
        })
    );
    assert_eq!(
        expand_ids("t".into(), &[1, 2], &[2], 9),
        Err(PromptError::TemplateMismatch {
            found: 0,
            expected: 1
        })
    );
}
