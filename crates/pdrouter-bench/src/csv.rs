//! The per-request CSV (`--csv`): writing and reading it back for `plot`.

use std::io::{self, BufRead, Write};

use crate::stats::Record;

/// The header line of the per-request CSV.
pub const HEADER: &str = "label,start_offset_ms,status,ttft_ms,latency_ms,prompt_tokens,complete";

fn field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

/// Writes the header and one row per record. A missing TTFT is an empty
/// field; `complete` is 1 or 0.
pub fn write_csv<W: Write>(mut out: W, records: &[Record]) -> io::Result<()> {
    writeln!(out, "{HEADER}")?;
    for r in records {
        let ttft = r.ttft_ms.map(|t| format!("{t:.3}")).unwrap_or_default();
        writeln!(
            out,
            "{},{:.3},{},{},{:.3},{},{}",
            field(&r.label),
            r.start_offset_ms,
            r.status,
            ttft,
            r.latency_ms,
            r.prompt_tokens,
            u8::from(r.complete)
        )?;
    }
    out.flush()
}

/// Splits one CSV line into fields (double-quoted fields may contain commas
/// and doubled quotes).
fn split_line(line: &str) -> Result<Vec<String>, String> {
    let mut fields = Vec::new();
    let mut cur = String::new();
    let mut chars = line.chars().peekable();
    let mut quoted = false;
    while let Some(c) = chars.next() {
        match (quoted, c) {
            (true, '"') if chars.peek() == Some(&'"') => {
                chars.next();
                cur.push('"');
            }
            (true, '"') => quoted = false,
            (true, c) => cur.push(c),
            (false, '"') if cur.is_empty() => quoted = true,
            (false, ',') => fields.push(std::mem::take(&mut cur)),
            (false, c) => cur.push(c),
        }
    }
    if quoted {
        return Err("unterminated quoted field".to_owned());
    }
    fields.push(cur);
    Ok(fields)
}

/// Reads records written by [`write_csv`]. Errors name the offending line.
pub fn read_csv<R: BufRead>(input: R) -> Result<Vec<Record>, String> {
    let mut records = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| format!("line {}: {e}", i + 1))?;
        let line = line.trim_end_matches('\r');
        if i == 0 {
            if line != HEADER {
                return Err(format!("line 1: expected header {HEADER:?}, got {line:?}"));
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        let bad = |what: &str| format!("line {}: {what}", i + 1);
        let f = split_line(line).map_err(|e| bad(&e))?;
        if f.len() != 7 {
            return Err(bad(&format!("expected 7 fields, got {}", f.len())));
        }
        let num = |s: &str, name: &str| s.parse::<f64>().map_err(|_| bad(&format!("bad {name}")));
        records.push(Record {
            label: f[0].clone(),
            start_offset_ms: num(&f[1], "start_offset_ms")?,
            status: f[2].parse().map_err(|_| bad("bad status"))?,
            ttft_ms: if f[3].is_empty() {
                None
            } else {
                Some(num(&f[3], "ttft_ms")?)
            },
            latency_ms: num(&f[4], "latency_ms")?,
            prompt_tokens: f[5].parse().map_err(|_| bad("bad prompt_tokens"))?,
            complete: match f[6].as_str() {
                "1" => true,
                "0" => false,
                _ => return Err(bad("bad complete (expected 1 or 0)")),
            },
        });
    }
    Ok(records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records() -> Vec<Record> {
        vec![
            Record {
                label: "plain".to_owned(),
                start_offset_ms: 1.5,
                status: 200,
                ttft_ms: Some(2.25),
                latency_ms: 3.125,
                prompt_tokens: 12,
                complete: true,
            },
            Record {
                label: "with, \"quotes\"".to_owned(),
                start_offset_ms: 10.0,
                status: 0,
                ttft_ms: None,
                latency_ms: 60000.0,
                prompt_tokens: 1,
                complete: false,
            },
        ]
    }

    #[test]
    fn csv_has_header_and_one_row_per_request() {
        let mut out = Vec::new();
        write_csv(&mut out, &records()).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], HEADER);
        assert_eq!(lines[1], "plain,1.500,200,2.250,3.125,12,1");
        assert_eq!(lines[2], "\"with, \"\"quotes\"\"\",10.000,0,,60000.000,1,0");
        assert_eq!(lines.len(), 3);
    }

    #[test]
    fn csv_round_trips() {
        let mut out = Vec::new();
        write_csv(&mut out, &records()).unwrap();
        assert_eq!(read_csv(&out[..]).unwrap(), records());
    }

    #[test]
    fn csv_reader_names_bad_lines() {
        let err = read_csv("nope\n".as_bytes()).unwrap_err();
        assert!(err.contains("line 1"), "{err}");
        let text = format!("{HEADER}\na,1,200,x,3,4,1\n");
        let err = read_csv(text.as_bytes()).unwrap_err();
        assert!(err.contains("line 2") && err.contains("ttft_ms"), "{err}");
        let text = format!("{HEADER}\na,1,200\n");
        assert!(read_csv(text.as_bytes()).unwrap_err().contains("7 fields"));
        let text = format!("{HEADER}\na,1,200,2,3,4,yes\n");
        assert!(read_csv(text.as_bytes()).unwrap_err().contains("complete"));
    }
}
