//! `sweep.png`: throughput, p99 latency, the server's CPU per operation
//! (when the runs measured it) and, when they tried several shard counts,
//! how close throughput came to growing in proportion to them, all against
//! shard count, with Redis as a horizontal reference line. Text needs a
//! TrueType font, loaded at run time (DejaVu Sans, or `RANKD_CHART_FONT`);
//! without one the chart is drawn without any text rather than not at all.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

/// The font used when `RANKD_CHART_FONT` is not set.
pub const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const FAMILY: &str = "sans-serif";
const RANKD_COLOR: RGBColor = RGBColor(31, 119, 180);
const REDIS_COLOR: RGBColor = RGBColor(214, 39, 40);
const TARGET_COLOR: RGBColor = RGBColor(90, 90, 90);

/// Scaling the sweep's chart marks as the aim: S shards giving at least
/// 0.8 times S times one shard's throughput.
const SCALING_TARGET: f64 = 0.8;

/// What the chart shows of one run (rankd's, or the Redis reference).
#[derive(Debug, Clone, Copy)]
pub struct Figures {
    /// Throughput.
    pub ops_per_sec: f64,
    /// p99 latency, microseconds.
    pub p99_us: u64,
    /// Server CPU per operation, microseconds, if measured.
    pub server_cpu_us: Option<f64>,
}

/// One rankd run of the sweep.
#[derive(Debug, Clone, Copy)]
pub struct Point {
    /// Shard count.
    pub shards: usize,
    /// What the run measured.
    pub run: Figures,
    /// Throughput over linear scaling from the sweep's fewest shards.
    pub scaling: f64,
}

/// Registers the font once; whether text can be drawn.
fn font_ready() -> bool {
    static READY: OnceLock<bool> = OnceLock::new();
    *READY.get_or_init(|| {
        let path = std::env::var_os("RANKD_CHART_FONT").map_or_else(|| PathBuf::from(DEFAULT_FONT), PathBuf::from);
        let registered = std::fs::read(&path).ok().is_some_and(|bytes| {
            // plotters keeps fonts for the life of the process.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            plotters::style::register_font(FAMILY, FontStyle::Normal, bytes).is_ok()
        });
        if !registered {
            eprintln!("rankd-bench: no usable font at {}; drawing the chart without text", path.display());
        }
        registered
    })
}

/// Draws the chart to `path` (PNG), 1000 wide and 300 high a panel:
/// throughput and p99, then CPU when every rankd run has its CPU figure,
/// then scaling when the runs had more than one shard count.
pub fn draw(path: &Path, title: &str, points: &[Point], redis: Option<Figures>) -> Result<(), String> {
    draw_with(path, title, points, redis, font_ready())
}

/// One chart of the picture: one figure against shard count.
struct Panel<'a> {
    /// The y axis's label: the figure and its unit.
    y_desc: &'a str,
    /// `(shards, figure)` of each rankd run.
    points: Vec<(i32, f64)>,
    /// A line to compare against (Redis, or the scaling aim), if any.
    reference: Option<Reference>,
    /// Formats a value, given the axis top (for the number of decimals).
    format: fn(f64, f64) -> String,
    /// Whether the legend goes upper left rather than upper right: a curve
    /// that rises to the right (throughput) leaves that corner free.
    legend_left: bool,
}

/// A horizontal line across a panel: Redis's figure, or an aim.
#[derive(Clone, Copy)]
struct Reference {
    /// Where the line is drawn, in the panel's unit.
    value: f64,
    /// What it is, written above its right end.
    label: &'static str,
    /// Tells it apart from rankd's curve.
    color: RGBColor,
}

impl Reference {
    fn redis(value: f64) -> Self {
        Self { value, label: "redis", color: REDIS_COLOR }
    }
}

fn format_rate(v: f64, _top: f64) -> String {
    if v >= 1e6 {
        format!("{:.2}M", v / 1e6)
    } else if v >= 1e3 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

fn format_us(v: f64, _top: f64) -> String {
    format!("{v:.1}")
}

fn format_ratio(v: f64, _top: f64) -> String {
    format!("{v:.2}")
}

fn format_ms(v: f64, top: f64) -> String {
    if top >= 100.0 {
        format!("{v:.0}")
    } else if top >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

pub(crate) fn draw_with(
    path: &Path,
    title: &str,
    points: &[Point],
    redis: Option<Figures>,
    text: bool,
) -> Result<(), String> {
    let cpu: Option<Vec<(i32, f64)>> = points.iter().map(|p| Some((p.shards as i32, p.run.server_cpu_us?))).collect();
    let several_shard_counts = points.iter().any(|p| p.shards != points[0].shards);
    let panel_count = 2 + usize::from(cpu.is_some()) + usize::from(several_shard_counts);
    let root = BitMapBackend::new(path, (1000, 300 * panel_count as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let body = if text { root.titled(title, (FAMILY, 22)).map_err(err)? } else { root.margin(10, 0, 0, 0) };
    let areas = body.split_evenly((panel_count, 1));
    let x_max = points.iter().map(|p| p.shards).max().unwrap_or(1) as i32 + 1;
    let throughput = Panel {
        y_desc: "throughput (ops/s)",
        points: points.iter().map(|p| (p.shards as i32, p.run.ops_per_sec)).collect(),
        reference: redis.map(|r| Reference::redis(r.ops_per_sec)),
        format: format_rate,
        legend_left: true,
    };
    let latency = Panel {
        y_desc: "p99 latency (ms)",
        points: points.iter().map(|p| (p.shards as i32, p.run.p99_us as f64 / 1000.0)).collect(),
        reference: redis.map(|r| Reference::redis(r.p99_us as f64 / 1000.0)),
        format: format_ms,
        legend_left: false,
    };
    let mut panels = vec![throughput, latency];
    if let Some(cpu) = cpu {
        panels.push(Panel {
            y_desc: "server CPU per op (us)",
            points: cpu,
            reference: redis.and_then(|r| r.server_cpu_us).map(Reference::redis),
            format: format_us,
            legend_left: false,
        });
    }
    if several_shard_counts {
        panels.push(Panel {
            y_desc: "throughput / linear",
            points: points.iter().map(|p| (p.shards as i32, p.scaling)).collect(),
            reference: Some(Reference { value: SCALING_TARGET, label: "target", color: TARGET_COLOR }),
            format: format_ratio,
            legend_left: false,
        });
    }
    for (area, panel) in areas.iter().zip(&panels) {
        draw_panel(area, panel, x_max, text)?;
    }
    root.present().map_err(err)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    x_max: i32,
    text: bool,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let y_top =
        panel.points.iter().map(|p| p.1).chain(panel.reference.map(|r| r.value)).fold(0.0, f64::max).max(1e-6) * 1.25;
    let mut builder = ChartBuilder::on(area);
    builder.margin(12);
    if text {
        builder.x_label_area_size(42).y_label_area_size(80);
    }
    let mut chart = builder.build_cartesian_2d(0..x_max, 0.0..y_top).map_err(err)?;
    let format = panel.format;
    if text {
        chart
            .configure_mesh()
            .x_desc("shards")
            .y_desc(panel.y_desc)
            .x_labels((x_max as usize + 1).min(17))
            .y_labels(6)
            .y_label_formatter(&|v| format(*v, y_top))
            .label_style((FAMILY, 14))
            .axis_desc_style((FAMILY, 15))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(err)?;
    } else {
        // Axes and a light grid, drawn by hand: the mesh would need text.
        let grid = BLACK.mix(0.15);
        for i in 1..=5 {
            let y = y_top * f64::from(i) / 5.0;
            chart.draw_series(LineSeries::new([(0, y), (x_max, y)], grid)).map_err(err)?;
        }
        for &(x, _) in &panel.points {
            chart.draw_series(LineSeries::new([(x, 0.0), (x, y_top)], grid)).map_err(err)?;
        }
        chart.draw_series(LineSeries::new([(0, y_top), (0, 0.0), (x_max, 0.0)], BLACK)).map_err(err)?;
    }

    let line =
        chart.draw_series(LineSeries::new(panel.points.iter().copied(), RANKD_COLOR.stroke_width(3))).map_err(err)?;
    if text {
        line.label("rankd").legend(|(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], RANKD_COLOR.stroke_width(3)));
    }
    chart.draw_series(panel.points.iter().map(|&p| Circle::new(p, 5, RANKD_COLOR.filled()))).map_err(err)?;
    if text {
        chart
            .draw_series(
                panel.points.iter().map(|&(x, y)| {
                    EmptyElement::at((x, y)) + Text::new(format(y, y), (8, -20), (FAMILY, 14).into_font())
                }),
            )
            .map_err(err)?;
    }
    if let Some(Reference { value: r, label, color }) = panel.reference {
        let line = chart.draw_series(LineSeries::new([(0, r), (x_max, r)], color.stroke_width(2))).map_err(err)?;
        if text {
            line.label(label).legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(2)));
            let caption = format!("{label} {}", format(r, r));
            // Right-aligned at the line's end, ~8 px a character.
            let left = -(caption.len() as i32 * 8 + 10);
            chart
                .draw_series(std::iter::once(
                    EmptyElement::at((x_max, r))
                        + Text::new(caption, (left, -20), (FAMILY, 15).into_font().color(&color)),
                ))
                .map_err(err)?;
        }
    }
    if text {
        // The reference's label sits above its right end: a line in the
        // upper half would put it under an upper legend.
        let legend = match panel.reference {
            Some(r) if r.value > y_top / 2.0 => SeriesLabelPosition::LowerRight,
            _ if panel.legend_left => SeriesLabelPosition::UpperLeft,
            _ => SeriesLabelPosition::UpperRight,
        };
        chart
            .configure_series_labels()
            .position(legend)
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK.mix(0.5))
            .label_font((FAMILY, 14))
            .draw()
            .map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn draws_a_png_without_a_font() {
        let dir = tempfile::tempdir().unwrap();
        let point = |shards, ops_per_sec, p99_us, server_cpu_us| Point {
            shards,
            run: Figures { ops_per_sec, p99_us, server_cpu_us },
            scaling: ops_per_sec / (10_000.0 * shards as f64),
        };
        let redis = Figures { ops_per_sec: 25_000.0, p99_us: 4000, server_cpu_us: Some(9.0) };
        // Throughput and p99; CPU when measured; scaling when the shard
        // counts differ.
        let several =
            |cpu| vec![point(1, 10_000.0, 9000, cpu), point(2, 18_000.0, 7000, cpu), point(4, 30_000.0, 6000, cpu)];
        let one = |cpu| vec![point(2, 18_000.0, 7000, cpu)];
        for (points, height) in
            [(one(None), 600), (one(Some(11.0)), 900), (several(None), 900), (several(Some(11.0)), 1200)]
        {
            let path = dir.path().join("sweep.png");
            draw_with(&path, "title", &points, Some(redis), false).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
            // The IHDR chunk: width and height, big-endian, from byte 16.
            assert_eq!(u32::from_be_bytes(bytes[20..24].try_into().unwrap()), height);
        }
    }
}
