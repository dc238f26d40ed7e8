//! Hugging Face checkpoints: memory-mapped loading (single file or shards) and atomic saving.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::Write;
use std::path::{Component, Path, PathBuf};

use candle_core::safetensors::MmapedSafetensors;
use candle_core::{DType, Device, Tensor};
use serde_json::{json, Value};

use crate::model::master_dtype;
use crate::{Error, MemoryEstimate, Model, ModelConfig, Result, Workload};

const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";
/// Tokenizer and chat-template files copied from the source directory on save.
pub const TOKENIZER_FILES: [&str; 8] = [
    "tokenizer.json",
    "tokenizer_config.json",
    "vocab.json",
    "merges.txt",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "generation_config.json",
];

/// How [`Model::save_hf_with`] writes a checkpoint.
#[derive(Debug, Clone)]
pub struct SaveOptions {
    /// Storage dtype of the tensors; `None` keeps the master dtype (bit-exact round trip).
    pub dtype: Option<DType>,
    /// Largest shard in bytes; above it the tensors are split into shards with an index.
    pub max_shard_bytes: u64,
}

impl Default for SaveOptions {
    fn default() -> Self {
        Self {
            dtype: None,
            max_shard_bytes: 5_000_000_000,
        }
    }
}

pub(crate) fn io_err(what: &str, path: &Path, e: impl std::fmt::Display) -> Error {
    Error::Io(format!("{what} {}: {e}", path.display()))
}

pub(crate) fn dtype_name(dtype: DType) -> Result<&'static str> {
    Ok(match dtype {
        DType::F32 => "float32",
        DType::F64 => "float64",
        DType::BF16 => "bfloat16",
        DType::F16 => "float16",
        other => {
            return Err(Error::Checkpoint(format!(
                "cannot store tensors as {other:?}"
            )))
        }
    })
}

/// The safetensors files of a checkpoint directory: the shards named by the index when there is
/// one (each path checked to stay inside `dir`), otherwise `model.safetensors`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join(INDEX_FILE);
    if !index.exists() {
        let single = dir.join(SINGLE_FILE);
        if !single.exists() {
            return Err(Error::Checkpoint(format!(
                "{}: neither {SINGLE_FILE} nor {INDEX_FILE} found",
                dir.display()
            )));
        }
        return Ok(vec![single]);
    }
    let text = std::fs::read_to_string(&index).map_err(|e| io_err("reading", &index, e))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| Error::Checkpoint(format!("{}: invalid JSON: {e}", index.display())))?;
    let map = value
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| {
            Error::Checkpoint(format!("{}: no \"weight_map\" object", index.display()))
        })?;
    let root = dir
        .canonicalize()
        .map_err(|e| io_err("resolving", dir, e))?;
    let mut files: Vec<String> = Vec::new();
    for (name, file) in map {
        let file = file.as_str().ok_or_else(|| {
            Error::Checkpoint(format!(
                "{}: weight_map[{name:?}] = {file} is not a file name",
                index.display()
            ))
        })?;
        let rel = Path::new(file);
        let plain = rel.components().all(|c| matches!(c, Component::Normal(_)));
        if plain && !root.join(rel).exists() {
            return Err(Error::Checkpoint(format!(
                "{}: weight_map[{name:?}] names the shard {file:?}, which does not exist",
                index.display()
            )));
        }
        let resolved = root.join(rel).canonicalize().ok();
        if !plain || !resolved.is_some_and(|p| p.starts_with(&root)) {
            return Err(Error::Checkpoint(format!(
                "{}: weight_map[{name:?}] = {file:?} is not a file inside the model directory",
                index.display()
            )));
        }
        if !files.iter().any(|f| f == file) {
            files.push(file.to_string());
        }
    }
    files.sort();
    Ok(files.into_iter().map(|f| root.join(f)).collect())
}

impl Model {
    /// Loads a Hugging Face checkpoint directory (`config.json` plus `model.safetensors` or shards
    /// with `model.safetensors.index.json`) of any supported architecture, memory-mapped. Stored
    /// bf16/f16/f32/f64 tensors are converted to the master dtype; `dtype` is the compute dtype. A
    /// missing, extra or mis-shaped tensor is an error naming it. Refused with the estimate, before
    /// any tensor is read, when the weights do not fit in the device's available memory
    /// ([`MemoryEstimate`]).
    pub fn load(dir: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Self> {
        let dir = dir.as_ref();
        let cfg = ModelConfig::from_hf_json(dir.join("config.json"))?;
        MemoryEstimate::new(&cfg, dtype, Workload::Inference)
            .check(device)
            .map_err(|e| Error::Memory(format!("{}: {e}", dir.display())))?;
        let files = weight_files(dir)?;
        // SAFETY: the files are mapped read-only; like every mmap-based loader we rely on them not
        // being truncated while the model loads.
        let st = unsafe { MmapedSafetensors::multi(&files) }.map_err(|e| {
            Error::Checkpoint(format!("{}: cannot read safetensors: {e}", dir.display()))
        })?;
        let mut found: HashMap<String, Vec<usize>> = HashMap::new();
        for (name, view) in st.tensors() {
            found.insert(name, view.shape().to_vec());
        }
        let mut source = |name: &str, shape: &[usize], _: usize| -> Result<Tensor> {
            match found.get(name) {
                None => {
                    return Err(Error::Checkpoint(format!(
                        "{}: tensor {name} is missing",
                        dir.display()
                    )))
                }
                Some(s) if s != shape => {
                    return Err(Error::Checkpoint(format!(
                        "{}: tensor {name} has shape {s:?}, expected {shape:?}",
                        dir.display()
                    )))
                }
                Some(_) => {}
            }
            let view = st.get(name)?;
            match view.dtype() {
                safetensors::Dtype::BF16
                | safetensors::Dtype::F16
                | safetensors::Dtype::F32
                | safetensors::Dtype::F64 => {}
                other => {
                    return Err(Error::Checkpoint(format!(
                        "{}: tensor {name} has dtype {other:?}, expected bf16, f16, f32 or f64",
                        dir.display()
                    )))
                }
            }
            Ok(st.load(name, device)?.to_dtype(master_dtype(dtype))?)
        };
        // Unexpected tensors first: a checkpoint of another shape names what it has too many of.
        let expected = Self::tensor_names(&cfg);
        let mut extra: Vec<&String> = found
            .keys()
            .filter(|n| !expected.contains(n.as_str()))
            // A tied checkpoint may still carry its lm_head copy, and older Llama checkpoints
            // their rotary tables (computed from the configuration here); both are ignored.
            .filter(|n| !(cfg.tie_word_embeddings && n.as_str() == "lm_head.weight"))
            .filter(|n| !n.ends_with(".rotary_emb.inv_freq"))
            .collect();
        extra.sort();
        if let Some(name) = extra.first() {
            return Err(Error::Checkpoint(format!(
                "{}: unexpected tensor {name} ({} unexpected in all)",
                dir.display(),
                extra.len()
            )));
        }
        Self::build(cfg, &mut source, dtype, device, Some(dir.to_path_buf()))
    }

    /// The tensor names of a checkpoint of `cfg`.
    fn tensor_names(cfg: &ModelConfig) -> std::collections::HashSet<String> {
        // Builds nothing: the source records each name and hands back an empty tensor.
        let mut names = std::collections::HashSet::new();
        let mut source = |name: &str, _: &[usize], _: usize| -> Result<Tensor> {
            names.insert(name.to_string());
            Ok(Tensor::zeros(0, DType::F32, &Device::Cpu)?)
        };
        let _ = Self::build(cfg.clone(), &mut source, DType::F32, &Device::Cpu, None);
        names
    }

    /// Saves the model in the Hugging Face layout with the default [`SaveOptions`] (master dtype,
    /// shards of at most 5 GB).
    pub fn save_hf(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.save_hf_with(dir, &SaveOptions::default())
    }

    /// Saves the model in the Hugging Face layout: `config.json`, `generation_config.json`,
    /// `model.safetensors` (or shards and an index) and the tokenizer files of the source
    /// directory. The checkpoint is written into a temporary sibling directory, synced, then
    /// renamed onto `dir` (replacing a previous checkpoint there). Refused for a model with LoRA
    /// adapters: save those with [`Model::save_adapter`], or merge them first
    /// ([`Model::merge_lora`]).
    pub fn save_hf_with(&self, dir: impl AsRef<Path>, opts: &SaveOptions) -> Result<()> {
        if let Some(lora) = self.lora_config() {
            return Err(Error::Checkpoint(format!(
                "{}: the model carries LoRA adapters (r = {}): save them with \
                 Model::save_adapter, or merge them into the weights (Model::merge_lora) to save \
                 the full model",
                dir.as_ref().display(),
                lora.r
            )));
        }
        let store = opts.dtype.unwrap_or(self.master_dtype());
        write_dir_atomically(dir.as_ref(), true, |tmp| {
            self.write_into(tmp, store, opts.max_shard_bytes)
        })
    }

    fn write_into(&self, dir: &Path, store: DType, max_shard_bytes: u64) -> Result<()> {
        let mut cfg = self.config().clone();
        cfg.torch_dtype = Some(dtype_name(store)?.to_string());
        write_json(&dir.join("config.json"), &cfg.to_hf_json())?;
        let mut have_generation_config = false;
        if let Some(src) = self.source_dir() {
            for name in TOKENIZER_FILES {
                let from = src.join(name);
                if from.is_file() {
                    let to = dir.join(name);
                    std::fs::copy(&from, &to).map_err(|e| io_err("copying", &from, e))?;
                    sync_path(&to)?;
                    have_generation_config |= name == "generation_config.json";
                }
            }
        }
        if !have_generation_config {
            let mut gen = serde_json::Map::new();
            for key in ["bos_token_id", "eos_token_id", "pad_token_id"] {
                if let Some(v) = cfg.extra.get(key) {
                    gen.insert(key.to_string(), v.clone());
                }
            }
            write_json(&dir.join("generation_config.json"), &Value::Object(gen))?;
        }

        let mut tensors: Vec<(String, Tensor)> = Vec::with_capacity(self.params().len());
        for (i, p) in self.params().iter().enumerate() {
            if !self.holds_master(i) && store != self.compute_dtype() {
                return Err(Error::Checkpoint(format!(
                    "{}: this model holds only the {:?} replica of the weight, not its master \
                     (dropped by a data-parallel rank that does not own it); restore the \
                     master before saving it as {store:?}",
                    p.name,
                    self.compute_dtype()
                )));
            }
            tensors.push((p.name.clone(), p.var.as_detached_tensor().to_dtype(store)?));
        }
        tensors.sort_by(|a, b| a.0.cmp(&b.0));
        let bytes = |t: &Tensor| (t.elem_count() * t.dtype().size_in_bytes()) as u64;
        let total: u64 = tensors.iter().map(|(_, t)| bytes(t)).sum();
        let mut shards: Vec<Vec<(String, Tensor)>> = vec![Vec::new()];
        let mut size = 0u64;
        for (name, t) in tensors {
            let b = bytes(&t);
            if size > 0 && size + b > max_shard_bytes {
                shards.push(Vec::new());
                size = 0;
            }
            size += b;
            shards.last_mut().expect("non-empty").push((name, t));
        }
        let metadata: Option<HashMap<String, String>> =
            Some([("format".to_string(), "pt".to_string())].into());
        if shards.len() == 1 {
            let path = dir.join(SINGLE_FILE);
            write_safetensors(&path, &shards[0], &metadata)?;
            return Ok(());
        }
        let n = shards.len();
        let mut weight_map = BTreeMap::new();
        for (i, shard) in shards.iter().enumerate() {
            let file = format!("model-{:05}-of-{n:05}.safetensors", i + 1);
            write_safetensors(&dir.join(&file), shard, &metadata)?;
            for (name, _) in shard {
                weight_map.insert(name.clone(), file.clone());
            }
        }
        write_json(
            &dir.join(INDEX_FILE),
            &json!({"metadata": {"total_size": total}, "weight_map": weight_map}),
        )
    }
}

/// Writes the directory `dir` atomically: `fill` writes into a temporary sibling directory, which
/// is synced and then renamed onto `dir`; on error it is removed and `dir` is left as it was. With
/// `replace` an existing `dir` is replaced; without, `dir` must be absent or an empty directory.
pub(crate) fn write_dir_atomically(
    dir: &Path,
    replace: bool,
    fill: impl FnOnce(&Path) -> Result<()>,
) -> Result<()> {
    let parent = match dir.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent).map_err(|e| io_err("creating", &parent, e))?;
    let base = dir
        .file_name()
        .ok_or_else(|| Error::Io(format!("{}: not a directory name", dir.display())))?
        .to_string_lossy()
        .into_owned();
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let tmp = parent.join(format!(".{base}.tmp-{}-{stamp}", std::process::id()));
    std::fs::create_dir(&tmp).map_err(|e| io_err("creating", &tmp, e))?;
    if let Err(e) = fill(&tmp).and_then(|()| sync_path(&tmp)) {
        let _ = std::fs::remove_dir_all(&tmp);
        return Err(e);
    }
    if dir.exists() && replace {
        let old = parent.join(format!(".{base}.old-{}-{stamp}", std::process::id()));
        std::fs::rename(dir, &old).map_err(|e| io_err("moving aside", dir, e))?;
        std::fs::rename(&tmp, dir).map_err(|e| io_err("renaming into", dir, e))?;
        std::fs::remove_dir_all(&old).map_err(|e| io_err("removing", &old, e))?;
    } else {
        // Without `replace`, an existing directory is removed only when empty (else an error).
        let cleared = if dir.exists() {
            std::fs::remove_dir(dir).map_err(|e| io_err("replacing", dir, e))
        } else {
            Ok(())
        };
        let moved = cleared
            .and_then(|()| std::fs::rename(&tmp, dir).map_err(|e| io_err("renaming into", dir, e)));
        if let Err(e) = moved {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(e);
        }
    }
    sync_path(&parent)
}

pub(crate) fn write_safetensors(
    path: &Path,
    tensors: &[(String, Tensor)],
    metadata: &Option<HashMap<String, String>>,
) -> Result<()> {
    let data = tensors.iter().map(|(n, t)| (n.as_str(), t));
    safetensors::serialize_to_file(data, metadata.clone(), path)
        .map_err(|e| io_err("writing", path, e))?;
    sync_path(path)
}

pub(crate) fn write_json(path: &Path, value: &Value) -> Result<()> {
    let mut f = File::create(path).map_err(|e| io_err("creating", path, e))?;
    let text = serde_json::to_string_pretty(value).expect("JSON values serialise");
    f.write_all(text.as_bytes())
        .and_then(|_| f.write_all(b"\n"))
        .and_then(|_| f.sync_all())
        .map_err(|e| io_err("writing", path, e))
}

/// Flushes a file or directory to disk.
fn sync_path(path: &Path) -> Result<()> {
    File::open(path)
        .and_then(|f| f.sync_all())
        .map_err(|e| io_err("syncing", path, e))
}
