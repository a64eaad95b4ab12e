//! Fewer requests at once while the policy's endpoint says "too many
//! requests" (429), and no more episodes started than it can serve.
//!
//! A hosted API limits each key's requests; a run whose episodes ask more
//! than it allows meets 429 after 429. Retrying alone does not help: every
//! episode under way retries, the same crowd meets the same limit, and a
//! request that loses four times fails its turn — an episode not measured
//! because of how the run was configured, not the agent.
//!
//! So an [`OpenAiPolicy`](super::OpenAiPolicy) carries one [`Throttle`],
//! shared by its clones (the shards of a `basecamp run` variant, the
//! episodes of a pod), that bounds its requests in flight and adapts the
//! bound as TCP adapts its window (additive increase, multiplicative
//! decrease):
//!
//! - no limit until the first 429; then half the requests that were in
//!   flight ([`Request::rate_limited`]); a request beyond the limit waits
//!   for its place ([`Throttle::request`]) instead of spending its attempts
//!   on 429s;
//! - a 429 to a request sent before the last lowering lowers nothing more:
//!   one crowd, one halving;
//! - while the limit holds requests back, `limit` answers without 429
//!   raise it by one ([`Request::answered`]) — no sooner than
//!   [`RAISE_EVERY`], or the last `Retry-After` when longer, after the last
//!   change — so a run finds the endpoint's limit again after a burst of
//!   other traffic.
//!
//! And while a request waits for its place no episode starts
//! ([`Throttle::admit`]): the run's episodes at once settle where the
//! endpoint is kept busy — more of them than requests when its episodes
//! also spend time in tools — rather than queueing up inside episodes,
//! where the wait would count against their plan-step timeouts and
//! `resolution_time`. An episode waits before its trace and clock start.
//!
//! Each probe above the limit costs a 429, and the request that met it
//! waits its `Retry-After` inside its episode: probing as often as TCP
//! does (every `limit` answers) made a run against an endpoint that serves
//! 3 requests at once with `Retry-After: 1` slower than one that lost
//! episodes to it. For the same reason a `Retry-After` is the answered
//! request's to honour, not every request's: paused together at each 429,
//! that run stood still a second at each probe.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The least time between two changes of the limit before it is raised:
/// a probe above the endpoint's limit costs a 429 and its `Retry-After`.
pub const RAISE_EVERY: Duration = Duration::from_secs(1);

/// How many requests of one policy are in flight at once, and whether an
/// episode may start: see the module documentation.
#[derive(Debug, Default)]
pub struct Throttle {
    state: Mutex<State>,
    /// A request was answered or the limit rose: a waiting request or
    /// episode may go.
    changed: Notify,
}

#[derive(Debug, Default)]
struct State {
    /// Requests sent (holding a [`Request`]) and not yet answered.
    requests: usize,
    /// Requests waiting for their place.
    waiting: usize,
    /// The most requests in flight at once; `None` until the first 429.
    limit: Option<usize>,
    /// Answers without 429 counted toward raising `limit` by one.
    toward_raise: usize,
    /// When `limit` last changed.
    changed_at: Option<Instant>,
    /// The least time from `changed_at` to a raise: [`RAISE_EVERY`], or
    /// the last `Retry-After` when longer.
    raise_after: Duration,
    /// Bumped at each lowering: a 429 to a request sent before it was
    /// answered to the crowd already counted.
    generation: u64,
    /// 429 answers, retried or not.
    rate_limited: u64,
    /// The lowest `limit` so far.
    lowest: Option<usize>,
}

impl State {
    fn has_room(&self) -> bool {
        self.limit.is_none_or(|limit| self.requests < limit)
    }
}

/// A request's place among those in flight, and which crowd it belongs
/// to; drop it once answered.
#[derive(Debug)]
pub struct Request {
    throttle: Arc<Throttle>,
    generation: u64,
}

impl Request {
    /// It was answered without 429: while the limit holds requests back,
    /// `limit` such answers raise it by one (no sooner than [`RAISE_EVERY`],
    /// or the last `Retry-After`, after the last change).
    pub fn answered(&self) {
        self.throttle.answered(self);
    }

    /// It was answered 429, asking to be retried after `retry_after`:
    /// halves the limit (rounding up) unless this request's crowd was
    /// counted already; returns the lowering, if any.
    pub fn rate_limited(&self, retry_after: Option<Duration>) -> Option<Lowered> {
        self.throttle.rate_limited(self, retry_after)
    }
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
    /// The fewest requests at once the run came down to.
    pub lowest_requests_at_once: usize,
    /// The limit when the summary was written.
    pub requests_at_once_at_end: usize,
}

impl RateLimits {
    /// What a run's summary says of it, after the variant's name.
    pub fn sentence(&self) -> String {
        format!(
            "the policy endpoint answered 429 (too many requests) {} time(s), so fewer requests went at once: as \
             few as {}, {} at the end, and no episode started while one waited; it allows fewer than the run's \
             episodes in flight asked (--concurrency and --shards here, spec.parallelism in a cluster)",
            self.answers_429, self.lowest_requests_at_once, self.requests_at_once_at_end
        )
    }
}

impl Throttle {
    fn state(&self) -> MutexGuard<'_, State> {
        // The state is counts, each left whole by every update.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Waits until no request waits for its place: an episode started
    /// now would only queue behind them.
    pub async fn admit(&self) {
        loop {
            // Registered before the check, so a change between the check
            // and the wait still wakes this one.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.state().waiting == 0 {
                return;
            }
            changed.await;
        }
    }

    /// Waits until fewer requests than the limit are in flight, and holds
    /// this one's place; its outcome goes to [`Request::answered`] or
    /// [`Request::rate_limited`].
    pub async fn request(self: &Arc<Self>) -> Request {
        let mut waiting = None;
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            {
                let mut state = self.state();
                if state.has_room() {
                    state.requests += 1;
                    let generation = state.generation;
                    drop(state);
                    // No longer waiting: counted out (after the lock, which its drop takes).
                    drop(waiting);
                    return Request { throttle: self.clone(), generation };
                }
                if waiting.is_none() {
                    state.waiting += 1;
                    waiting = Some(WaitingCount { throttle: self });
                }
            }
            changed.await;
        }
    }

    /// A request was answered without 429: while the limit holds requests
    /// back, `limit` such answers raise it by one, once the limit has held
    /// for `raise_after`.
    fn answered(&self, request: &Request) {
        let mut state = self.state();
        let Some(limit) = state.limit else { return };
        // This request still holds its place: `requests` counts it.
        let held_back = state.requests >= limit || state.waiting > 0;
        if request.generation != state.generation || !held_back {
            return;
        }
        state.toward_raise += 1;
        let held = state.changed_at.is_none_or(|at| at.elapsed() >= state.raise_after);
        if state.toward_raise >= limit && held {
            state.toward_raise = 0;
            state.limit = Some(limit + 1);
            state.changed_at = Some(Instant::now());
            drop(state);
            self.changed.notify_waiters();
        }
    }

    /// A request was answered 429, asking to be retried after
    /// `retry_after`: halves the limit (rounding up) unless this request's
    /// crowd was counted already; returns the lowering, if any.
    fn rate_limited(&self, request: &Request, retry_after: Option<Duration>) -> Option<Lowered> {
        let mut state = self.state();
        state.rate_limited += 1;
        state.raise_after = retry_after.unwrap_or_default().max(RAISE_EVERY);
        if request.generation != state.generation {
            return None;
        }
        let from = state.limit.unwrap_or(state.requests).max(1);
        let to = from.div_ceil(2);
        state.generation += 1;
        state.toward_raise = 0;
        state.limit = Some(to);
        state.changed_at = Some(Instant::now());
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
            lowest_requests_at_once: state.lowest.unwrap_or(0),
            requests_at_once_at_end: state.limit.unwrap_or(0),
        })
    }
}

/// A request counted among those waiting until this drops: when it gets
/// its place, or is given up while it waits (its episode cut off).
struct WaitingCount<'a> {
    throttle: &'a Throttle,
}

impl Drop for WaitingCount<'_> {
    fn drop(&mut self) {
        self.throttle.state().waiting -= 1;
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
    use std::time::Duration;

    use super::*;

    /// `n` requests sent at once.
    async fn sent(throttle: &Arc<Throttle>, n: usize) -> Vec<Request> {
        let mut requests = Vec::new();
        for _ in 0..n {
            requests.push(throttle.request().await);
        }
        requests
    }

    /// The limit after `answers` more requests answered without 429, one
    /// at a time (beside those the test holds in flight).
    async fn raised_to(throttle: &Arc<Throttle>, answers: usize) -> Option<usize> {
        for _ in 0..answers {
            throttle.answered(&throttle.request().await);
        }
        throttle.state().limit
    }

    #[tokio::test]
    async fn no_limit_until_the_first_429_then_half_the_requests_in_flight() {
        let throttle = Arc::new(Throttle::default());
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
            Some(RateLimits { answers_429: 7, lowest_requests_at_once: 2, requests_at_once_at_end: 2 })
        );
    }

    #[tokio::test]
    async fn never_below_one() {
        let throttle = Arc::new(Throttle::default());
        let request = throttle.request().await;
        assert_eq!(throttle.rate_limited(&request, None), Some(Lowered { from: 1, to: 1, new_low: true }));
        drop(request);
        let request = throttle.request().await;
        assert_eq!(throttle.rate_limited(&request, None), None, "one already: nothing lowered, nothing said");
        assert_eq!(throttle.report().unwrap().requests_at_once_at_end, 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_over_the_limit_waits_and_no_episode_starts_meanwhile() {
        let throttle = Arc::new(Throttle::default());
        let mut requests = sent(&throttle, 2).await;
        throttle.rate_limited(&requests[0], None);
        tokio::time::timeout(Duration::from_secs(1), throttle.admit()).await.expect("nothing waits: episodes start");
        let request = tokio::spawn({
            let throttle = throttle.clone();
            async move { throttle.request().await }
        });
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!request.is_finished(), "2 in flight of a limit of 1: the next waits");
        let episode = tokio::spawn({
            let throttle = throttle.clone();
            async move { throttle.admit().await }
        });
        requests.pop();
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert!(!request.is_finished(), "still 1 in flight");
        assert!(!episode.is_finished(), "a request waits: no episode starts");
        requests.pop();
        let sent = tokio::time::timeout(Duration::from_secs(1), request).await.expect("sent once one was answered");
        tokio::time::timeout(Duration::from_secs(1), episode).await.expect("started once none waits").unwrap();
        drop(sent);
        assert_eq!(throttle.state().waiting, 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_given_up_while_it_waits_is_counted_out() {
        let throttle = Arc::new(Throttle::default());
        let request = throttle.request().await;
        throttle.rate_limited(&request, None);
        let waiting = tokio::spawn({
            let throttle = throttle.clone();
            async move { throttle.request().await }
        });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(throttle.state().waiting, 1);
        waiting.abort();
        let _ = waiting.await;
        assert_eq!(throttle.state().waiting, 0);
        tokio::time::timeout(Duration::from_secs(1), throttle.admit()).await.expect("episodes start again");
    }

    #[tokio::test(start_paused = true)]
    async fn answers_while_the_limit_holds_requests_back_raise_it_by_one_per_limit_and_second() {
        let throttle = Arc::new(Throttle::default());
        let crowd = sent(&throttle, 6).await;
        throttle.rate_limited(&crowd[0], None);
        tokio::time::advance(RAISE_EVERY).await;
        // Answers to the crowd sent before the lowering raise nothing.
        for request in &crowd {
            throttle.answered(request);
        }
        drop(crowd);
        // A limit of 3 with 1 in flight at a time: it holds nothing back, and stays.
        assert_eq!(raised_to(&throttle, 10).await, Some(3));
        // With 2 more in flight, each answer is at the limit.
        let others = sent(&throttle, 2).await;
        assert_eq!(raised_to(&throttle, 2).await, Some(3));
        assert_eq!(raised_to(&throttle, 1).await, Some(4), "the third answer at a limit of 3");
        let more = sent(&throttle, 1).await;
        // 4 answers at a limit of 4, but within a second of the last raise.
        assert_eq!(raised_to(&throttle, 4).await, Some(4));
        tokio::time::advance(RAISE_EVERY).await;
        assert_eq!(raised_to(&throttle, 1).await, Some(5));
        drop((others, more));
        tokio::time::advance(RAISE_EVERY).await;
        assert_eq!(raised_to(&throttle, 10).await, Some(5), "1 in flight of 5");
        assert_eq!(throttle.report().unwrap().lowest_requests_at_once, 3);
    }

    #[tokio::test(start_paused = true)]
    async fn a_longer_retry_after_spaces_the_raises_further() {
        let throttle = Arc::new(Throttle::default());
        let request = throttle.request().await;
        throttle.rate_limited(&request, Some(Duration::from_secs(20)));
        drop(request);
        assert_eq!(throttle.state().limit, Some(1));
        tokio::time::advance(Duration::from_secs(19)).await;
        assert_eq!(raised_to(&throttle, 5).await, Some(1), "19 s after a 429 that asked for 20");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(raised_to(&throttle, 1).await, Some(2));
    }
}
