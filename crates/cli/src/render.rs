//! Small text helpers shared by the commands' human-readable output.

use std::time::Duration;

/// A lease or wait for people: `850 ms`, `29.4 s`, `12 min 3 s`.
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms < 1_000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", d.as_secs_f64())
    } else {
        let secs = d.as_secs();
        format!("{} min {} s", secs / 60, secs % 60)
    }
}

/// Rows as left-aligned columns separated by two spaces, the last column unpadded.
pub fn table(rows: &[Vec<String>]) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|cell| cell.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                let pad = widths[c] - cell.chars().count();
                line.push_str(cell);
                line.extend(std::iter::repeat_n(' ', pad + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration(Duration::from_millis(850)), "850 ms");
        assert_eq!(duration(Duration::from_millis(29_440)), "29.4 s");
        assert_eq!(duration(Duration::from_secs(723)), "12 min 3 s");
    }

    #[test]
    fn tables_align() {
        let rows = vec![
            vec!["NAME".to_string(), "TTL".to_string()],
            vec!["inventory:42".to_string(), "1 s".to_string()],
        ];
        assert_eq!(table(&rows), "NAME          TTL\ninventory:42  1 s\n");
    }
}
