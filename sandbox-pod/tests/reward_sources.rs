//! Every reward source validation accepts (`basecamp_api::sandbox::REWARD_SOURCES`,
//! the one list) is one the runner scores: a source validation passed but
//! the runner did not know would score 0 on every episode.

use basecamp_api::sandbox::REWARD_SOURCES;
use basecamp_sandbox::episode::metric_score;
use basecamp_trace::metrics::EpisodeMetrics;
use basecamp_trace::pb::Outcome;

#[test]
fn every_reward_source_validation_accepts_is_scored_by_the_runner() {
    let metrics = EpisodeMetrics::default();
    for source in REWARD_SOURCES {
        assert!(metric_score(source, &metrics, Outcome::Completed, 8).is_some(), "{source} is not scored");
    }
    assert!(metric_score("stepz", &metrics, Outcome::Completed, 8).is_none());
}
