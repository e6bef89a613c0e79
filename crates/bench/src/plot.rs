//! The handoff-gap distribution, leasehold vs the two polling baselines (SVG, log scale).

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use crate::report::Results;

pub(crate) fn handoff_gaps(results: &Results, dir: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("handoff-gaps.svg");
    let series = [
        ("leasehold (pub/sub)", &results.handoff, BLUE),
        ("polling, 10 ms sleep", &results.handoff_polling_10ms, RED),
        (
            "polling, 100 ms sleep",
            &results.handoff_polling_100ms,
            BLACK,
        ),
    ];
    let max_us = series
        .iter()
        .filter_map(|(_, h, _)| h.as_ref())
        .flat_map(|h| h.gap_curve.iter().map(|(_, v)| *v))
        .max()
        .unwrap_or(1_000)
        .max(1_000) as f64;
    let root = SVGBackend::new(&path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Handoff gap: release returned -> next acquire returned",
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(50f64..100f64, (1f64..max_us * 2.0).log_scale())?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("gap (microseconds, log)")
        .draw()?;
    for (label, run, color) in series {
        let Some(run) = run else { continue };
        let points: Vec<(f64, f64)> = run
            .gap_curve
            .iter()
            .map(|(p, v)| (*p, (*v).max(1) as f64))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(label)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|p| Circle::new(p, 3, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    root.present()?;
    drop(chart);
    drop(root);
    Ok(path)
}
