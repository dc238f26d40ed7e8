//! The engine thread: one [`Batcher`] per served model (the base model and each LoRA adapter),
//! fed by every HTTP request.
//!
//! Requests arrive as jobs on a channel; their prompts join the batch of the model they name
//! between decode steps and leave as they finish, so concurrent requests on one model share every
//! decode step. Each turn of the loop steps every model that has work, the base model first, then
//! the adapters in the order they were loaded; a model's samples do not depend on the others.
//! The thread also owns the weights: a weight update lets the requests in flight finish on the
//! old weights, holds the requests that arrive meanwhile, swaps the decoders once every batch is
//! empty and releases them on the new weights (or aborts the requests in flight first, when
//! asked). While generation is paused in place the swap happens at once and the paused requests
//! continue on the new weights.
//!
//! An adapter loaded under a name already served replaces it for new requests; the requests in
//! flight on the old one finish on it, and it is dropped once its batch is empty. An unloaded
//! adapter is dropped the same way.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;

use rlreplay_model::generate::Decoder;
use rlreplay_sampling::engine::{Batcher, BatcherStats, Finished, Group};
use rlreplay_sampling::sampling::{LogprobMode, SamplingParams};
use tokio::sync::oneshot;

use crate::protocol::control::{PauseMode, ServerInfo};
use crate::request::{Completion, Finish, Job};

/// What a finished job sends back: its completions (prompt-major), the weight version that
/// produced them, and the seconds since it arrived.
pub struct JobResult {
    /// `p * n + j`.
    pub completions: Vec<Completion>,
    /// The weight version in use when the job finished.
    pub weight_version: String,
    /// Seconds from arrival to the last sample.
    pub latency: f64,
}

/// Why a job was not run: the adapter it names is not served (any more).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownAdapter(pub String);

/// Where a job's result goes.
pub type JobReply = oneshot::Sender<Result<JobResult, UnknownAdapter>>;

/// Messages to the engine thread.
pub enum Command {
    /// Generate a job; the result goes to `reply`.
    Submit {
        /// The caller's id for [`Command::Cancel`].
        id: u64,
        /// The validated request.
        job: Arc<Job>,
        /// The LoRA adapter to generate with, by name; `None`: the base model.
        adapter: Option<String>,
        /// Where the result goes.
        reply: JobReply,
    },
    /// The caller gave up on job `id`: drop its samples.
    Cancel {
        /// The job's id.
        id: u64,
    },
    /// Pause generation; `reply` when done (for `wait`, once the batch is empty).
    Pause {
        /// What happens to the requests in flight.
        mode: Pause,
        /// Answered when the pause is in effect.
        reply: oneshot::Sender<()>,
    },
    /// Resume generation.
    Continue {
        /// Answered at once.
        reply: oneshot::Sender<()>,
    },
    /// An update starts: hold new requests (abort the ones in flight when `abort`).
    BeginUpdate {
        /// Abort the requests in flight.
        abort: bool,
        /// Answered at once.
        reply: oneshot::Sender<()>,
    },
    /// The new weights are loaded: swap them in once the batch is empty (at once when paused).
    Swap {
        /// The new decoder.
        decoder: Box<Decoder>,
        /// The served adapters rebuilt on the new weights, by name.
        adapters: Vec<(String, Box<Decoder>)>,
        /// The directory it was loaded from.
        model_path: String,
        /// The new version, if given.
        version: Option<String>,
        /// Answered with the number of requests that waited for the new weights.
        reply: oneshot::Sender<usize>,
    },
    /// Serve a LoRA adapter (merged into its decoder) under `name`, replacing one of that name
    /// for new requests.
    LoadAdapter {
        /// The adapter's name.
        name: String,
        /// The base weights with the adapter merged.
        decoder: Box<Decoder>,
        /// Answered with whether an adapter of that name was replaced.
        reply: oneshot::Sender<bool>,
    },
    /// Stop serving the adapter `name` to new requests.
    UnloadAdapter {
        /// The adapter's name.
        name: String,
        /// Answered with whether it was served.
        reply: oneshot::Sender<bool>,
    },
    /// Loading failed: release the held requests on the old weights.
    CancelUpdate {
        /// Answered at once.
        reply: oneshot::Sender<()>,
    },
    /// Report counters.
    Info {
        /// Where they go.
        reply: oneshot::Sender<ServerInfo>,
    },
}

/// How a pause treats the requests in flight.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pause {
    /// End them with what they generated.
    Abort,
    /// Keep them until continue.
    InPlace,
    /// Let them finish, hold new ones.
    Wait,
}

impl From<PauseMode> for Pause {
    fn from(m: PauseMode) -> Self {
        match m {
            PauseMode::Abort => Self::Abort,
            PauseMode::InPlace | PauseMode::Retract => Self::InPlace,
        }
    }
}

/// A job being generated.
struct Running {
    job: Arc<Job>,
    results: Vec<Option<Completion>>,
    left: usize,
    arrived: Instant,
    reply: JobReply,
}

/// A job waiting to start (while paused or during an update).
struct Held {
    id: u64,
    job: Arc<Job>,
    adapter: Option<String>,
    reply: JobReply,
    arrived: Instant,
}

/// One served model: the base model or a LoRA adapter, with its own batch.
struct Slot {
    /// Unique among the slots ever made; the base model's is 0.
    id: u64,
    /// The adapter's name; `None` for the base model.
    name: Option<String>,
    /// Whether new requests may start on it; false once unloaded or replaced (it then finishes
    /// the requests it has and is dropped).
    live: bool,
    decoder: Box<Decoder>,
    batcher: Batcher,
}

/// Samples `first..first + left` (those not yet finished) of prompt `prompt` of job `job`: one
/// batcher group. A prompt whose `n` is above `max_num_seqs` enters the batch as several pieces,
/// so that no more than `max_num_seqs` sequences decode at once.
struct Piece {
    job: u64,
    prompt: usize,
    first: usize,
    left: usize,
}

/// A weight swap waiting for the batch to empty.
struct PendingSwap {
    decoder: Box<Decoder>,
    adapters: Vec<(String, Box<Decoder>)>,
    model_path: String,
    version: Option<String>,
    reply: oneshot::Sender<usize>,
}

/// The state of the engine thread.
pub struct Worker {
    /// The base model first, then the adapters in load order.
    slots: Vec<Slot>,
    next_slot: u64,
    /// The counters of the slots dropped so far.
    retired: BatcherStats,
    mode: LogprobMode,
    max_num_seqs: usize,
    weight_version: String,
    /// Shared with the HTTP side: the model directory in use.
    model_path: Arc<std::sync::Mutex<String>>,
    jobs: HashMap<u64, Running>,
    /// (slot id, batcher group id) -> the samples it generates.
    groups: HashMap<(u64, usize), Piece>,
    /// Requests that arrived while paused or during an update.
    held: VecDeque<Held>,
    paused: bool,
    /// `pause?mode=wait` callers, answered when the batch is empty.
    pause_waiters: Vec<oneshot::Sender<()>>,
    updating: bool,
    held_during_update: usize,
    swap: Option<PendingSwap>,
    weight_updates: u64,
}

impl Worker {
    /// A worker serving `decoder`, decoding up to `max_num_seqs` sequences of each served model
    /// at once (at least 1).
    pub fn new(
        decoder: Decoder,
        max_num_seqs: usize,
        mode: LogprobMode,
        weight_version: String,
        model_path: Arc<std::sync::Mutex<String>>,
    ) -> Self {
        let max_num_seqs = max_num_seqs.max(1);
        Self {
            slots: vec![Slot {
                id: 0,
                name: None,
                live: true,
                decoder: Box::new(decoder),
                batcher: Batcher::new(max_num_seqs),
            }],
            next_slot: 1,
            retired: BatcherStats::default(),
            mode,
            max_num_seqs,
            weight_version,
            model_path,
            jobs: HashMap::new(),
            groups: HashMap::new(),
            held: VecDeque::new(),
            paused: false,
            pause_waiters: Vec::new(),
            updating: false,
            held_during_update: 0,
            swap: None,
            weight_updates: 0,
        }
    }

    /// Serves the LoRA adapter merged into `decoder` under `name`; an adapter already served
    /// under that name stops taking new requests (see the module docs). Returns whether one was.
    pub fn add_adapter(&mut self, name: String, decoder: Box<Decoder>) -> bool {
        let replaced = self.retire(&name);
        self.slots.push(Slot {
            id: self.next_slot,
            name: Some(name),
            live: true,
            decoder,
            batcher: Batcher::new(self.max_num_seqs),
        });
        self.next_slot += 1;
        replaced
    }

    /// Runs until every sender of `rx` is gone.
    pub fn run(mut self, rx: mpsc::Receiver<Command>) {
        loop {
            let busy = !self.is_idle() && !self.paused;
            let cmd = if busy {
                match rx.try_recv() {
                    Ok(c) => Some(c),
                    Err(mpsc::TryRecvError::Empty) => None,
                    Err(mpsc::TryRecvError::Disconnected) => return,
                }
            } else {
                match rx.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return,
                }
            };
            if let Some(c) = cmd {
                self.handle(c);
                // Take every queued command before the next step.
                continue;
            }
            self.step();
        }
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Submit {
                id,
                job,
                adapter,
                reply,
            } => {
                let held = Held {
                    id,
                    job,
                    adapter,
                    reply,
                    arrived: Instant::now(),
                };
                if self.paused || self.updating || !self.pause_waiters.is_empty() {
                    if self.updating {
                        self.held_during_update += 1;
                    }
                    self.held.push_back(held);
                } else {
                    self.start(held);
                }
            }
            Command::Cancel { id } => {
                if self.jobs.remove(&id).is_some() {
                    // Every piece of every prompt of the job, waiting or running.
                    let dropped: HashSet<(u64, usize)> = self
                        .groups
                        .iter()
                        .filter(|(_, piece)| piece.job == id)
                        .map(|(&g, _)| g)
                        .collect();
                    self.groups.retain(|g, _| !dropped.contains(g));
                    for slot in &mut self.slots {
                        let sid = slot.id;
                        slot.batcher.retain_groups(|g| !dropped.contains(&(sid, g)));
                    }
                }
                self.held.retain(|h| h.id != id);
                self.settle();
            }
            Command::Pause { mode, reply } => match mode {
                Pause::Abort => {
                    self.abort_all();
                    self.paused = true;
                    let _ = reply.send(());
                }
                Pause::InPlace => {
                    self.paused = true;
                    let _ = reply.send(());
                    self.try_swap();
                }
                Pause::Wait => {
                    self.pause_waiters.push(reply);
                    self.settle();
                }
            },
            Command::Continue { reply } => {
                self.paused = false;
                self.release();
                let _ = reply.send(());
            }
            Command::BeginUpdate { abort, reply } => {
                if abort {
                    self.abort_all();
                }
                self.updating = true;
                self.held_during_update = 0;
                let _ = reply.send(());
            }
            Command::Swap {
                decoder,
                adapters,
                model_path,
                version,
                reply,
            } => {
                self.swap = Some(PendingSwap {
                    decoder,
                    adapters,
                    model_path,
                    version,
                    reply,
                });
                self.try_swap();
            }
            Command::LoadAdapter {
                name,
                decoder,
                reply,
            } => {
                let replaced = self.add_adapter(name, decoder);
                let _ = reply.send(replaced);
            }
            Command::UnloadAdapter { name, reply } => {
                let found = self.retire(&name);
                let _ = reply.send(found);
            }
            Command::CancelUpdate { reply } => {
                self.updating = false;
                self.release();
                let _ = reply.send(());
            }
            Command::Info { reply } => {
                let s = self.stats();
                let _ = reply.send(ServerInfo {
                    weight_version: self.weight_version.clone(),
                    max_num_seqs: self.max_num_seqs,
                    forward_passes: s.forward_passes,
                    decode_steps: s.decode_steps,
                    generated_tokens: s.sampled_tokens,
                    max_running_seqs: s.max_running,
                    max_running_requests: s.max_running_groups,
                    running_seqs: self.slots.iter().map(|s| s.batcher.running()).sum(),
                    waiting_prompts: self.slots.iter().map(|s| s.batcher.waiting()).sum(),
                    held_requests: self.held.len(),
                    paused: self.paused,
                    weight_updates: self.weight_updates,
                });
            }
        }
    }

    /// Whether no model has work, waiting or running.
    fn is_idle(&self) -> bool {
        self.slots.iter().all(|s| s.batcher.is_idle())
    }

    /// The counters of every batch, dropped ones included: sums, and the largest of the maxima.
    fn stats(&self) -> BatcherStats {
        let mut t = self.retired;
        for s in self.slots.iter().map(|s| s.batcher.stats()) {
            add_stats(&mut t, &s);
        }
        t
    }

    /// Takes the live adapter `name` out of service for new requests (dropped at once when its
    /// batch is empty, else once it is). Returns whether it was served.
    fn retire(&mut self, name: &str) -> bool {
        let mut found = false;
        for slot in &mut self.slots {
            if slot.live && slot.name.as_deref() == Some(name) {
                slot.live = false;
                found = true;
            }
        }
        self.drop_retired();
        found
    }

    /// Drops the retired adapters whose batches are empty.
    fn drop_retired(&mut self) {
        let mut retired = self.retired;
        self.slots.retain(|s| {
            let keep = s.live || !s.batcher.is_idle();
            if !keep {
                add_stats(&mut retired, &s.batcher.stats());
            }
            keep
        });
        self.retired = retired;
    }

    /// Puts a job's prompts into the batch of its model, in pieces of at most `max_num_seqs`
    /// samples (prompts with no tokens to generate finish at once). A job naming an adapter that
    /// is not served is answered [`UnknownAdapter`].
    fn start(&mut self, held: Held) {
        let Held {
            id,
            job,
            adapter,
            reply,
            arrived,
        } = held;
        let slot = self.slots.iter().position(|s| s.live && s.name == adapter);
        let Some(slot) = slot else {
            let _ = reply.send(Err(UnknownAdapter(adapter.unwrap_or_default())));
            return;
        };
        let n = job.n;
        let mut run = Running {
            results: vec![None; job.prompts.len() * n],
            left: job.prompts.len() * n,
            arrived,
            reply,
            job: job.clone(),
        };
        for (p, prompt) in job.prompts.iter().enumerate() {
            let s = &prompt.spec;
            if s.max_new_tokens == 0 {
                for j in 0..n {
                    run.results[p * n + j] = Some(Completion {
                        tokens: Vec::new(),
                        logprobs: Vec::new(),
                        top: Vec::new(),
                        finish: Finish::Length,
                    });
                    run.left -= 1;
                }
                continue;
            }
            for first in (0..n).step_by(self.max_num_seqs) {
                let count = self.max_num_seqs.min(n - first);
                let group = self.slots[slot].batcher.push(Group {
                    prompt: prompt.ids.clone(),
                    n: count,
                    params: SamplingParams {
                        temperature: s.temperature,
                        top_p: s.top_p,
                        top_k: s.top_k,
                        max_new_tokens: s.max_new_tokens,
                        stop_ids: s.stop_ids.clone(),
                        seed: s.seed,
                    },
                    first_stream: s.first_stream + (p * n + first) as u64,
                    logprobs: self.mode,
                    top_logprobs: job.top_logprobs.unwrap_or(0),
                });
                let piece = Piece {
                    job: id,
                    prompt: p,
                    first,
                    left: count,
                };
                self.groups.insert((self.slots[slot].id, group), piece);
            }
        }
        if run.left == 0 {
            self.reply(run);
        } else {
            self.jobs.insert(id, run);
        }
    }

    /// Answers a job whose samples have all finished.
    fn reply(&self, run: Running) {
        let result = JobResult {
            completions: run.results.into_iter().flatten().collect(),
            weight_version: self.weight_version.clone(),
            latency: run.arrived.elapsed().as_secs_f64(),
        };
        // The caller may have gone away; nothing to do then.
        let _ = run.reply.send(Ok(result));
    }

    /// Files finished samples of slot `slot` under their jobs and answers the jobs that are
    /// complete.
    fn deliver(&mut self, slot: u64, finished: Vec<Finished>) {
        for f in finished {
            let g = f.generation;
            let key = (slot, g.prompt);
            let Some(piece) = self.groups.get_mut(&key) else {
                continue;
            };
            let (id, p, j) = (piece.job, piece.prompt, piece.first + g.sample);
            piece.left -= 1;
            if piece.left == 0 {
                self.groups.remove(&key);
            }
            let Some(run) = self.jobs.get_mut(&id) else {
                continue;
            };
            let spec = &run.job.prompts[p].spec;
            let finish = match (f.aborted, g.truncated, g.tokens.last()) {
                (true, _, _) => Finish::Abort,
                (false, false, Some(&last)) => Finish::Stop {
                    id: last,
                    eos: spec.eos_ids.contains(&last),
                },
                _ => Finish::Length,
            };
            let n = run.job.n;
            run.results[p * n + j] = Some(Completion {
                tokens: g.tokens,
                logprobs: g.logprobs,
                top: f.top,
                finish,
            });
            run.left -= 1;
            if run.left == 0 {
                if let Some(run) = self.jobs.remove(&id) {
                    self.reply(run);
                }
            }
        }
    }

    fn abort_all(&mut self) {
        for i in 0..self.slots.len() {
            self.abort_slot(i);
        }
        self.drop_retired();
    }

    /// Ends every request of slot `i` now.
    fn abort_slot(&mut self, i: usize) {
        let aborted = self.slots[i].batcher.abort_all();
        let id = self.slots[i].id;
        self.deliver(id, aborted);
    }

    /// One step of every model that has work.
    fn step(&mut self) {
        for i in 0..self.slots.len() {
            let slot = &mut self.slots[i];
            if slot.batcher.is_idle() {
                continue;
            }
            let id = slot.id;
            match slot.batcher.step(&slot.decoder) {
                Ok(done) => self.deliver(id, done),
                Err(e) => {
                    // Requests are validated before they get here: an error is the engine's own
                    // (out of memory, a backend failure). Fail the model's requests in flight,
                    // keep serving.
                    eprintln!(
                        "error: the decode step failed: {e:#}; aborting the requests in flight"
                    );
                    self.abort_slot(i);
                }
            }
        }
        self.settle();
    }

    /// Drops the retired adapters that are done; once every batch is empty, answers `wait`
    /// pauses and applies a pending weight swap.
    fn settle(&mut self) {
        self.drop_retired();
        if !self.is_idle() {
            return;
        }
        if !self.pause_waiters.is_empty() {
            self.paused = true;
            for w in self.pause_waiters.drain(..) {
                let _ = w.send(());
            }
        }
        self.try_swap();
    }

    /// Swaps in the pending weights when every batch is empty or generation is paused.
    fn try_swap(&mut self) {
        if !(self.is_idle() || self.paused) {
            return;
        }
        let Some(s) = self.swap.take() else {
            return;
        };
        let mut adapters: HashMap<String, Box<Decoder>> = s.adapters.into_iter().collect();
        // Retired adapters finish their requests on the weights they had.
        for slot in self.slots.iter_mut().filter(|s| s.live) {
            if let Some(d) = slot.name.as_ref().and_then(|n| adapters.remove(n)) {
                slot.decoder = d;
            }
        }
        self.slots[0].decoder = s.decoder;
        if let Some(v) = s.version {
            self.weight_version = v;
        }
        if let Ok(mut p) = self.model_path.lock() {
            *p = s.model_path;
        }
        self.weight_updates += 1;
        self.updating = false;
        let _ = s.reply.send(self.held_during_update);
        self.release();
    }

    /// Starts the held requests unless paused or updating.
    fn release(&mut self) {
        if self.paused || self.updating || !self.pause_waiters.is_empty() {
            return;
        }
        while let Some(h) = self.held.pop_front() {
            self.start(h);
        }
    }
}

/// Adds the counters `s` to `total`: sums, and the largest of the maxima.
fn add_stats(total: &mut BatcherStats, s: &BatcherStats) {
    total.forward_passes += s.forward_passes;
    total.decode_steps += s.decode_steps;
    total.sampled_tokens += s.sampled_tokens;
    total.max_running = total.max_running.max(s.max_running);
    total.max_running_groups = total.max_running_groups.max(s.max_running_groups);
}
