//! The usage chart, drawn on the server as SVG: one bar per UTC day, a few
//! gridlines with their values, a date under every seventh bar (the newest
//! always), and each bar's
//! exact figure in its tooltip and in the accessible description. Colours come
//! from the stylesheet (classes only: the pages allow no inline style).

use std::fmt::Write as _;

/// One day of the chart.
pub(crate) struct Day {
    /// `YYYY-MM-DD`.
    pub(crate) date: String,
    pub(crate) value: f64,
}

const W: f64 = 720.0;
const H: f64 = 200.0;
const LEFT: f64 = 78.0;
const BOTTOM: f64 = 24.0;
const TOP: f64 = 10.0;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" axis maximum at or above `max` (1, 2 or 5 times a power of ten).
fn nice_ceiling(max: f64) -> f64 {
    if max <= 0.0 {
        return 1.0;
    }
    let p = 10f64.powf(max.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= max {
            return m * p;
        }
    }
    10.0 * p
}

/// The chart of `days` (oldest first); `label` formats a value (`$0.12`, `1,204`).
/// With `whole`, the values are counts: the gridlines fall on whole numbers.
pub(crate) fn bars(
    days: &[Day],
    title: &str,
    whole: bool,
    label: &dyn Fn(f64) -> String,
) -> String {
    let n = days.len().max(1) as f64;
    let max = days.iter().map(|d| d.value).fold(0.0, f64::max);
    // Four gridlines above zero: for counts, each a whole, round step.
    let top = if whole {
        4.0 * nice_ceiling(max / 4.0).max(1.0)
    } else {
        nice_ceiling(max)
    };
    let plot_w = W - LEFT - 8.0;
    let plot_h = H - TOP - BOTTOM;
    let slot = plot_w / n;
    let bar_w = (slot * 0.7).max(1.0);
    let mut svg = String::with_capacity(4096 + days.len() * 200);
    let total: f64 = days.iter().map(|d| d.value).sum();
    let _ = write!(
        svg,
        "<svg class=\"chart\" viewBox=\"0 0 {W} {H}\" role=\"img\" aria-labelledby=\"chart-title\" \
         xmlns=\"http://www.w3.org/2000/svg\"><title id=\"chart-title\">{} (total {})</title>",
        esc(title),
        esc(&label(total))
    );
    for i in 0..=4 {
        let v = top * f64::from(i) / 4.0;
        let y = TOP + plot_h - plot_h * f64::from(i) / 4.0;
        let _ = write!(
            svg,
            "<line class=\"grid\" x1=\"{LEFT}\" x2=\"{}\" y1=\"{y:.1}\" y2=\"{y:.1}\"/>\
             <text class=\"axis\" x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            W - 8.0,
            LEFT - 6.0,
            y + 4.0,
            esc(&label(v))
        );
    }
    for (i, d) in days.iter().enumerate() {
        let h = if top > 0.0 {
            plot_h * d.value / top
        } else {
            0.0
        };
        let x = LEFT + slot * i as f64 + (slot - bar_w) / 2.0;
        let y = TOP + plot_h - h;
        let _ = write!(
            svg,
            "<rect class=\"bar\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{bar_w:.1}\" height=\"{h:.1}\" rx=\"2\">\
             <title>{}: {}</title></rect>",
            esc(&d.date),
            esc(&label(d.value))
        );
        // A date under every seventh bar, counted from the newest (always shown).
        if (days.len() - 1 - i).is_multiple_of(7) {
            let _ = write!(
                svg,
                "<text class=\"axis\" x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{}</text>",
                x + bar_w / 2.0,
                H - 6.0,
                esc(d.date.get(5..).unwrap_or(&d.date))
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_day_is_a_bar_with_its_figure() {
        let days = vec![
            Day {
                date: "2026-11-01".into(),
                value: 3.0,
            },
            Day {
                date: "2026-11-02".into(),
                value: 0.0,
            },
            Day {
                date: "2026-11-03".into(),
                value: 7.0,
            },
        ];
        let svg = bars(&days, "Requests <per day>", true, &|v| format!("{v:.0}"));
        assert!(svg.contains(">8</text>"), "whole gridlines: {svg}");
        assert_eq!(svg.matches("<rect").count(), 3);
        assert!(svg.contains("<title>2026-11-03: 7</title>"));
        assert!(svg.contains("Requests &lt;per day&gt; (total 10)"));
        assert!(!svg.contains("style="));
        assert_eq!(nice_ceiling(7.0), 10.0);
        assert_eq!(nice_ceiling(0.13), 0.2);
        assert_eq!(nice_ceiling(0.0), 1.0);
    }
}
