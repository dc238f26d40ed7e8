//! `rlreplay convert`: a llama.cpp GGUF file as a Hugging Face model directory (logic in
//! `rlreplay_model::gguf`).

use std::path::PathBuf;
use std::process::ExitCode;

use rlreplay_model::gguf::{convert, ConvertOptions, ConvertReport};
use rlreplay_model::DType;

/// Storage dtype of the written tensors.
#[derive(clap::ValueEnum, Clone, Copy, Debug)]
pub enum Dtype {
    /// The dequantized values exactly.
    F32,
    /// Rounded to bfloat16 (half the size).
    Bf16,
}

/// Arguments of `rlreplay convert`.
#[derive(clap::Args)]
pub struct Args {
    /// The GGUF file (architecture llama, qwen2 or qwen3; byte-level BPE tokenizer).
    pub file: PathBuf,
    /// Output directory; must not exist or be empty. Written atomically.
    #[arg(long)]
    pub out: PathBuf,
    /// Storage dtype of the written tensors.
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: Dtype,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
}

/// Runs `rlreplay convert`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let dtype = match args.dtype {
        Dtype::F32 => DType::F32,
        Dtype::Bf16 => DType::BF16,
    };
    let report = convert(&args.file, &args.out, &ConvertOptions { dtype })?;
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", summary(&report));
    }
    Ok(ExitCode::SUCCESS)
}

/// The human summary of a conversion.
fn summary(r: &ConvertReport) -> String {
    let mut types: Vec<(&String, &usize)> = r.quantization.iter().collect();
    types.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
    let types: Vec<String> = types.iter().map(|(t, n)| format!("{t} {n}")).collect();
    let name = r
        .name
        .as_deref()
        .map_or(String::new(), |n| format!("{n}: "));
    let tied = if r.tie_word_embeddings {
        ", tied embeddings"
    } else {
        ""
    };
    format!(
        "{name}{} ({}), {} layers, hidden {}, vocab {}, {:.1} M parameters{tied}\n\
         tensors: {} in the GGUF ({}), {} written as {}\n\
         tokenizer: byte-level BPE, pre-tokenizer {}, {} tokens, {} merges\n\
         written to {}\n",
        r.architecture,
        r.model_type,
        r.layers,
        r.hidden_size,
        r.vocab_size,
        r.parameters as f64 / 1e6,
        r.gguf_tensors,
        types.join(", "),
        r.tensors_written,
        r.dtype,
        r.tokenizer_pre,
        r.tokens,
        r.merges,
        r.out_dir,
    )
}
