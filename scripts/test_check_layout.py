#!/usr/bin/env python3
"""Self-tests of scripts/check_layout.py: python3 scripts/test_check_layout.py"""

import contextlib
import io
import os
import sys
import tempfile
import textwrap
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import check_layout as cl  # noqa: E402


def parse(src):
    return cl.parse_file(textwrap.dedent(src))


def body(n):
    """n statement lines."""
    return "".join("    let _x%d = %d;\n" % (i, i) for i in range(n))


class Lexer(unittest.TestCase):
    def fn_ends(self, src):
        return [(f.name, f.line, f.end_line) for f in parse(src).functions]

    def test_raw_and_byte_strings_with_braces(self):
        src = """\
        fn a() {
            let s = r#"}{ "quoted" }"#;
            let t = r"{";
            let u = br##"}"# still"##;
            let v = b"}\\"{";
            let w = "\\"}";
        }
        fn b() {}
        """
        self.assertEqual(self.fn_ends(src), [("a", 1, 7), ("b", 8, 8)])

    def test_raw_identifier_is_not_a_raw_string(self):
        src = """\
        fn r#match(r#fn: u8) -> u8 {
            r#fn
        }
        """
        self.assertEqual(self.fn_ends(src), [("match", 1, 3)])

    def test_lifetimes_and_char_literals(self):
        src = """\
        fn f<'a>(x: &'a str) -> char {
            let c = '{';
            let q = '\\'';
            let u = '\\u{7b}';
            let b = b'}';
            'outer: loop {
                break 'outer;
            }
            c
        }
        struct S<'a>(&'a str);
        impl<'a> S<'a> {
            fn g(&self) -> &'a str where 'a: 'a {
                self.0
            }
        }
        """
        self.assertEqual(self.fn_ends(src), [("f", 1, 10), ("g", 13, 15)])

    def test_nested_block_comments(self):
        src = """\
        fn a() {
            /* outer /* inner } */ still a comment { */
            // a line comment }
            let x = 1;
        }
        """
        self.assertEqual(self.fn_ends(src), [("a", 1, 5)])

    def test_trait_method_without_body_is_not_a_function(self):
        src = """\
        trait T {
            fn decl(&self) -> u8;
            fn with_default(&self) -> u8 {
                1
            }
        }
        type F = fn(u8) -> u8;
        """
        fns = parse(src).functions
        found = [(f.qualname, f.line, f.end_line) for f in fns]
        self.assertEqual(found, [("T::with_default", 3, 5)])

    def test_method_names_carry_their_impl_type(self):
        src = """\
        impl<T: Clone> From<T> for Wrapper<T> where T: Send {
            fn from(t: T) -> Self {
                Wrapper(t)
            }
        }
        fn outer() -> impl Fn() {
            fn inner() {}
            || {}
        }
        """
        names = [f.qualname for f in parse(src).functions]
        self.assertEqual(names, ["Wrapper::from", "outer", "outer::inner"])


class TestCode(unittest.TestCase):
    def test_cfg_test_module_lines_do_not_count(self):
        head = "fn a() {}\n\n#[cfg(test)]\nmod tests {\n    #[test]\n    fn t() {\n"
        src = head + body(200) + "    }\n}\n"
        pf = cl.parse_file(src)
        self.assertEqual(pf.code_lines, 2)
        self.assertEqual([(f.name, f.is_test) for f in pf.functions], [("a", False), ("t", True)])

    def test_cfg_not_test_is_code(self):
        pf = parse("""\
        #[cfg(not(test))]
        fn a() {}
        #[cfg(all(test, unix))]
        fn b() {}
        """)
        self.assertEqual([(f.name, f.is_test) for f in pf.functions], [("a", False), ("b", True)])

    def test_test_paths(self):
        self.assertTrue(cl.is_test_path("crates/x/src/tests.rs"))
        self.assertTrue(cl.is_test_path("crates/x/src/a/tests/b.rs"))
        self.assertTrue(cl.is_test_path("crates/x/benches/b.rs"))
        self.assertFalse(cl.is_test_path("crates/x/src/testing.rs"))


class LongFn(unittest.TestCase):
    def one(self, above):
        src = above + "pub fn long() {\n" + body(120) + "}\n"
        (f,) = cl.parse_file(src).functions
        self.assertEqual(f.length, 122)
        return f.allowed

    def test_marker_in_doc_comment_or_between_attributes(self):
        self.assertTrue(self.one("/// Does it all.\n// long-fn: one arm per flag\n#[inline]\n"))
        self.assertTrue(self.one("#[inline]\n// long-fn: kept together\n#[allow(x)]\n"))

    def test_marker_needs_a_reason_and_contiguity(self):
        self.assertFalse(self.one("// long-fn:\n"))
        self.assertFalse(self.one("// long-fn: separated by a blank line\n\n"))
        self.assertFalse(self.one('const S: &str = "// long-fn: in a string";\n'))


class Refs(unittest.TestCase):
    def refs(self, src):
        return [("::".join(r.segments), r.line) for r in parse(src).refs]

    def test_grouped_use(self):
        src = """\
        use crate::{a::X, b::{self, Y as Z}, c::*};
        use super::{
            d,
            e::F,
        };
        use std::collections::HashMap;
        """
        self.assertEqual(
            self.refs(src),
            [
                ("crate::a::X", 1),
                ("crate::b", 1),
                ("crate::b::Y", 1),
                ("crate::c", 1),
                ("super::d", 3),
                ("super::e::F", 4),
            ],
        )

    def test_inline_paths_not_comments_or_strings(self):
        src = """\
        fn f() {
            crate::a::run();
            // crate::b::run();
            /* super::c::run() */
            let s = "crate::d::run()";
            let t = r#"super::e"#;
            <crate::g::G as T>::h();
            self.crate_field;
        }
        """
        self.assertEqual(self.refs(src), [("crate::a::run", 2), ("crate::g::G", 7)])

    def test_test_code_references_are_ignored(self):
        src = """\
        #[cfg(test)]
        use crate::x::Y;
        #[cfg(test)]
        mod tests {
            use super::super::z;
            fn t() {
                crate::q::r();
            }
        }
        #[test]
        fn u() {
            crate::q::s();
        }
        """
        self.assertEqual(self.refs(src), [])

    def test_resolve(self):
        self.assertEqual(cl.resolve(["super", "b", "X"], ("p", "a")), ("p", "b", "X"))
        self.assertEqual(cl.resolve(["super", "super", "b"], ("p", "a", "x")), ("p", "b"))
        self.assertEqual(cl.resolve(["self", "x"], ("p",)), ("p", "x"))
        self.assertEqual(cl.resolve(["crate", "b"], ("p", "a")), ("b",))


def make_tree(root, files):
    for rel, text in files.items():
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "w") as f:
            f.write(textwrap.dedent(text))


def run(root, *args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cl.main(["--root", root] + list(args))
    return rc, out.getvalue()


LIB = "crates/demo/src/lib.rs"


class Cycles(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.TemporaryDirectory()
        self.root = self.tmp.name
        os.makedirs(os.path.join(self.root, "scripts"))

    def tearDown(self):
        self.tmp.cleanup()

    def cycles(self):
        ws = cl.Workspace(self.root)
        ws.load()
        self.assertEqual(ws.errors, [])
        return [
            (label, members, [(a, b, f, ln) for a, b, f, ln, _ in detail])
            for label, members, detail in ws.cycles()
        ]

    def test_cycle_of_three_through_super_and_crate(self):
        make_tree(
            self.root,
            {
                LIB: "mod p;\npub struct Root;\n",
                "crates/demo/src/p/mod.rs": "mod a;\nmod b;\nmod c;\npub(crate) fn helper() {}\n",
                "crates/demo/src/p/a.rs": "use super::b::B;\npub struct A;\n",
                "crates/demo/src/p/b.rs": "mod deep;\npub struct B;\n",
                "crates/demo/src/p/b/deep.rs": "pub fn f() { super::super::c::g(); }\n",
                "crates/demo/src/p/c.rs": (
                    "// crate::p::b is only mentioned here\n"
                    "pub fn g() {\n"
                    "    let _ = \"super::b\";\n"
                    "    super::helper();\n"
                    "    let _ = crate::Root;\n"
                    "    crate::p::a::A;\n"
                    "}\n"
                ),
            },
        )
        self.assertEqual(
            self.cycles(),
            [
                (
                    "crates/demo/src/p",
                    ["a", "b", "c"],
                    [
                        ("a", "b", "crates/demo/src/p/a.rs", 1),
                        ("b", "c", "crates/demo/src/p/b/deep.rs", 1),
                        ("c", "a", "crates/demo/src/p/c.rs", 6),
                    ],
                )
            ],
        )

    def test_parent_items_and_test_modules_make_no_edges(self):
        make_tree(
            self.root,
            {
                LIB: (
                    "mod a;\nmod b;\npub use b::B;\npub use self::a::A;\npub struct R;\n"
                    "fn f() { crate::a::A; }\n"
                ),
                "crates/demo/src/a.rs": "use crate::B;\nuse crate::R;\npub struct A;\n",
                "crates/demo/src/b.rs": (
                    "use crate::a::A;\npub struct B;\n#[cfg(test)]\nmod tests;\n"
                ),
                "crates/demo/src/b/tests.rs": "use crate::b::B;\n",
            },
        )
        self.assertEqual(self.cycles(), [])

    def test_baseline_new_stale_and_subset(self):
        make_tree(
            self.root,
            {
                LIB: "mod a;\nmod b;\n",
                "crates/demo/src/a.rs": "use crate::b::B;\npub struct A;\n",
                "crates/demo/src/b.rs": "use crate::a::A;\npub struct B;\n",
            },
        )
        baseline = os.path.join(self.root, "scripts", "layout-baseline.txt")
        rc, out = run(self.root)
        self.assertEqual(rc, 1)
        self.assertIn("new: cycle crates/demo/src: a,b", out)
        self.assertIn("1 cycles; 1 not in the baseline", out)

        with open(baseline, "w") as f:
            f.write("# comment\ncycle crates/demo/src: a,b,z\n")
        rc, out = run(self.root)
        self.assertEqual(rc, 0)
        self.assertEqual(
            out.strip().splitlines()[-1],
            "layout: 0 files over 800 lines, 0 functions over 100 lines, 1 cycles; baseline ok",
        )

        with open(baseline, "a") as f:
            f.write("fn crates/demo/src/a.rs gone\n")
        rc, out = run(self.root)
        self.assertEqual(rc, 1)
        self.assertIn("stale baseline entry (delete it): fn crates/demo/src/a.rs gone", out)

        rc, out = run(self.root, "--write-baseline")
        self.assertEqual(rc, 0)
        with open(baseline) as f:
            keys = [ln for ln in f.read().splitlines() if not ln.startswith("#")]
        self.assertEqual(keys, ["cycle crates/demo/src: a,b"])
        rc, out = run(self.root, "--report")
        self.assertEqual(rc, 0)
        self.assertIn("a -> b  crates/demo/src/a.rs:1", out)

    def test_size_and_long_fn_baseline_keys(self):
        make_tree(
            self.root,
            {
                LIB: "mod big;\n",
                "crates/demo/src/big.rs": (
                    "pub struct S;\nimpl S {\n    pub fn run() {\n" + body(850) + "    }\n}\n"
                ),
            },
        )
        run(self.root, "--write-baseline")
        with open(os.path.join(self.root, "scripts", "layout-baseline.txt")) as f:
            keys = [ln for ln in f.read().splitlines() if not ln.startswith("#")]
        self.assertEqual(keys, ["size crates/demo/src/big.rs", "fn crates/demo/src/big.rs S::run"])

    def test_an_inline_test_module_counts_toward_the_file_size(self):
        code = "pub fn f() {}\n" * 700
        tests = "#[cfg(test)]\nmod tests {\n" + "    fn t() {}\n" * 150 + "}\n"
        make_tree(
            self.root,
            {
                LIB: "mod big;\nmod small;\n",
                "crates/demo/src/big.rs": code + tests,
                "crates/demo/src/small.rs": code,
            },
        )
        ws = cl.Workspace(self.root)
        ws.load()
        self.assertEqual([rel for rel, _, _ in ws.big_files()], ["crates/demo/src/big.rs"])


if __name__ == "__main__":
    unittest.main()
