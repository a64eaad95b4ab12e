//! Rewards: named components `{name: {score, weight}}`, their weighted sum,
//! and weight schedules over training steps whose every change is recorded.
//!
//! The sandbox scores each episode with a [`RewardCalculator`] and writes the
//! result as the trace's `reward_signal` ([`pb::RewardSignal`]); dataset
//! preprocessors reuse the same calculator so a reward computed offline and
//! one computed in a pod agree to the bit.
//!
//! A [`RewardSpec`] names the components and their base weights, and may
//! carry a piecewise-constant [`WeightSchedule`]: a list of
//! `{atTrainingStep, weights}` entries, each overriding some weights from
//! that training step on (entries accumulate: a component an entry does not
//! name keeps its previous weight). Every weight the schedule changes becomes
//! a [`pb::WeightDelta`] `(component, old, new, training_step)`, so a reader
//! can see in one trace why the reward moved ("a reward weight that fights
//! another").
//!
//! Nothing here is ever silently `NaN`: a non-finite score, a non-finite
//! weight or a weighted sum that overflows is an error naming the component.
//! [`RewardTracker`] is the streaming form for preprocessors: it emits each
//! weight delta once, in the first signal that the change applies to.

use std::collections::BTreeMap;

use basecamp_trace::pb;
use serde::{Deserialize, Serialize};

/// Errors of building a reward calculator or scoring an episode.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RewardError {
    #[error(
        "rewards.schedule[{index}] (atTrainingStep {at_training_step}) sets a weight for `{component}`, which is not a reward component (components: {known}); add it under rewards.components or fix the name"
    )]
    UnknownScheduleComponent { index: usize, at_training_step: u64, component: String, known: String },
    #[error(
        "a score was given for `{component}`, which is not a reward component (components: {known}); add it under rewards.components or stop scoring it"
    )]
    UnknownScoredComponent { component: String, known: String },
    #[error(
        "no score for reward component `{component}`; every component needs a score (use 0.0 explicitly when it does not apply)"
    )]
    MissingScore { component: String },
    #[error(
        "reward component `{component}` scored {value}, which is not a finite number; fix the scorer (rewards are never NaN or infinite)"
    )]
    NonFiniteScore { component: String, value: f64 },
    #[error("{field}: weight {value} is not a finite number")]
    NonFiniteWeight { field: String, value: f64 },
    #[error(
        "rewards.schedule[{index}] repeats atTrainingStep {at_training_step} (first at rewards.schedule[{first_index}]); merge the two entries"
    )]
    DuplicateScheduleStep { index: usize, first_index: usize, at_training_step: u64 },
    #[error(
        "the weighted sum of the reward components overflowed to {value} ({terms}); scale the scores or weights down"
    )]
    NonFiniteSum { value: f64, terms: String },
    #[error("reward component name {name:?} is empty or has surrounding whitespace")]
    InvalidComponentName { name: String },
}

impl RewardError {
    /// A fixed, bounded name for metrics labels and event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            Self::UnknownScheduleComponent { .. } => "RewardScheduleUnknownComponent",
            Self::UnknownScoredComponent { .. } => "RewardUnknownComponent",
            Self::MissingScore { .. } => "RewardMissingScore",
            Self::NonFiniteScore { .. } => "RewardNonFiniteScore",
            Self::NonFiniteWeight { .. } => "RewardNonFiniteWeight",
            Self::DuplicateScheduleStep { .. } => "RewardScheduleDuplicateStep",
            Self::NonFiniteSum { .. } => "RewardNonFiniteSum",
            Self::InvalidComponentName { .. } => "RewardInvalidComponentName",
        }
    }
}

/// One component of a reward: its raw score and the weight it counts with.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Component {
    pub score: f64,
    pub weight: f64,
}

/// Scored components by name: the `{name: {score, weight}}` form of a reward.
///
/// Building one checks every score and weight is finite; [`Self::weighted_sum`]
/// checks the sum did not overflow.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(transparent)]
pub struct RewardComponents(BTreeMap<String, Component>);

impl RewardComponents {
    /// Checks every name, score and weight.
    pub fn new(components: BTreeMap<String, Component>) -> Result<Self, RewardError> {
        for (name, component) in &components {
            check_name(name)?;
            check_score(name, component.score)?;
            check_weight(format!("rewards.components.{name}.weight"), component.weight)?;
        }
        Ok(Self(components))
    }

    pub fn get(&self, name: &str) -> Option<&Component> {
        self.0.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &Component)> {
        self.0.iter().map(|(name, component)| (name.as_str(), component))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// `sum(score * weight)` over the components, in name order (so the
    /// floating-point result does not depend on insertion order). Never
    /// `-0.0` (a score of 0 with a negative weight, or no components):
    /// `+ 0.0` turns it into `0.0` and leaves every other value as it is.
    pub fn weighted_sum(&self) -> Result<f64, RewardError> {
        let sum: f64 = self.0.values().map(|c| c.score * c.weight).sum::<f64>() + 0.0;
        if sum.is_finite() {
            Ok(sum)
        } else {
            let terms = self
                .0
                .iter()
                .map(|(name, c)| format!("{name}: {} * {}", c.score, c.weight))
                .collect::<Vec<_>>()
                .join(", ");
            Err(RewardError::NonFiniteSum { value: sum, terms })
        }
    }

    /// The trace record: components, their weighted sum, and the given weight deltas.
    pub fn to_signal(&self, weight_deltas: Vec<pb::WeightDelta>) -> Result<pb::RewardSignal, RewardError> {
        let weighted_sum = self.weighted_sum()?;
        let components = self
            .0
            .iter()
            .map(|(name, c)| pb::RewardComponent { name: name.clone(), score: c.score, weight: c.weight })
            .collect();
        Ok(pb::RewardSignal { components, weighted_sum, weight_deltas })
    }
}

impl<'de> Deserialize<'de> for RewardComponents {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<String, Component>::deserialize(deserializer)?;
        Self::new(map).map_err(serde::de::Error::custom)
    }
}

/// A component as configured: its base weight (the weight before any schedule entry).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentSpec {
    pub weight: f64,
}

/// From `at_training_step` on, these components count with these weights.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleEntry {
    pub at_training_step: u64,
    pub weights: BTreeMap<String, f64>,
}

/// A piecewise-constant weight schedule over training steps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct WeightSchedule(pub Vec<ScheduleEntry>);

/// The reward configuration: components with base weights, and an optional schedule.
///
/// ```yaml
/// components:
///   accuracy: {weight: 1.0}
///   brevity: {weight: 0.2}
/// schedule:
///   - atTrainingStep: 1000
///     weights: {brevity: 0.5}
/// ```
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RewardSpec {
    pub components: BTreeMap<String, ComponentSpec>,
    #[serde(default, skip_serializing_if = "is_empty_schedule")]
    pub schedule: WeightSchedule,
}

fn is_empty_schedule(schedule: &WeightSchedule) -> bool {
    schedule.0.is_empty()
}

/// One point of the resolved schedule: the weights in force from `training_step`
/// on, and the changes that took effect there.
#[derive(Debug, Clone, PartialEq)]
struct Segment {
    training_step: u64,
    weights: BTreeMap<String, f64>,
    /// Only real changes: a schedule entry that repeats a weight adds no delta.
    deltas: Vec<pb::WeightDelta>,
}

/// Scores episodes: the validated [`RewardSpec`] with its schedule resolved
/// into segments. Cheap to share (`&self` everywhere) across episodes.
#[derive(Debug, Clone, PartialEq)]
pub struct RewardCalculator {
    base: BTreeMap<String, f64>,
    /// Sorted by training step, steps unique.
    segments: Vec<Segment>,
}

impl RewardCalculator {
    /// Validates the spec: component names, finite weights, schedule entries
    /// naming known components, no training step twice. Entries may be
    /// listed in any order; they apply in training-step order.
    pub fn new(spec: &RewardSpec) -> Result<Self, RewardError> {
        let mut base = BTreeMap::new();
        for (name, component) in &spec.components {
            check_name(name)?;
            check_weight(format!("rewards.components.{name}.weight"), component.weight)?;
            base.insert(name.clone(), component.weight);
        }

        let mut order: Vec<usize> = (0..spec.schedule.0.len()).collect();
        // Stable: on a tie the first-listed index comes first, which the duplicate message names.
        order.sort_by_key(|&i| spec.schedule.0[i].at_training_step);
        for pair in order.windows(2) {
            let (first, second) = (pair[0], pair[1]);
            let step = spec.schedule.0[second].at_training_step;
            if spec.schedule.0[first].at_training_step == step {
                return Err(RewardError::DuplicateScheduleStep {
                    index: second,
                    first_index: first,
                    at_training_step: step,
                });
            }
        }

        let mut weights = base.clone();
        let mut segments = Vec::with_capacity(order.len());
        for index in order {
            let entry = &spec.schedule.0[index];
            let mut deltas = Vec::new();
            for (component, &new_weight) in &entry.weights {
                let Some(old_weight) = weights.get_mut(component) else {
                    return Err(RewardError::UnknownScheduleComponent {
                        index,
                        at_training_step: entry.at_training_step,
                        component: component.clone(),
                        known: known_names(base.keys()),
                    });
                };
                check_weight(format!("rewards.schedule[{index}].weights.{component}"), new_weight)?;
                if *old_weight != new_weight {
                    deltas.push(pb::WeightDelta {
                        component: component.clone(),
                        old_weight: *old_weight,
                        new_weight,
                        training_step: entry.at_training_step,
                    });
                    *old_weight = new_weight;
                }
            }
            segments.push(Segment { training_step: entry.at_training_step, weights: weights.clone(), deltas });
        }
        Ok(Self { base, segments })
    }

    /// The component names, sorted.
    pub fn component_names(&self) -> impl Iterator<Item = &str> {
        self.base.keys().map(String::as_str)
    }

    /// The weights in force at `training_step`.
    pub fn weights_at(&self, training_step: u64) -> &BTreeMap<String, f64> {
        match self.segment_index_at(training_step) {
            Some(i) => &self.segments[i].weights,
            None => &self.base,
        }
    }

    /// Every weight change of the schedule, in training-step order.
    pub fn all_deltas(&self) -> impl Iterator<Item = &pb::WeightDelta> {
        self.segments.iter().flat_map(|s| s.deltas.iter())
    }

    /// The weight changes that took effect at or before `training_step`: the
    /// history that explains [`Self::weights_at`].
    pub fn deltas_up_to(&self, training_step: u64) -> Vec<pb::WeightDelta> {
        self.deltas_in(None, training_step)
    }

    /// Pairs `scores` with the weights in force at `training_step`.
    /// Every component needs a score, and no score may name an unknown component.
    pub fn components_at(
        &self,
        training_step: u64,
        scores: &BTreeMap<String, f64>,
    ) -> Result<RewardComponents, RewardError> {
        if let Some(unknown) = scores.keys().find(|name| !self.base.contains_key(*name)) {
            return Err(RewardError::UnknownScoredComponent {
                component: unknown.clone(),
                known: known_names(self.base.keys()),
            });
        }
        let weights = self.weights_at(training_step);
        let mut components = BTreeMap::new();
        for (name, &weight) in weights {
            let Some(&score) = scores.get(name) else {
                return Err(RewardError::MissingScore { component: name.clone() });
            };
            check_score(name, score)?;
            components.insert(name.clone(), Component { score, weight });
        }
        Ok(RewardComponents(components))
    }

    /// The trace's `reward_signal` for one episode scored at `training_step`:
    /// components, weighted sum, and the weight deltas that brought the
    /// weights to where they are (so one trace explains its own reward).
    pub fn signal(&self, training_step: u64, scores: &BTreeMap<String, f64>) -> Result<pb::RewardSignal, RewardError> {
        self.components_at(training_step, scores)?.to_signal(self.deltas_up_to(training_step))
    }

    fn segment_index_at(&self, training_step: u64) -> Option<usize> {
        // Segments are sorted; the last one starting at or before the step applies.
        let after = self.segments.partition_point(|s| s.training_step <= training_step);
        after.checked_sub(1)
    }

    /// Deltas of segments with `after < training_step <= up_to` (`after: None` = from the start).
    fn deltas_in(&self, after: Option<u64>, up_to: u64) -> Vec<pb::WeightDelta> {
        self.segments
            .iter()
            .filter(|s| after.is_none_or(|a| s.training_step > a) && s.training_step <= up_to)
            .flat_map(|s| s.deltas.iter().cloned())
            .collect()
    }
}

/// Scores a stream of samples (a preprocessor's dataset, a trainer's
/// rollouts) and emits each weight delta once: in the first signal whose
/// training step the change applies to, rather than in every signal.
#[derive(Debug, Clone)]
pub struct RewardTracker {
    calculator: RewardCalculator,
    /// The training step of the previous signal (`None` before the first).
    last_step: Option<u64>,
}

impl RewardTracker {
    pub fn new(calculator: RewardCalculator) -> Self {
        Self { calculator, last_step: None }
    }

    pub fn calculator(&self) -> &RewardCalculator {
        &self.calculator
    }

    /// Like [`RewardCalculator::signal`], but the deltas are only those not
    /// yet emitted. Moving forward, they are the schedule's changes since the
    /// previous step. Moving backward (samples out of order), they are
    /// the direct differences between the previous and the new weights,
    /// dated at the new weights' schedule point.
    pub fn signal(
        &mut self,
        training_step: u64,
        scores: &BTreeMap<String, f64>,
    ) -> Result<pb::RewardSignal, RewardError> {
        let components = self.calculator.components_at(training_step, scores)?;
        let deltas = match self.last_step {
            None => self.calculator.deltas_up_to(training_step),
            Some(last) if training_step >= last => self.calculator.deltas_in(Some(last), training_step),
            Some(last) => self.backward_deltas(last, training_step),
        };
        let signal = components.to_signal(deltas)?;
        self.last_step = Some(training_step);
        Ok(signal)
    }

    fn backward_deltas(&self, from: u64, to: u64) -> Vec<pb::WeightDelta> {
        let old = self.calculator.weights_at(from);
        let new = self.calculator.weights_at(to);
        let at = self.calculator.segment_index_at(to).map_or(0, |i| self.calculator.segments[i].training_step);
        new.iter()
            .filter_map(|(name, &new_weight)| {
                let old_weight = *old.get(name)?;
                (old_weight != new_weight).then(|| pb::WeightDelta {
                    component: name.clone(),
                    old_weight,
                    new_weight,
                    training_step: at,
                })
            })
            .collect()
    }
}

fn check_name(name: &str) -> Result<(), RewardError> {
    if name.is_empty() || name.trim() != name {
        return Err(RewardError::InvalidComponentName { name: name.to_owned() });
    }
    Ok(())
}

fn check_score(component: &str, value: f64) -> Result<(), RewardError> {
    if value.is_finite() { Ok(()) } else { Err(RewardError::NonFiniteScore { component: component.to_owned(), value }) }
}

fn check_weight(field: String, value: f64) -> Result<(), RewardError> {
    if value.is_finite() { Ok(()) } else { Err(RewardError::NonFiniteWeight { field, value }) }
}

fn known_names<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let names: Vec<&str> = names.map(String::as_str).collect();
    if names.is_empty() { "none defined".to_owned() } else { names.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(yaml_like: serde_json::Value) -> RewardSpec {
        serde_json::from_value(yaml_like).expect("test spec parses")
    }

    fn scores(pairs: &[(&str, f64)]) -> BTreeMap<String, f64> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
    }

    fn two_components_with_schedule() -> RewardCalculator {
        RewardCalculator::new(&spec(serde_json::json!({
            "components": {"accuracy": {"weight": 1.0}, "brevity": {"weight": 0.2}},
            "schedule": [
                {"atTrainingStep": 2000, "weights": {"accuracy": 0.5}},
                {"atTrainingStep": 1000, "weights": {"brevity": 0.5, "accuracy": 1.0}},
            ]
        })))
        .expect("valid spec")
    }

    #[test]
    fn weighted_sum_of_named_components() {
        let components = RewardComponents::new(BTreeMap::from([
            ("accuracy".to_owned(), Component { score: 1.0, weight: 0.7 }),
            ("format".to_owned(), Component { score: 0.5, weight: 0.3 }),
        ]))
        .unwrap();
        assert!((components.weighted_sum().unwrap() - 0.85).abs() < 1e-12);
        let signal = components.to_signal(vec![]).unwrap();
        assert_eq!(signal.components.len(), 2);
        assert_eq!(signal.components[0].name, "accuracy");
        assert_eq!(signal.components[1].weight, 0.3);
    }

    #[test]
    fn a_zero_score_with_a_negative_weight_sums_to_zero_not_negative_zero() {
        let components =
            RewardComponents::new(BTreeMap::from([("efficiency".to_owned(), Component { score: 0.0, weight: -0.05 })]))
                .unwrap();
        let sum = components.weighted_sum().unwrap();
        assert!(sum == 0.0 && sum.is_sign_positive(), "{sum:?}");
        let none = RewardComponents::new(BTreeMap::new()).unwrap().weighted_sum().unwrap();
        assert!(none.is_sign_positive(), "{none:?}");
        assert_eq!(serde_json::to_string(&components.to_signal(vec![]).unwrap().weighted_sum).unwrap(), "0.0");
    }

    #[test]
    fn components_deserialize_from_name_score_weight_map() {
        let components: RewardComponents = serde_json::from_str(
            r#"{"helpfulness": {"score": 0.9, "weight": 2}, "safety": {"score": 1, "weight": 1}}"#,
        )
        .unwrap();
        assert!((components.weighted_sum().unwrap() - 2.8).abs() < 1e-12);
        let err = serde_json::from_str::<RewardComponents>(r#"{"x": {"score": 1, "weight": 1, "wieght": 2}}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("unknown field `wieght`"), "{err}");
    }

    #[test]
    fn schedule_is_piecewise_constant_and_accumulates() {
        let calc = two_components_with_schedule();
        assert_eq!(calc.weights_at(0), &scores(&[("accuracy", 1.0), ("brevity", 0.2)]));
        assert_eq!(calc.weights_at(999), &scores(&[("accuracy", 1.0), ("brevity", 0.2)]));
        assert_eq!(calc.weights_at(1000), &scores(&[("accuracy", 1.0), ("brevity", 0.5)]));
        // The 2000 entry does not name brevity: it keeps 0.5.
        assert_eq!(calc.weights_at(2000), &scores(&[("accuracy", 0.5), ("brevity", 0.5)]));
        assert_eq!(calc.weights_at(u64::MAX), &scores(&[("accuracy", 0.5), ("brevity", 0.5)]));
    }

    #[test]
    fn every_weight_change_is_a_delta_and_repeats_are_not() {
        let calc = two_components_with_schedule();
        let deltas: Vec<_> = calc.all_deltas().cloned().collect();
        // accuracy 1.0 -> 1.0 at step 1000 is no change.
        assert_eq!(
            deltas,
            vec![
                pb::WeightDelta { component: "brevity".into(), old_weight: 0.2, new_weight: 0.5, training_step: 1000 },
                pb::WeightDelta { component: "accuracy".into(), old_weight: 1.0, new_weight: 0.5, training_step: 2000 },
            ]
        );
        assert!(calc.deltas_up_to(999).is_empty());
        assert_eq!(calc.deltas_up_to(1500).len(), 1);
    }

    #[test]
    fn signal_carries_weights_sum_and_history() {
        let calc = two_components_with_schedule();
        let signal = calc.signal(2500, &scores(&[("accuracy", 1.0), ("brevity", 0.4)])).unwrap();
        assert!((signal.weighted_sum - (0.5 + 0.2)).abs() < 1e-12);
        assert_eq!(signal.weight_deltas.len(), 2);
        let before = calc.signal(10, &scores(&[("accuracy", 1.0), ("brevity", 0.4)])).unwrap();
        assert!((before.weighted_sum - (1.0 + 0.08)).abs() < 1e-12);
        assert!(before.weight_deltas.is_empty());
    }

    #[test]
    fn unknown_component_in_schedule_is_named_with_its_entry() {
        let err = RewardCalculator::new(&spec(serde_json::json!({
            "components": {"accuracy": {"weight": 1.0}, "helpfulness": {"weight": 1.0}},
            "schedule": [{"atTrainingStep": 10, "weights": {"helpfulnes": 2.0}}]
        })))
        .unwrap_err();
        assert_eq!(err.category(), "RewardScheduleUnknownComponent");
        let msg = err.to_string();
        assert!(msg.contains("rewards.schedule[0]"), "{msg}");
        assert!(msg.contains("`helpfulnes`"), "{msg}");
        assert!(msg.contains("accuracy, helpfulness"), "{msg}");
    }

    #[test]
    fn duplicate_schedule_step_is_refused() {
        let err = RewardCalculator::new(&spec(serde_json::json!({
            "components": {"a": {"weight": 1.0}},
            "schedule": [
                {"atTrainingStep": 5, "weights": {"a": 2.0}},
                {"atTrainingStep": 1, "weights": {"a": 3.0}},
                {"atTrainingStep": 5, "weights": {"a": 4.0}}
            ]
        })))
        .unwrap_err();
        assert_eq!(err, RewardError::DuplicateScheduleStep { index: 2, first_index: 0, at_training_step: 5 });
    }

    #[test]
    fn non_finite_scores_and_weights_are_errors_never_nan() {
        let calc = two_components_with_schedule();
        let err = calc.signal(0, &scores(&[("accuracy", f64::NAN), ("brevity", 0.0)])).unwrap_err();
        assert_eq!(err.category(), "RewardNonFiniteScore");
        assert!(err.to_string().contains("`accuracy` scored NaN"), "{err}");
        let err = calc.signal(0, &scores(&[("accuracy", 1.0), ("brevity", f64::INFINITY)])).unwrap_err();
        assert!(err.to_string().contains("`brevity` scored inf"), "{err}");

        let err = RewardComponents::new(BTreeMap::from([("a".to_owned(), Component { score: 1.0, weight: f64::NAN })]))
            .unwrap_err();
        assert_eq!(err.category(), "RewardNonFiniteWeight");
        assert!(err.to_string().contains("rewards.components.a.weight"), "{err}");

        let mut bad_schedule = spec(serde_json::json!({"components": {"a": {"weight": 1.0}}}));
        bad_schedule.schedule.0.push(ScheduleEntry {
            at_training_step: 3,
            weights: BTreeMap::from([("a".to_owned(), f64::NEG_INFINITY)]),
        });
        let err = RewardCalculator::new(&bad_schedule).unwrap_err();
        assert!(err.to_string().contains("rewards.schedule[0].weights.a"), "{err}");
    }

    #[test]
    fn overflowing_sum_is_an_error() {
        let components = RewardComponents::new(BTreeMap::from([
            ("a".to_owned(), Component { score: f64::MAX, weight: 2.0 }),
            ("b".to_owned(), Component { score: 1.0, weight: 1.0 }),
        ]))
        .unwrap();
        let err = components.weighted_sum().unwrap_err();
        assert_eq!(err.category(), "RewardNonFiniteSum");
    }

    #[test]
    fn scores_must_cover_exactly_the_components() {
        let calc = two_components_with_schedule();
        let err = calc.signal(0, &scores(&[("accuracy", 1.0)])).unwrap_err();
        assert_eq!(err, RewardError::MissingScore { component: "brevity".into() });
        let err = calc.signal(0, &scores(&[("accuracy", 1.0), ("brevity", 1.0), ("style", 1.0)])).unwrap_err();
        assert_eq!(err.category(), "RewardUnknownComponent");
        assert!(err.to_string().contains("`style`"), "{err}");
    }

    #[test]
    fn invalid_component_names_are_refused() {
        let err = RewardCalculator::new(&spec(serde_json::json!({"components": {" a": {"weight": 1.0}}}))).unwrap_err();
        assert_eq!(err.category(), "RewardInvalidComponentName");
    }

    #[test]
    fn tracker_emits_each_delta_once() {
        let mut tracker = RewardTracker::new(two_components_with_schedule());
        let s = scores(&[("accuracy", 1.0), ("brevity", 1.0)]);
        assert!(tracker.signal(0, &s).unwrap().weight_deltas.is_empty());
        assert!(tracker.signal(500, &s).unwrap().weight_deltas.is_empty());
        let at_1200 = tracker.signal(1200, &s).unwrap().weight_deltas;
        assert_eq!(at_1200.len(), 1);
        assert_eq!(at_1200[0].component, "brevity");
        assert!(tracker.signal(1300, &s).unwrap().weight_deltas.is_empty());
        let at_5000 = tracker.signal(5000, &s).unwrap().weight_deltas;
        assert_eq!(at_5000.len(), 1);
        assert_eq!(at_5000[0].component, "accuracy");
        // Out of order: back before both changes, dated at the base (step 0).
        let back = tracker.signal(10, &s).unwrap().weight_deltas;
        assert_eq!(back.len(), 2);
        assert!(back.iter().all(|d| d.training_step == 0));
        assert!(back.iter().any(|d| d.component == "brevity" && d.old_weight == 0.5 && d.new_weight == 0.2));
    }

    #[test]
    fn tracker_starting_late_reports_history_first() {
        let mut tracker = RewardTracker::new(two_components_with_schedule());
        let s = scores(&[("accuracy", 0.0), ("brevity", 0.0)]);
        assert_eq!(tracker.signal(3000, &s).unwrap().weight_deltas.len(), 2);
        assert!(tracker.signal(3001, &s).unwrap().weight_deltas.is_empty());
    }

    #[test]
    fn spec_round_trips_in_camel_case() {
        let text = r#"{"components":{"a":{"weight":1.0}},"schedule":[{"atTrainingStep":7,"weights":{"a":2.0}}]}"#;
        let parsed: RewardSpec = serde_json::from_str(text).unwrap();
        assert_eq!(serde_json::to_string(&parsed).unwrap(), text);
        let err =
            serde_json::from_str::<RewardSpec>(r#"{"components":{},"schedule":[{"at_training_step":7,"weights":{}}]}"#)
                .unwrap_err()
                .to_string();
        assert!(err.contains("unknown field `at_training_step`"), "{err}");
    }
}
