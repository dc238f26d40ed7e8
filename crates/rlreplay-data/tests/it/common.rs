//! Helpers shared by the integration tests: small batches and raw Parquet files with any columns.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow_array::{ArrayRef, RecordBatch};
use arrow_schema::{Field, Schema};
use parquet::arrow::ArrowWriter;
use rlreplay_data::synth::{generate, SynthConfig};
use rlreplay_data::RolloutBatch;

/// A small synthetic configuration: 4 prompts × 4 rollouts, short responses, vocab 1000, EOS 999.
pub fn small_config() -> SynthConfig {
    SynthConfig {
        steps: 3,
        prompts: 4,
        group: 4,
        vocab: 1000,
        mean_len: 12.0,
        max_len: 24,
        prompt_len: 6,
        eos: 999,
        seed: 7,
        ..SynthConfig::default()
    }
}

/// Step 1 of [`small_config`].
pub fn small_batch() -> RolloutBatch {
    generate(&small_config(), 1).unwrap()
}

/// Writes named columns as one Parquet file.
pub fn write_columns(path: &Path, cols: Vec<(&str, ArrayRef)>) -> PathBuf {
    let fields: Vec<Field> = cols
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch =
        RecordBatch::try_new(schema.clone(), cols.into_iter().map(|(_, a)| a).collect()).unwrap();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut w = ArrowWriter::try_new(std::fs::File::create(path).unwrap(), schema, None).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    path.to_owned()
}
