use std::path::Path;

use serde_json::json;

use super::*;
use crate::bytelevel;

fn compile(source: &str) -> ChatTemplate {
    let special = vec![
        ("bos_token", "<s>".to_owned()),
        ("eos_token", "</s>".to_owned()),
    ];
    ChatTemplate::compile(source.to_owned(), special, Path::new("test.jinja")).unwrap()
}

fn render(source: &str, messages: serde_json::Value) -> Result<String, TemplateError> {
    compile(source).render(&ChatInput {
        messages: TemplateValue::from_serialize(&messages),
        ..ChatInput::default()
    })
}

fn ok(source: &str, messages: serde_json::Value) -> String {
    render(source, messages).unwrap()
}

#[test]
fn tojson_writes_python_json_dumps_output() {
    let value = json!({"b": [1, 2.5, 1.0, true, null], "a": "é\"\n<>&", "c": {}});
    let msgs = json!([value]);
    // Keys in the order the client wrote them, as Python's json.dumps keeps a dict's.
    assert_eq!(
        ok("{{ messages[0] | tojson }}", msgs.clone()),
        r#"{"b": [1, 2.5, 1.0, true, null], "a": "é\"\n<>&", "c": {}}"#
    );
    assert_eq!(
        ok("{{ messages[0].b | tojson(indent=2) }}", msgs.clone()),
        "[\n  1,\n  2.5,\n  1.0,\n  true,\n  null\n]"
    );
    assert_eq!(
        ok(
            "{{ messages[0].a | tojson(ensure_ascii=true) }}",
            msgs.clone()
        ),
        r#""\u00e9\"\n<>&""#
    );
    assert_eq!(
        ok(
            "{{ messages[0] | tojson(separators=(',', ':'), sort_keys=true) }}",
            msgs.clone()
        ),
        r#"{"a":"é\"\n<>&","b":[1,2.5,1.0,true,null],"c":{}}"#
    );
    assert_eq!(
        ok("{{ '🦀' | tojson(true) }}", msgs.clone()),
        r#""\ud83e\udd80""#
    );
    assert_eq!(
        ok("{{ 1e20 | tojson }} {{ 0.00001 | tojson }}", msgs),
        "1e+20 1e-05"
    );
}

#[test]
fn raise_exception_carries_its_message() {
    let src = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}ok";
    let err = render(src, json!([{"role": "assistant", "content": "x"}])).unwrap_err();
    match err {
        TemplateError::Raised { message } => {
            assert_eq!(
                message,
                "Conversation roles must alternate user/assistant/user/assistant/..."
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(ok(src, json!([{"role": "user", "content": "x"}])), "ok");
    // Other failures are rendering errors, not raised ones.
    let err = render("{{ messages[0].content + 1 }}", json!([{"content": "x"}])).unwrap_err();
    assert!(matches!(err, TemplateError::Render { .. }), "{err:?}");
}

#[test]
fn python_methods_loop_controls_and_whitespace_settings() {
    let msgs = json!([{"role": "user", "content": "  <think>a</think>\nHello World  "}]);
    let src = "{{ messages[0].content.strip().split('</think>')[-1].lstrip('\\n').upper() }}|\
               {{ messages[0].content.startswith('  <') }}|{{ 'x,y'.replace(',', ';') }}|\
               {% for k, v in messages[0].items() %}{{ k }}={{ v | length }};{% endfor %}|\
               {{ messages[0].get('missing', 'dflt') }}|{{ 'hello world'.title() }}";
    assert_eq!(
        ok(src, msgs),
        "HELLO WORLD|True|x;y|role=4;content=32;|dflt|Hello World"
    );
    let src = "{% for i in [1, 2, 3, 4] %}{% if i == 2 %}{% continue %}{% endif %}{% if i == 4 %}{% break %}{% endif %}{{ i }}{% endfor %}";
    assert_eq!(ok(src, json!([])), "13");
    // trim_blocks drops the newline after a block tag, lstrip_blocks the indent before one.
    let src =
        "{% for m in messages %}\n    {% if true %}\n[{{ m.role }}]\n    {% endif %}\n{% endfor %}";
    assert_eq!(ok(src, json!([{"role": "a"}, {"role": "b"}])), "[a]\n[b]\n");
    let src = "{% set ns = namespace(n=0) %}{% for m in messages[::-1] %}{% set ns.n = ns.n + 1 %}{{ m.role }}{% endfor %}{{ ns.n }}";
    assert_eq!(ok(src, json!([{"role": "a"}, {"role": "b"}])), "ba2");
}

#[test]
fn special_tokens_and_arguments_are_variables() {
    let t = compile(
        "{{ bos_token }}{{ messages[0].content }}{{ eos_token }}{{ pad_token is defined }}{{ tools is none }}{{ flag }}",
    );
    let input = ChatInput {
        messages: TemplateValue::from_serialize(&json!([{"role": "user", "content": "x"}])),
        kwargs: vec![("flag".into(), TemplateValue::from_serialize(&7))],
        ..ChatInput::default()
    };
    assert_eq!(t.render(&input).unwrap(), "<s>x</s>FalseTrue7");
    let reserved = ChatInput {
        kwargs: vec![("messages".into(), TemplateValue::default())],
        ..ChatInput::default()
    };
    assert!(matches!(
        t.render(&reserved),
        Err(TemplateError::ReservedArgument { name }) if name == "messages"
    ));
}

#[test]
fn arguments_override_special_tokens_and_the_last_repeat_wins() {
    let t = compile(
        "{{ bos_token }}|{{ eos_token }}|{{ flag }}|{{ add_generation_prompt }}|{{ documents is none }}|{{ unset is defined }}",
    );
    let input = ChatInput {
        add_generation_prompt: true,
        kwargs: vec![
            ("eos_token".into(), TemplateValue::from_serialize("<end>")),
            ("flag".into(), TemplateValue::from_serialize(&1)),
            ("flag".into(), TemplateValue::from_serialize(&2)),
        ],
        ..ChatInput::default()
    };
    assert_eq!(t.render(&input).unwrap(), "<s>|<end>|2|True|True|False");
    // The same with more arguments than are scanned: looked up through a map.
    let mut many = input.kwargs.clone();
    many.extend(
        (0..2 * SCANNED_ARGUMENTS).map(|i| (format!("x{i}"), TemplateValue::from_serialize(&i))),
    );
    many.push(("flag".into(), TemplateValue::from_serialize(&3)));
    let input = ChatInput {
        kwargs: many,
        ..input
    };
    assert_eq!(t.render(&input).unwrap(), "<s>|<end>|3|True|True|False");
    let names = compile("{{ x0 }},{{ x31 }},{{ x32 is defined }}")
        .render(&input)
        .unwrap();
    assert_eq!(names, "0,31,False");
    // Every reserved name is refused, wherever it comes among the arguments.
    for name in RESERVED {
        let input = ChatInput {
            kwargs: vec![
                ("flag".into(), TemplateValue::from_serialize(&1)),
                (name.into(), TemplateValue::from_serialize(&1)),
            ],
            ..ChatInput::default()
        };
        assert!(matches!(
            t.render(&input),
            Err(TemplateError::ReservedArgument { name: n }) if n == name
        ));
    }
}

#[test]
fn strftime_formats_utc_dates() {
    // 2024-02-29 13:05:09 UTC, a Thursday, day 60 of a leap year.
    let t = 1_709_211_909;
    assert_eq!(strftime("%d %b %Y", t).unwrap(), "29 Feb 2024");
    assert_eq!(
        strftime("%A %B %e %j %H:%M:%S %I%p %y %F %%", t).unwrap(),
        "Thursday February 29 060 13:05:09 01PM 24 2024-02-29 %"
    );
    assert_eq!(strftime("%Y-%m-%d %a", 0).unwrap(), "1970-01-01 Thu");
    assert!(strftime("%Q", t).is_err());
    let year = compile("{{ strftime_now('%Y') }}")
        .render(&ChatInput::default())
        .unwrap();
    assert!(year.parse::<u32>().unwrap() >= 2024);
}

#[test]
fn content_format_is_probed_at_compile_time() {
    let parts = compile(bytelevel::CHAT_TEMPLATE);
    assert_eq!(parts.content_format(), ContentFormat::OpenAi);
    let strings = compile("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}");
    assert_eq!(strings.content_format(), ContentFormat::String);
    let concat = compile("{% for m in messages %}{{ m.role + ': ' + m.content }}{% endfor %}");
    assert_eq!(concat.content_format(), ContentFormat::String);
}

#[test]
fn bytelevel_template_renders_parts_tool_calls_and_refuses_unknown_roles() {
    let t = compile(bytelevel::CHAT_TEMPLATE);
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Look: "}, {"type": "image_url", "image_url": {"url": "x"}}]},
        {"role": "assistant", "content": null, "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]},
        {"role": "tool", "tool_call_id": "1", "content": "42"}
    ]);
    let input = ChatInput {
        messages: TemplateValue::from_serialize(&messages),
        tools: Some(TemplateValue::from_serialize(&json!([{"name": "f"}]))),
        add_generation_prompt: true,
        ..ChatInput::default()
    };
    assert_eq!(
        t.render(&input).unwrap(),
        "<|im_start|>system\nBe brief.\n\nTools you may call, one JSON object per line:\n<tools>\n\
         {\"name\": \"f\"}\n</tools>\nTo call one, answer <tool_call>{\"name\": ..., \"arguments\": \
         {...}}</tool_call>.<|im_end|>\n<|im_start|>user\nLook: <image><|im_end|>\n\
         <|im_start|>assistant\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n\
         </tool_call><|im_end|>\n<|im_start|>tool\n42<|im_end|>\n<|im_start|>assistant\n"
    );
    let bad = ChatInput {
        messages: TemplateValue::from_serialize(&json!([{"role": "robot", "content": "x"}])),
        ..ChatInput::default()
    };
    assert!(matches!(
        t.render(&bad),
        Err(TemplateError::Raised { message }) if message == "unknown message role: robot"
    ));
}

#[test]
fn python_literals_print_as_python_does() {
    let out = ok(
        "{{ messages[0].content }}|{{ true }}|{{ [1, 'a'] }}",
        json!([{"content": null}]),
    );
    assert_eq!(out, "None|True|[1, 'a']");
}
