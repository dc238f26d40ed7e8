//! The per-row table of an audit: one Parquet row per rollout, keyed by `uid`, `step` and `row`
//! (the row's index in its shard) so that it joins with the dataset.
//!
//! Columns: `uid`, `step`, `row`, `score`, `success`, `response_length`, `response_truncated`
//! (cut by the length limit), `policy_version` (the version of the weights that generated the
//! row; null when the dataset does not record it), `seq_log_ratio` (`Σδ`), `mean_log_ratio`, `max_token_log_ratio`,
//! `min_token_log_ratio`, `seq_weight`, `geo_weight`, `kl_k1`, `kl_k3` (row means); per threshold
//! `C` (written with `_` for `.`, e.g. `1_5`): `tokens_above_C`, `tokens_below_C` (tokens whose
//! weight is above `C` / below the lower bound), `seq_above_C`, `seq_below_C`, `geo_above_C`,
//! `geo_below_C`; with rejection sampling, `rs_rejected_tokens`. The file's key-value metadata
//! `rlreplay.audit` holds the thresholds and bounds as JSON. One row group per step; the file is
//! written under a temporary name and renamed into place by [`RowsWriter::finish`].

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::stats::{threshold_label, AuditConfig, RowAudit};
use arrow_array::{ArrayRef, BooleanArray, Float64Array, Int64Array, RecordBatch, StringArray};
use arrow_schema::{DataType, Field, Schema, SchemaRef};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::KeyValue;
use parquet::file::properties::WriterProperties;
use rlreplay_data::RolloutBatch;

use crate::{write_err, AuditError, Result};

/// Writes the per-row table, one step at a time.
pub struct RowsWriter {
    path: PathBuf,
    tmp: PathBuf,
    schema: SchemaRef,
    rs: bool,
    writer: Option<ArrowWriter<File>>,
}

impl std::fmt::Debug for RowsWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RowsWriter")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

/// The column-name label of a threshold: its metric label with `_` for `.`.
pub fn column_label(c: f64) -> String {
    threshold_label(c).replace('.', "_")
}

impl RowsWriter {
    /// Creates `path` (under a temporary name until [`RowsWriter::finish`]).
    pub fn create(path: &Path, cfg: &AuditConfig) -> Result<Self> {
        let rs = cfg
            .correction
            .rejection_options()
            .is_ok_and(|o| !o.is_empty());
        let f64_col = |n: &str| Field::new(n, DataType::Float64, false);
        let mut fields = vec![
            Field::new("uid", DataType::Utf8, false),
            Field::new("step", DataType::Int64, false),
            Field::new("row", DataType::Int64, false),
            f64_col("score"),
            Field::new("success", DataType::Boolean, false),
            Field::new("response_length", DataType::Int64, false),
            Field::new("response_truncated", DataType::Boolean, false),
            Field::new("policy_version", DataType::Int64, true),
        ];
        for n in [
            "seq_log_ratio",
            "mean_log_ratio",
            "max_token_log_ratio",
            "min_token_log_ratio",
            "seq_weight",
            "geo_weight",
            "kl_k1",
            "kl_k3",
        ] {
            fields.push(f64_col(n));
        }
        for &c in &cfg.thresholds {
            let l = column_label(c);
            for n in ["tokens_above", "tokens_below"] {
                fields.push(Field::new(format!("{n}_{l}"), DataType::Int64, false));
            }
            for n in ["seq_above", "seq_below", "geo_above", "geo_below"] {
                fields.push(Field::new(format!("{n}_{l}"), DataType::Boolean, false));
            }
        }
        if rs {
            fields.push(Field::new("rs_rejected_tokens", DataType::Int64, false));
        }
        let schema = Arc::new(Schema::new(fields));
        let about = serde_json::json!({
            "thresholds": cfg.thresholds,
            "lower_bounds": cfg.thresholds.iter().map(|&c| cfg.lower(c)).collect::<Vec<_>>(),
            "rollout_rs": cfg.correction.rollout_rs,
            "rollout_rs_threshold": cfg.correction.rollout_rs_threshold,
            "success_reward_threshold": cfg.correction.success_reward_threshold,
        });
        let props = WriterProperties::builder()
            .set_compression(Compression::ZSTD(ZstdLevel::default()))
            .set_key_value_metadata(Some(vec![KeyValue::new(
                "rlreplay.audit".into(),
                about.to_string(),
            )]))
            .build();
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "rows.parquet".into());
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        let tmp = dir
            .unwrap_or(Path::new("."))
            .join(format!(".{name}.{}.tmp", std::process::id()));
        let file = File::create(&tmp).map_err(|e| write_err(path, e))?;
        let writer = ArrowWriter::try_new(file, schema.clone(), Some(props))
            .map_err(|e| write_err(path, e))?;
        Ok(Self {
            path: path.to_path_buf(),
            tmp,
            schema,
            rs,
            writer: Some(writer),
        })
    }

    /// Appends one step's rows as a row group.
    pub fn write_step(
        &mut self,
        batch: &RolloutBatch,
        scores: &[f64],
        rows: &[RowAudit],
    ) -> Result<()> {
        let n = rows.len();
        let int = |f: &dyn Fn(usize, &RowAudit) -> i64| -> ArrayRef {
            Arc::new(Int64Array::from_iter_values(
                rows.iter().enumerate().map(|(i, r)| f(i, r)),
            ))
        };
        let float = |f: &dyn Fn(&RowAudit) -> f64| -> ArrayRef {
            Arc::new(Float64Array::from_iter_values(rows.iter().map(f)))
        };
        let boolean = |f: &dyn Fn(&RowAudit) -> bool| -> ArrayRef {
            Arc::new(rows.iter().map(|r| Some(f(r))).collect::<BooleanArray>())
        };
        let mut cols: Vec<ArrayRef> = vec![
            Arc::new(StringArray::from_iter_values(&batch.uids[..n])),
            int(&|_, _| batch.step),
            int(&|i, _| i as i64),
            Arc::new(Float64Array::from_iter_values(scores[..n].iter().copied())),
            boolean(&|r| r.success),
            int(&|_, r| r.tokens as i64),
            boolean(&|r| r.truncated),
            Arc::new(
                batch.policy_version[..n]
                    .iter()
                    .map(|v| v.and_then(|v| i64::try_from(v).ok()))
                    .collect::<Int64Array>(),
            ),
            float(&|r| r.seq_log_ratio),
            float(&|r| r.mean_log_ratio),
            float(&|r| r.max_token_log_ratio),
            float(&|r| r.min_token_log_ratio),
            float(&|r| r.seq_weight),
            float(&|r| r.geo_weight),
            float(&|r| r.kl_k1),
            float(&|r| r.kl_k3),
        ];
        let thresholds = rows.first().map_or(0, |r| r.flags.len());
        for j in 0..thresholds {
            cols.push(int(&|_, r| r.flags[j].tokens_above as i64));
            cols.push(int(&|_, r| r.flags[j].tokens_below as i64));
            cols.push(boolean(&|r| r.flags[j].seq_above));
            cols.push(boolean(&|r| r.flags[j].seq_below));
            cols.push(boolean(&|r| r.flags[j].geo_above));
            cols.push(boolean(&|r| r.flags[j].geo_below));
        }
        if self.rs {
            cols.push(int(&|_, r| r.rs_rejected_tokens.unwrap_or(0) as i64));
        }
        if n == 0 {
            return Ok(());
        }
        let record = RecordBatch::try_new(self.schema.clone(), cols)
            .map_err(|e| write_err(&self.path, e))?;
        let w = self.writer.as_mut().ok_or_else(|| AuditError::Write {
            path: self.path.clone(),
            msg: "already closed".into(),
        })?;
        w.write(&record).map_err(|e| write_err(&self.path, e))?;
        // One row group per step keeps the buffered rows to one step.
        w.flush().map_err(|e| write_err(&self.path, e))
    }

    /// Writes the footer and moves the file into place.
    pub fn finish(mut self) -> Result<()> {
        if let Some(w) = self.writer.take() {
            w.close().map_err(|e| write_err(&self.path, e))?;
        }
        std::fs::rename(&self.tmp, &self.path).map_err(|e| write_err(&self.path, e))
    }
}

impl Drop for RowsWriter {
    /// An unfinished table leaves no file behind.
    fn drop(&mut self) {
        if self.writer.take().is_some() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}
