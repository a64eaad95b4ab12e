//! Fewer episodes at once while the policy's endpoint says "too many
//! requests" (429).
//!
//! A hosted API limits each key's requests; a run whose episodes in flight
//! ask more than it allows meets 429 after 429. Retrying alone does not
//! help: every episode under way retries, the same crowd meets the same
//! limit, and a request that loses four times fails its turn — an episode
//! not measured because of how the run was configured, not the agent.
//!
//! So an [`OpenAiPolicy`](super::OpenAiPolicy) carries one [`Throttle`],
//! shared by its clones (the shards of a `basecamp run` variant, the
//! episodes of a pod), that adapts its limit as TCP adapts its window
//! (additive increase, multiplicative decrease):
//!
//! - no limit until the first 429; then half the requests that were in
//!   flight ([`Throttle::rate_limited`]);
//! - a 429 to a request sent before the last lowering lowers nothing more:
//!   one crowd, one halving;
//! - while the limit holds episodes back, each `limit` answers without 429
//!   raise it by one ([`Throttle::answered`]), so a run finds the
//!   endpoint's limit again after a burst of other traffic;
//! - a `Retry-After` pauses every request of the policy until then, not
//!   only the one it answered.
//!
//! The limit bounds the episodes running: an episode waits for its
//! [`Slot`] before it starts — its trace is not created and its clock not
//! started — so a throttled run's `resolution_time` and plan-step timeouts
//! measure the agent, not a queue. It bounds the requests in flight too
//! ([`Throttle::request`]): the episodes already running when it was
//! lowered take turns instead of spending their attempts on 429s.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::time::Instant;

/// How many episodes of one policy run at once, and when its requests may
/// be sent: see the module documentation.
#[derive(Debug, Default)]
pub struct Throttle {
    state: Mutex<State>,
    /// An episode or a request ended, or the limit rose: a waiting one may go.
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Episodes started (holding a [`Slot`]) and not yet ended.
    running: usize,
    /// Requests sent (holding a [`Request`]) and not yet answered.
    requests: usize,
    /// The most episodes running, and requests in flight, at once; `None`
    /// until the first 429.
    limit: Option<usize>,
    /// Answers without 429 counted toward raising `limit` by one.
    toward_raise: usize,
    /// Bumped at each lowering: a 429 to a request sent before it was
    /// answered to the crowd already counted.
    generation: u64,
    /// No request is sent before this: the latest `Retry-After`.
    paused_until: Option<Instant>,
    /// 429 answers, retried or not.
    rate_limited: u64,
    /// The lowest `limit` so far.
    lowest: Option<usize>,
}

impl State {
    fn below_limit(&self, count: usize) -> bool {
        self.limit.is_none_or(|limit| count < limit)
    }
}

/// An episode's place among those running; dropping it (the episode ended)
/// lets the next start.
#[derive(Debug)]
pub struct Slot {
    throttle: Arc<Throttle>,
}

/// A request's place among those in flight, and which crowd it belongs
/// to; drop it once answered.
#[derive(Debug)]
pub struct Request {
    throttle: Arc<Throttle>,
    generation: u64,
}

/// The limit was lowered by a 429.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lowered {
    /// The limit before, or the requests that were in flight when there was none.
    pub from: usize,
    pub to: usize,
    /// No limit was ever this low before: worth saying to the user.
    pub new_low: bool,
}

/// What a throttle did, for a shard's summary and metrics.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RateLimits {
    /// 429 answers of the policy's endpoint, retried or not.
    pub answers_429: u64,
    /// The fewest episodes at once the run came down to.
    pub lowest_episodes_at_once: usize,
    /// The limit when the summary was written.
    pub episodes_at_once_at_end: usize,
}

impl RateLimits {
    /// What a run's summary says of it, after the variant's name.
    pub fn sentence(&self) -> String {
        format!(
            "the policy endpoint answered 429 (too many requests) {} time(s), so fewer episodes ran at once: as \
             few as {}, {} at the end; it allows fewer requests at once than the run's episodes in flight \
             (--concurrency, shards)",
            self.answers_429, self.lowest_episodes_at_once, self.episodes_at_once_at_end
        )
    }
}

impl Throttle {
    fn state(&self) -> MutexGuard<'_, State> {
        // The state is counts, each left whole by every update.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until one more episode may run, and holds its place.
    pub async fn admit(self: &Arc<Self>) -> Slot {
        loop {
            // Registered before the check, so an episode that ends between
            // the check and the wait still wakes this one.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.state();
                if state.below_limit(state.running) {
                    state.running += 1;
                    return Slot { throttle: self.clone() };
                }
            }
            changed.await;
        }
    }

    /// Waits until a request may be sent — a `Retry-After` is over, fewer
    /// than the limit are in flight — and holds its place; its outcome goes
    /// to [`answered`](Self::answered) or [`rate_limited`](Self::rate_limited).
    pub async fn request(self: &Arc<Self>) -> Request {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let paused_until = {
                let mut state = self.state();
                match state.paused_until.filter(|until| *until > Instant::now()) {
                    Some(until) => Some(until),
                    None if state.below_limit(state.requests) => {
                        state.requests += 1;
                        return Request { throttle: self.clone(), generation: state.generation };
                    }
                    None => None,
                }
            };
            match paused_until {
                Some(until) => tokio::time::sleep_until(until).await,
                None => changed.await,
            }
        }
    }

    /// A request was answered without 429: while the limit is what holds
    /// episodes back, every `limit` such answers raise it by one.
    pub fn answered(&self, request: &Request) {
        let mut state = self.state();
        let Some(limit) = state.limit else { return };
        if request.generation != state.generation || state.running < limit {
            return;
        }
        state.toward_raise += 1;
        if state.toward_raise >= limit {
            state.toward_raise = 0;
            state.limit = Some(limit + 1);
            drop(state);
            self.changed.notify_waiters();
        }
    }

    /// A request was answered 429; `pause`: the `Retry-After` that will be
    /// honoured. Halves the limit (rounding up) unless this request's crowd
    /// was counted already; returns the lowering, if any.
    pub fn rate_limited(&self, request: &Request, pause: Option<Duration>) -> Option<Lowered> {
        let mut state = self.state();
        state.rate_limited += 1;
        if let Some(pause) = pause {
            let until = Instant::now() + pause;
            state.paused_until = Some(state.paused_until.map_or(until, |already| already.max(until)));
        }
        if request.generation != state.generation {
            return None;
        }
        let from = state.limit.unwrap_or(state.requests).max(1);
        let to = from.div_ceil(2);
        state.generation += 1;
        state.toward_raise = 0;
        state.limit = Some(to);
        let new_low = state.lowest.is_none_or(|lowest| to < lowest);
        if new_low {
            state.lowest = Some(to);
        }
        // From one, halving leaves one: the same limit, said once.
        (to < from || new_low).then_some(Lowered { from, to, new_low })
    }

    /// What the throttle did so far; `None` before the first 429.
    pub fn report(&self) -> Option<RateLimits> {
        let state = self.state();
        (state.rate_limited > 0).then(|| RateLimits {
            answers_429: state.rate_limited,
            lowest_episodes_at_once: state.lowest.unwrap_or(0),
            episodes_at_once_at_end: state.limit.unwrap_or(0),
        })
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.throttle.state().running -= 1;
        self.throttle.changed.notify_waiters();
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        self.throttle.state().requests -= 1;
        self.throttle.changed.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` episodes started at once.
    async fn started(throttle: &Arc<Throttle>, n: usize) -> Vec<Slot> {
        let mut slots = Vec::new();
        for _ in 0..n {
            slots.push(throttle.admit().await);
        }
        slots
    }

    /// `n` requests sent at once.
    async fn sent(throttle: &Arc<Throttle>, n: usize) -> Vec<Request> {
        let mut requests = Vec::new();
        for _ in 0..n {
            requests.push(throttle.request().await);
        }
        requests
    }

    /// The limit after `answers` more requests answered without 429, one at a time.
    async fn raised_to(throttle: &Arc<Throttle>, answers: usize) -> Option<usize> {
        for _ in 0..answers {
            throttle.answered(&throttle.request().await);
        }
        throttle.state().limit
    }

    #[tokio::test]
    async fn no_limit_until_the_first_429_then_half_the_requests_in_flight() {
        let throttle = Arc::new(Throttle::default());
        let _slots = started(&throttle, 8).await;
        let crowd = sent(&throttle, 6).await;
        assert_eq!(throttle.report(), None);
        assert_eq!(throttle.rate_limited(&crowd[0], None), Some(Lowered { from: 6, to: 3, new_low: true }));
        // The rest of the crowd that met the limit lowers nothing more.
        for request in &crowd[1..] {
            assert_eq!(throttle.rate_limited(request, None), None);
        }
        drop(crowd);
        // A request sent since, under the new limit, meets 429: lowered again.
        let request = throttle.request().await;
        assert_eq!(throttle.rate_limited(&request, None), Some(Lowered { from: 3, to: 2, new_low: true }));
        assert_eq!(
            throttle.report(),
            Some(RateLimits { answers_429: 7, lowest_episodes_at_once: 2, episodes_at_once_at_end: 2 })
        );
    }

    #[tokio::test]
    async fn never_below_one() {
        let throttle = Arc::new(Throttle::default());
        let _slot = throttle.admit().await;
        let request = throttle.request().await;
        assert_eq!(throttle.rate_limited(&request, None), Some(Lowered { from: 1, to: 1, new_low: true }));
        drop(request);
        let request = throttle.request().await;
        assert_eq!(throttle.rate_limited(&request, None), None, "one already: nothing lowered, nothing said");
        assert_eq!(throttle.report().unwrap().episodes_at_once_at_end, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn an_episode_or_a_request_over_the_limit_waits_for_one_to_end() {
        let throttle = Arc::new(Throttle::default());
        let mut slots = started(&throttle, 3).await;
        let mut requests = sent(&throttle, 2).await;
        throttle.rate_limited(&requests[0], None);
        let episode = tokio::spawn({
            let throttle = throttle.clone();
            async move { throttle.admit().await }
        });
        let request = tokio::spawn({
            let throttle = throttle.clone();
            async move { throttle.request().await }
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!episode.is_finished(), "3 running of a limit of 1: the next waits");
        assert!(!request.is_finished(), "2 in flight of a limit of 1: the next waits");
        requests.pop();
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!request.is_finished(), "still 1 in flight");
        requests.pop();
        tokio::time::timeout(Duration::from_secs(1), request).await.expect("sent once one was answered").unwrap();
        slots.truncate(1);
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!episode.is_finished(), "still 1 running");
        slots.pop();
        tokio::time::timeout(Duration::from_secs(1), episode).await.expect("started once one ended").unwrap();
    }

    #[tokio::test]
    async fn answers_while_the_limit_holds_episodes_back_raise_it_by_one_per_limit() {
        let throttle = Arc::new(Throttle::default());
        let mut slots = started(&throttle, 2).await;
        let crowd = sent(&throttle, 6).await;
        throttle.rate_limited(&crowd[0], None);
        // Answers to the crowd sent before the lowering raise nothing.
        for request in &crowd {
            throttle.answered(request);
        }
        drop(crowd);
        // A limit of 3 with 2 running: it holds nothing back, and stays.
        assert_eq!(raised_to(&throttle, 10).await, Some(3));
        slots.push(throttle.admit().await);
        assert_eq!(raised_to(&throttle, 2).await, Some(3));
        assert_eq!(raised_to(&throttle, 1).await, Some(4), "the third answer at a limit of 3");
        assert_eq!(raised_to(&throttle, 3).await, Some(4), "3 running of 4");
        slots.push(throttle.admit().await);
        assert_eq!(raised_to(&throttle, 4).await, Some(5));
        assert_eq!(throttle.report().unwrap().lowest_episodes_at_once, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_retry_after_pauses_every_request_until_then() {
        let throttle = Arc::new(Throttle::default());
        let _slot = throttle.admit().await;
        let request = throttle.request().await;
        throttle.rate_limited(&request, Some(Duration::from_secs(2)));
        // A shorter one later does not end the pause early.
        throttle.rate_limited(&request, Some(Duration::from_millis(10)));
        drop(request);
        let asked = Instant::now();
        drop(throttle.request().await);
        assert_eq!(asked.elapsed(), Duration::from_secs(2));
        let asked = Instant::now();
        drop(throttle.request().await);
        assert_eq!(asked.elapsed(), Duration::ZERO, "the pause is over");
    }
}
