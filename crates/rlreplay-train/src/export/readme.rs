//! The model card's README: YAML front matter (metadata and model-index), the published card's
//! sections, filled from the run.

use rlreplay_data::IoContext;
use std::fs;
use std::path::Path;

use serde::Serialize;

use super::{ExportOptions, Run, ValRow};
use crate::config::{hub_id, Config, SourceKind, Task, TeacherRegularization};
use crate::error::{Error, Result};
use crate::rundir::csv_records;
use rlreplay_model::lora::{ADAPTER_CONFIG, ADAPTER_WEIGHTS};

/// What the card's sections share.
struct Card<'a> {
    /// The card's title (its directory's name).
    name: &'a str,
    base: BaseModel,
    method: String,
    /// The validation data sources, joined.
    dataset: String,
    /// Prompts per trainer step (online), or `as logged`.
    batch: String,
    /// The root policy is a PEFT adapter of the base model.
    adapter: bool,
}

impl Run {
    /// The model card: YAML front matter, then the published card's sections.
    pub(super) fn readme(
        &self,
        card: &Path,
        name: &str,
        opts: &ExportOptions,
        files: &[String],
        exported_at: &str,
    ) -> Result<String> {
        let cfg = &self.config;
        let c = Card {
            name,
            base: BaseModel::of(cfg, opts),
            method: method(cfg),
            dataset: if self.sources.is_empty() {
                "validation set".to_string()
            } else {
                self.sources.join(", ")
            },
            batch: match cfg.source {
                SourceKind::Online => cfg.batch.train_batch_size.to_string(),
                SourceKind::Logged => "as logged".into(),
            },
            adapter: files.iter().any(|f| f == ADAPTER_CONFIG),
        };
        let mut s = self.front_matter(&c)?;
        s.push_str(&self.intro(&c));
        s.push_str(&self.validation_tables(&c));
        s.push_str("## Training Recipe\n\n");
        for line in self.recipe(&c.base, &c.method) {
            s.push_str(&format!("- {line}\n"));
        }
        s.push_str("\n## Detailed Training Hyperparameters\n\n");
        s.push_str(&self.hyperparameter_table()?);
        s.push_str("\n## Raw result and artifact files\n\n");
        for f in files
            .iter()
            .filter(|f| f.starts_with("results/") || f.starts_with("artifacts/"))
        {
            s.push_str(&format!("- `{f}`\n"));
        }
        let tokenizer = files.iter().any(|f| f == "tokenizer.json");
        s.push_str(&if c.adapter {
            peft_usage(name, c.base.id.as_deref())
        } else {
            usage(name, tokenizer)
        });
        s.push_str(&self.source(card, opts, exported_at));
        Ok(s)
    }

    /// The YAML front matter: metadata, and the model-index when the root policy was validated.
    fn front_matter(&self, c: &Card<'_>) -> Result<String> {
        let cfg = &self.config;
        let k = self.k;
        let mut s = String::from("---\n");
        if let Some(l) = &c.base.license {
            s.push_str(&format!("license: {}\n", yaml(l)));
        }
        let library = if c.adapter { "peft" } else { "transformers" };
        s.push_str(&format!(
            "library_name: {library}\npipeline_tag: text-generation\n"
        ));
        if let Some(id) = &c.base.id {
            s.push_str(&format!("base_model: {}\n", yaml(id)));
        }
        s.push_str("tags:\n");
        // An adapter (or the run's adapter merged at export) has no config.json of its own
        // there: the architecture is the base model's.
        let typed = std::iter::once(self.root.dir.clone())
            .chain(cfg.model.path.clone())
            .find(|d| d.join("config.json").is_file());
        let arch = typed.map(|d| model_type(&d)).transpose()?.flatten();
        if c.adapter {
            s.push_str("- \"lora\"\n- \"peft\"\n");
        }
        for tag in tags(cfg, arch.as_deref()) {
            s.push_str(&format!("- {}\n", yaml(&tag)));
        }
        if let Some(v) = self.row_at(self.root.step) {
            s.push_str(&format!(
                "model-index:\n- name: {}\n  results:\n  - task:\n      type: text-generation\n      \
                 name: Text Generation\n    dataset:\n      name: {}\n      type: {}\n      \
                 split: validation\n    metrics:\n    - type: {}\n      name: {}\n      \
                 value: {}\n",
                yaml(c.name),
                yaml(&c.dataset),
                yaml(&c.dataset),
                yaml(&format!("mean@{k}")),
                yaml(&format!("validation mean@{k} at step {}", v.step)),
                v.value
            ));
        }
        s.push_str("---\n\n");
        Ok(s)
    }

    /// The title, what the run is, and which policy is where.
    fn intro(&self, c: &Card<'_>) -> String {
        let cfg = &self.config;
        let k = self.k;
        let how = match cfg.source {
            SourceKind::Online => "trained online with `rlreplay train`",
            SourceKind::Logged => "trained with `rlreplay replay` on logged rollouts",
        };
        let mut what = vec![c.base.display.clone()];
        what.extend((!self.sources.is_empty()).then(|| c.dataset.clone()));
        what.push(c.method.clone());
        what.extend(
            cfg.source
                .draws_prompts()
                .then(|| format!("batch-size-{}", c.batch)),
        );
        let last = self.last.0;
        let root = match (self.root.label.as_str(), &self.root.note) {
            ("best", _) => format!(
                "The repository root contains the best validation checkpoint (step {}), selected \
                 by validation mean@{k}. `checkpoints/last/` contains the final checkpoint (step \
                 {last}).",
                self.root.step
            ),
            (_, Some(_)) => format!(
                "The run never validated, so no checkpoint is selected by validation mean@{k}: \
                 the repository root contains the final checkpoint (step {last}), as \
                 `checkpoints/last/` does."
            ),
            (label, None) => format!(
                "The repository root contains the checkpoint of step {} (chosen at export: \
                 `--checkpoint {label}`). `checkpoints/last/` contains the final checkpoint (step \
                 {last}).",
                self.root.step
            ),
        };
        format!(
            "# {}\n\nThis repository contains the {} run, {how}.\n\n{root}\n\n",
            c.name,
            what.join(" ")
        )
    }

    /// `## Performance` and `## Validation Mean@k`, from `validation_mean{k}.csv`.
    fn validation_tables(&self, c: &Card<'_>) -> String {
        let k = self.k;
        if self.validations.is_empty() {
            return format!(
                "## Validation Mean@{k}\n\nThe run never validated: it has no \
                 `results/validation_mean{k}.csv`.\n\n"
            );
        }
        let best = self.best.as_ref();
        let last = self.last.0;
        let percent = |v: Option<&ValRow>| v.map_or("—".to_string(), |v| v.percent.clone());
        let mut s = format!(
            "## Performance\n\n| Dataset | Method | Base model | Train batch size | Best val \
             mean@{k} | Best checkpoint | Final val mean@{k} | Final checkpoint |\n\
             |---|---|---|---|---|---|---|---|\n"
        );
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} | {} | {} | {last} |\n\n",
            cell(&c.dataset),
            cell(&c.method),
            cell(&c.base.display),
            c.batch,
            percent(best),
            best.map_or("—".to_string(), |b| b.step.to_string()),
            percent(self.row_at(last)),
        ));
        s.push_str(&format!(
            "## Validation Mean@{k}\n\n| step | val_mean{k} | percent |\n|---|---|---|\n"
        ));
        for v in &self.validations {
            s.push_str(&format!("| {} | {} | {} |\n", v.step, v.value, v.percent));
        }
        s.push('\n');
        s
    }

    /// `hyperparameters.csv` as a Markdown table.
    fn hyperparameter_table(&self) -> Result<String> {
        let path = &self.hyperparameters;
        let text = fs::read_to_string(path).at("cannot read", path)?;
        let mut records = csv_records(&text).into_iter();
        let mut s = String::new();
        if let Some(header) = records.next() {
            s.push_str(&format!("| {} |\n", row_cells(&header)));
            s.push_str(&format!("|{}\n", "---|".repeat(header.len())));
            for record in records {
                s.push_str(&format!("| {} |\n", row_cells(&record)));
            }
        }
        Ok(s)
    }

    /// `## Source`: where the policies come from, and how the card was produced.
    fn source(&self, card: &Path, opts: &ExportOptions, exported_at: &str) -> String {
        let run = self.dir.display();
        let root = if self.root.dir == self.dir {
            format!("`{run}` (the run's best policy, `best_step.txt`)")
        } else {
            format!("`{}`", self.root.dir.display())
        };
        format!(
            "\n## Source\n\n- Run directory: `{run}`\n- Root checkpoint: {root}, step {}\n- Last \
             checkpoint: `{}`, step {}\n- Produced on {} by `rlreplay export {run} --out {} \
             --checkpoint {}` (rlreplay {}): the policies are the run's checkpoints as saved, the \
             tables above are the run's own `results/*.csv`, and `results/export_note.csv` \
             records the export.\n",
            self.root.step,
            self.last.1.display(),
            self.last.0,
            exported_at.get(..10).unwrap_or(exported_at),
            card.display(),
            opts.checkpoint,
            env!("CARGO_PKG_VERSION")
        )
    }

    /// The lines of the training recipe, from the resolved configuration and the last
    /// checkpoint's trainer state.
    fn recipe(&self, base: &BaseModel, method: &str) -> Vec<String> {
        let cfg = &self.config;
        let a = &cfg.algorithm;
        let k = self.k;
        let mut lines = vec![format!("Base model: {}", base.display)];
        let mut algo =
            format!(
            "Algorithm: {method}: `adv_estimator = {}`{}, `loss_mode = {}`, `loss_agg_mode = {}`, \
             clip ratio {} / {}",
            a.adv_estimator.name(),
            if a.adv_estimator == rlreplay_algo::AdvEstimator::Grpo {
                format!(" (`norm_adv_by_std_in_grpo = {}`)", a.norm_adv_by_std_in_grpo)
            } else {
                String::new()
            },
            a.loss_mode.name(),
            a.loss_agg_mode.name(),
            a.clip_ratio_low.unwrap_or(a.clip_ratio),
            a.clip_ratio_high.unwrap_or(a.clip_ratio),
        );
        if let Some(level) = a.rollout_is {
            algo.push_str(&format!(
                ", rollout correction `rollout_is = {}` (threshold {})",
                level.name(),
                a.rollout_is_threshold
            ));
        }
        if a.loss_mode.needs_teacher() {
            let sd = &cfg.self_distillation;
            algo.push_str(&format!(
                ", teacher `{}` (rate {}), token reweighting λ {} ε_w {}",
                spelled(&sd.teacher_regularization),
                sd.teacher_update_rate,
                a.token_reweight_lambda,
                a.token_reweight_eps_w
            ));
        }
        lines.push(algo);
        let d = &cfg.data;
        let data = match (cfg.source, d.task()) {
            (SourceKind::Logged, _) => format!(
                "Data: logged rollouts `{}`{}, schedule `{}`",
                d.path.as_deref().unwrap_or_default(),
                d.steps
                    .as_ref()
                    .map(|s| format!(" (steps {s})"))
                    .unwrap_or_default(),
                spelled(&cfg.schedule.mode)
            ),
            (SourceKind::Online, Task::Toy) => format!(
                "Data: the toy arithmetic task, {} training and {} validation prompts (operators \
                 `{}`, operands up to {})",
                cfg.toy.train_prompts, cfg.toy.val_prompts, cfg.toy.operators, cfg.toy.max_operand
            ),
            (SourceKind::Online, Task::Files) => format!(
                "Data: training prompts `{}`{}",
                d.train_files
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                if d.train_max_samples > 0 {
                    format!(" (at most {})", d.train_max_samples)
                } else {
                    String::new()
                }
            ),
        };
        lines.push(format!(
            "{data}; prompts up to {} tokens{}",
            d.max_prompt_length,
            d.enable_thinking
                .map(|t| format!(", `enable_thinking = {t}`"))
                .unwrap_or_default()
        ));
        let r = &cfg.rollout;
        lines.push(match cfg.source {
            SourceKind::Online => format!(
                "Rollouts: n = {} per prompt, temperature {}, top_p {}, responses up to {} tokens",
                r.n, r.temperature, r.top_p, r.max_response_length
            ),
            SourceKind::Logged => format!(
                "Rollouts: logged (log-probs at temperature {}), responses up to {} tokens",
                r.temperature, r.max_response_length
            ),
        });
        let v = &cfg.validation;
        let toy = cfg.prompt_task() == Some(Task::Toy);
        let prompts = match &d.val_files {
            Some(p) => Some(format!("`{}`", p.display())),
            None => toy.then(|| "the toy task's validation prompts".to_string()),
        };
        lines.push(match prompts {
            Some(prompts) if v.test_freq > 0 || !self.validations.is_empty() => format!(
                "Validation: mean@{k} on {prompts} (sources: {}; {k} samples per prompt, \
                 temperature {}, top_p {}) every {} steps{}",
                if self.sources.is_empty() {
                    "not recorded".to_string()
                } else {
                    self.sources.join(", ")
                },
                v.val_temperature,
                v.val_top_p,
                v.test_freq,
                if v.val_before_train {
                    " and before training"
                } else {
                    ""
                }
            ),
            _ => "Validation: none".to_string(),
        });
        let b = &cfg.batch;
        lines.push(format!(
            "Batch: {}{} prompts per optimizer step, {} PPO epoch(s), micro-batches of up to {} \
             tokens",
            match cfg.source {
                SourceKind::Online => format!("{} prompts per trainer step, ", b.train_batch_size),
                SourceKind::Logged => String::new(),
            },
            b.ppo_mini_batch_size
                .map_or_else(|| "all".to_string(), |m| m.to_string()),
            b.ppo_epochs,
            b.max_tokens_per_micro_batch
        ));
        let o = &cfg.optim;
        lines.push(format!(
            "Optimizer: AdamW, learning rate {} (`{}` schedule, {} warm-up steps), betas ({}, \
             {}), weight decay {}, gradient clip {}",
            o.lr,
            spelled(&o.lr_schedule),
            o.lr_warmup_steps,
            o.betas[0],
            o.betas[1],
            o.weight_decay,
            o.grad_clip
        ));
        let st = &self.state;
        lines.push(format!(
            "Steps: {} configured, {} completed at the last checkpoint ({} optimizer updates, {} \
             skipped; {} tokens trained)",
            cfg.trainer
                .total_training_steps
                .map_or_else(|| "the whole schedule".to_string(), |t| t.to_string()),
            st.global_step,
            st.optimizer_steps,
            st.skipped_updates,
            st.tokens_trained
        ));
        let m = &cfg.model;
        lines.push(format!(
            "Hardware: device `{}`, dtype `{}`, {}, seed {}",
            m.device,
            spelled(&m.dtype),
            match cfg.trainer.threads {
                0 => "a worker thread per core".to_string(),
                n => format!("{n} worker threads"),
            },
            cfg.trainer.seed
        ));
        lines
    }
}

/// The base model as the card names it.
struct BaseModel {
    /// Its hub id, when known.
    id: Option<String>,
    /// How the card's text names it.
    display: String,
    /// The license of the card's metadata, when known.
    license: Option<String>,
}

impl BaseModel {
    fn of(cfg: &Config, opts: &ExportOptions) -> Self {
        let path = cfg.model.path.as_deref();
        let derived = path.and_then(hub_id);
        let id = opts.base_model.clone().or(derived);
        let display = match (&id, path) {
            (Some(id), _) => id.clone(),
            (None, Some(p)) => format!("`{}`", p.display()),
            (None, None) if cfg.prompt_task() == Some(Task::Toy) => {
                "random Qwen3 (the toy task's initial model)".into()
            }
            (None, None) => "random Qwen3 (`[model.random]`)".into(),
        };
        let license = opts
            .license
            .clone()
            .or_else(|| path.and_then(|p| readme_license(&p.join("README.md"))));
        Self {
            id,
            display,
            license,
        }
    }
}

/// The `license` of a model README's YAML front matter.
fn readme_license(readme: &Path) -> Option<String> {
    let text = fs::read_to_string(readme).ok()?;
    let front = text.strip_prefix("---")?.split("\n---").next()?;
    front.lines().find_map(|l| {
        let v = l.strip_prefix("license:")?.trim().trim_matches(['"', '\'']);
        (!v.is_empty()).then(|| v.to_string())
    })
}

/// `model_type` of a policy's `config.json`.
fn model_type(dir: &Path) -> Result<Option<String>> {
    let path = dir.join("config.json");
    let text = fs::read_to_string(&path).at("cannot read", &path)?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| Error::JsonFile { path, source })?;
    Ok(value
        .get("model_type")
        .and_then(|t| t.as_str())
        .map(str::to_string))
}

/// The method's name: `RLSD_TR` style for self-distillation (loss and teacher), the advantage
/// estimator and loss otherwise.
fn method(cfg: &Config) -> String {
    let a = &cfg.algorithm;
    if a.loss_mode.needs_teacher() {
        let teacher = match cfg.self_distillation.teacher_regularization {
            TeacherRegularization::TrustRegion => "TR",
            TeacherRegularization::Ema => "EMA",
        };
        format!("{}_{teacher}", a.loss_mode.name().to_uppercase())
    } else {
        format!("{} ({} loss)", a.adv_estimator.name(), a.loss_mode.name())
    }
}

/// The configuration's spelling of a value (its serialized name: `trust-region`, `warmup`).
fn spelled<T: Serialize>(v: &T) -> String {
    serde_json::to_value(v)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// The card's tags: the architecture, the algorithm's names, the task.
fn tags(cfg: &Config, model_type: Option<&str>) -> Vec<String> {
    let a = &cfg.algorithm;
    let mut tags: Vec<String> = model_type.into_iter().map(str::to_string).collect();
    tags.push("reinforcement-learning".into());
    tags.push(a.adv_estimator.name().into());
    tags.push(a.loss_mode.name().into());
    if a.loss_mode.needs_teacher() {
        tags.push(spelled(&cfg.self_distillation.teacher_regularization));
    }
    tags.push("text-generation".into());
    tags.push("rlreplay".into());
    let mut seen = std::collections::HashSet::new();
    tags.retain(|t| seen.insert(t.clone()));
    tags
}

/// `## Usage`: loading the card with transformers.
fn usage(name: &str, tokenizer: bool) -> String {
    let mut s =
        String::from("\n## Usage\n\n```python\nfrom transformers import AutoModelForCausalLM");
    s.push_str(if tokenizer {
        ", AutoTokenizer\n\n"
    } else {
        "\n\n"
    });
    s.push_str(&format!(
        "model_id = {}  # this directory, or the hub repository it is uploaded to\n",
        yaml(name)
    ));
    if tokenizer {
        s.push_str("tokenizer = AutoTokenizer.from_pretrained(model_id)\n");
    }
    s.push_str(
        "model = AutoModelForCausalLM.from_pretrained(\n    model_id,\n    \
         torch_dtype=\"auto\",\n    device_map=\"auto\",\n)\n```\n",
    );
    s
}

/// `## Usage` of an adapter card: the base model with the adapter, through PEFT.
fn peft_usage(name: &str, base: Option<&str>) -> String {
    format!(
        "\n## Usage\n\nA LoRA adapter ({ADAPTER_CONFIG}, {ADAPTER_WEIGHTS}) of the base model; \
         `rlreplay export --merge` writes it merged into full weights.\n\n```python\n\
         from peft import AutoPeftModelForCausalLM\n\n\
         model_id = {}  # this directory, or the hub repository it is uploaded to\n\
         # loads the base model named in adapter_config.json{}\n\
         model = AutoPeftModelForCausalLM.from_pretrained(model_id, torch_dtype=\"auto\")\n```\n",
        yaml(name),
        base.map(|b| format!(" ({b})")).unwrap_or_default()
    )
}

/// A YAML (and Python) double-quoted string.
fn yaml(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

/// A Markdown table cell (line breaks as `<br>`).
fn cell(s: &str) -> String {
    s.replace('|', "\\|")
        .replace("\r\n", "<br>")
        .replace(['\n', '\r'], "<br>")
}

fn row_cells(cells: &[String]) -> String {
    cells
        .iter()
        .map(|c| cell(c))
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_ids_and_licenses_are_read_not_guessed() {
        assert_eq!(
            hub_id(Path::new("hf://Qwen/Qwen3-4B")).as_deref(),
            Some("Qwen/Qwen3-4B")
        );
        assert_eq!(
            hub_id(Path::new("/c/hub/models--Qwen--Qwen3-4B/snapshots/abc")).as_deref(),
            Some("Qwen/Qwen3-4B")
        );
        assert_eq!(hub_id(Path::new("models/Qwen3-4B")), None);
        let dir = tempfile::tempdir().unwrap();
        let readme = dir.path().join("README.md");
        fs::write(
            &readme,
            "---\nlicense: apache-2.0\ntags:\n- x\n---\n# M\nlicense: mit\n",
        )
        .unwrap();
        assert_eq!(readme_license(&readme).as_deref(), Some("apache-2.0"));
        fs::write(&readme, "# M\nlicense: mit\n").unwrap();
        assert_eq!(readme_license(&readme), None);
    }

    #[test]
    fn table_cells_escape_pipes_and_breaks() {
        assert_eq!(cell("a|b\nc"), "a\\|b<br>c");
    }
}
