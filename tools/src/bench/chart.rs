//! `bench.png`: bandwidth against message size (rnic solid, the kernel's
//! transports dashed), and the 64-byte round trips (median, with a line up
//! to the 99th percentile).

use std::path::Path;

use plotters::prelude::*;
use plotters::style::FontStyle;

use super::{size_label, Report};

type Res<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// Where the labels' typeface is looked for (Debian's fonts-dejavu-core first).
const FONTS: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];

fn load_font() -> Res<()> {
    static LOADED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let ok = *LOADED.get_or_init(|| {
        let Some(bytes) = FONTS.iter().find_map(|p| std::fs::read(p).ok()) else {
            return false;
        };
        // plotters keeps fonts for the life of the process.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(format!(
            "no TrueType font for the labels (install fonts-dejavu-core; looked in {})",
            FONTS.join(", ")
        )
        .into())
    }
}

const PALETTE: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// Draw the report's chart into `path`.
pub fn draw(r: &Report, path: &Path) -> Res<()> {
    load_font()?;
    let root = BitMapBackend::new(path, (1400, 620)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = r
        .context
        .iter()
        .map(|(k, v)| match k.as_str() {
            "settings" => String::new(),
            _ => v.clone(),
        })
        .filter(|v| !v.is_empty())
        .collect::<Vec<_>>()
        .join(", ");
    let root = root.titled(
        &format!("rnic bench on loopback: {title}"),
        ("sans-serif", 18),
    )?;
    let (left, right) = root.split_horizontally(900);
    bandwidth(r, &left)?;
    round_trips(r, &right)?;
    root.present()?;
    Ok(())
}

fn bandwidth(r: &Report, area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>) -> Res<()> {
    // The sizes are evenly spaced (powers of four): one column each.
    let mut sizes: Vec<u32> = r
        .series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let column = |size: u32| sizes.iter().position(|&s| s == size).unwrap_or(0) as f64;
    let gbps = r.series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
    let top = gbps.clone().fold(1.0f64, f64::max) * 1.5;
    let bottom = gbps.filter(|&g| g > 0.0).fold(top, f64::min) / 1.5;
    let mut chart = ChartBuilder::on(area)
        .caption("Bandwidth (log scale)", ("sans-serif", 16))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(
            -0.3..sizes.len().max(1) as f64 - 0.7,
            (bottom..top).log_scale(),
        )?;
    chart
        .configure_mesh()
        .x_desc("message size")
        .y_desc("Gb/s")
        .x_labels(sizes.len() * 4)
        .x_label_formatter(&|x| {
            let i = x.round();
            match sizes.get(i as usize) {
                Some(&s) if (x - i).abs() < 0.01 => size_label(s),
                _ => String::new(),
            }
        })
        .y_label_formatter(&|y| format!("{y}"))
        .label_style(("sans-serif", 12))
        .draw()?;
    for (i, s) in r.series.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let pts: Vec<(f64, f64)> = s.points.iter().map(|p| (column(p.0), p.1)).collect();
        let style = color.stroke_width(if s.rnic { 3 } else { 2 });
        let legend = chart
            .draw_series(DashedLineSeries::new(
                pts.clone(),
                if s.rnic { 1000 } else { 8 },
                if s.rnic { 0 } else { 5 },
                style,
            ))?
            .label(&s.name);
        legend.legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], style));
        chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 12))
        .draw()?;
    Ok(())
}

fn round_trips(
    r: &Report,
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
) -> Res<()> {
    let n = r.round_trips.len().max(1);
    let top = r.round_trips.iter().map(|x| x.us[2]).fold(1.0f64, f64::max) * 1.1;
    // Short names, to fit under the bars: "UDP", "UDP shaped", "rnic WRITE".
    let names: Vec<String> = r
        .round_trips
        .iter()
        .map(|x| {
            x.name
                .replace(" ping-pong", "")
                .replace(", WRITE-shaped", " shaped")
        })
        .collect();
    let mut chart = ChartBuilder::on(area)
        .caption(
            "64 B round trip, polling (bar p50, line to p99)",
            ("sans-serif", 16),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55)
        .build_cartesian_2d(0.0..n as f64, 0.0..top)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x| {
            let i = x.floor() as usize;
            if (x - x.floor() - 0.5).abs() < 0.01 {
                names.get(i).cloned().unwrap_or_default()
            } else {
                String::new()
            }
        })
        .y_desc("us")
        .label_style(("sans-serif", 12))
        .draw()?;
    for (i, x) in r.round_trips.iter().enumerate() {
        let color = if x.rnic { PALETTE[3] } else { PALETTE[7] };
        let at = i as f64;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(at + 0.2, 0.0), (at + 0.8, x.us[1])],
            color.filled(),
        )))?;
        chart.draw_series(std::iter::once(PathElement::new(
            vec![(at + 0.5, x.us[1]), (at + 0.5, x.us[2])],
            BLACK.stroke_width(2),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{:.1}", x.us[1]),
            (at + 0.3, x.us[1] + top * 0.02),
            ("sans-serif", 12),
        )))?;
    }
    Ok(())
}
