//! What the types alone do not express: value ranges and the settings that go together.

use super::{parse_steps, Config, RolloutBackend, ScheduleMode, Task, ToyTask};
use crate::error::{Error, Result};

impl Config {
    /// Checks what the types alone do not express.
    pub fn validate(&self) -> Result<()> {
        self.algorithm.validate().map_err(Error::Algorithm)?;
        let algo = &self.algorithm;
        if algo.use_kl_loss {
            return Err(Error::config(
                "algorithm.use_kl_loss",
                "[algorithm] use_kl_loss = true: the trainer has no reference policy",
            ));
        }
        let m = &self.model;
        if let Some(random) = &m.random {
            random.to_config()?;
        }
        // The initial policy follows from the prompts: a prompt set is rendered with the
        // tokenizer of its model directory, and the toy task makes its model when none is given.
        match self.prompt_task() {
            None => {
                if m.path.is_none() == m.random.is_none() {
                    return Err(Error::config(
                        "model",
                        "[model]: give exactly one of `path` and `random`",
                    ));
                }
            }
            Some(Task::Files) => {
                if self.data.train_files.is_none() || m.path.is_none() {
                    return Err(Error::config(
                        "data.task",
                        "[data] task = \"files\" needs data.train_files and model.path",
                    ));
                }
                if m.random.is_some() {
                    return Err(Error::config(
                        "model.random",
                        "[model] random: the prompt files need the tokenizer of [model] path",
                    ));
                }
            }
            Some(Task::Toy) => {
                if m.path.is_some() && m.random.is_some() {
                    return Err(Error::config(
                        "model",
                        "[model]: give at most one of `path` and `random`",
                    ));
                }
                if let (None, Some(v)) = (&m.path, m.random.as_ref().and_then(|r| r.vocab_size())) {
                    let toy = ToyTask::VOCAB_SIZE;
                    if v != toy as u64 {
                        return Err(Error::config(
                            "model.random.vocab_size",
                            format!(
                                "[model.random] vocab_size = {v}: the toy tokenizer has {toy} ids"
                            ),
                        ));
                    }
                }
            }
        }
        if self.source.reads_logged_rollouts() && self.data.path.is_none() {
            return Err(Error::config(
                "data.path",
                "[data] path: the rollout dataset to replay is missing",
            ));
        }
        // Without a model directory (a random model; the toy task makes one) there is no
        // tokenizer to decode the rows with.
        let has_model_dir = m.path.is_some() || self.prompt_task() == Some(Task::Toy);
        if algo.loss_mode.needs_teacher() && !has_model_dir {
            return Err(Error::config("algorithm.loss_mode", format!("[algorithm] loss_mode = {:?} needs [model] path: the teacher contexts are decoded \
                 with the model directory's tokenizer.json",
                algo.loss_mode.name())));
        }
        m.fresh_lora()?;
        if m.adapter.is_some() && m.lora_dropout != 0.0 {
            return Err(Error::config(
                "model.lora_dropout",
                format!(
                    "[model] lora_dropout = {}: only 0 is supported (dropout is not implemented)",
                    m.lora_dropout
                ),
            ));
        }
        self.self_distillation.validate()?;
        let r = &self.rollout;
        if !(r.temperature > 0.0 && r.temperature.is_finite()) {
            return Err(Error::config(
                "rollout.temperature",
                format!(
                    "[rollout] temperature = {}: must be a finite positive number",
                    r.temperature
                ),
            ));
        }
        if r.n == 0 || r.max_response_length == 0 || r.max_batch == 0 {
            return Err(Error::config(
                "rollout",
                "[rollout] n, max_response_length and max_batch must be at least 1",
            ));
        }
        if r.backend == RolloutBackend::Remote {
            if r.endpoints.is_empty() {
                return Err(Error::config(
                    "rollout.backend",
                    "[rollout] backend = \"remote\" needs endpoints = [\"http://host:port\", ...]",
                ));
            }
            if let Some(e) = r.endpoints.iter().find(|e| !e.starts_with("http://")) {
                return Err(Error::config(
                    "rollout.endpoints",
                    format!("[rollout] endpoints: {e:?} is not an http:// URL"),
                ));
            }
            let timeout_ok = r.request_timeout_s > 0.0 && r.request_timeout_s.is_finite();
            let backoff_ok = r.retry_backoff_s >= 0.0 && r.retry_backoff_s.is_finite();
            if !(timeout_ok && backoff_ok) {
                return Err(Error::config(
                    "rollout.request_timeout_s",
                    "[rollout] request_timeout_s must be positive and retry_backoff_s >= 0",
                ));
            }
        }
        if r.max_off_policy_steps > 0 && r.backend != RolloutBackend::Remote {
            return Err(Error::config(
                "rollout.max_off_policy_steps",
                format!(
                    "[rollout] max_off_policy_steps = {}: asynchronous generation needs \
                 backend = \"remote\"",
                    r.max_off_policy_steps
                ),
            ));
        }
        let unit = |x: f64| x > 0.0 && x <= 1.0;
        if !unit(r.top_p) || !unit(self.validation.val_top_p) {
            return Err(Error::config(
                "rollout.top_p",
                "[rollout] top_p and [validation] val_top_p must lie in (0, 1]",
            ));
        }
        let v = &self.validation;
        if v.val_n == 0 || v.val_temperature.is_nan() || v.val_temperature < 0.0 {
            return Err(Error::config(
                "validation.val_n",
                "[validation] val_n must be >= 1 and val_temperature >= 0",
            ));
        }
        if self.reward.timeout_s.is_nan() || self.reward.timeout_s <= 0.0 {
            return Err(Error::config(
                "reward.timeout_s",
                "[reward] timeout_s must be positive",
            ));
        }
        if let Some(t) = self.reward.truncated_score.filter(|t| !t.is_finite()) {
            return Err(Error::config(
                "reward.truncated_score",
                format!("[reward] truncated_score = {t}: must be a finite number"),
            ));
        }
        let o = &self.optim;
        if !(o.lr >= 0.0 && o.lr.is_finite()) {
            return Err(Error::config(
                "optim.lr",
                format!(
                    "[optim] lr = {}: must be a finite non-negative number",
                    o.lr
                ),
            ));
        }
        if o.grad_clip.is_nan() || o.grad_clip <= 0.0 {
            return Err(Error::config(
                "optim.grad_clip",
                format!("[optim] grad_clip = {}: must be positive", o.grad_clip),
            ));
        }
        if o.betas.iter().any(|b| !(0.0..1.0).contains(b)) {
            return Err(Error::config(
                "optim.betas",
                format!("[optim] betas = {:?}: each must lie in [0, 1)", o.betas),
            ));
        }
        if o.eps.is_nan()
            || o.eps <= 0.0
            || o.weight_decay.is_nan()
            || o.weight_decay < 0.0
            || !(0.0..=1.0).contains(&o.min_lr_ratio)
        {
            return Err(Error::config(
                "optim",
                "[optim]: eps must be > 0, weight_decay >= 0, min_lr_ratio in [0, 1]",
            ));
        }
        let b = &self.batch;
        if b.train_batch_size == 0 || b.ppo_mini_batch_size == Some(0) {
            return Err(Error::config(
                "batch.train_batch_size",
                "[batch] train_batch_size and ppo_mini_batch_size must be at least 1 prompt",
            ));
        }
        if b.ppo_epochs == 0 || self.schedule.epochs == 0 {
            return Err(Error::config(
                "batch.ppo_epochs",
                "[batch] ppo_epochs and [schedule] epochs must be at least 1",
            ));
        }
        if b.max_tokens_per_micro_batch == 0 {
            return Err(Error::config(
                "batch.max_tokens_per_micro_batch",
                "[batch] max_tokens_per_micro_batch = 0: must be positive",
            ));
        }
        if self.trainer.total_training_steps == Some(0) {
            return Err(Error::config(
                "trainer.total_training_steps",
                "[trainer] total_training_steps = 0: must be at least 1",
            ));
        }
        self.toy.validate()?;
        let s = &self.schedule;
        match s.mode {
            ScheduleMode::Mix if s.mix.is_empty() => {
                return Err(Error::config(
                    "schedule.mode",
                    "[schedule] mode = \"mix\" needs a non-empty `mix` list",
                ))
            }
            ScheduleMode::Lag if s.lag == 0 => {
                return Err(Error::config(
                    "schedule.mode",
                    "[schedule] mode = \"lag\" needs lag >= 1",
                ))
            }
            _ => {}
        }
        if !(s.group_fraction > 0.0 && s.group_fraction <= 1.0) {
            return Err(Error::config(
                "schedule.group_fraction",
                format!(
                    "[schedule] group_fraction = {}: must be in (0, 1]",
                    s.group_fraction
                ),
            ));
        }
        for (i, m) in s.mix.iter().enumerate() {
            if !(m.weight > 0.0 && m.weight.is_finite()) {
                return Err(Error::config(
                    "schedule.mix",
                    format!(
                        "[schedule] mix[{i}].weight = {}: must be a finite positive number",
                        m.weight
                    ),
                ));
            }
            parse_steps(&m.steps).map_err(|e| {
                Error::config("schedule.mix", format!("[schedule] mix[{i}].steps: {e}"))
            })?;
        }
        if let Some(r) = &self.data.steps {
            parse_steps(r)
                .map_err(|e| Error::config("data.steps", format!("[data] steps: {e}")))?;
        }
        Ok(())
    }
}
