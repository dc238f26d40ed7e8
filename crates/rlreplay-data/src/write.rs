//! Writing shards in the canonical schema: one zstd-compressed Parquet file per step, atomically.

use crate::error::IoContext;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{
    ArrayRef, Float32Array, Int32Array, Int64Array, ListArray, RecordBatch, StringArray,
};
use arrow_buffer::OffsetBuffer;
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::properties::WriterProperties;
use parquet::schema::types::ColumnPath;

use crate::batch::RolloutBatch;
use crate::error::{Error, Result};
use crate::stop::{StopIds, STOP_IDS_KEY};

/// The canonical Arrow schema rlreplay writes.
pub fn canonical_schema() -> Arc<Schema> {
    let list = |name: &str, item: DataType| {
        Field::new(
            name,
            DataType::List(Arc::new(Field::new("item", item, false))),
            false,
        )
    };
    Arc::new(Schema::new(vec![
        Field::new("step", DataType::Int64, false),
        Field::new("uid", DataType::Utf8, false),
        list("prompt_token_ids", DataType::Int32),
        list("response_token_ids", DataType::Int32),
        list("rollout_log_probs", DataType::Float32),
        Field::new("score", DataType::Float32, false),
        Field::new("data_source", DataType::Utf8, true),
        Field::new("ground_truth", DataType::Utf8, true),
        Field::new("temperature", DataType::Float32, true),
        Field::new("top_p", DataType::Float32, true),
        Field::new("policy_version", DataType::Int64, true),
    ]))
}

/// The path of `step`'s shard in a dataset directory: `DIR/data/step-NNNN.parquet`.
pub fn shard_path(dir: &Path, step: i64) -> PathBuf {
    dir.join("data").join(format!("step-{step:04}.parquet"))
}

/// Writes shards into a dataset directory (zstd level 3 by default), each naming the dataset's
/// stop ids in its footer when they are given.
#[derive(Debug, Clone)]
pub struct ShardWriter {
    dir: PathBuf,
    zstd_level: i32,
    stop: Option<StopIds>,
}

impl ShardWriter {
    /// A writer for the dataset directory `dir` (created when needed).
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            zstd_level: 3,
            stop: None,
        }
    }

    /// Names the ids that end a response in every shard's footer ([`STOP_IDS_KEY`]).
    pub fn stop_ids(mut self, stop: StopIds) -> Self {
        self.stop = Some(stop);
        self
    }

    /// Sets the zstd compression level (1–22).
    pub fn zstd_level(mut self, level: i32) -> Self {
        self.zstd_level = level;
        self
    }

    /// Writes `batch` as `DIR/data/step-NNNN.parquet` (temp file + rename) and returns its path.
    pub fn write(&self, batch: &RolloutBatch) -> Result<PathBuf> {
        let path = shard_path(&self.dir, batch.step);
        self.write_to(&path, batch)?;
        Ok(path)
    }

    /// Writes `batch` to exactly `path`, atomically: readers see the old file or the new one.
    pub fn write_to(&self, path: &Path, batch: &RolloutBatch) -> Result<()> {
        let record = to_record_batch(batch)?;
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir).at("creating", dir)?;
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("shard");
        let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
        let result = (|| -> Result<()> {
            let file = File::create(&tmp).at("creating", &tmp)?;
            let level = ZstdLevel::try_new(self.zstd_level).map_err(|source| Error::ZstdLevel {
                level: self.zstd_level,
                source,
            })?;
            let no_dict = |c: &str, b: parquet::file::properties::WriterPropertiesBuilder| {
                b.set_column_dictionary_enabled(
                    ColumnPath::from(vec![c.to_owned(), "list".into(), "item".into()]),
                    false,
                )
            };
            let mut props = WriterProperties::builder()
                .set_compression(Compression::ZSTD(level))
                .set_key_value_metadata(self.stop.as_ref().map(|s| {
                    vec![parquet::file::metadata::KeyValue::new(
                        STOP_IDS_KEY.to_owned(),
                        s.to_json(),
                    )]
                }));
            for c in [
                "prompt_token_ids",
                "response_token_ids",
                "rollout_log_probs",
            ] {
                props = no_dict(c, props);
            }
            let mut w = ArrowWriter::try_new(file, record.schema(), Some(props.build()))?;
            w.write(&record)?;
            let file = w.into_inner()?;
            file.sync_all().at("writing", &tmp)?;
            Ok(())
        })();
        if let Err(e) = result {
            let _ = std::fs::remove_file(&tmp);
            return Err(Error::WriteShard {
                path: path.to_owned(),
                source: Box::new(e),
            });
        }
        std::fs::rename(&tmp, path).map_err(|source| Error::Rename {
            from: tmp.clone(),
            to: path.to_owned(),
            source,
        })?;
        Ok(())
    }
}

/// Writes `batch` as `DIR/data/step-NNNN.parquet` with the default settings; returns the path.
pub fn write_shard(dir: &Path, batch: &RolloutBatch) -> Result<PathBuf> {
    ShardWriter::new(dir).write(batch)
}

/// The batch as one Arrow record batch in the canonical schema.
pub fn to_record_batch(b: &RolloutBatch) -> Result<RecordBatch> {
    let n = b.len();
    let consistent = b.uids.len() == n
        && b.prompt_offsets.len() == n + 1
        && b.response_offsets.len() == n + 1
        && b.prompt_offsets.first() == Some(&0)
        && b.response_offsets.first() == Some(&0)
        && b.prompt_offsets.last() == Some(&b.prompt_tokens.len())
        && b.response_offsets.last() == Some(&b.response_tokens.len())
        && b.rollout_log_probs.len() == b.response_tokens.len()
        && b.prompt_offsets.windows(2).all(|w| w[0] <= w[1])
        && b.response_offsets.windows(2).all(|w| w[0] <= w[1])
        && [
            b.data_source.len(),
            b.ground_truth.len(),
            b.temperature.len(),
            b.top_p.len(),
            b.policy_version.len(),
        ]
        .iter()
        .all(|&l| l == n);
    if !consistent {
        return Err(Error::InconsistentBatch { step: b.step });
    }
    let ids = |toks: &[u32], offs: &[usize]| -> Result<ArrayRef> {
        let vals: Vec<i32> = toks
            .iter()
            .map(|&t| i32::try_from(t))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| Error::Int32 { what: "token id" })?;
        let offs: Vec<i32> = offs
            .iter()
            .map(|&o| i32::try_from(o))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| Error::Int32 {
                what: "token offset (too many tokens in one shard)",
            })?;
        let item = Arc::new(Field::new("item", DataType::Int32, false));
        Ok(Arc::new(ListArray::try_new(
            item,
            OffsetBuffer::new(offs.into()),
            Arc::new(Int32Array::from(vals)),
            None,
        )?))
    };
    let resp_offsets: Vec<i32> = b.response_offsets.iter().map(|&o| o as i32).collect();
    let lp_item = Arc::new(Field::new("item", DataType::Float32, false));
    let log_probs = ListArray::try_new(
        lp_item,
        OffsetBuffer::new(resp_offsets.into()),
        Arc::new(Float32Array::from(b.rollout_log_probs.clone())),
        None,
    )?;
    let columns: Vec<ArrayRef> = vec![
        Arc::new(Int64Array::from(vec![b.step; n])),
        Arc::new(StringArray::from_iter_values(&b.uids)),
        ids(&b.prompt_tokens, &b.prompt_offsets)?,
        ids(&b.response_tokens, &b.response_offsets)?,
        Arc::new(log_probs),
        Arc::new(Float32Array::from(b.scores.clone())),
        Arc::new(
            b.data_source
                .iter()
                .map(Option::as_deref)
                .collect::<StringArray>(),
        ),
        Arc::new(
            b.ground_truth
                .iter()
                .map(Option::as_deref)
                .collect::<StringArray>(),
        ),
        Arc::new(b.temperature.iter().copied().collect::<Float32Array>()),
        Arc::new(b.top_p.iter().copied().collect::<Float32Array>()),
        Arc::new(
            b.policy_version
                .iter()
                .map(|v| v.and_then(|v| i64::try_from(v).ok()))
                .collect::<Int64Array>(),
        ),
    ];
    Ok(RecordBatch::try_new(canonical_schema(), columns)?)
}
