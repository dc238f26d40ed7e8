//! GGUF (llama.cpp's format) to a Hugging Face model directory that transformers loads unchanged:
//! `config.json`, `generation_config.json`, `model.safetensors`, `tokenizer.json` and
//! `tokenizer_config.json`.
//!
//! [`convert`] reads a `llama`, `qwen2` or `qwen3` GGUF with candle, dequantizes every tensor to
//! f32 (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K), renames it
//! to the Hugging Face layout, undoes llama.cpp's row permutation of the query and key weights
//! of `llama` files, and writes the directory atomically. The header is scanned with bounded
//! reads before candle parses it, so a truncated or corrupt file is refused, with the key or
//! tensor it concerns, before anything large is allocated or written.

mod config;
mod header;
mod tokenizer;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap};
use std::io::BufReader;
use std::path::Path;

use candle_core::quantized::gguf_file;
use candle_core::{DType, Device, Tensor};

use crate::checkpoint::{dtype_name, write_dir_atomically, write_json, write_safetensors};
use crate::{Error, Result};
use config::{Arch, Hyper};
use header::TensorEntry;

/// How [`convert`] writes the model.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    /// Storage dtype of the written tensors: f32 (the dequantized values exactly, the default),
    /// bf16 or f16.
    pub dtype: DType,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        Self { dtype: DType::F32 }
    }
}

/// What [`convert`] read and wrote.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ConvertReport {
    /// The GGUF file.
    pub source: String,
    /// The written model directory.
    pub out_dir: String,
    /// `general.name`, when the file has one.
    pub name: Option<String>,
    /// `general.architecture` (`llama`, `qwen2`, `qwen3`).
    pub architecture: String,
    /// The Hugging Face `model_type` written to `config.json`.
    pub model_type: String,
    /// Decoder layers.
    pub layers: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Parameters written (zero biases included, the tied lm_head counted once).
    pub parameters: u64,
    /// Whether the lm_head shares the embedding (the file has no `output.weight`).
    pub tie_word_embeddings: bool,
    /// Tensors in the GGUF file.
    pub gguf_tensors: usize,
    /// The GGUF tensors by storage type (`Q4_1`, `Q8_0`, `F32`, ...).
    pub quantization: BTreeMap<String, usize>,
    /// Tensors written to `model.safetensors`.
    pub tensors_written: usize,
    /// Storage dtype of the written tensors (`float32`, `bfloat16`, `float16`).
    pub dtype: String,
    /// The pre-tokenizer (`tokenizer.ggml.pre`) the tokenizer was built for.
    pub tokenizer_pre: String,
    /// Tokens in the vocabulary.
    pub tokens: usize,
    /// BPE merges.
    pub merges: usize,
}

/// Typed access to the metadata of one file, with errors naming the file and the key.
pub(crate) struct Meta<'a> {
    md: &'a HashMap<String, gguf_file::Value>,
    file: &'a str,
}

impl<'a> Meta<'a> {
    fn err(&self, msg: impl std::fmt::Display) -> Error {
        Error::Config(format!("{}: {msg}", self.file))
    }

    fn wrong_type(&self, key: &str, v: &gguf_file::Value, expected: &str) -> Error {
        self.err(format!(
            "{key} has type {:?}, expected {expected}",
            v.value_type()
        ))
    }

    /// A non-negative integer of any integer type.
    fn u64(&self, key: &str) -> Result<Option<u64>> {
        use gguf_file::Value as V;
        let Some(v) = self.md.get(key) else {
            return Ok(None);
        };
        let n = match *v {
            V::U8(x) => Some(u64::from(x)),
            V::U16(x) => Some(u64::from(x)),
            V::U32(x) => Some(u64::from(x)),
            V::U64(x) => Some(x),
            V::I8(x) => u64::try_from(x).ok(),
            V::I16(x) => u64::try_from(x).ok(),
            V::I32(x) => u64::try_from(x).ok(),
            V::I64(x) => u64::try_from(x).ok(),
            _ => return Err(self.wrong_type(key, v, "an integer")),
        };
        n.map(Some)
            .ok_or_else(|| self.err(format!("{key} = {v:?} is negative")))
    }

    /// A number; an f32 is taken at its shortest decimal spelling (`1e-5`, not
    /// `9.999999747378752e-6`), as the model's own `config.json` writes it.
    fn f64(&self, key: &str) -> Result<Option<f64>> {
        use gguf_file::Value as V;
        let Some(v) = self.md.get(key) else {
            return Ok(None);
        };
        Ok(Some(match *v {
            V::F32(x) => x.to_string().parse().unwrap_or(f64::from(x)),
            V::F64(x) => x,
            _ => match self.u64(key) {
                Ok(Some(n)) => n as f64,
                _ => return Err(self.wrong_type(key, v, "a number")),
            },
        }))
    }

    fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.md.get(key) {
            None => Ok(None),
            Some(gguf_file::Value::String(s)) => Ok(Some(s.as_str())),
            Some(v) => Err(self.wrong_type(key, v, "a string")),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.md.get(key) {
            None => Ok(None),
            Some(gguf_file::Value::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong_type(key, v, "a boolean")),
        }
    }

    fn array(&self, key: &str) -> Result<Option<&'a [gguf_file::Value]>> {
        match self.md.get(key) {
            None => Ok(None),
            Some(gguf_file::Value::Array(a)) => Ok(Some(a.as_slice())),
            Some(v) => Err(self.wrong_type(key, v, "an array")),
        }
    }

    fn array_len(&self, key: &str) -> Result<Option<usize>> {
        Ok(self.array(key)?.map(<[_]>::len))
    }

    fn str_array(&self, key: &str) -> Result<Option<Vec<&'a str>>> {
        let Some(a) = self.array(key)? else {
            return Ok(None);
        };
        a.iter()
            .enumerate()
            .map(|(i, v)| match v {
                gguf_file::Value::String(s) => Ok(s.as_str()),
                v => Err(self.wrong_type(&format!("{key}[{i}]"), v, "a string")),
            })
            .collect::<Result<_>>()
            .map(Some)
    }

    fn int_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        use gguf_file::Value as V;
        let Some(a) = self.array(key)? else {
            return Ok(None);
        };
        a.iter()
            .enumerate()
            .map(|(i, v)| match *v {
                V::I32(x) => Ok(i64::from(x)),
                V::U32(x) => Ok(i64::from(x)),
                V::I8(x) => Ok(i64::from(x)),
                V::U8(x) => Ok(i64::from(x)),
                V::I16(x) => Ok(i64::from(x)),
                V::U16(x) => Ok(i64::from(x)),
                V::I64(x) => Ok(x),
                _ => Err(self.wrong_type(&format!("{key}[{i}]"), v, "an integer")),
            })
            .collect::<Result<_>>()
            .map(Some)
    }
}

/// Where a written tensor comes from.
#[derive(Debug, Clone, PartialEq)]
enum Source {
    /// A GGUF tensor; for `llama` query and key weights, with llama.cpp's row permutation over
    /// this many heads undone.
    Gguf {
        name: String,
        unpermute: Option<usize>,
    },
    /// Zeros: a bias the file leaves out where the Hugging Face model has one.
    Zeros,
}

/// One tensor of `model.safetensors`.
#[derive(Debug, Clone)]
struct Item {
    hf: String,
    shape: Vec<usize>,
    source: Source,
}

/// A tensor the model has: GGUF name (or, within a layer, suffix), Hugging Face name (suffix),
/// shape, whether a missing one is written as zeros, and the heads of its row permutation.
struct Wanted {
    gguf: String,
    hf: String,
    shape: Vec<usize>,
    zero_if_missing: bool,
    unpermute: Option<usize>,
}

/// The GGUF names of the attention biases.
const ATTN_BIASES: [&str; 4] = [
    "attn_q.bias",
    "attn_k.bias",
    "attn_v.bias",
    "attn_output.bias",
];

/// The tensors of one decoder layer. `bias`: whether the attention projections carry biases
/// (for Qwen2, those of q/k/v always; for the others all four when any is present).
fn layer_tensors(h: &Hyper, bias: bool) -> Vec<Wanted> {
    let (d, q, kv) = (h.hidden, h.heads * h.head_dim, h.kv_heads * h.head_dim);
    let llama = h.arch == Arch::Llama;
    let perm = |heads: usize| llama.then_some(heads);
    let t = |gguf: &str, hf: &str, shape: Vec<usize>, unpermute| Wanted {
        gguf: gguf.to_string(),
        hf: hf.to_string(),
        shape,
        zero_if_missing: false,
        unpermute,
    };
    let mut v = vec![
        t("attn_norm.weight", "input_layernorm.weight", vec![d], None),
        t(
            "ffn_norm.weight",
            "post_attention_layernorm.weight",
            vec![d],
            None,
        ),
        t(
            "attn_q.weight",
            "self_attn.q_proj.weight",
            vec![q, d],
            perm(h.heads),
        ),
        t(
            "attn_k.weight",
            "self_attn.k_proj.weight",
            vec![kv, d],
            perm(h.kv_heads),
        ),
        t(
            "attn_v.weight",
            "self_attn.v_proj.weight",
            vec![kv, d],
            None,
        ),
        t(
            "attn_output.weight",
            "self_attn.o_proj.weight",
            vec![d, q],
            None,
        ),
        t(
            "ffn_gate.weight",
            "mlp.gate_proj.weight",
            vec![h.ffn, d],
            None,
        ),
        t("ffn_up.weight", "mlp.up_proj.weight", vec![h.ffn, d], None),
        t(
            "ffn_down.weight",
            "mlp.down_proj.weight",
            vec![d, h.ffn],
            None,
        ),
    ];
    if h.arch == Arch::Qwen3 {
        v.push(t(
            "attn_q_norm.weight",
            "self_attn.q_norm.weight",
            vec![h.head_dim],
            None,
        ));
        v.push(t(
            "attn_k_norm.weight",
            "self_attn.k_norm.weight",
            vec![h.head_dim],
            None,
        ));
    }
    if bias || h.arch == Arch::Qwen2 {
        let mut biases = vec![
            t(
                "attn_q.bias",
                "self_attn.q_proj.bias",
                vec![q],
                perm(h.heads),
            ),
            t(
                "attn_k.bias",
                "self_attn.k_proj.bias",
                vec![kv],
                perm(h.kv_heads),
            ),
            t("attn_v.bias", "self_attn.v_proj.bias", vec![kv], None),
        ];
        if h.arch != Arch::Qwen2 {
            biases.push(t(
                "attn_output.bias",
                "self_attn.o_proj.bias",
                vec![d],
                None,
            ));
        }
        for b in &mut biases {
            b.zero_if_missing = true;
        }
        v.extend(biases);
    }
    v
}

/// The tensors to write, checked against the file's: every tensor of the file must map to one,
/// every required one must be in the file with the expected shape. Returns the items, whether the
/// embedding is tied and whether the attention has biases.
fn plan(h: &Hyper, tensors: &[TensorEntry], file: &str) -> Result<(Vec<Item>, bool, bool)> {
    let err = |msg: String| Error::Checkpoint(format!("{file}: {msg}"));
    let by_name: HashMap<&str, &TensorEntry> =
        tensors.iter().map(|t| (t.name.as_str(), t)).collect();
    if by_name.contains_key("rope_freqs.weight") {
        return Err(err(
            "the file scales the rotary embedding per frequency (tensor rope_freqs.weight, \
             llama3-style rope scaling), which is not supported"
                .into(),
        ));
    }
    let bias = h.arch != Arch::Qwen2
        && tensors.iter().any(|t| {
            t.name
                .strip_prefix("blk.")
                .and_then(|r| r.split_once('.'))
                .is_some_and(|(_, suffix)| ATTN_BIASES.contains(&suffix))
        });
    let tied = !by_name.contains_key("output.weight");
    let layer = layer_tensors(h, bias);

    // Every tensor of the file must be one the model has.
    for t in tensors {
        let known = match t.name.as_str() {
            "token_embd.weight" | "output_norm.weight" | "output.weight" => true,
            name => name
                .strip_prefix("blk.")
                .and_then(|r| r.split_once('.'))
                .is_some_and(|(n, suffix)| {
                    // `blk.01` is not layer 1.
                    n.parse::<usize>()
                        .is_ok_and(|k| k < h.layers && k.to_string() == n)
                        && layer.iter().any(|l| l.gguf == suffix)
                }),
        };
        if !known {
            return Err(err(format!(
                "unexpected tensor {} (not part of a {}-layer {} model)",
                t.name,
                h.layers,
                h.arch.name()
            )));
        }
    }

    let whole = |gguf: &str, hf: &str, shape: Vec<usize>| Wanted {
        gguf: gguf.to_string(),
        hf: hf.to_string(),
        shape,
        zero_if_missing: false,
        unpermute: None,
    };
    let mut wanted = vec![
        whole(
            "token_embd.weight",
            "model.embed_tokens.weight",
            vec![h.vocab, h.hidden],
        ),
        whole("output_norm.weight", "model.norm.weight", vec![h.hidden]),
    ];
    if !tied {
        wanted.push(whole(
            "output.weight",
            "lm_head.weight",
            vec![h.vocab, h.hidden],
        ));
    }
    for n in 0..h.layers {
        for l in &layer {
            wanted.push(Wanted {
                gguf: format!("blk.{n}.{}", l.gguf),
                hf: format!("model.layers.{n}.{}", l.hf),
                shape: l.shape.clone(),
                ..*l
            });
        }
    }
    let mut items = Vec::with_capacity(wanted.len());
    for Wanted {
        gguf,
        hf,
        shape,
        zero_if_missing,
        unpermute,
    } in wanted
    {
        let source = match by_name.get(gguf.as_str()) {
            None if zero_if_missing => Source::Zeros,
            None => return Err(err(format!("tensor {gguf} ({hf}) is missing"))),
            Some(t) if t.dims != shape => {
                return Err(err(format!(
                    "tensor {gguf} has shape {:?}, expected {shape:?} for {hf} (rows first; GGUF \
                     lists the dimensions the other way round)",
                    t.dims
                )))
            }
            Some(_) => Source::Gguf {
                name: gguf,
                unpermute,
            },
        };
        items.push(Item { hf, shape, source });
    }
    Ok((items, tied, bias))
}

/// Undoes llama.cpp's permutation of the rows of a query or key weight (or bias) over `heads`
/// heads. `convert_hf_to_gguf.py` reorders each head's rows from the Hugging Face layout (first
/// halves of the rotary pairs, then second halves) to interleaved pairs:
/// `w.reshape(heads, 2, rows / heads / 2, ...).swapaxes(1, 2).reshape(w.shape)`. This is its
/// inverse.
pub(crate) fn unpermute_rows(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let rows = dims.first().copied().unwrap_or(0);
    if rows == 0 || heads == 0 || !rows.is_multiple_of(2 * heads) {
        return Err(Error::Checkpoint(format!(
            "cannot undo the row permutation of a {dims:?} tensor over {heads} heads"
        )));
    }
    let cols: usize = dims[1..].iter().product();
    Ok(t.reshape((heads, rows / heads / 2, 2, cols))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)?)
}

/// Refuses an output directory that exists and is not an empty directory.
fn check_out_dir(out: &Path) -> Result<()> {
    if !out.exists() {
        return Ok(());
    }
    let empty = out.is_dir()
        && std::fs::read_dir(out)
            .map_err(|e| Error::Io(format!("reading {}: {e}", out.display())))?
            .next()
            .is_none();
    if !empty {
        return Err(Error::Io(format!(
            "{} already exists and is not an empty directory; choose another output directory \
             or remove it",
            out.display()
        )));
    }
    Ok(())
}

/// Converts the GGUF file at `path` into a Hugging Face model directory `out_dir` (see the
/// module documentation). `out_dir` must not exist or be empty; it is written atomically, and
/// nothing is written when the file cannot be converted.
pub fn convert(
    path: impl AsRef<Path>,
    out_dir: impl AsRef<Path>,
    opts: &ConvertOptions,
) -> Result<ConvertReport> {
    let (path, out_dir) = (path.as_ref(), out_dir.as_ref());
    let file = path.display().to_string();
    let torch_dtype = match opts.dtype {
        DType::F32 | DType::BF16 | DType::F16 => dtype_name(opts.dtype)?,
        other => {
            return Err(Error::Config(format!(
                "cannot write tensors as {other:?} (f32, bf16 or f16)"
            )))
        }
    };
    check_out_dir(out_dir)?;
    let header = header::scan(path)?;
    let open = || {
        std::fs::File::open(path)
            .map(BufReader::new)
            .map_err(|e| Error::Io(format!("opening {file}: {e}")))
    };
    let mut reader = open()?;
    let content = gguf_file::Content::read(&mut reader)
        .map_err(|e| Error::Checkpoint(format!("{file}: {e}")))?;
    let meta = Meta {
        md: &content.metadata,
        file: &file,
    };
    let h = config::hyper(&meta)?;
    let tok = tokenizer::tokenizer_files(&meta, h.context)?;
    if tok.tokens > h.vocab {
        return Err(meta.err(format!(
            "tokenizer.ggml.tokens has {} tokens, more than the vocabulary size {}",
            tok.tokens, h.vocab
        )));
    }
    let (items, tied, bias) = plan(&h, &header.tensors, &file)?;
    let config = config::config_json(&h, tied, bias, torch_dtype);
    let generation = config::generation_config(&h);

    // Tensor by tensor: only the written copy and one tensor's f32 values are held at a time.
    let mut out: Vec<(String, Tensor)> = Vec::with_capacity(items.len());
    for item in items {
        let t = match &item.source {
            Source::Zeros => Tensor::zeros(item.shape.as_slice(), opts.dtype, &Device::Cpu)?,
            Source::Gguf { name, unpermute } => {
                let q = content
                    .tensor(&mut reader, name, &Device::Cpu)
                    .map_err(|e| Error::Checkpoint(format!("{file}: tensor {name}: {e}")))?;
                let mut t = q
                    .dequantize(&Device::Cpu)
                    .map_err(|e| Error::Checkpoint(format!("{file}: tensor {name}: {e}")))?;
                if let Some(heads) = unpermute {
                    t = unpermute_rows(&t, *heads)?;
                }
                t.to_dtype(opts.dtype)?
            }
        };
        out.push((item.hf, t));
    }
    let parameters = out.iter().map(|(_, t)| t.elem_count() as u64).sum();

    write_dir_atomically(out_dir, false, |dir| {
        write_json(&dir.join("config.json"), &config)?;
        write_json(&dir.join("generation_config.json"), &generation)?;
        write_json(&dir.join("tokenizer.json"), &tok.tokenizer)?;
        write_json(&dir.join("tokenizer_config.json"), &tok.config)?;
        let metadata = Some([("format".to_string(), "pt".to_string())].into());
        write_safetensors(&dir.join("model.safetensors"), &out, &metadata)
    })?;

    let mut quantization = BTreeMap::new();
    for t in &header.tensors {
        *quantization
            .entry(header::dtype_name(t.dtype).to_string())
            .or_insert(0) += 1;
    }
    Ok(ConvertReport {
        source: file.clone(),
        out_dir: out_dir.display().to_string(),
        name: meta.str("general.name")?.map(str::to_string),
        architecture: h.arch.name().to_string(),
        model_type: h.arch.model_type().to_string(),
        layers: h.layers,
        hidden_size: h.hidden,
        vocab_size: h.vocab,
        parameters,
        tie_word_embeddings: tied,
        gguf_tensors: header.tensors.len(),
        quantization,
        tensors_written: out.len(),
        dtype: torch_dtype.to_string(),
        tokenizer_pre: tok.pre,
        tokens: tok.tokens,
        merges: tok.merges,
    })
}
