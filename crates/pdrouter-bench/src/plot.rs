//! Hand-written SVG of TTFT distributions: one empirical CDF per label on a
//! logarithmic time axis.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use crate::stats::Record;

const WIDTH: f64 = 860.0;
const HEIGHT: f64 = 520.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
/// At most this many vertices per curve (long runs are thinned evenly in
/// probability).
const MAX_POINTS: usize = 1500;
/// Colour-blind-friendly palette (Okabe–Ito), cycled.
const COLOURS: [&str; 8] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
];

/// One curve: a label and its TTFT samples in milliseconds.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// TTFT samples in milliseconds (any order).
    pub ttft_ms: Vec<f64>,
}

/// Groups the TTFTs of successful requests by label, in label order.
pub fn series_from_records(records: &[Record]) -> Vec<Series> {
    let mut by_label: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    for r in records {
        if let (true, Some(t)) = (r.is_ok(), r.ttft_ms) {
            by_label.entry(&r.label).or_default().push(t);
        }
    }
    by_label
        .into_iter()
        .map(|(label, ttft_ms)| Series {
            label: label.to_owned(),
            ttft_ms,
        })
        .collect()
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Decade-aligned axis range `[lo, hi]` (powers of ten) covering `min..max`.
fn log_range(min: f64, max: f64) -> (f64, f64) {
    let lo = 10f64.powf(min.log10().floor());
    let mut hi = 10f64.powf(max.log10().ceil());
    if hi <= lo {
        hi = lo * 10.0;
    }
    (lo, hi)
}

fn tick_label(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').to_owned()
    }
}

/// The plot area and its scales: a log time axis over `[lo, hi]` ms, probability on y.
#[derive(Clone, Copy, Debug)]
struct Axes {
    lo: f64,
    hi: f64,
    plot_w: f64,
    plot_h: f64,
}

impl Axes {
    fn x_of(&self, v: f64) -> f64 {
        LEFT + (v.max(self.lo).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
            * self.plot_w
    }

    fn y_of(&self, p: f64) -> f64 {
        TOP + (1.0 - p) * self.plot_h
    }
}

/// TTFTs are clamped to at least this (1 µs) so the log axis stays finite.
const FLOOR_MS: f64 = 0.001;

/// Renders the empirical CDFs of `series` as an SVG document. TTFTs are
/// clamped to at least 1 µs so the log axis stays finite; empty series are
/// listed in the legend as "(no data)".
pub fn render_svg(title: &str, series: &[Series]) -> String {
    let all = series.iter().flat_map(|s| s.ttft_ms.iter().copied());
    let (min, max) = all
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
            (lo.min(v.max(FLOOR_MS)), hi.max(v.max(FLOOR_MS)))
        });
    let (lo, hi) = if min.is_finite() {
        log_range(min, max)
    } else {
        (1.0, 1000.0)
    };
    let axes = Axes {
        lo,
        hi,
        plot_w: WIDTH - LEFT - RIGHT,
        plot_h: HEIGHT - TOP - BOTTOM,
    };
    let mut svg = String::new();
    header(&mut svg, title, &axes);
    grid(&mut svg, &axes);
    frame(&mut svg, &axes);
    for (i, s) in series.iter().enumerate() {
        curve(&mut svg, &axes, i, s);
    }
    svg.push_str("</svg>\n");
    svg
}

/// The document's opening tag, background and title.
fn header(svg: &mut String, title: &str, axes: &Axes) {
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(
        svg,
        r#"<rect x="0" y="0" width="{WIDTH}" height="{HEIGHT}" fill="white"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="22" text-anchor="middle" font-size="15">{}</text>"#,
        LEFT + axes.plot_w / 2.0,
        escape(title)
    );
}

/// Grid and ticks: 1-2-5 per decade on x, tenths on y.
fn grid(svg: &mut String, axes: &Axes) {
    let (hi, plot_w, plot_h) = (axes.hi, axes.plot_w, axes.plot_h);
    let mut decade = axes.lo;
    while decade < hi * 1.0001 {
        for (m, major) in [(1.0, true), (2.0, false), (5.0, false)] {
            let v = decade * m;
            if v > hi * 1.0001 {
                break;
            }
            let x = axes.x_of(v);
            let stroke = if major { "#bbbbbb" } else { "#e5e5e5" };
            let _ = writeln!(
                svg,
                r#"<line x1="{x:.1}" y1="{TOP}" x2="{x:.1}" y2="{:.1}" stroke="{stroke}"/>"#,
                TOP + plot_h
            );
            let _ = writeln!(
                svg,
                r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
                TOP + plot_h + 16.0,
                tick_label(v)
            );
        }
        decade *= 10.0;
    }
    for i in 0..=10 {
        let p = f64::from(i) / 10.0;
        let y = axes.y_of(p);
        let _ = writeln!(
            svg,
            r#"<line x1="{LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}"/>"#,
            LEFT + plot_w,
            if i % 5 == 0 { "#bbbbbb" } else { "#e5e5e5" }
        );
        let _ = writeln!(
            svg,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{p:.1}</text>"#,
            LEFT - 6.0,
            y + 4.0
        );
    }
}

/// The plot's border and the axis titles.
fn frame(svg: &mut String, axes: &Axes) {
    let (plot_w, plot_h) = (axes.plot_w, axes.plot_h);
    let _ = writeln!(
        svg,
        r#"<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">time to first token (ms, log scale)</text>"#,
        LEFT + plot_w / 2.0,
        HEIGHT - 18.0
    );
    let _ = writeln!(
        svg,
        r#"<text x="18" y="{:.1}" text-anchor="middle" transform="rotate(-90 18 {:.1})">fraction of requests (CDF)</text>"#,
        TOP + plot_h / 2.0,
        TOP + plot_h / 2.0
    );
}

/// The `i`th series: its CDF (if it has samples) and its legend entry.
fn curve(svg: &mut String, axes: &Axes, i: usize, s: &Series) {
    let colour = COLOURS[i % COLOURS.len()];
    let mut v: Vec<f64> = s
        .ttft_ms
        .iter()
        .copied()
        .filter(|t| t.is_finite())
        .map(|t| t.max(FLOOR_MS))
        .collect();
    v.sort_by(f64::total_cmp);
    let legend_y = TOP + 10.0 + 20.0 * i as f64;
    let legend_x = LEFT + axes.plot_w + 16.0;
    if !v.is_empty() {
        // Step function: at each sample the CDF jumps from (k-1)/n to k/n.
        let n = v.len();
        let step = n.div_ceil(MAX_POINTS).max(1);
        let mut pts = String::new();
        let mut prev = 0.0;
        let mut k = 0;
        while k < n {
            let x = axes.x_of(v[k]);
            let p = (k + 1) as f64 / n as f64;
            let _ = write!(
                pts,
                "{x:.2},{:.2} {x:.2},{:.2} ",
                axes.y_of(prev),
                axes.y_of(p)
            );
            prev = p;
            k = if k + 1 == n { n } else { (k + step).min(n - 1) };
        }
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"><title>{}</title></polyline>"#,
            pts.trim_end(),
            escape(&s.label)
        );
    }
    let _ = writeln!(
        svg,
        r#"<line x1="{legend_x:.1}" y1="{legend_y:.1}" x2="{:.1}" y2="{legend_y:.1}" stroke="{colour}" stroke-width="3"/>"#,
        legend_x + 22.0
    );
    let suffix = if v.is_empty() {
        " (no data)".to_owned()
    } else {
        format!(" (n={})", v.len())
    };
    let _ = writeln!(
        svg,
        r#"<text x="{:.1}" y="{:.1}">{}{}</text>"#,
        legend_x + 28.0,
        legend_y + 4.0,
        escape(&s.label),
        suffix
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_range_is_decade_aligned() {
        assert_eq!(log_range(3.0, 450.0), (1.0, 1000.0));
        assert_eq!(log_range(0.2, 0.7), (0.1, 1.0));
        assert_eq!(log_range(10.0, 10.0), (10.0, 100.0));
    }

    #[test]
    fn svg_has_one_curve_per_series_and_a_legend() {
        let series = vec![
            Series {
                label: "round_robin".to_owned(),
                ttft_ms: vec![5.0, 1.0, 450.0, 20.0],
            },
            Series {
                label: "a<b&c".to_owned(),
                ttft_ms: vec![2.0, 3.0],
            },
            Series {
                label: "empty".to_owned(),
                ttft_ms: Vec::new(),
            },
        ];
        let svg = render_svg("TTFT", &series);
        assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
        assert!(svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("round_robin (n=4)"));
        assert!(svg.contains("a&lt;b&amp;c (n=2)"));
        assert!(!svg.contains("a<b"));
        assert!(svg.contains("empty (no data)"));
        assert!(svg.contains("log scale"));
        assert!(svg.contains("CDF"));
        // Axis from 1 to 1000 ms (data 1..450): decade tick labels present.
        for t in [">1<", ">10<", ">100<", ">1000<"] {
            assert!(svg.contains(t), "missing tick {t}");
        }
        // Every opened element is closed or self-closed.
        let opened = svg.matches('<').count();
        let closes = svg.matches("</").count() + svg.matches("/>").count();
        assert_eq!(
            opened,
            2 * svg.matches("</").count() + svg.matches("/>").count()
        );
        assert!(closes > 0);
    }

    #[test]
    fn cdf_ends_at_one_and_is_monotone() {
        let series = vec![Series {
            label: "x".to_owned(),
            ttft_ms: (1..=5000).map(f64::from).collect(),
        }];
        let svg = render_svg("t", &series);
        let pts = svg
            .split("points=\"")
            .nth(1)
            .and_then(|s| s.split('"').next())
            .unwrap();
        let coords: Vec<(f64, f64)> = pts
            .split(' ')
            .map(|p| {
                let (x, y) = p.split_once(',').unwrap();
                (x.parse().unwrap(), y.parse().unwrap())
            })
            .collect();
        assert!(
            coords.len() <= 2 * MAX_POINTS + 2,
            "{} vertices",
            coords.len()
        );
        assert!(
            coords
                .windows(2)
                .all(|w| w[1].0 >= w[0].0 && w[1].1 <= w[0].1)
        );
        // Last vertex is at probability 1 (top of the plot).
        assert!((coords.last().unwrap().1 - TOP).abs() < 0.01);
    }

    #[test]
    fn series_keep_only_successful_ttfts_grouped_by_label() {
        let r = |label: &str, status, ttft| Record {
            label: label.to_owned(),
            start_offset_ms: 0.0,
            status,
            ttft_ms: ttft,
            latency_ms: 1.0,
            prompt_tokens: 1,
            complete: true,
        };
        let s = series_from_records(&[
            r("b", 200, Some(1.0)),
            r("a", 200, Some(2.0)),
            r("a", 429, Some(0.5)),
            r("a", 0, None),
            r("b", 200, Some(3.0)),
        ]);
        assert_eq!(s.len(), 2);
        assert_eq!(
            (s[0].label.as_str(), s[0].ttft_ms.clone()),
            ("a", vec![2.0])
        );
        assert_eq!(s[1].ttft_ms, vec![1.0, 3.0]);
    }
}
