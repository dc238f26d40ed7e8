//! The floor of any shard reader: the time to read a shard's bytes and to decompress every page of
//! its token and log-prob columns, without decoding a value (one thread, best of `REPEAT` runs).
//!
//! `cargo run --release -p rlreplay-data --example page_floor -- SHARD.parquet...`

use std::fs::File;
use std::time::Instant;

use parquet::file::reader::{FileReader, SerializedFileReader};

const COLUMNS: &[&str] = &[
    "prompt_token_ids",
    "response_token_ids",
    "rollout_log_probs",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let repeat: usize = std::env::var("REPEAT").map_or(Ok(5), |v| v.parse())?;
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        return Err("usage: page_floor SHARD.parquet...".into());
    }
    let (mut read_best, mut pages_best) = (f64::INFINITY, f64::INFINITY);
    let (mut compressed, mut decompressed) = (0usize, 0usize);
    for _ in 0..repeat {
        let t = Instant::now();
        let bytes: usize = files
            .iter()
            .map(|f| std::fs::read(f).map(|b| b.len()))
            .sum::<Result<_, _>>()?;
        read_best = read_best.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        let mut out = 0;
        for f in &files {
            let reader = SerializedFileReader::new(File::open(f)?)?;
            let schema = reader.metadata().file_metadata().schema_descr_ptr();
            for g in 0..reader.num_row_groups() {
                let rg = reader.get_row_group(g)?;
                for c in 0..schema.num_columns() {
                    if !COLUMNS.contains(&schema.column(c).path().parts()[0].as_str()) {
                        continue;
                    }
                    for page in rg.get_column_page_reader(c)? {
                        out += page?.buffer().len();
                    }
                }
            }
        }
        pages_best = pages_best.min(t.elapsed().as_secs_f64());
        (compressed, decompressed) = (bytes, out);
    }
    println!(
        "{} shard(s): file read {:.1} ms ({:.1} MB); token + log-prob pages read and decompressed \
         {:.1} ms ({:.1} MB out), one thread, best of {repeat}",
        files.len(),
        read_best * 1e3,
        compressed as f64 / 1e6,
        pages_best * 1e3,
        decompressed as f64 / 1e6,
    );
    Ok(())
}
