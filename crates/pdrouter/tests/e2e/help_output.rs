//! The binary's help text is part of its interface: operators read it and scripts grep it. Each
//! help invocation's output is compared byte for byte with a golden file in
//! `tests/fixtures/help/`, so a refactoring of the command line cannot change a flag's wording,
//! range, default, heading or order unnoticed. A deliberate change of the help regenerates the
//! file (`pdrouter launch --help > tests/fixtures/help/launch_help.txt`) in the same commit.

use std::path::Path;
use std::process::Command;

/// Each invocation and the golden file holding its output.
const CASES: &[(&[&str], &str)] = &[
    (&["--help"], "help.txt"),
    (&["-h"], "h.txt"),
    (&["launch", "--help"], "launch_help.txt"),
    (&["launch", "-h"], "launch_h.txt"),
    (&["demo", "--help"], "demo_help.txt"),
    (&["demo", "-h"], "demo_h.txt"),
];

/// Lines shown around the first difference.
const CONTEXT: usize = 3;

/// A short diff from the first line that differs: a few lines of context, then the next lines
/// of each side (`-` golden, `+` actual), quoted so that whitespace changes show.
fn first_difference(want: &str, got: &str) -> String {
    let want: Vec<&str> = want.split_inclusive('\n').collect();
    let got: Vec<&str> = got.split_inclusive('\n').collect();
    let first = want
        .iter()
        .zip(&got)
        .position(|(w, g)| w != g)
        .unwrap_or(want.len().min(got.len()));
    let mut out = format!("first difference at line {}:\n", first + 1);
    for line in &want[first.saturating_sub(CONTEXT)..first] {
        out.push_str(&format!("  {}", line.trim_end_matches('\n')));
        out.push('\n');
    }
    // Ten lines of each side are enough to see what moved or changed.
    for line in want.iter().skip(first).take(10) {
        out.push_str(&format!("- {:?}\n", line));
    }
    for line in got.iter().skip(first).take(10) {
        out.push_str(&format!("+ {:?}\n", line));
    }
    out
}

#[test]
fn help_output_matches_the_golden_files_byte_for_byte() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/help");
    let mut failures = Vec::new();
    for (args, file) in CASES {
        let out = Command::new(env!("CARGO_BIN_EXE_pdrouter"))
            .args(*args)
            .env_remove("COLUMNS")
            .output()
            .unwrap();
        assert!(out.status.success(), "pdrouter {args:?} failed: {out:?}");
        let got = String::from_utf8(out.stdout).unwrap();
        let path = dir.join(file);
        let want = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
        if got != want {
            failures.push(format!(
                "pdrouter {} differs from {file}; {}",
                args.join(" "),
                first_difference(&want, &got)
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn the_difference_report_points_at_the_first_changed_line() {
    let report = first_difference("a\nb\nc\n", "a\nB\nc\n");
    assert!(
        report.starts_with("first difference at line 2:"),
        "{report}"
    );
    assert!(report.contains("- \"b\\n\""), "{report}");
    assert!(report.contains("+ \"B\\n\""), "{report}");
    let shorter = first_difference("a\nb\n", "a\n");
    assert!(
        shorter.starts_with("first difference at line 2:"),
        "{shorter}"
    );
}
