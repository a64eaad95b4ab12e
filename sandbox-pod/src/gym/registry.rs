//! The episodes a server-mode sandbox holds, and a bound on how many run at
//! once. Each episode has a slot behind a lock that is only ever held
//! briefly: a step takes the episode out of its slot while its tool calls
//! run (leaving what it began from, [`Playing`]), so a read, an injection
//! or a close is answered at once, not after the step. Steps take turns on
//! a lock of their own. A status readable without either lock serves
//! listings and the idle reaper.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use serde::Serialize;
use serde_json::Value;

use crate::driver::StopSignal;
use crate::episode::{Episode, EpisodeResult};
use crate::policy::ChatMessage;

/// One episode's slot: the running episode, or its result once finished.
#[derive(Debug, Default)]
pub struct Slot {
    /// `None` while a step is played ([`Slot::playing`]) and once finished.
    pub episode: Option<Episode>,
    pub result: Option<EpisodeResult>,
    /// The step under way, if one is.
    pub playing: Option<Playing>,
    /// The ids of the live injections accepted so far: each is given once.
    pub injection_ids: BTreeSet<String>,
}

/// A step being played, and the episode as it stood when the step began
/// (as of the last finished step), which a read answers with meanwhile.
#[derive(Debug)]
pub struct Playing {
    pub step: u32,
    pub messages: Vec<ChatMessage>,
    pub memory: Value,
}

/// What listings show; updated after every operation on the slot.
#[derive(Debug, Clone, Serialize)]
pub struct SlotStatus {
    pub episode_id: String,
    /// The test-set row it was created from; absent for an inline episode.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub row_id: Option<String>,
    pub step: u32,
    /// The step being played right now (its action's tool calls running), if any.
    pub step_in_progress: Option<u32>,
    pub done: bool,
    /// `running`, or the outcome once done (`completed`, `max_steps`, `error`, `cancelled`).
    pub state: String,
    /// True once the trace is complete (`close`, the final step, or the idle timeout).
    pub closed: bool,
    pub created_unix_ms: u64,
    pub trace_file: String,
    #[serde(skip)]
    pub last_used: Instant,
}

/// A slot and its status.
#[derive(Debug)]
pub struct Entry {
    pub slot: tokio::sync::Mutex<Slot>,
    pub status: Mutex<SlotStatus>,
    /// Held by a step for as long as it is played (and by a close or the
    /// shutdown until the step has ended): steps are played one at a time.
    pub turn: tokio::sync::Mutex<()>,
    /// Fired by a close: the step under way is cut off where it stands.
    pub closing: StopSignal,
}

impl Entry {
    pub fn new(status: SlotStatus) -> Self {
        Self {
            slot: tokio::sync::Mutex::new(Slot::default()),
            status: Mutex::new(status),
            turn: tokio::sync::Mutex::new(()),
            closing: StopSignal::new(),
        }
    }

    pub fn status(&self) -> SlotStatus {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    pub fn update(&self, f: impl FnOnce(&mut SlotStatus)) {
        let mut status = self.status.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut status);
        status.last_used = Instant::now();
    }
}

/// All episodes, and the count of those still open.
#[derive(Debug, Default)]
pub struct Registry {
    entries: Mutex<BTreeMap<String, Arc<Entry>>>,
    open: AtomicUsize,
    next: AtomicUsize,
}

/// Why an episode could not be registered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegisterError {
    Full { open: usize, max: usize },
    Exists(String),
}

impl Registry {
    /// A fresh sequence number for generated episode ids.
    pub fn next_number(&self) -> usize {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::Acquire)
    }

    /// Reserves room for one more open episode, at most `max` at once.
    pub fn reserve(&self, max: usize) -> Result<Reservation<'_>, RegisterError> {
        let mut open = self.open.load(Ordering::Acquire);
        loop {
            if open >= max {
                return Err(RegisterError::Full { open, max });
            }
            match self.open.compare_exchange(open, open + 1, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => return Ok(Reservation { registry: self, kept: false }),
                Err(now) => open = now,
            }
        }
    }

    /// One open episode finished.
    pub fn release(&self) {
        self.open.fetch_sub(1, Ordering::AcqRel);
    }

    pub fn contains(&self, id: &str) -> bool {
        self.lock().contains_key(id)
    }

    /// Adds an entry under a reservation; refused when the id is taken.
    pub fn insert(&self, reservation: Reservation<'_>, id: &str, entry: Arc<Entry>) -> Result<(), RegisterError> {
        let mut entries = self.lock();
        if entries.contains_key(id) {
            return Err(RegisterError::Exists(id.to_string()));
        }
        entries.insert(id.to_string(), entry);
        reservation.keep();
        Ok(())
    }

    /// Forgets an entry (one whose episode never started).
    pub fn remove(&self, id: &str) {
        self.lock().remove(id);
    }

    pub fn get(&self, id: &str) -> Option<Arc<Entry>> {
        self.lock().get(id).cloned()
    }

    pub fn all(&self) -> Vec<Arc<Entry>> {
        self.lock().values().cloned().collect()
    }

    /// Forgets the closed episodes untouched for longer than `held`.
    pub fn forget_closed(&self, held: Duration) {
        self.lock().retain(|_, entry| {
            let status = entry.status.lock().unwrap_or_else(|p| p.into_inner());
            !(status.closed && status.last_used.elapsed() > held)
        });
    }

    /// Open episodes untouched for longer than `idle`.
    pub fn idle(&self, idle: Duration) -> Vec<Arc<Entry>> {
        self.all().into_iter().filter(|e| !e.status().closed && e.status().last_used.elapsed() > idle).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Entry>>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Room for one open episode; given back unless [`Registry::insert`] keeps it.
#[derive(Debug)]
pub struct Reservation<'a> {
    registry: &'a Registry,
    kept: bool,
}

impl Reservation<'_> {
    fn keep(mut self) {
        self.kept = true;
    }
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if !self.kept {
            self.registry.release();
        }
    }
}

pub fn unix_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
