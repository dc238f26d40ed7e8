//! Renderings of evaluation metrics: JSON, a human table, and a CSV in the style of a model
//! card's `validation_mean16.csv` (`step,val_mean16,percent`).

use std::fmt::Write as _;

use serde_json::{json, Map, Value};

use crate::metrics::GroupMetrics;

/// One group's metrics as a JSON object with `mean@n`, `pass@k`, `maj@k`, `answered`,
/// `response_length/mean` and `response_length/clip_ratio` keys.
pub fn group_json(g: &GroupMetrics) -> Value {
    let mut m = Map::new();
    m.insert("data_source".into(), json!(g.data_source));
    m.insert("prompts".into(), json!(g.prompts));
    m.insert("n".into(), json!(g.n));
    m.insert(format!("mean@{}", g.n), json!(g.mean));
    for (k, v) in &g.pass_at_k {
        m.insert(format!("pass@{k}"), json!(v));
    }
    for (k, v) in &g.maj_at_k {
        m.insert(format!("maj@{k}"), json!(v));
    }
    m.insert("answered".into(), json!(g.answered));
    m.insert("response_length/mean".into(), json!(g.response_length));
    m.insert("response_length/clip_ratio".into(), json!(g.clip_ratio));
    Value::Object(m)
}

/// A fixed-width table: one row per group, values in percent but the mean response length
/// (`length`, tokens); `answered` is the share of samples with an answer to vote on, `clipped`
/// the share cut at the token limit.
pub fn table(groups: &[GroupMetrics]) -> String {
    let Some(first) = groups.first() else {
        return String::new();
    };
    let mut headers = vec![
        "data_source".to_string(),
        "prompts".to_string(),
        format!("mean@{}", first.n),
    ];
    headers.extend(first.pass_at_k.iter().map(|(k, _)| format!("pass@{k}")));
    headers.extend(first.maj_at_k.iter().map(|(k, _)| format!("maj@{k}")));
    headers.extend(["answered", "length", "clipped"].map(String::from));
    let rows: Vec<Vec<String>> = groups
        .iter()
        .map(|g| {
            let pct = |v: f64| format!("{:.2}", 100.0 * v);
            let mut r = vec![g.data_source.clone(), g.prompts.to_string(), pct(g.mean)];
            r.extend(g.pass_at_k.iter().map(|(_, v)| pct(*v)));
            r.extend(g.maj_at_k.iter().map(|(_, v)| pct(*v)));
            r.extend([
                pct(g.answered),
                format!("{:.1}", g.response_length),
                pct(g.clip_ratio),
            ]);
            r
        })
        .collect();
    let widths: Vec<usize> = (0..headers.len())
        .map(|c| {
            rows.iter()
                .map(|r| r[c].len())
                .chain([headers[c].len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    let line = |cells: &[String], out: &mut String| {
        for (c, cell) in cells.iter().enumerate() {
            if c == 0 {
                let _ = write!(out, "{cell:<w$}", w = widths[c]);
            } else {
                let _ = write!(out, "  {cell:>w$}", w = widths[c]);
            }
        }
        out.push('\n');
    };
    line(&headers, &mut out);
    for r in &rows {
        line(r, &mut out);
    }
    out
}

/// The CSV of mean@n per group: `[step,]data_source,val_mean{n},percent`, values with 12
/// decimals and percentages with 2, as in a model card's `validation_mean16.csv`.
pub fn mean_csv(groups: &[GroupMetrics], step: Option<i64>) -> String {
    let n = groups.first().map_or(0, |g| g.n);
    let mut out = String::new();
    if step.is_some() {
        out.push_str("step,");
    }
    let _ = writeln!(out, "data_source,val_mean{n},percent");
    for g in groups {
        if let Some(s) = step {
            let _ = write!(out, "{s},");
        }
        let _ = writeln!(
            out,
            "{},{:.12},{:.2}%",
            csv_field(&g.data_source),
            g.mean,
            100.0 * g.mean
        );
    }
    out
}

/// Quotes a CSV field when it holds a comma, a quote or a line break.
fn csv_field(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn groups() -> Vec<GroupMetrics> {
        vec![
            GroupMetrics {
                data_source: "bio,x".into(),
                prompts: 2,
                n: 2,
                mean: 0.325,
                pass_at_k: vec![(1, 0.325), (2, 0.5)],
                maj_at_k: vec![(1, 0.325), (2, 0.25)],
                answered: 0.75,
                response_length: 31.5,
                clip_ratio: 0.25,
            },
            GroupMetrics {
                data_source: "all".into(),
                prompts: 2,
                n: 2,
                mean: 0.48500000000000004,
                pass_at_k: vec![(1, 0.485), (2, 0.5)],
                maj_at_k: vec![(1, 0.485), (2, 0.25)],
                answered: 0.5,
                response_length: 40.0,
                clip_ratio: 0.0,
            },
        ]
    }

    #[test]
    fn csv_in_model_card_style() {
        assert_eq!(
            mean_csv(&groups(), None),
            "data_source,val_mean2,percent\n\"bio,x\",0.325000000000,32.50%\nall,0.485000000000,48.50%\n"
        );
        assert!(
            mean_csv(&groups(), Some(90)).starts_with("step,data_source,val_mean2,percent\n90,")
        );
    }

    #[test]
    fn json_keys() {
        let v = group_json(&groups()[0]);
        assert_eq!(v["mean@2"], json!(0.325));
        assert_eq!(v["pass@2"], json!(0.5));
        assert_eq!(v["maj@2"], json!(0.25));
        assert_eq!(v["answered"], json!(0.75));
        assert_eq!(v["response_length/mean"], json!(31.5));
        assert_eq!(v["response_length/clip_ratio"], json!(0.25));
    }

    #[test]
    fn table_aligns_columns() {
        let t = table(&groups());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert!(lines[0].starts_with("data_source  prompts  mean@2  pass@1"));
        assert!(lines[2].contains("48.50"));
        assert!(
            lines[0].ends_with("maj@2  answered  length  clipped"),
            "{t}"
        );
        assert!(lines[1].ends_with("75.00    31.5    25.00"), "{t}");
        assert!(lines.iter().all(|l| l.len() == lines[0].len()));
        assert_eq!(table(&[]), "");
    }
}
