//! The kinds of rollout source and what each needs, decided in one place.

use super::{RolloutBackend, RolloutSection, WeightSync, DEFAULT_ONLINE_STEPS};

/// The kinds of rollout source, one per training front.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SourceKind {
    /// A logged rollout dataset and a schedule (`rlreplay replay`).
    #[default]
    Logged,
    /// Generation from the policy being trained (`rlreplay train`).
    Online,
}

/// Every property of a kind of source, decided here and nowhere else: the configuration, the
/// trainer and the data-parallel ranks ask these instead of naming a kind, and a new kind adds its
/// arm to each exhaustive match below.
impl SourceKind {
    /// Every kind.
    pub const ALL: [SourceKind; 2] = [SourceKind::Logged, SourceKind::Online];

    /// The command that trains from this kind of source.
    pub fn command(self) -> &'static str {
        match self {
            SourceKind::Logged => "rlreplay replay",
            SourceKind::Online => "rlreplay train",
        }
    }

    /// The configuration keys (`section` or `section.key`) only this kind of source reads: the
    /// other fronts refuse them, and the resolved configuration leaves out the other kinds'.
    pub fn keys(self) -> &'static [&'static str] {
        match self {
            SourceKind::Logged => &["data.path", "data.steps", "data.vocab_check", "schedule"],
            SourceKind::Online => &[
                "data.task",
                "data.train_files",
                "data.train_max_samples",
                "data.shuffle",
                "toy",
                "rollout.n",
                "rollout.top_p",
                "rollout.backend",
                "rollout.endpoints",
                "rollout.protocol",
                "rollout.weight_sync",
                "rollout.weights_dir",
                "rollout.request_timeout_s",
                "rollout.retries",
                "rollout.retry_backoff_s",
                "rollout.max_off_policy_steps",
                "rollout.invalid_samples",
                "batch.train_batch_size",
            ],
        }
    }

    /// Whether the source replays a logged rollout dataset (`[data] path`).
    pub fn reads_logged_rollouts(self) -> bool {
        match self {
            SourceKind::Logged => true,
            SourceKind::Online => false,
        }
    }

    /// Whether the source draws text prompts from a prompt set (`[data] task`: files or the toy
    /// task) and renders them with the policy's chat template.
    pub fn draws_prompts(self) -> bool {
        match self {
            SourceKind::Logged => false,
            SourceKind::Online => true,
        }
    }

    /// Whether the source samples responses (with `[rollout]`'s sampling parameters): it needs
    /// the end-of-response ids from the configuration or the model, where logged rows may name
    /// their own.
    pub fn samples(self) -> bool {
        match self {
            SourceKind::Logged => false,
            SourceKind::Online => true,
        }
    }

    /// Trainer steps of a run whose `[trainer] total_training_steps` is absent, written out in
    /// the resolved configuration; `None`: as many as the source plans.
    pub fn default_steps(self) -> Option<u64> {
        match self {
            SourceKind::Logged => None,
            SourceKind::Online => Some(DEFAULT_ONLINE_STEPS),
        }
    }

    /// Whether the source reads the whole policy after every update under `rollout` (rank 0
    /// writes each version for the inference servers of `backend = "remote"`,
    /// `weight_sync = "disk"`): ZeRO-1 then keeps the master weights whole on every rank.
    pub fn needs_whole_weights(self, rollout: &RolloutSection) -> bool {
        match self {
            SourceKind::Logged => false,
            SourceKind::Online => {
                rollout.backend == RolloutBackend::Remote && rollout.weight_sync == WeightSync::Disk
            }
        }
    }
}
