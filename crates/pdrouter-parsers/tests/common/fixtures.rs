//! Tool-call fixtures, written from each family's documented markup (chat templates, model
//! cards): none, one and two calls, text before and after, an unknown function, malformed
//! arguments, output cut off inside a call.

use super::Fixture;
use pdrouter_parsers::ToolKind;

pub const fn fx(
    name: &'static str,
    text: &'static str,
    content: &'static str,
    calls: &'static [(&'static str, &'static str)],
) -> Fixture {
    Fixture {
        name,
        text,
        content,
        calls,
    }
}

/// A fixture whose whole output is text.
pub const fn text(name: &'static str, text: &'static str) -> Fixture {
    fx(name, text, text, &[])
}

pub const QWEN: &[Fixture] = &[
    text("no call", "The weather is fine <b>today</b>."),
    fx(
        "one call after text",
        "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>",
        "Let me check.",
        &[("get_weather", r#"{"city":"Paris","days":3}"#)],
    ),
    fx(
        "two calls, text after",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"umbrella {shop}\", \"limit\": 5}}\n</tool_call>\nDone.",
        "\nDone.",
        &[
            ("get_weather", r#"{"city":"Paris"}"#),
            ("search", r#"{"query":"umbrella {shop}","limit":5}"#),
        ],
    ),
    text(
        "unknown function",
        "Sure.<tool_call>\n{\"name\": \"launch\", \"arguments\": {}}\n</tool_call>",
    ),
    text(
        "malformed json",
        "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": }}\n</tool_call> ok",
    ),
    text(
        "cut off in a call",
        "Checking <tool_call>\n{\"name\": \"get_weather\"",
    ),
    text("marker-like text", "a < b and <tool"),
    fx(
        "valid then unknown",
        "<tool_call>{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}</tool_call><tool_call>{\"name\":\"nope\"}</tool_call>",
        "<tool_call>{\"name\":\"nope\"}</tool_call>",
        &[("get_weather", r#"{"city":"Oslo"}"#)],
    ),
    fx(
        "parameters key, arguments as a string",
        "<tool_call>\n{\"name\": \"get_time\", \"parameters\": {}}\n</tool_call><tool_call>{\"name\": \"search\", \"arguments\": \"{\\\"query\\\": \\\"é\\\"}\"}</tool_call>",
        "",
        &[("get_time", "{}"), ("search", r#"{"query":"é"}"#)],
    ),
];

pub const QWEN_XML: &[Fixture] = &[
    text("no call", "Here is <function=code> as prose."),
    fx(
        "one call after text",
        "I'll look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "I'll look.",
        &[("get_weather", r#"{"city":"New York","days":3}"#)],
    ),
    fx(
        "two calls, typed values",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=search>\n<parameter=query>\nline one\nline two\n</parameter>\n<parameter=filters>\n{\"b\": 1, \"a\": [true]}\n</parameter>\n<parameter=exact>\ntrue\n</parameter>\n<parameter=note>\n42\n</parameter>\n</function>\n</tool_call>",
        "",
        &[
            ("get_weather", r#"{"city":"Paris"}"#),
            (
                "search",
                r#"{"query":"line one\nline two","filters":{"b":1,"a":[true]},"exact":true,"note":"42"}"#,
            ),
        ],
    ),
    text(
        "unknown function",
        "<tool_call>\n<function=delete_all>\n</function>\n</tool_call>",
    ),
    text(
        "malformed: no </function>",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</tool_call> after",
    ),
    fx(
        "wrong type falls back to a string, text after",
        "<tool_call>\n<function=get_weather>\n<parameter=days>\nthree\n</parameter>\n</function>\n</tool_call> and more",
        " and more",
        &[("get_weather", r#"{"days":"three"}"#)],
    ),
    text(
        "cut off in a call",
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",
    ),
];

pub const GLM45: &[Fixture] = &[
    text("no call", "No tools needed <arg_key>."),
    fx(
        "one call after text",
        "Checking.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Beijing</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n</tool_call>",
        "Checking.",
        &[("get_weather", r#"{"city":"Beijing","days":2}"#)],
    ),
    fx(
        "two calls, inferred values, text after",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Shanghai</arg_value>\n</tool_call>\n<tool_call>search\n<arg_key>query</arg_key>\n<arg_value>123</arg_value>\n<arg_key>extra</arg_key>\n<arg_value>[1, 2]</arg_value>\n<arg_key>tag</arg_key>\n<arg_value>x y</arg_value>\n</tool_call>\nAll set.",
        "\nAll set.",
        &[
            ("get_weather", r#"{"city":"Shanghai"}"#),
            ("search", r#"{"query":"123","extra":[1,2],"tag":"x y"}"#),
        ],
    ),
    fx(
        "call without arguments",
        "<tool_call>get_time\n</tool_call>",
        "",
        &[("get_time", "{}")],
    ),
    text(
        "unknown function",
        "<tool_call>format_disk\n<arg_key>d</arg_key>\n<arg_value>c</arg_value>\n</tool_call>",
    ),
    text(
        "malformed: unclosed value",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris\n</tool_call>",
    ),
    text(
        "cut off in a call",
        "ok <tool_call>get_weather\n<arg_key>ci",
    ),
];

pub const GLM47: &[Fixture] = &[
    text("no call", "Plain answer."),
    fx(
        "one call",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Beijing</arg_value><arg_key>days</arg_key><arg_value>2</arg_value></tool_call>",
        "",
        &[("get_weather", r#"{"city":"Beijing","days":2}"#)],
    ),
    fx(
        "two calls between text",
        "Sure<tool_call>get_time</tool_call><tool_call>search<arg_key>query</arg_key><arg_value>a b</arg_value><arg_key>exact</arg_key><arg_value>False</arg_value></tool_call>thanks",
        "Surethanks",
        &[
            ("get_time", "{}"),
            ("search", r#"{"query":"a b","exact":false}"#),
        ],
    ),
    fx(
        "newline layout too",
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Rome</arg_value>\n</tool_call>",
        "",
        &[("get_weather", r#"{"city":"Rome"}"#)],
    ),
    text(
        "unknown function",
        "<tool_call>shutdown<arg_key>now</arg_key><arg_value>true</arg_value></tool_call>",
    ),
    text(
        "malformed",
        "<tool_call>get_weather<arg_key>city</arg_value></tool_call>",
    ),
    text(
        "cut off in a call",
        "<tool_call>get_weather<arg_key>city</arg_key><arg_val",
    ),
];

pub const DEEPSEEK: &[Fixture] = &[
    text("no call", "Nothing to call."),
    fx(
        "one call after text",
        "Let me check.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\", \"days\": 1}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "Let me check.",
        &[("get_weather", r#"{"city":"Tokyo","days":1}"#)],
    ),
    fx(
        "two calls, text after",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{\"query\": \"sushi\", \"limit\": 2}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>\nEnjoy.",
        "\nEnjoy.",
        &[
            ("get_weather", r#"{"city":"Tokyo"}"#),
            ("search", r#"{"query":"sushi","limit":2}"#),
        ],
    ),
    fx(
        "unknown function: the block is text, section markers dropped",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>rm_rf\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>rm_rf\n```json\n{}\n```<｜tool▁call▁end｜>",
        &[],
    ),
    fx(
        "malformed json",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"city\": \"Tokyo\"\n```<｜tool▁call▁end｜>",
        &[],
    ),
    fx(
        "cut off in a call",
        "Hi<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"ci",
        "Hi<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n{\"ci",
        &[],
    ),
    text("partial section marker", "see <｜tool▁calls"),
];

pub const DEEPSEEK31: &[Fixture] = &[
    text("no call", "Nothing to call."),
    fx(
        "one call",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Hangzhou\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "",
        &[("get_weather", r#"{"city":"Hangzhou"}"#)],
    ),
    fx(
        "two calls between text",
        "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\": \"Xi'an\", \"unit\": \"c\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜> Done",
        "Checking. Done",
        &[
            ("get_weather", r#"{"city":"Xi'an","unit":"c"}"#),
            ("get_time", "{}"),
        ],
    ),
    fx(
        "unknown function",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>nope<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>nope<｜tool▁sep｜>{}<｜tool▁call▁end｜>",
        &[],
    ),
    fx(
        "malformed json, valid call after",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{city: 1}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{city: 1}<｜tool▁call▁end｜>",
        &[("get_time", "{}")],
    ),
    fx(
        "cut off in a call",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\"",
        "<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{\"city\"",
        &[],
    ),
];

pub const KIMI_K2: &[Fixture] = &[
    text("no call", "Plain <|text|>."),
    fx(
        "one call after text",
        "I'll check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Beijing\"}<|tool_call_end|><|tool_calls_section_end|>",
        "I'll check.",
        &[("get_weather", r#"{"city":"Beijing"}"#)],
    ),
    fx(
        "two calls, text after",
        "<|tool_calls_section_begin|>\n<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Beijing\", \"days\": 2}<|tool_call_end|>\n<|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{\"query\": \"hotpot\"}<|tool_call_end|>\n<|tool_calls_section_end|>\nDone.",
        "\n\nDone.",
        &[
            ("get_weather", r#"{"city":"Beijing","days":2}"#),
            ("search", r#"{"query":"hotpot"}"#),
        ],
    ),
    fx(
        "unknown function",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.hack:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
        "<|tool_call_begin|>functions.hack:0<|tool_call_argument_begin|>{}<|tool_call_end|>",
        &[],
    ),
    fx(
        "malformed json",
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": Beijing}<|tool_call_end|><|tool_calls_section_end|>",
        "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": Beijing}<|tool_call_end|>",
        &[],
    ),
    fx(
        "cut off in a call",
        "ok<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_arg",
        "ok<|tool_call_begin|>functions.get_weather:0<|tool_call_arg",
        &[],
    ),
];

pub const MINIMAX_M2: &[Fixture] = &[
    text("no call", "Use <invoke> tags, they said."),
    fx(
        "one call after text",
        "Let me look that up.\n<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">San Francisco</parameter>\n<parameter name=\"days\">5</parameter>\n</invoke>\n</minimax:tool_call>",
        "Let me look that up.",
        &[("get_weather", r#"{"city":"San Francisco","days":5}"#)],
    ),
    fx(
        "two invokes in one block, text after",
        "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"city\">Paris</parameter>\n</invoke>\n<invoke name=\"search\">\n<parameter name=\"query\">x</parameter>\n<parameter name=\"limit\">10</parameter>\n<parameter name=\"filters\">{\"k\": \"v\"}</parameter>\n</invoke>\n</minimax:tool_call>\nThere.",
        "\nThere.",
        &[
            ("get_weather", r#"{"city":"Paris"}"#),
            ("search", r#"{"query":"x","limit":10,"filters":{"k":"v"}}"#),
        ],
    ),
    fx(
        "two blocks",
        "<minimax:tool_call><invoke name=\"get_time\"></invoke></minimax:tool_call><minimax:tool_call><invoke name=\"get_weather\"><parameter name=\"city\">Lyon</parameter></invoke></minimax:tool_call>",
        "",
        &[("get_time", "{}"), ("get_weather", r#"{"city":"Lyon"}"#)],
    ),
    text(
        "an unknown invoke makes the block text",
        "<minimax:tool_call>\n<invoke name=\"get_time\"></invoke>\n<invoke name=\"erase\"></invoke>\n</minimax:tool_call>",
    ),
    text(
        "malformed: unclosed invoke",
        "<minimax:tool_call>\n<invoke name=\"get_time\">\n</minimax:tool_call>",
    ),
    text(
        "cut off in a call",
        "<minimax:tool_call>\n<invoke name=\"get_weather\">\n<parameter name=\"ci",
    ),
];

pub const STEP3: &[Fixture] = &[
    text("no call", "No calls here."),
    fx(
        "one call between text",
        "Some text\n<｜tool_calls_begin｜>\n<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"get_weather\">\n<steptml:parameter name=\"city\">Tokyo</steptml:parameter>\n<steptml:parameter name=\"days\">2</steptml:parameter>\n</steptml:invoke><｜tool_call_end｜>\n<｜tool_calls_end｜>More text",
        "Some text\nMore text",
        &[("get_weather", r#"{"city":"Tokyo","days":2}"#)],
    ),
    fx(
        "two calls",
        "<｜tool_calls_begin｜>\n<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"search\">\n<steptml:parameter name=\"query\">rust programming</steptml:parameter>\n<steptml:parameter name=\"exact\">true</steptml:parameter>\n</steptml:invoke><｜tool_call_end｜>\n<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"get_time\">\n</steptml:invoke><｜tool_call_end｜>\n<｜tool_calls_end｜>",
        "",
        &[
            ("search", r#"{"query":"rust programming","exact":true}"#),
            ("get_time", "{}"),
        ],
    ),
    fx(
        "unknown function",
        "<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"nuke\"></steptml:invoke><｜tool_call_end｜><｜tool_calls_end｜>",
        "<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"nuke\"></steptml:invoke><｜tool_call_end｜>",
        &[],
    ),
    fx(
        "malformed",
        "<｜tool_calls_begin｜><｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"get_time\"><｜tool_call_end｜><｜tool_calls_end｜>",
        "<｜tool_call_begin｜>function<｜tool_sep｜><steptml:invoke name=\"get_time\"><｜tool_call_end｜>",
        &[],
    ),
];

pub const LLAMA: &[Fixture] = &[
    text("no call", "Hello! How can I help?"),
    fx(
        "bare json at the start",
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Boston\", \"days\": 2}}",
        "",
        &[("get_weather", r#"{"city":"Boston","days":2}"#)],
    ),
    fx(
        "python tag, two calls separated by ;",
        "<|python_tag|>{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Boston\"}}; {\"name\": \"search\", \"arguments\": {\"query\": \"news\"}}",
        "",
        &[
            ("get_weather", r#"{"city":"Boston"}"#),
            ("search", r#"{"query":"news"}"#),
        ],
    ),
    fx(
        "text then python tag",
        "Let me check. <|python_tag|>{\"name\": \"get_time\", \"parameters\": {}}",
        "Let me check.",
        &[("get_time", "{}")],
    ),
    text(
        "json later in text is text",
        "The JSON is {\"name\": \"get_weather\"}",
    ),
    text(
        "unknown function",
        "{\"name\": \"unknown\", \"parameters\": {}}",
    ),
    text(
        "malformed",
        "{\"name\": \"get_weather\", \"parameters\": {\"city\": }} trailing",
    ),
    fx(
        "cut off in a call: the tag is consumed",
        "<|python_tag|>{\"name\": \"get_weather\", \"param",
        "{\"name\": \"get_weather\", \"param",
        &[],
    ),
    fx(
        "call then text",
        "\n{\"name\":\"get_time\",\"parameters\":{}} That's the time.",
        " That's the time.",
        &[("get_time", "{}")],
    ),
];

pub const PYTHONIC: &[Fixture] = &[
    text("no call", "See [the docs](https://x) and [1, 2]."),
    fx(
        "two calls",
        "[get_weather(city=\"San Francisco\", days=3), get_time()]",
        "",
        &[
            ("get_weather", r#"{"city":"San Francisco","days":3}"#),
            ("get_time", "{}"),
        ],
    ),
    fx(
        "text before and after",
        "Sure! [search(query='cheap flights', limit=5, filters={'from': 'SFO'}, exact=False)] Anything else?",
        "Sure! Anything else?",
        &[(
            "search",
            r#"{"query":"cheap flights","limit":5,"filters":{"from":"SFO"},"exact":false}"#,
        )],
    ),
    fx(
        "python_start wrapper",
        "<|python_start|>[get_time()]<|python_end|>",
        "",
        &[("get_time", "{}")],
    ),
    text("unknown function", "[launch(code=1)]"),
    text("positional argument", "[get_weather(city=\"Paris\", 3)]"),
    text("cut off in a call", "Result: [get_weather(city='Par"),
];

pub const MISTRAL: &[Fixture] = &[
    text("no call", "Bonjour [TOOL] [x]."),
    fx(
        "array",
        "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 1}}]",
        "",
        &[("get_weather", r#"{"city":"Paris","days":1}"#)],
    ),
    fx(
        "text then two calls in an array",
        "Checking.[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}, {\"name\": \"search\", \"arguments\": {\"query\": \"louvre\"}}]",
        "Checking.",
        &[
            ("get_weather", r#"{"city":"Paris"}"#),
            ("search", r#"{"query":"louvre"}"#),
        ],
    ),
    fx(
        "v11 form, two calls",
        "[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"}[TOOL_CALLS]get_time[ARGS]{}",
        "",
        &[("get_weather", r#"{"city":"Paris"}"#), ("get_time", "{}")],
    ),
    fx(
        "v13 form with a call id, text after",
        "[TOOL_CALLS]search[CALL_ID]a1b2c3d4e[ARGS]{\"query\": \"x\"} done",
        " done",
        &[("search", r#"{"query":"x"}"#)],
    ),
    text(
        "an unknown function makes the array text",
        "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {}}, {\"name\": \"nope\", \"arguments\": {}}]",
    ),
    text(
        "malformed",
        "[TOOL_CALLS]get_weather[ARGS]{\"city\": Paris}",
    ),
    text(
        "cut off in a call",
        "[TOOL_CALLS] [{\"name\": \"get_weather\"",
    ),
];

pub const JSON: &[Fixture] = &[
    fx(
        "one object",
        "{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Lima\"}}",
        "",
        &[("get_weather", r#"{"city":"Lima"}"#)],
    ),
    fx(
        "an array of two",
        "\n[{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Lima\"}}, {\"name\": \"get_time\"}]",
        "",
        &[("get_weather", r#"{"city":"Lima"}"#), ("get_time", "{}")],
    ),
    text("text first", "Hello {\"name\": \"get_time\"}"),
    text(
        "unknown function",
        "{\"name\": \"nope\", \"arguments\": {}}",
    ),
    text("malformed", "{\"name\": \"get_time\", \"arguments\": {]}"),
    text(
        "an unknown element makes the array text",
        "[{\"name\": \"get_time\"}, {\"name\": \"nope\"}]",
    ),
    text("cut off", "{\"name\": \"get_time\", \"argu"),
];

pub const HARMONY: &[Fixture] = &[
    text("plain content", "It is sunny."),
    fx(
        "analysis then a call",
        "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"SF\"}<|call|>",
        "",
        &[("get_weather", r#"{"city":"SF"}"#)],
    ),
    fx(
        "final answer",
        "<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>Hello there!<|return|>",
        "Hello there!",
        &[],
    ),
    fx(
        "preamble and two calls, recipient in the role part too",
        "<|channel|>commentary<|message|>Checking both.<|end|><|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Oslo\"}<|call|><|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>",
        "Checking both.",
        &[("get_weather", r#"{"city":"Oslo"}"#), ("get_time", "{}")],
    ),
    text(
        "unknown function",
        "<|channel|>commentary to=functions.rm <|constrain|>json<|message|>{}<|call|>",
    ),
    text(
        "malformed json",
        "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{oops}<|call|>",
    ),
    fx(
        "call ended by end of output (stop token not kept)",
        "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}",
        "",
        &[("get_time", "{}")],
    ),
    fx(
        "final text after reasoning removed, then a verbatim call",
        "Let me see.<|start|>assistant<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>{}<|call|>",
        "Let me see.",
        &[("get_time", "{}")],
    ),
];

pub const ALL: &[(ToolKind, &[Fixture])] = &[
    (ToolKind::Qwen, QWEN),
    (ToolKind::QwenXml, QWEN_XML),
    (ToolKind::Glm45Moe, GLM45),
    (ToolKind::Glm47Moe, GLM47),
    (ToolKind::DeepSeek, DEEPSEEK),
    (ToolKind::DeepSeek31, DEEPSEEK31),
    (ToolKind::KimiK2, KIMI_K2),
    (ToolKind::MinimaxM2, MINIMAX_M2),
    (ToolKind::Step3, STEP3),
    (ToolKind::Llama, LLAMA),
    (ToolKind::Pythonic, PYTHONIC),
    (ToolKind::Mistral, MISTRAL),
    (ToolKind::Json, JSON),
    (ToolKind::Harmony, HARMONY),
];
