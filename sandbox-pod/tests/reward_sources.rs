//! The reward sources validation accepts (`basecamp_api::sandbox::REWARD_SOURCES`)
//! are exactly the ones the runner scores: a source validation passed but
//! the runner did not know would score 0 on every episode, and one the
//! runner knows but validation refused could not be used.

use std::collections::BTreeSet;

use basecamp_sandbox::episode::{REWARD_SOURCES, metric_score};
use basecamp_trace::metrics::EpisodeMetrics;
use basecamp_trace::pb::Outcome;

#[test]
fn validation_and_the_runner_know_the_same_reward_sources() {
    let validated: BTreeSet<&str> = basecamp_api::sandbox::REWARD_SOURCES.iter().copied().collect();
    let scored: BTreeSet<&str> = REWARD_SOURCES.iter().copied().collect();
    assert_eq!(validated, scored);
    let metrics = EpisodeMetrics::default();
    for source in &validated {
        assert!(metric_score(source, &metrics, Outcome::Completed, 8).is_some(), "{source} is not scored");
    }
    assert!(metric_score("stepz", &metrics, Outcome::Completed, 8).is_none());
}
