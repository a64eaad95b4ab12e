//! The query language: exact messages for bad queries, and evaluation
//! against traces written by the real writer (true positives and negatives).

use basecamp_trace::pb::{
    EpisodeEnd, ErrorContext, Header, MemoryDelta, MemorySource, Outcome, PlanStep, RewardComponent, RewardSignal,
    StepKind, StepStatus, TokenLogit, record::Body,
};
use basecamp_trace::query::{Match, NamesSeen, Query, Section};
use basecamp_trace::{TraceReader, TraceWriter};

fn error_of(query: &str) -> String {
    Query::parse(query).expect_err("the query should not compile").to_string()
}

#[test]
fn bad_queries_show_the_query_and_a_caret() {
    let cases: &[(&str, &str)] = &[
        (
            "plan_execution.tool = \"x\"",
            "invalid query: '=' is not an operator; use '==' to compare\n  plan_execution.tool = \"x\"\n                      ^",
        ),
        (
            "latency_ms >",
            "invalid query: expected a value (a \"string\", a number, true, false or null) after '>', found the end of the query\n  latency_ms >\n              ^",
        ),
        (
            "(exists(error_context) or step > 3",
            "invalid query: this '(' is never closed\n  (exists(error_context) or step > 3\n  ^",
        ),
        (
            "plan.tool == \"x\"",
            "invalid query: unknown section or field 'plan'; sections are episode, plan_execution, memory_state, token_logit, reward_signal, error_context, policy_turn, injection, episode_end; a bare name is a plan_execution field (index, kind, plan_label, tool, call_id, arguments, input_hash, observation, result_hash, response_bytes, status, error_type, error_message, fallback_used, memory_hash_before, memory_hash_after, start_unix_nanos, latency_ms, latency_us, timeout_ms)\n  plan.tool == \"x\"\n  ^",
        ),
        (
            "plan_execution.latency_ms > \"slow\"",
            "invalid query: this path holds a number; it cannot be compared with a string\n  plan_execution.latency_ms > \"slow\"\n                              ^",
        ),
        (
            "plan_execution.status == \"done\"",
            "invalid query: unknown value \"done\"; one of unspecified, ok, error, timeout, fallback, rolled_back, refused\n  plan_execution.status == \"done\"\n                           ^",
        ),
        (
            "tool == tracking_api",
            "invalid query: expected a value (a \"string\", a number, true, false or null), found 'tracking_api'; quote strings\n  tool == tracking_api\n          ^",
        ),
        (
            "exists(step)",
            "invalid query: exists() takes a section or a record field, e.g. exists(error_context)\n  exists(step)\n         ^",
        ),
        (
            "memory_state == null",
            "invalid query: compare a field, not the whole section: memory_state.KEY (the value a delta wrote to KEY); or use exists(memory_state)\n  memory_state == null\n  ^",
        ),
        (
            "step > 1 step < 3",
            "invalid query: expected 'and', 'or' or the end of the query, found 'step'\n  step > 1 step < 3\n           ^",
        ),
        ("", "invalid query: the query is empty\n  \n  ^"),
        ("tool == \"a\")", "invalid query: this ')' has no matching '('\n  tool == \"a\")\n             ^"),
        (
            "token_logit.logprob < true",
            "invalid query: '<' orders numbers and strings, not a boolean\n  token_logit.logprob < true\n                      ^",
        ),
        (
            "error_context.message == \"unterminated",
            "invalid query: this string is never closed\n  error_context.message == \"unterminated\n                           ^",
        ),
        (
            "plan_execution.tool.name == \"x\"",
            "invalid query: 'tool' has no fields; remove '.name'\n  plan_execution.tool.name == \"x\"\n                      ^",
        ),
        (
            "reward_signal.accuracy.bonus > 1",
            "invalid query: a reward component has 'score' and 'weight', not 'bonus'\n  reward_signal.accuracy.bonus > 1\n                         ^",
        ),
        // The caret counts characters, not bytes.
        (
            "memory_state.\"città\" == 1 and é",
            "invalid query: unexpected character 'é'\n  memory_state.\"città\" == 1 and é\n                                ^",
        ),
        // ... and terminal cells: a wide character takes two, a control character is shown as one.
        (
            "memory_state.\"配送\" == 1 and é",
            "invalid query: unexpected character 'é'\n  memory_state.\"配送\" == 1 and é\n                               ^",
        ),
        (
            "memory_state.\"a\u{7}\" == 1 and é",
            "invalid query: unexpected character 'é'\n  memory_state.\"a\u{fffd}\" == 1 and é\n                             ^",
        ),
    ];
    for (query, want) in cases {
        assert_eq!(error_of(query), *want, "query: {query}");
    }
}

#[test]
fn good_queries_compile_and_name_only_the_sections_they_read() {
    let q = Query::parse("plan_execution.tool == \"tracking_api\" and latency_ms > 800").unwrap();
    assert_eq!(q.sections(), [Section::PlanExecution]);
    let q = Query::parse("memory_state.shipping_status == null").unwrap();
    assert_eq!(q.sections(), [Section::MemoryState]);
    let q = Query::parse("exists(error_context) or reward_signal.efficiency_penalty < -0.1").unwrap();
    assert_eq!(q.sections(), [Section::RewardSignal, Section::ErrorContext]);
    let q = Query::parse("not (step >= 3 && episode.variant != 'b') || !exists(memory_state.x)").unwrap();
    assert_eq!(q.sections(), [Section::MemoryState]);
    for ok in [
        "plan_execution.status == \"STEP_STATUS_TIMEOUT\"",
        "plan_execution.arguments.order_id == \"A-1\"",
        "plan_execution.observation.items.0.sku == 'x'",
        "memory_state.\"user.phone\" != null",
        "error_context.cause == \"deadline\" and error_context.memory.order.id == 7",
        "token_logit.logprob < -5.5e0",
        "reward_signal.tool_call_accuracy.weight >= 0.5 and reward_signal.weighted_sum > 0",
        "policy_turn.logprobs_missing == true",
        "injection.trigger == \"live\"",
        "episode.id == \"ep-1\" and episode.training_step > 100",
    ] {
        Query::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
    }
}

fn plan(tool: &str, status: StepStatus, latency_ms: u64) -> Body {
    Body::PlanStep(Box::new(PlanStep {
        tool: tool.into(),
        status: status as i32,
        latency_micros: latency_ms * 1000,
        arguments_json: r#"{"order_id":"A-7","items":[{"sku":"s1"}]}"#.into(),
        error_type: if status == StepStatus::Timeout { "timeout".into() } else { String::new() },
        ..Default::default()
    }))
}

fn delta(key: &str, after: Option<&str>) -> Body {
    Body::MemoryDelta(MemoryDelta {
        key: key.into(),
        before_json: Some("\"x\"".into()),
        after_json: after.map(str::to_string),
        source: MemorySource::Tool as i32,
        origin: "t".into(),
    })
}

fn reward(efficiency: f64) -> Body {
    Body::RewardSignal(RewardSignal {
        components: vec![
            RewardComponent { name: "accuracy".into(), score: 1.0, weight: 0.7 },
            RewardComponent { name: "efficiency_penalty".into(), score: efficiency, weight: 0.3 },
        ],
        weighted_sum: 0.7 + 0.3 * efficiency,
        weight_deltas: vec![],
    })
}

/// An episode whose steps are built to hit or miss each example query.
fn write_episode() -> Vec<u8> {
    let header = Header { episode_id: "ep-q".into(), variant: "b".into(), ..Default::default() };
    let mut w = TraceWriter::new(Vec::new(), header, 3).unwrap();
    w.append(0, delta("shipping_status", Some("\"pending\""))).unwrap();
    w.end_step().unwrap();
    // 1: a fast tracking_api call; memory written with a real value.
    w.append(1, plan("tracking_api", StepStatus::Ok, 120)).unwrap();
    w.append(1, delta("shipping_status", Some("{\"code\":\"in_transit\"}"))).unwrap();
    w.append(1, reward(-0.05)).unwrap();
    w.end_step().unwrap();
    // 2: a slow tracking_api call that timed out, null written, error context.
    w.append(2, Body::TokenLogit(TokenLogit { token: "ok".into(), logprob: -7.5, token_id: -3, ..Default::default() }))
        .unwrap();
    w.append(2, plan("tracking_api", StepStatus::Timeout, 900)).unwrap();
    w.append(2, delta("shipping_status", Some("null"))).unwrap();
    w.append(
        2,
        Body::ErrorContext(Box::new(ErrorContext {
            error_type: "timeout".into(),
            cause_chain: vec!["tracking_api timed out".into(), "deadline".into()],
            memory_snapshot_json: [("order".to_string(), "{\"id\":7}".to_string())].into(),
            ..Default::default()
        })),
    )
    .unwrap();
    w.append(2, reward(-0.2)).unwrap();
    w.end_step().unwrap();
    // 3: two calls: a slow order_lookup and a fast tracking_api (never one call both).
    // ... and a token derived from raw logits (entropy and KL set).
    let derived = TokenLogit { token_id: 9, entropy: Some(2.5), kl: Some(0.75), ..Default::default() };
    w.append(3, Body::TokenLogit(derived)).unwrap();
    w.append(3, plan("order_lookup", StepStatus::Ok, 950)).unwrap();
    w.append(3, plan("tracking_api", StepStatus::Ok, 10)).unwrap();
    w.append(3, delta("other", Some("null"))).unwrap();
    w.append(3, delta("shipping_status", None)).unwrap();
    w.end_step().unwrap();
    w.finish(EpisodeEnd { steps: 3, ..Default::default() }).unwrap()
}

fn steps_matching(bytes: &[u8], query: &str) -> Vec<u32> {
    let q = Query::parse(query).unwrap_or_else(|e| panic!("{e}"));
    let mut reader = TraceReader::new(bytes, "ep.trace").unwrap();
    let mut out = Vec::new();
    q.search(&mut reader, &mut |m: Match| out.push(m.step)).unwrap();
    out
}

#[test]
fn queries_find_exactly_the_steps_they_describe() {
    let bytes = write_episode();
    let cases: &[(&str, &[u32])] = &[
        ("memory_state.shipping_status == null", &[2]),
        // KL and entropy are optional: the step-2 token without them matches neither side.
        ("token_logit.kl > 0.5", &[3]),
        ("token_logit.kl >= 0", &[3]),
        ("token_logit.entropy < 3 and token_logit.kl < 1", &[3]),
        ("token_logit.logprob < -1", &[2]),
        ("memory_state.shipping_status != null", &[0, 1]),
        ("memory_state.shipping_status.code == \"in_transit\"", &[1]),
        ("exists(memory_state.shipping_status)", &[0, 1, 2, 3]),
        ("exists(memory_state.other) and not exists(memory_state.missing)", &[3]),
        ("plan_execution.tool == \"tracking_api\" and latency_ms > 800", &[2]),
        ("plan_execution.tool == \"tracking_api\"", &[1, 2, 3]),
        // Step 3 has a slow call and a tracking_api call, but not one call that is both.
        ("plan_execution.tool == \"order_lookup\" and latency_ms >= 950", &[3]),
        ("plan_execution.tool == \"tracking_api\" and latency_ms >= 950", &[]),
        ("exists(error_context)", &[2]),
        ("not exists(error_context)", &[0, 1, 3]),
        ("exists(plan_execution.error_type)", &[2]),
        ("plan_execution.status == \"timeout\"", &[2]),
        ("not plan_execution.status == \"ok\"", &[2]),
        ("reward_signal.efficiency_penalty < -0.1", &[2]),
        ("reward_signal.efficiency_penalty <= -0.05", &[1, 2]),
        ("reward_signal.accuracy.weight == 0.7 and reward_signal.weighted_sum < 0.66", &[2]),
        ("reward_signal.missing > 0", &[]),
        ("error_context.cause == \"deadline\" and error_context.memory.order.id == 7", &[2]),
        ("token_logit.logprob < -7 and token_logit.token_id == -3", &[2]),
        ("plan_execution.arguments.items.0.sku == \"s1\" and step <= 1", &[1]),
        ("episode.variant == \"b\" and step == 0", &[0]),
        ("episode.variant == \"a\"", &[]),
        ("(step == 1 or step == 3) and exists(plan_execution)", &[1, 3]),
        // Keywords in capitals, as AND/OR/NOT always were (EXISTS was "unknown field EXISTS").
        ("(step == 1 OR step == 3) AND EXISTS(plan_execution)", &[1, 3]),
        ("NOT EXISTS(error_context)", &[0, 1, 3]),
        ("memory_state.shipping_status == NULL", &[2]),
        ("tool > \"p\"", &[1, 2, 3]),
        // A leading '.' is a number where a value stands, as `-.5` is.
        ("reward_signal.efficiency_penalty < -.1", &[2]),
        ("token_logit.kl > .5", &[3]),
        ("(token_logit.kl > .5)", &[3]),
    ];
    for (query, want) in cases {
        assert_eq!(steps_matching(&bytes, query), *want, "query: {query}");
    }
}

/// Searches `bytes` with `query`, noting the names met in `seen`.
fn note_names(query: &Query, bytes: &[u8], seen: &mut NamesSeen) {
    let mut reader = TraceReader::new(bytes, "ep.trace").unwrap();
    let mut seen_here = NamesSeen::default();
    query.search_noting(&mut reader, &mut |_| {}, &mut seen_here).unwrap();
    seen.merge(seen_here);
}

#[test]
fn names_no_searched_trace_has_are_listed_with_some_of_those_they_have() {
    let q = Query::parse("memory_state.statu == null or reward_signal.acuracy < 0 or memory_state.k03 == 1").unwrap();
    let mut seen = NamesSeen::default();
    assert!(q.unseen_names(&seen).is_empty(), "nothing searched, nothing to say");

    // 25 keys, shown sorted, the first 20 of them; no reward at all.
    let mut w = TraceWriter::new(Vec::new(), Header::default(), 3).unwrap();
    for i in (0..25).rev() {
        w.append(1, delta(&format!("k{i:02}"), Some("1"))).unwrap();
    }
    w.end_step().unwrap();
    note_names(&q, &w.finish(EpisodeEnd::default()).unwrap(), &mut seen);
    let first_20: Vec<String> = (0..20).map(|i| format!("`k{i:02}`")).collect();
    assert_eq!(
        q.unseen_names(&seen),
        [
            format!("the searched trace has no memory key `statu` (keys it has: {}, ...)", first_20.join(", ")),
            "the searched trace has no reward component `acuracy`: it has no components at all".to_string(),
        ]
    );

    // A second trace with a reward: the components both have, merged.
    let mut w = TraceWriter::new(Vec::new(), Header::default(), 3).unwrap();
    w.append(1, reward(-0.5)).unwrap();
    w.end_step().unwrap();
    note_names(&q, &w.finish(EpisodeEnd::default()).unwrap(), &mut seen);
    assert_eq!(
        q.unseen_names(&seen)[1],
        "none of the 2 searched traces has reward component `acuracy` (components they have: `accuracy`, `efficiency_penalty`)"
    );
}

#[test]
fn path_segments_of_digits_and_letters_are_names_as_written() {
    // A segment after '.' was lexed as a number when it began with a digit:
    // `grid.1.0` read as `grid.(1.0)`, i.e. `grid.1`, and matched nothing;
    // `codes.1e3` navigated to the key "1000"; `2fa` and `0.1` were errors.
    let header = Header { episode_id: "ep-n".into(), ..Default::default() };
    let mut w = TraceWriter::new(Vec::new(), header, 3).unwrap();
    w.append(0, delta("2fa", Some("true"))).unwrap();
    w.append(0, delta("grid", Some("[[1, 2], [3, 4]]"))).unwrap();
    w.append(0, delta("codes", Some(r#"{"1e3": "x", "1000": "y", "007": "z"}"#))).unwrap();
    w.end_step().unwrap();
    let bytes = w.finish(EpisodeEnd { steps: 0, ..Default::default() }).unwrap();
    let cases: &[(&str, &[u32])] = &[
        ("memory_state.2fa == true", &[0]),
        ("memory_state.grid.1.0 == 3", &[0]),
        ("memory_state.grid.0.1 == 2", &[0]),
        ("memory_state.grid.1 == 3", &[]),
        ("memory_state.codes.1e3 == \"x\"", &[0]),
        ("memory_state.codes.1000 == \"y\"", &[0]),
        ("memory_state.codes.007 == \"z\"", &[0]),
        ("memory_state.\"2fa\" == true and memory_state.grid.\"1\".1 == 4", &[0]),
    ];
    for (query, want) in cases {
        assert_eq!(steps_matching(&bytes, query), *want, "query: {query}");
    }
}

#[test]
fn exists_finds_a_recorded_entropy_or_kl_of_zero() {
    // entropy and kl are proto3 `optional`: recorded means derived from raw
    // logits, and 0 is a value (KL of two identical runs, a one-hot row).
    // exists() took 0 for "not set" as for plain scalars and missed them.
    let header = Header { episode_id: "ep-z".into(), ..Default::default() };
    let mut w = TraceWriter::new(Vec::new(), header, 3).unwrap();
    let zero = TokenLogit { token_id: 1, entropy: Some(0.0), kl: Some(0.0), ..Default::default() };
    w.append(1, Body::TokenLogit(zero)).unwrap();
    w.end_step().unwrap();
    w.append(2, Body::TokenLogit(TokenLogit { token_id: 2, ..Default::default() })).unwrap();
    w.end_step().unwrap();
    let bytes = w.finish(EpisodeEnd { steps: 2, ..Default::default() }).unwrap();
    let cases: &[(&str, &[u32])] = &[
        ("exists(token_logit.kl)", &[1]),
        ("exists(token_logit.entropy)", &[1]),
        ("not exists(token_logit.kl)", &[2]),
        ("token_logit.kl == 0", &[1]),
        // Plain scalars keep their rule: 0 is the proto default, not a value.
        ("exists(token_logit.position)", &[]),
    ];
    for (query, want) in cases {
        assert_eq!(steps_matching(&bytes, query), *want, "query: {query}");
    }
}

#[test]
fn exists_finds_json_values_that_are_zero_empty_or_false() {
    // A JSON path has a value when the JSON has it: 0, "" and false are
    // values (exists() treated them as unset proto scalars, while null
    // counted as set).
    let header = Header { episode_id: "ep-j".into(), ..Default::default() };
    let mut w = TraceWriter::new(Vec::new(), header, 3).unwrap();
    w.append(1, delta("cart", Some(r#"{"count": 0, "note": "", "gift": false, "coupon": null}"#))).unwrap();
    let mut call = plan("order_lookup", StepStatus::Ok, 5);
    if let Body::PlanStep(p) = &mut call {
        p.arguments_json = r#"{"quantity": 0}"#.into();
    }
    w.append(1, call).unwrap();
    w.end_step().unwrap();
    let bytes = w.finish(EpisodeEnd { steps: 1, ..Default::default() }).unwrap();
    for query in [
        "exists(memory_state.cart.count)",
        "exists(memory_state.cart.note)",
        "exists(memory_state.cart.gift)",
        "exists(memory_state.cart.coupon)",
        "exists(plan_execution.arguments.quantity)",
    ] {
        assert_eq!(steps_matching(&bytes, query), [1], "query: {query}");
    }
    assert_eq!(steps_matching(&bytes, "exists(memory_state.cart.missing)"), [0u32; 0]);
}

#[test]
fn an_enum_value_is_its_short_name_or_its_proto_name_nothing_else() {
    // Any string ending in "_<name>" was taken for <name>: status == "not_ok"
    // searched for ok, kind == "no_tool_call" for tool_call.
    let bytes = write_episode();
    assert_eq!(steps_matching(&bytes, "plan_execution.status == \"STEP_STATUS_TIMEOUT\""), [2]);
    assert_eq!(steps_matching(&bytes, "plan_execution.status == \"Timeout\""), [2]);
    assert_eq!(steps_matching(&bytes, "injection.trigger == \"INJECTION_TRIGGER_LIVE\""), [0u32; 0]);
    for (query, at) in [
        ("plan_execution.status == \"not_ok\"", 25),
        ("plan_execution.kind == \"no_tool_call\"", 23),
        ("plan_execution.status == \"STEP_KIND_OK\"", 25),
    ] {
        let error = Query::parse(query).expect_err(query);
        assert_eq!(error.at, at, "{error}");
        assert!(error.message.starts_with("unknown value "), "{error}");
    }
}

/// How episodes ended is searchable: the end is a record of the last step,
/// so `episode_end.failure_class == "policy_error"` finds the episodes the
/// policy's server failed, one match each, at the step it happened. Before,
/// only the step's own records could say so (`plan_execution.kind`), and
/// an episode's outcome or final answer could not be searched at all.
#[test]
fn how_an_episode_ended_is_searchable_at_its_last_step() {
    let mut w = TraceWriter::new(Vec::new(), Header { episode_id: "ep-end".into(), ..Default::default() }, 3).unwrap();
    w.append(0, delta("order", Some("\"A-7\""))).unwrap();
    w.end_step().unwrap();
    w.append(1, plan("track_order", StepStatus::Ok, 20)).unwrap();
    w.end_step().unwrap();
    let failed =
        PlanStep { kind: StepKind::PolicyError as i32, status: StepStatus::Error as i32, ..Default::default() };
    w.append(2, Body::PlanStep(Box::new(failed))).unwrap();
    w.end_step().unwrap();
    let end = EpisodeEnd {
        outcome: Outcome::Error as i32,
        steps: 2,
        final_answer: "Your order ships Monday.".into(),
        failure_class: "policy_error".into(),
        final_memory_hash: vec![0xab; 32],
        ..Default::default()
    };
    let bytes = w.finish(end).unwrap();
    let cases: &[(&str, &[u32])] = &[
        ("episode_end.failure_class == \"policy_error\"", &[2]),
        ("episode_end.failure_class == \"ok\"", &[]),
        ("episode_end.outcome == \"error\"", &[2]),
        ("episode_end.outcome == \"OUTCOME_ERROR\"", &[2]),
        ("episode_end.outcome != \"completed\"", &[2]),
        ("episode_end.steps >= 2 and plan_execution.kind == \"policy_error\"", &[2]),
        ("episode_end.final_answer > \"Your\"", &[2]),
        ("episode_end.final_memory_hash == \"abababababababab\"", &[2]),
        ("exists(episode_end)", &[2]),
        ("not exists(episode_end)", &[0, 1]),
    ];
    for (query, want) in cases {
        assert_eq!(steps_matching(&bytes, query), *want, "query: {query}");
    }
    // An end whose outcome was not set is not "completed"; the end is at the last step.
    assert_eq!(steps_matching(&write_episode(), "episode_end.outcome == \"completed\""), [0u32; 0]);
    assert_eq!(steps_matching(&write_episode(), "exists(episode_end)"), [3]);
    let error = error_of("episode_end.class == \"x\"");
    assert!(
        error.contains("unknown episode_end field 'class'; fields are outcome, end_time_unix_nanos, steps"),
        "{error}"
    );
    let error = error_of("episode_end.outcome == \"timeout\"");
    assert!(error.contains("unknown value"), "{error}");
}

#[test]
fn a_match_names_the_frame_and_section_of_the_record() {
    let bytes = write_episode();
    let q = Query::parse("exists(error_context)").unwrap();
    let mut reader = TraceReader::new(bytes.as_slice(), "ep.trace").unwrap();
    let mut got = Vec::new();
    q.search(&mut reader, &mut |m| got.push(m)).unwrap();
    assert_eq!(got.len(), 1);
    let m = &got[0];
    assert_eq!((m.episode.as_str(), m.step, m.section), ("ep-q", 2, Some(Section::ErrorContext)));
    // The offset is where step 2's frame starts: reading from there gives step 2 first.
    let mut indexed = basecamp_trace::IndexedTrace::new(std::io::Cursor::new(bytes.clone()), "ep.trace").unwrap();
    let step2 = indexed.read_step(2).unwrap();
    assert!(step2.iter().any(|r| matches!(r.body, Some(Body::ErrorContext(_)))));
    let frame = &bytes[m.offset as usize..];
    let header: [u8; 20] = frame[..20].try_into().unwrap();
    assert!(basecamp_trace::format::FrameHeader::decode(&header).is_ok(), "offset {} is a frame start", m.offset);
}

#[test]
fn damage_keeps_the_matches_before_it_and_reports_the_offset() {
    let bytes = write_episode();
    let cut = &bytes[..bytes.len() - 40];
    let q = Query::parse("plan_execution.tool == \"tracking_api\"").unwrap();
    let mut reader = TraceReader::new(cut, "cut.trace").unwrap();
    let mut steps = Vec::new();
    let err = q.search(&mut reader, &mut |m| steps.push(m.step)).unwrap_err();
    assert!(err.to_string().starts_with("cut.trace: truncated at byte "), "{err}");
    assert_eq!(steps, [1, 2, 3]);
}

mod never_panics {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

        /// Any text either compiles or is an error whose caret lies inside the query.
        #[test]
        fn any_query_text(text in "[ -~éß\\t]{0,40}") {
            if let Err(e) = Query::parse(&text) {
                prop_assert!(e.at <= text.len());
                prop_assert!(text.is_char_boundary(e.at));
                let shown = e.to_string();
                prop_assert!(shown.starts_with("invalid query: "));
            }
        }

        /// Queries built from the grammar's pieces never panic either.
        #[test]
        fn grammar_shaped_queries(parts in proptest::collection::vec(prop_oneof![
            Just("plan_execution.tool"), Just("latency_ms"), Just("memory_state.k"), Just("exists(error_context)"),
            Just("reward_signal.r"), Just("=="), Just("<"), Just(">="), Just("and"), Just("or"), Just("not"),
            Just("("), Just(")"), Just("\"x\""), Just("3"), Just("-1.5"), Just("null"), Just("true"), Just("."),
        ], 0..12)) {
            let text = parts.join(" ");
            let _ = Query::parse(&text);
        }

        /// A damaged trace is searched up to the damage, never panicking.
        #[test]
        fn flipped_bytes_in_a_trace(flips in proptest::collection::vec((any::<prop::sample::Index>(), 1u8..=255), 1..4)) {
            let mut bytes = write_episode();
            for (at, x) in flips {
                let i = at.index(bytes.len());
                bytes[i] ^= x;
            }
            let q = Query::parse("memory_state.shipping_status == null or plan_execution.tool > \"a\" or exists(error_context) \
                                  or reward_signal.accuracy < 2 or token_logit.logprob < 0 or error_context.memory.order.id == 7").unwrap();
            if let Ok(mut reader) = TraceReader::new(bytes.as_slice(), "x.trace") {
                let _ = q.search(&mut reader, &mut |_| {});
            }
        }

        /// Records whose frames are intact but whose bodies are garbage (a
        /// buggy writer): the evaluator reads fields straight from the bytes
        /// and must report, not panic.
        #[test]
        fn garbage_record_bodies(field in 3u32..=10, body in proptest::collection::vec(any::<u8>(), 0..48)) {
            let bytes = trace_with_raw_record(1, field, &body);
            let q = Query::parse("memory_state.k == null or plan_execution.tool > \"a\" or exists(error_context) \
                                  or reward_signal.r < 2 or token_logit.logprob < 0 or error_context.memory.k.x == 7 \
                                  or policy_turn.model == \"m\" or injection.trigger == \"live\" or error_context.cause == \"c\"").unwrap();
            let mut reader = TraceReader::new(bytes.as_slice(), "g.trace").unwrap();
            let result = q.search(&mut reader, &mut |_| {});
            if let Err(e) = result {
                let text = e.to_string();
                prop_assert!(text.starts_with("g.trace: "), "{}", text);
            }
        }
    }
}

/// A trace file built by hand: the header frame, then one frame holding a
/// record of `step` whose body field `field` carries `body` verbatim.
fn trace_with_raw_record(step: u32, field: u32, body: &[u8]) -> Vec<u8> {
    use basecamp_trace::format::{FrameHeader, FrameKind, preamble};
    use basecamp_trace::pb::Record;
    use prost::Message;
    let frame = |payload: &[u8]| {
        let compressed = zstd::bulk::compress(payload, 3).unwrap();
        let header = FrameHeader {
            kind: FrameKind::Records,
            record_kinds: 0,
            flags: 0,
            compressed_len: compressed.len() as u32,
            raw_len: payload.len() as u32,
            payload_crc: crc32fast::hash(&compressed),
        };
        [header.encode().to_vec(), compressed].concat()
    };
    let header = Record {
        step: 0,
        body: Some(Body::Header(Box::new(Header { episode_id: "g".into(), schema_major: 1, ..Default::default() }))),
    };
    let mut record = Vec::new();
    prost::encoding::encode_varint(1 << 3, &mut record); // field 1 (step), varint
    prost::encoding::encode_varint(u64::from(step), &mut record);
    prost::encoding::encode_varint(u64::from(field << 3 | 2), &mut record);
    prost::encoding::encode_varint(body.len() as u64, &mut record);
    record.extend_from_slice(body);
    let mut payload = Vec::new();
    prost::encoding::encode_varint(record.len() as u64, &mut payload);
    payload.extend_from_slice(&record);
    [preamble().to_vec(), frame(&header.encode_length_delimited_to_vec()), frame(&payload)].concat()
}

#[test]
fn a_record_body_that_does_not_decode_is_named_by_step_and_section() {
    // Field 1 with wire type 7: no protobuf reader accepts it.
    let bytes = trace_with_raw_record(1, 3, &[0x0f, 0x00]);
    let q = Query::parse("plan_execution.tool == \"x\"").unwrap();
    let mut reader = TraceReader::new(bytes.as_slice(), "g.trace").unwrap();
    let err = q.search(&mut reader, &mut |_| {}).unwrap_err();
    assert!(err.to_string().starts_with("g.trace: corrupt frame at byte "), "{err}");
    assert!(err.to_string().ends_with(": step 1: a plan_execution record does not decode"), "{err}");
    // A query that does not read plan steps skips the record undecoded.
    let q = Query::parse("reward_signal.r > 0").unwrap();
    let mut reader = TraceReader::new(bytes.as_slice(), "g.trace").unwrap();
    let err = q.search(&mut reader, &mut |_| {}).unwrap_err();
    assert!(err.to_string().starts_with("g.trace: truncated at byte "), "{err}");
}

/// A hash copied from `trace parse` (proto3 JSON: base64) matches as its
/// hex does, in either case; a string that is neither is refused rather
/// than matching nothing. `\u` escapes spell any character, one beyond
/// U+FFFF as a JSON surrogate pair, and a short one names itself.
#[test]
fn hashes_match_in_hex_or_base64_and_unicode_escapes_spell_any_character() {
    use base64::Engine as _;
    let hash: Vec<u8> = (0u8..32).map(|i| i.wrapping_mul(37).wrapping_add(250)).collect();
    let mut w = TraceWriter::new(Vec::new(), Header { episode_id: "ep-h".into(), ..Default::default() }, 3).unwrap();
    let step = PlanStep { tool: "😀 lookup".into(), input_hash: hash.clone(), ..Default::default() };
    w.append(1, Body::PlanStep(Box::new(step))).unwrap();
    w.end_step().unwrap();
    let bytes = w.finish(EpisodeEnd { steps: 1, ..Default::default() }).unwrap();
    let b64 = base64::engine::general_purpose::STANDARD.encode(&hash);
    assert!(b64.ends_with('=') && b64.contains(['+', '/']), "{b64}: the test covers padding and both alphabets");
    for literal in [
        hex::encode(&hash),
        hex::encode_upper(&hash),
        b64.clone(),
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(&hash),
    ] {
        assert_eq!(steps_matching(&bytes, &format!("input_hash == \"{literal}\"")), [1], "{literal}");
        assert_eq!(steps_matching(&bytes, &format!("input_hash != \"{literal}\"")), [0u32; 0], "{literal}");
    }
    assert_eq!(steps_matching(&bytes, "result_hash == \"\""), [1], "an empty hash is written \"\"");
    // Not 32 bytes: no hash could match it; refused, not an empty result.
    for wrong in ["abcd".to_string(), "AAAA".to_string(), format!("{}aa", hex::encode(&hash))] {
        let said = error_of(&format!("input_hash == \"{wrong}\""));
        assert!(said.starts_with("invalid query: a hash is a sha256, 32 bytes"), "{wrong}: {said}");
    }
    assert_eq!(
        error_of("input_hash == \"not a hash!\""),
        "invalid query: a hash is a sha256, 32 bytes written in hex (64 digits, or its first 8 or more as `trace \
         validate` and the reports print them) or in base64 (as `trace parse` prints it); \"not a hash!\" is none \
         of these\n  input_hash == \"not a hash!\"\n                ^"
    );

    assert_eq!(steps_matching(&bytes, r#"tool == "\ud83d\ude00 lookup""#), [1]);
    assert_eq!(steps_matching(&bytes, r#"tool == "\uD83D\uDE00 lookup""#), [1]);
    for (query, message) in [
        (r#"tool == "\u12""#, r"'\u12' is not an escape: '\u' takes four hex digits, as in '\u00e9'"),
        (
            r#"tool == "\ud83d lookup""#,
            r"'\ud83d' is the first half of a surrogate pair: follow it with the second ('\udc00' to '\udfff'), or type the character itself",
        ),
        (r#"tool == "\ude00""#, r"'\ude00' is the second half of a surrogate pair, without the first"),
    ] {
        let said = error_of(query);
        assert!(said.starts_with(&format!("invalid query: {message}\n")), "{query}: {said}");
    }
    // The closing quote after a short escape is still the string's end: not "never closed".
    assert!(!error_of(r#"tool == "\u12""#).contains("never closed"));
}

/// `trace validate` and the reports print a hash's first 12 hex digits;
/// search refused them ("a hash is a sha256, 32 bytes"), so a hash a
/// finding names could not be looked for. A hex prefix of 8 digits or more
/// now matches every hash that starts with it (`==`, `!=`; ordering is
/// refused), for the plan step's hashes and the header's config hash.
#[test]
fn a_hash_prefix_as_validate_prints_it_matches_the_hashes_starting_with_it() {
    let hash = |seed: u8| -> Vec<u8> { (0u8..32).map(|i| i.wrapping_mul(seed).wrapping_add(seed)).collect() };
    let (mut a, b, config) = (hash(37), hash(91), hash(13));
    // Its first 43 hex digits end in "0": also a sha256 in unpadded base64, which they were read as.
    a[21] = 0x05;
    let header = Header { episode_id: "ep-p".into(), config_hash: config.clone(), ..Default::default() };
    let mut w = TraceWriter::new(Vec::new(), header, 3).unwrap();
    for (step, h) in [(1, &a), (2, &b)] {
        let plan = PlanStep { index: step, memory_hash_before: h.clone(), ..Default::default() };
        w.append(step, Body::PlanStep(Box::new(plan))).unwrap();
        w.end_step().unwrap();
    }
    let bytes = w.finish(EpisodeEnd { steps: 2, ..Default::default() }).unwrap();
    let short = |h: &[u8]| basecamp_trace::Digest::from_slice(h).unwrap().short();
    assert_eq!(short(&a).len(), 12, "what validate prints");
    for prefix in [
        short(&a),
        short(&a).to_ascii_uppercase(),
        hex::encode(&a)[..8].to_string(),
        hex::encode(&a)[..43].to_string(),
        hex::encode(&a)[..63].to_string(),
    ] {
        assert_eq!(steps_matching(&bytes, &format!("memory_hash_before == \"{prefix}\"")), [1], "{prefix}");
        assert_eq!(steps_matching(&bytes, &format!("memory_hash_before != \"{prefix}\"")), [2], "{prefix}");
    }
    assert_eq!(steps_matching(&bytes, &format!("memory_hash_before == \"{}\"", short(&b))), [2]);
    assert_eq!(steps_matching(&bytes, &format!("episode.config_hash == \"{}\"", short(&config))), [1, 2]);
    assert_eq!(steps_matching(&bytes, &format!("episode.config_hash == \"{}\"", hex::encode(&config))), [1, 2]);
    assert_eq!(steps_matching(&bytes, &format!("episode.config_hash == \"{}\"", short(&a))), [0u32; 0]);
    // Too short to pick out a hash: refused, as before.
    let said = error_of(&format!("memory_hash_before == \"{}\"", &short(&a)[..7]));
    assert!(said.starts_with("invalid query: a hash is a sha256, 32 bytes"), "{said}");
    assert_eq!(
        error_of(&format!("memory_hash_before < \"{}\"", short(&a))),
        format!(
            "invalid query: a hash prefix can only be compared with == and != (it matches the hashes starting \
             with it), not '<'\n  memory_hash_before < \"{}\"\n                     ^",
            short(&a)
        )
    );
}
