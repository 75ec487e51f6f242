//! `sweep.png`: throughput, p99 latency, the server's CPU per operation
//! (when the runs measured it) and, when they tried several shard counts,
//! how close throughput came to growing in proportion to them.
//!
//! The x axis is the shard count, with one rankd curve per connection count;
//! a sweep of connection counts on one shard count puts the connections on
//! the x axis instead. Redis, run once per connection count, is drawn
//! beside: a dashed horizontal line against shards, a curve against
//! connections. Text needs a TrueType font, loaded at run time (DejaVu Sans,
//! or `RANKD_CHART_FONT`); without one the chart is drawn without any text
//! rather than not at all.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use plotters::coord::Shift;
use plotters::prelude::*;

/// The font used when `RANKD_CHART_FONT` is not set.
pub const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const FAMILY: &str = "sans-serif";
/// rankd's curves, one colour per connection count (cycled past six).
const RANKD_COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
];
const REDIS_COLOR: RGBColor = RGBColor(214, 39, 40);
const TARGET_COLOR: RGBColor = RGBColor(90, 90, 90);

/// Scaling the sweep's chart marks as the aim: S shards giving at least
/// 0.8 times S times one shard's throughput.
const SCALING_TARGET: f64 = 0.8;

/// Where a panel's legend column starts, in pixels from its left.
const LEGEND_LEFT: i32 = 770;

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
    /// Connection count.
    pub connections: usize,
    /// What the run measured.
    pub run: Figures,
    /// Throughput over linear scaling from the sweep's fewest shards, at
    /// the same connection count.
    pub scaling: f64,
}

/// Redis's run at one connection count.
#[derive(Debug, Clone, Copy)]
pub struct RedisPoint {
    /// Connection count.
    pub connections: usize,
    /// What the run measured.
    pub run: Figures,
}

/// What the x axis counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Axis {
    Shards,
    Connections,
}

/// Which dimension of the sweep goes where: the x axis is the shard count
/// unless only the connection count varied; each value of the other
/// dimension is a curve of its own.
#[derive(Debug, PartialEq)]
struct Layout {
    axis: Axis,
    /// The x axis's values in order, drawn one tick apart from x = 1.
    ticks: Vec<usize>,
    /// The other dimension's values: one rankd curve each.
    curves: Vec<usize>,
}

impl Layout {
    fn of(points: &[Point]) -> Layout {
        let shards: BTreeSet<usize> = points.iter().map(|p| p.shards).collect();
        let connections: BTreeSet<usize> = points.iter().map(|p| p.connections).collect();
        if shards.len() == 1 && connections.len() > 1 {
            Layout {
                axis: Axis::Connections,
                ticks: connections.into_iter().collect(),
                curves: shards.into_iter().collect(),
            }
        } else {
            Layout {
                axis: Axis::Shards,
                ticks: shards.into_iter().collect(),
                curves: connections.into_iter().collect(),
            }
        }
    }

    /// A run's place on the x axis, and the curve it belongs to.
    fn place(&self, shards: usize, connections: usize) -> (i32, usize) {
        let (x, curve) = match self.axis {
            Axis::Shards => (shards, connections),
            Axis::Connections => (connections, shards),
        };
        (self.position(x), curve)
    }

    fn position(&self, x: usize) -> i32 {
        self.ticks.iter().position(|&t| t == x).map_or(0, |i| i as i32 + 1)
    }

    /// The right end of the x axis.
    fn x_max(&self) -> i32 {
        self.ticks.len() as i32 + 1
    }

    fn x_desc(&self) -> &'static str {
        match self.axis {
            Axis::Shards => "shards",
            Axis::Connections => "connections",
        }
    }

    /// The legend's name for curve `value`: bare when there is one curve.
    fn curve_label(&self, system: &str, value: usize) -> String {
        if self.curves.len() == 1 {
            return system.to_string();
        }
        match self.axis {
            Axis::Shards => format!("{system}, {value} conn{}", if value == 1 { "" } else { "s" }),
            Axis::Connections => format!("{system}, {value} shard{}", if value == 1 { "" } else { "s" }),
        }
    }

    fn color(&self, curve: usize) -> RGBColor {
        let i = self.curves.iter().position(|&c| c == curve).unwrap_or(0);
        RANKD_COLORS[i % RANKD_COLORS.len()]
    }
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

/// Draws the chart to `path` (PNG), 1000 wide and 300 high a panel, the
/// legends in a column on the right:
/// throughput and p99, then CPU when every rankd run has its CPU figure,
/// then scaling when the runs had more than one shard count.
pub fn draw(path: &Path, title: &str, points: &[Point], redis: &[RedisPoint]) -> Result<(), String> {
    draw_with(path, title, points, redis, font_ready())
}

/// One chart of the picture: one figure against the x axis.
struct Panel {
    /// The y axis's label: the figure and its unit.
    y_desc: &'static str,
    series: Vec<Series>,
    /// Formats a value, given the axis top (for the number of decimals).
    format: fn(f64, f64) -> String,
}

/// One curve or line of a panel.
struct Series {
    label: String,
    color: RGBColor,
    shape: Shape,
}

enum Shape {
    /// Runs joined by a solid line, each marked and labelled with its value.
    Curve(Vec<(i32, f64)>),
    /// A dashed line across the panel at one value (Redis against shards,
    /// or an aim), its value given in the legend.
    Level(f64),
}

impl Series {
    fn values(&self) -> Vec<f64> {
        match &self.shape {
            Shape::Curve(points) => points.iter().map(|p| p.1).collect(),
            Shape::Level(value) => vec![*value],
        }
    }
}

/// The series of one figure: a rankd curve per connection count (or shard
/// count), and Redis's. `None` when a rankd run lacks the figure.
fn series_of(
    layout: &Layout,
    points: &[Point],
    redis: &[RedisPoint],
    figure: impl Fn(&Figures) -> Option<f64>,
) -> Option<Vec<Series>> {
    let mut series = rankd_curves(layout, points, |p| figure(&p.run))?;
    match layout.axis {
        Axis::Shards => {
            for r in redis {
                let Some(value) = figure(&r.run) else { continue };
                let color = if layout.curves.len() == 1 { REDIS_COLOR } else { layout.color(r.connections) };
                let label = layout.curve_label("redis", r.connections);
                series.push(Series { label, color, shape: Shape::Level(value) });
            }
        }
        Axis::Connections => {
            let mut line: Vec<(i32, f64)> =
                redis.iter().filter_map(|r| Some((layout.position(r.connections), figure(&r.run)?))).collect();
            line.sort_by_key(|p| p.0);
            if !line.is_empty() {
                series.push(Series { label: "redis".into(), color: REDIS_COLOR, shape: Shape::Curve(line) });
            }
        }
    }
    Some(series)
}

/// rankd's curves of one figure of its runs; `None` when a run lacks it.
fn rankd_curves(layout: &Layout, points: &[Point], figure: impl Fn(&Point) -> Option<f64>) -> Option<Vec<Series>> {
    let mut series = Vec::new();
    for &curve in &layout.curves {
        let mut line = Vec::new();
        for p in points {
            let (x, of) = layout.place(p.shards, p.connections);
            if of == curve {
                line.push((x, figure(p)?));
            }
        }
        line.sort_by_key(|p| p.0);
        let label = layout.curve_label("rankd", curve);
        series.push(Series { label, color: layout.color(curve), shape: Shape::Curve(line) });
    }
    Some(series)
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

fn panels(points: &[Point], redis: &[RedisPoint], layout: &Layout) -> Vec<Panel> {
    let throughput = series_of(layout, points, redis, |f| Some(f.ops_per_sec)).unwrap_or_default();
    let latency = series_of(layout, points, redis, |f| Some(f.p99_us as f64 / 1000.0)).unwrap_or_default();
    let mut panels = vec![
        Panel { y_desc: "throughput (ops/s)", series: throughput, format: format_rate },
        Panel { y_desc: "p99 latency (ms)", series: latency, format: format_ms },
    ];
    if let Some(cpu) = series_of(layout, points, redis, |f| f.server_cpu_us) {
        panels.push(Panel { y_desc: "server CPU per op (us)", series: cpu, format: format_us });
    }
    if layout.axis == Axis::Shards && layout.ticks.len() > 1 {
        // Scaling is a rankd figure: no Redis beside it, the aim instead.
        let mut scaling = rankd_curves(layout, points, |p| Some(p.scaling)).unwrap_or_default();
        scaling.push(Series { label: "target".into(), color: TARGET_COLOR, shape: Shape::Level(SCALING_TARGET) });
        panels.push(Panel { y_desc: "throughput / linear", series: scaling, format: format_ratio });
    }
    panels
}

pub(crate) fn draw_with(
    path: &Path,
    title: &str,
    points: &[Point],
    redis: &[RedisPoint],
    text: bool,
) -> Result<(), String> {
    let layout = Layout::of(points);
    let panels = panels(points, redis, &layout);
    let root = BitMapBackend::new(path, (1000, 300 * panels.len() as u32)).into_drawing_area();
    root.fill(&WHITE).map_err(err)?;
    let body = if text { root.titled(title, (FAMILY, 22)).map_err(err)? } else { root.margin(10, 0, 0, 0) };
    let areas = body.split_evenly((panels.len(), 1));
    for (area, panel) in areas.iter().zip(&panels) {
        draw_panel(area, panel, &layout, text)?;
    }
    root.present().map_err(err)
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    panel: &Panel,
    layout: &Layout,
    text: bool,
) -> Result<(), String>
where
    DB::ErrorType: 'static,
{
    let y_top = panel.series.iter().flat_map(Series::values).fold(0.0, f64::max).max(1e-6) * 1.25;
    let x_max = layout.x_max();
    // The legend has a column of its own: inside the plot it would cover
    // the curves of a sweep with several connection counts.
    let (area, legend_area) = area.split_horizontally(LEGEND_LEFT);
    let mut builder = ChartBuilder::on(&area);
    builder.margin(12);
    if text {
        builder.x_label_area_size(42).y_label_area_size(80);
    }
    let mut chart = builder.build_cartesian_2d(0..x_max, 0.0..y_top).map_err(err)?;
    let format = panel.format;
    if text {
        let tick_label = |x: &i32| {
            usize::try_from(*x - 1).ok().and_then(|i| layout.ticks.get(i)).map_or(String::new(), usize::to_string)
        };
        chart
            .configure_mesh()
            .x_desc(layout.x_desc())
            .y_desc(panel.y_desc)
            .x_labels(x_max as usize + 1)
            .x_label_formatter(&tick_label)
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
        for x in 1..x_max {
            chart.draw_series(LineSeries::new([(x, 0.0), (x, y_top)], grid)).map_err(err)?;
        }
        chart.draw_series(LineSeries::new([(0, y_top), (0, 0.0), (x_max, 0.0)], BLACK)).map_err(err)?;
    }

    for (i, series) in panel.series.iter().enumerate() {
        let color = series.color;
        match &series.shape {
            Shape::Curve(points) => {
                chart.draw_series(LineSeries::new(points.iter().copied(), color.stroke_width(3))).map_err(err)?;
                chart.draw_series(points.iter().map(|&p| Circle::new(p, 5, color.filled()))).map_err(err)?;
                if text {
                    let labels = points.iter().map(|&(x, y)| {
                        EmptyElement::at((x, y)) + Text::new(format(y, y), (8, -20), (FAMILY, 14).into_font())
                    });
                    chart.draw_series(labels).map_err(err)?;
                }
            }
            Shape::Level(value) => {
                let level = [(0, *value), (x_max, *value)];
                chart.draw_series(DashedLineSeries::new(level, 10, 6, color.stroke_width(2))).map_err(err)?;
            }
        }
        // The legend entry: a level's value is written in it.
        let y = 24 + 22 * i as i32;
        let sample: Vec<(i32, i32)> = match series.shape {
            Shape::Curve(_) => vec![(0, y), (28, y)],
            Shape::Level(_) => vec![(0, y), (10, y)],
        };
        legend_area.draw(&PathElement::new(sample, color.stroke_width(3))).map_err(err)?;
        if matches!(series.shape, Shape::Level(_)) {
            legend_area.draw(&PathElement::new(vec![(18, y), (28, y)], color.stroke_width(3))).map_err(err)?;
        }
        if text {
            let label = match series.shape {
                Shape::Curve(_) => series.label.clone(),
                Shape::Level(value) => format!("{} {}", series.label, format(value, value)),
            };
            legend_area.draw(&Text::new(label, (36, y - 8), (FAMILY, 14).into_font())).map_err(err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(shards: usize, connections: usize, ops_per_sec: f64, server_cpu_us: Option<f64>) -> Point {
        Point {
            shards,
            connections,
            run: Figures { ops_per_sec, p99_us: 5000, server_cpu_us },
            scaling: ops_per_sec / (10_000.0 * shards as f64),
        }
    }

    #[test]
    fn the_x_axis_is_shards_unless_only_connections_vary() {
        let grid = [point(2, 64, 1.0, None), point(1, 8, 1.0, None), point(1, 64, 1.0, None), point(2, 8, 1.0, None)];
        let layout = Layout::of(&grid);
        assert_eq!(layout, Layout { axis: Axis::Shards, ticks: vec![1, 2], curves: vec![8, 64] });
        assert_eq!(layout.place(2, 8), (2, 8));
        assert_eq!(layout.curve_label("redis", 64), "redis, 64 conns");

        let connections = [point(4, 512, 1.0, None), point(4, 1, 1.0, None), point(4, 64, 1.0, None)];
        let layout = Layout::of(&connections);
        assert_eq!(layout, Layout { axis: Axis::Connections, ticks: vec![1, 64, 512], curves: vec![4] });
        assert_eq!((layout.place(4, 512), layout.x_max()), ((3, 4), 4));
        assert_eq!(layout.curve_label("rankd", 4), "rankd", "one curve needs no name");

        let one = Layout::of(&[point(2, 8, 1.0, None)]);
        assert_eq!(one, Layout { axis: Axis::Shards, ticks: vec![2], curves: vec![8] });
    }

    #[test]
    fn each_connection_count_is_a_curve_and_redis_a_level_beside_it() {
        let grid = [point(1, 8, 100.0, Some(9.0)), point(2, 8, 150.0, Some(8.0)), point(1, 64, 300.0, None)];
        let redis = [
            RedisPoint { connections: 8, run: Figures { ops_per_sec: 120.0, p99_us: 1, server_cpu_us: Some(7.0) } },
            RedisPoint { connections: 64, run: Figures { ops_per_sec: 200.0, p99_us: 1, server_cpu_us: Some(6.0) } },
        ];
        let layout = Layout::of(&grid);
        let series = series_of(&layout, &grid, &redis, |f| Some(f.ops_per_sec)).unwrap();
        let shapes: Vec<(&str, Vec<f64>)> = series.iter().map(|s| (s.label.as_str(), s.values())).collect();
        assert_eq!(
            shapes,
            [
                ("rankd, 8 conns", vec![100.0, 150.0]),
                ("rankd, 64 conns", vec![300.0]),
                ("redis, 8 conns", vec![120.0]),
                ("redis, 64 conns", vec![200.0]),
            ]
        );
        assert!(matches!(series[2].shape, Shape::Level(_)));
        assert_eq!(series[0].color, series[2].color, "redis is drawn in its connection count's colour");
        // One rankd run without a CPU figure: no CPU panel.
        assert!(series_of(&layout, &grid, &redis, |f| f.server_cpu_us).is_none());

        // Connections on the x axis: Redis is a curve too.
        let conns = [point(1, 64, 300.0, None), point(1, 8, 100.0, None)];
        let layout = Layout::of(&conns);
        let series = series_of(&layout, &conns, &redis, |f| Some(f.ops_per_sec)).unwrap();
        let Shape::Curve(redis_curve) = &series[1].shape else { panic!("redis is a curve against connections") };
        assert_eq!((series[1].label.as_str(), redis_curve.as_slice()), ("redis", &[(1, 120.0), (2, 200.0)][..]));
        let Shape::Curve(rankd_curve) = &series[0].shape else { panic!("rankd is a curve") };
        assert_eq!(rankd_curve.as_slice(), &[(1, 100.0), (2, 300.0)]);
    }

    #[test]
    fn draws_a_png_without_a_font() {
        let dir = tempfile::tempdir().unwrap();
        let redis = |connections| RedisPoint {
            connections,
            run: Figures { ops_per_sec: 25_000.0, p99_us: 4000, server_cpu_us: Some(9.0) },
        };
        let shards = |cpu| vec![point(1, 8, 10_000.0, cpu), point(2, 8, 18_000.0, cpu), point(4, 8, 30_000.0, cpu)];
        let mut grid = shards(Some(11.0));
        grid.extend([point(1, 64, 12_000.0, Some(8.0)), point(2, 64, 20_000.0, Some(7.0))]);
        let connections = vec![point(2, 1, 3_000.0, Some(30.0)), point(2, 64, 18_000.0, Some(12.0))];
        // Throughput and p99; CPU when measured; scaling when the shard
        // counts differ.
        for (points, height) in [
            (vec![point(2, 8, 18_000.0, None)], 600),
            (vec![point(2, 8, 18_000.0, Some(11.0))], 900),
            (shards(None), 900),
            (shards(Some(11.0)), 1200),
            (grid, 1200),
            (connections, 900),
        ] {
            let path = dir.path().join("sweep.png");
            draw_with(&path, "title", &points, &[redis(8), redis(64)], false).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
            // The IHDR chunk: width and height, big-endian, from byte 16.
            assert_eq!(u32::from_be_bytes(bytes[20..24].try_into().unwrap()), height);
        }
    }
}
