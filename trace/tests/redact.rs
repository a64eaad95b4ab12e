//! Redaction: no original value survives anywhere in the decompressed
//! output, the output is a valid trace, and tokens are stable within a run.

use basecamp_trace::format::{FRAME_HEADER_LEN, FrameHeader, PREAMBLE_LEN};
use basecamp_trace::memory::{Memory, MemoryPatch};
use basecamp_trace::pb::{
    EpisodeEnd, ErrorContext, Header, MemorySource, PlanStep, PolicyTurn, StepKind, StepStatus, ToolPayload,
    record::Body,
};
use basecamp_trace::redact::{Pattern, Redactor};
use basecamp_trace::validate::validate_reader;
use basecamp_trace::{TraceReader, TraceWriter, canonical_json, hash_json, read_trace_from};
use serde_json::json;

const PHONE: &str = "+1 415-555-0134";
const ADDRESS: &str = "1 Infinite Loop, Cupertino";
const EMAIL: &str = "jane.doe@example.com";
const OTHER_PHONE: &str = "(650) 555.0199";
/// Only in a write the memory policy refused (a PII key's value).
const REFUSED_ADDRESS: &str = "221B Baker Street";

/// A small but complete episode carrying personal data in every place it can hide.
fn pii_episode() -> Vec<u8> {
    let header = Header { episode_id: "ep-pii".into(), top_k: 1, ..Default::default() };
    let mut w = TraceWriter::new(Vec::new(), header, 3).unwrap();
    let mut memory = Memory::new();
    let initial = json!({"user_phone": PHONE, "user_address": {"street": ADDRESS}, "order_id": "A-1"});
    for d in memory.apply(&MemoryPatch::from_object(initial.as_object().unwrap()), MemorySource::Initial, "test_set") {
        w.append(0, Body::MemoryDelta(d.to_record())).unwrap();
    }
    w.end_step().unwrap();

    let args = json!({"user_phone": PHONE, "order_id": "A-1", "contact": {"email": EMAIL}});
    let observation =
        json!({"status": "in_transit", "note": format!("customer at {ADDRESS} called from {OTHER_PHONE}")});
    w.append(
        1,
        Body::PolicyTurn(PolicyTurn {
            content: format!("I will email {EMAIL} and call {PHONE}."),
            tool_calls_json:
                json!([{"id": "c1", "function": {"name": "tracking_api", "arguments": canonical_json(&args)}}])
                    .to_string(),
            ..Default::default()
        }),
    )
    .unwrap();
    w.append(
        1,
        Body::TokenLogit(basecamp_trace::pb::TokenLogit {
            token: EMAIL.into(),
            top_tokens: vec![EMAIL.into()].into(),
            top_ids: vec![5].into(),
            top_logprobs: vec![-0.1].into(),
            ..Default::default()
        }),
    )
    .unwrap();
    let before = memory.hash();
    let patch = MemoryPatch::default()
        .set("user_phone", json!(OTHER_PHONE))
        .set("shipping_status", json!({"status": "in_transit", "contact": EMAIL}));
    let deltas = memory.apply(&patch, MemorySource::Tool, "tracking_api");
    w.append(
        1,
        Body::PlanStep(Box::new(PlanStep {
            index: 1,
            kind: StepKind::ToolCall as i32,
            tool: "tracking_api".into(),
            arguments_json: canonical_json(&args),
            input_hash: hash_json(&args).0.to_vec(),
            observation_json: canonical_json(&observation),
            result_hash: hash_json(&observation).0.to_vec(),
            status: StepStatus::Ok as i32,
            memory_hash_before: before.0.to_vec(),
            memory_hash_after: memory.hash().0.to_vec(),
            refused_memory_json: [
                ("user_address".to_string(), canonical_json(&json!([REFUSED_ADDRESS]))),
                ("note".to_string(), canonical_json(&json!(format!("mail {EMAIL}")))),
            ]
            .into(),
            ..Default::default()
        })),
    )
    .unwrap();
    for d in &deltas {
        w.append(1, Body::MemoryDelta(d.to_record())).unwrap();
    }
    w.append(
        1,
        Body::ErrorContext(Box::new(ErrorContext {
            error_type: "tool_error".into(),
            message: format!("lookup for {EMAIL} failed"),
            cause_chain: vec![format!("no record for {PHONE}")],
            memory_snapshot_json: memory.entries().map(|(k, v)| (k.clone(), canonical_json(v))).collect(),
            last_tool_payloads: vec![ToolPayload {
                tool: "tracking_api".into(),
                arguments_json: canonical_json(&args),
                response_json: canonical_json(&observation),
                status: StepStatus::Ok as i32,
            }],
            ..Default::default()
        })),
    )
    .unwrap();
    w.append(1, Body::MemorySnapshot(memory.to_snapshot())).unwrap();
    w.end_step().unwrap();
    let end = EpisodeEnd {
        outcome: 1,
        steps: 1,
        final_memory_hash: memory.hash().0.to_vec(),
        // A PII field's value quoted in free text is found by its value, not by a pattern.
        final_answer: format!("We will call you at {PHONE} and ship to {ADDRESS}."),
        ..Default::default()
    };
    w.finish(end).unwrap()
}

/// Every byte the trace's frames decompress to.
fn decompressed(trace: &[u8]) -> Vec<u8> {
    let mut at = PREAMBLE_LEN;
    let mut out = Vec::new();
    while at + FRAME_HEADER_LEN <= trace.len() {
        let Ok(h) = FrameHeader::decode(trace[at..at + FRAME_HEADER_LEN].try_into().unwrap()) else { break };
        let payload = &trace[at + FRAME_HEADER_LEN..at + FRAME_HEADER_LEN + h.compressed_len as usize];
        out.extend(zstd::bulk::decompress(payload, h.raw_len as usize).unwrap());
        at += FRAME_HEADER_LEN + h.compressed_len as usize;
    }
    out
}

fn contains(haystack: &[u8], needle: &str) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle.as_bytes())
}

fn redact(input: &[u8], redactor: &Redactor) -> Vec<u8> {
    let mut out = Vec::new();
    redactor.redact(|| TraceReader::new(input, "in.trace"), &mut out, "out.trace").unwrap();
    out
}

fn redactor(salt: &[u8]) -> Redactor {
    Redactor::new(
        ["user_phone".to_string(), "user_address".to_string()],
        vec![Pattern::Email, Pattern::Phone],
        salt.to_vec(),
    )
}

#[test]
fn no_original_value_survives_and_the_output_is_valid() {
    let input = pii_episode();
    let plain = decompressed(&input);
    // The input holds every value, so the check below can fail.
    for value in [PHONE, ADDRESS, EMAIL, OTHER_PHONE, REFUSED_ADDRESS, "Cupertino", "415-555", "jane.doe"] {
        assert!(contains(&plain, value), "the input should contain {value}");
    }
    assert!(validate_reader(TraceReader::new(input.as_slice(), "in.trace").unwrap()).is_empty());

    let r = redactor(b"test-salt");
    let output = redact(&input, &r);
    let bytes = decompressed(&output);
    for value in [
        PHONE,
        ADDRESS,
        EMAIL,
        OTHER_PHONE,
        REFUSED_ADDRESS,
        "Baker",
        "Cupertino",
        "415-555",
        "555.0199",
        "jane.doe",
        "example.com",
    ] {
        assert!(!contains(&bytes, value), "{value:?} survived redaction");
        assert!(!contains(&output, value), "{value:?} is in the output file");
    }
    let findings = validate_reader(TraceReader::new(output.as_slice(), "out.trace").unwrap());
    assert!(findings.is_empty(), "the redacted trace is not valid: {findings:#?}");

    // What is not personal data is untouched, and tokens are joinable.
    let trace = read_trace_from(output.as_slice(), "out.trace").unwrap();
    let text = serde_json::to_string(&trace.records).unwrap();
    assert!(text.contains("in_transit") && text.contains("A-1") && text.contains("tracking_api"));
    let phone_token = r.token(PHONE);
    let plan = trace
        .records
        .iter()
        .find_map(|rec| match &rec.body {
            Some(Body::PlanStep(p)) => Some(p.clone()),
            _ => None,
        })
        .unwrap();
    let args: serde_json::Value = serde_json::from_str(&plan.arguments_json).unwrap();
    assert_eq!(args["user_phone"], json!(phone_token));
    let initial_phone = trace
        .records
        .iter()
        .find_map(|rec| match &rec.body {
            Some(Body::MemoryDelta(d)) if d.key == "user_phone" => d.after_json.clone(),
            _ => None,
        })
        .unwrap();
    assert_eq!(initial_phone, canonical_json(&json!(phone_token)), "a memory value and an argument field join");
    assert_eq!(args["contact"]["email"], json!(r.token(EMAIL)));
}

#[test]
fn the_salt_decides_the_tokens() {
    let input = pii_episode();
    let a1 = redact(&input, &redactor(b"a"));
    let a2 = redact(&input, &redactor(b"a"));
    let b = redact(&input, &redactor(b"b"));
    assert_eq!(decompressed(&a1), decompressed(&a2), "same salt, same output");
    assert!(contains(&decompressed(&a1), &redactor(b"a").token(PHONE)));
    assert!(!contains(&decompressed(&b), &redactor(b"a").token(PHONE)));
}

#[test]
fn a_damaged_input_is_refused_with_its_offset() {
    let input = pii_episode();
    let cut = &input[..input.len() - 20];
    let mut out = Vec::new();
    let err = redactor(b"s").redact(|| TraceReader::new(cut, "cut.trace"), &mut out, "out.trace").unwrap_err();
    assert!(err.to_string().starts_with("cut.trace: truncated at byte "), "{err}");
    assert!(out.is_empty(), "the damage is found by the first pass, before anything is written");
}

/// The fields that occur are reported, so the CLI can point out one that
/// occurs nowhere: `email` is a key only inside tool arguments (nested JSON),
/// `user_address` a memory key, `user_phonee` nothing at all.
#[test]
fn the_pii_fields_that_occur_are_reported() {
    let input = pii_episode();
    let redactor = Redactor::new(["email", "user_address", "user_phonee"].map(String::from), vec![], b"s".to_vec());
    let stats = redactor.redact(|| TraceReader::new(&input[..], "in.trace"), Vec::new(), "out.trace").unwrap();
    assert_eq!(stats.fields_found.into_iter().collect::<Vec<_>>(), ["email", "user_address"]);
}

/// A redacted trace redacted again with the same salt was hashed a second
/// time (memory values and every place a token recurred), so its tokens no
/// longer joined with traces redacted once; it now comes out unchanged.
#[test]
fn redacting_a_redacted_trace_with_the_same_salt_changes_nothing() {
    let once = redact(&pii_episode(), &redactor(b"s"));
    let mut twice = Vec::new();
    let stats = redactor(b"s").redact(|| TraceReader::new(&once[..], "once.trace"), &mut twice, "twice.trace").unwrap();
    assert_eq!(stats.replaced, 0);
    assert_eq!(twice, once);
}

/// Patterns are matched in object keys and memory keys too, not only in
/// values: an address used as a key was kept. A key that already reads like
/// another's redacted text keeps its name, and the redacted one gets a
/// suffix, so no entry is lost and memory keys stay one name each.
#[test]
fn keys_are_redacted_and_two_keys_never_become_one() {
    let r = Redactor::new([], vec![Pattern::Email], b"keys".to_vec());
    let token_key = format!("contact:{}", r.token(EMAIL));
    let email_key = format!("contact:{EMAIL}");
    let header = Header { episode_id: "ep-keys".into(), ..Default::default() };
    let mut w = TraceWriter::new(Vec::new(), header, 3).unwrap();
    let mut memory = Memory::new();
    let initial = json!({&email_key: "vip", &token_key: "kept"});
    for d in memory.apply(&MemoryPatch::from_object(initial.as_object().unwrap()), MemorySource::Initial, "test_set") {
        w.append(0, Body::MemoryDelta(d.to_record())).unwrap();
    }
    w.end_step().unwrap();
    let args = json!({"contacts": {EMAIL: "vip", r.token(EMAIL): "other"}});
    let before = memory.hash();
    let deltas = memory.apply(&MemoryPatch::default().set(&email_key, json!("vvip")), MemorySource::Tool, "crm");
    w.append(
        1,
        Body::PlanStep(Box::new(PlanStep {
            index: 1,
            kind: StepKind::ToolCall as i32,
            tool: "crm".into(),
            arguments_json: canonical_json(&args),
            input_hash: hash_json(&args).0.to_vec(),
            observation_json: "{}".into(),
            status: StepStatus::Ok as i32,
            memory_hash_before: before.0.to_vec(),
            memory_hash_after: memory.hash().0.to_vec(),
            refused_memory_json: [(format!("note:{EMAIL}"), "null".to_string())].into(),
            ..Default::default()
        })),
    )
    .unwrap();
    for d in &deltas {
        w.append(1, Body::MemoryDelta(d.to_record())).unwrap();
    }
    w.append(
        1,
        Body::ErrorContext(Box::new(ErrorContext {
            error_type: "tool_error".into(),
            memory_snapshot_json: memory.entries().map(|(k, v)| (k.clone(), canonical_json(v))).collect(),
            ..Default::default()
        })),
    )
    .unwrap();
    w.append(1, Body::MemorySnapshot(memory.to_snapshot())).unwrap();
    w.end_step().unwrap();
    let end = EpisodeEnd { outcome: 1, steps: 1, final_memory_hash: memory.hash().0.to_vec(), ..Default::default() };
    let input = w.finish(end).unwrap();
    assert!(validate_reader(TraceReader::new(input.as_slice(), "in.trace").unwrap()).is_empty());

    let output = redact(&input, &r);
    assert!(!contains(&decompressed(&output), EMAIL), "an address used as a key survived redaction");
    let findings = validate_reader(TraceReader::new(output.as_slice(), "out.trace").unwrap());
    assert!(findings.is_empty(), "the redacted trace is not valid: {findings:#?}");

    let trace = read_trace_from(output.as_slice(), "out.trace").unwrap();
    let mut replayed = Memory::new();
    let (mut snapshot, mut error_memory, mut arguments, mut refused) = (None, None, None, None);
    for record in &trace.records {
        match &record.body {
            Some(Body::MemoryDelta(d)) => {
                let patch = match &d.after_json {
                    Some(v) => MemoryPatch::default().set(&d.key, serde_json::from_str(v).unwrap()),
                    None => MemoryPatch::default().remove(&d.key),
                };
                replayed.apply(&patch, MemorySource::Tool, "");
            }
            Some(Body::MemorySnapshot(s)) => snapshot = Some(s.entries_json.clone()),
            Some(Body::ErrorContext(e)) => error_memory = Some(e.memory_snapshot_json.clone()),
            Some(Body::PlanStep(p)) => {
                arguments = Some(serde_json::from_str::<serde_json::Value>(&p.arguments_json).unwrap());
                refused = Some(p.refused_memory_json.keys().cloned().collect::<Vec<_>>());
            }
            _ => {}
        }
    }
    let redacted_key = format!("{token_key}#2");
    let expected: std::collections::BTreeMap<String, String> =
        [(token_key.clone(), "\"kept\"".to_string()), (redacted_key, "\"vvip\"".to_string())].into();
    let replayed: std::collections::BTreeMap<String, String> =
        replayed.entries().map(|(k, v)| (k.clone(), canonical_json(v))).collect();
    assert_eq!(replayed, expected, "the deltas keep both keys apart");
    assert_eq!(snapshot.unwrap(), expected, "the snapshot names the keys as the deltas do");
    assert_eq!(error_memory.unwrap(), expected, "the error context names the keys as the deltas do");
    assert_eq!(refused.unwrap(), [format!("note:{}", r.token(EMAIL))]);
    assert_eq!(
        arguments.unwrap(),
        json!({"contacts": {r.token(EMAIL): "other", format!("{}#2", r.token(EMAIL)): "vip"}})
    );

    let mut twice = Vec::new();
    let stats = r.redact(|| TraceReader::new(&output[..], "once.trace"), &mut twice, "twice.trace").unwrap();
    assert_eq!((stats.replaced, twice), (0, output), "redacting again changes nothing");
}

#[test]
fn an_all_digit_pii_value_is_redacted_in_free_text_where_it_stands_alone() {
    const ACCOUNT: &str = "48213977";
    let header = Header { episode_id: "ep-account".into(), ..Default::default() };
    let mut w = TraceWriter::new(Vec::new(), header, 3).unwrap();
    let args = json!({"account_id": ACCOUNT});
    w.append(
        1,
        Body::PolicyTurn(PolicyTurn {
            // The value alone, then inside a longer number and a word: only the first is the account.
            content: format!("Account {ACCOUNT} is closed; ticket 1{ACCOUNT}0 and x{ACCOUNT} are not it."),
            tool_calls_json:
                json!([{"id": "c1", "function": {"name": "accounts", "arguments": canonical_json(&args)}}]).to_string(),
            ..Default::default()
        }),
    )
    .unwrap();
    w.end_step().unwrap();
    let input = w.finish(EpisodeEnd { outcome: 1, steps: 1, ..Default::default() }).unwrap();

    let r = Redactor::new(["account_id".to_string()], Vec::new(), b"salt".to_vec());
    let output = redact(&input, &r);
    let token = r.token(ACCOUNT);
    let trace = read_trace_from(output.as_slice(), "out.trace").unwrap();
    let content = trace
        .records
        .iter()
        .find_map(|rec| match &rec.body {
            Some(Body::PolicyTurn(p)) => Some(p.content.clone()),
            _ => None,
        })
        .expect("the policy turn");
    // Before: all-digit values were never searched for in free text, so the account stayed in the content.
    assert_eq!(content, format!("Account {token} is closed; ticket 1{ACCOUNT}0 and x{ACCOUNT} are not it."));
    // Redaction leaves the trace as valid as it was (this minimal one has no plan step).
    let findings = |bytes: &[u8]| validate_reader(TraceReader::new(bytes, "out.trace").unwrap());
    assert_eq!(findings(&output), findings(&input));

    // A second pass with the same salt changes nothing: no digit run inside a token is taken for the value.
    assert_eq!(redact(&output, &r), output);
}

#[test]
fn the_row_id_is_redacted_like_the_episode_id() {
    // The row id kept "dave@example.com" while the episode id of the same
    // value became a token.
    let header =
        Header { episode_id: "dave@example.com".into(), row_id: "dave@example.com".into(), ..Default::default() };
    let w = TraceWriter::new(Vec::new(), header, 3).unwrap();
    let input = w.finish(EpisodeEnd { outcome: 1, ..Default::default() }).unwrap();
    let r = Redactor::new([], vec![Pattern::Email], b"s".to_vec());
    let mut output = Vec::new();
    let stats = r.redact(|| TraceReader::new(&input[..], "in.trace"), &mut output, "out.trace").unwrap();
    let trace = read_trace_from(output.as_slice(), "out.trace").unwrap();
    let token = r.token("dave@example.com");
    assert_eq!((trace.header.episode_id.as_str(), trace.header.row_id.as_str()), (token.as_str(), token.as_str()));
    assert_eq!(stats.episode_id, ("dave@example.com".to_string(), token));
    assert!(!contains(&output, "dave@") && !contains(&decompressed(&output), "dave@"));
}

#[test]
fn null_and_booleans_of_a_pii_field_are_kept() {
    // `memory_state.shipping_status == null` found 19 steps before redaction
    // and none after: null became "redacted:…".
    let header = Header { episode_id: "ep".into(), ..Default::default() };
    let mut w = TraceWriter::new(Vec::new(), header, 3).unwrap();
    let mut memory = Memory::new();
    let initial = json!({"shipping_status": null, "vip": true, "user_phone": PHONE});
    for d in memory.apply(&MemoryPatch::from_object(initial.as_object().unwrap()), MemorySource::Initial, "test_set") {
        w.append(0, Body::MemoryDelta(d.to_record())).unwrap();
    }
    let args = json!({"shipping_status": null, "vip": false, "user_phone": 4155550134u64});
    w.append(
        0,
        Body::PlanStep(Box::new(PlanStep {
            index: 0,
            kind: StepKind::ToolCall as i32,
            tool: "crm".into(),
            arguments_json: canonical_json(&args),
            input_hash: hash_json(&args).0.to_vec(),
            observation_json: "{}".into(),
            status: StepStatus::Ok as i32,
            memory_hash_before: memory.hash().0.to_vec(),
            memory_hash_after: memory.hash().0.to_vec(),
            ..Default::default()
        })),
    )
    .unwrap();
    w.end_step().unwrap();
    let end = EpisodeEnd { outcome: 1, final_memory_hash: memory.hash().0.to_vec(), ..Default::default() };
    let input = w.finish(end).unwrap();
    let r = Redactor::new(
        ["shipping_status".to_string(), "vip".to_string(), "user_phone".to_string()],
        vec![],
        b"s".to_vec(),
    );
    let output = redact(&input, &r);
    let findings = validate_reader(TraceReader::new(output.as_slice(), "out.trace").unwrap());
    assert!(findings.is_empty(), "{findings:#?}");
    let trace = read_trace_from(output.as_slice(), "out.trace").unwrap();
    let mut memory_after = std::collections::BTreeMap::new();
    let mut arguments = None;
    for record in &trace.records {
        match &record.body {
            Some(Body::MemoryDelta(d)) => {
                memory_after.insert(d.key.clone(), d.after_json.clone().unwrap());
            }
            Some(Body::PlanStep(p)) => {
                arguments = Some(serde_json::from_str::<serde_json::Value>(&p.arguments_json).unwrap())
            }
            _ => {}
        }
    }
    assert_eq!(memory_after["shipping_status"], "null");
    assert_eq!(memory_after["vip"], "true");
    assert_eq!(memory_after["user_phone"], canonical_json(&json!(r.token(PHONE))));
    // A number may be a phone number: still replaced.
    assert_eq!(arguments.unwrap(), json!({"shipping_status": null, "vip": false, "user_phone": r.token("4155550134")}));
}

/// A trace that reads to its footer without an episode end was redacted
/// into a copy with an end record made up (`EpisodeEnd::default()`, outcome
/// unspecified), which then read as a finished episode. It is refused, with
/// or without `allowing_truncated` (nothing was cut off), naming why.
#[test]
fn a_trace_without_an_episode_end_is_refused_not_given_a_made_up_end() {
    let mut w = TraceWriter::new(Vec::new(), Header { episode_id: "ep".into(), ..Default::default() }, 3).unwrap();
    w.append(1, Body::PlanStep(Box::default())).unwrap();
    w.end_step().unwrap();
    let whole = w.finish(EpisodeEnd { outcome: 1, steps: 1, ..Default::default() }).unwrap();
    // Take out the end's frame (the one before the index) and move the trailer's offset.
    let mut frames = Vec::new();
    let mut at = PREAMBLE_LEN;
    while at + basecamp_trace::format::TRAILER_LEN < whole.len() {
        let h = FrameHeader::decode(whole[at..at + FRAME_HEADER_LEN].try_into().unwrap()).unwrap();
        frames.push(at..at + FRAME_HEADER_LEN + h.compressed_len as usize);
        at = frames.last().unwrap().end;
    }
    let (end, index) = (frames[frames.len() - 2].clone(), frames[frames.len() - 1].clone());
    let mut unended = [&whole[..end.start], &whole[index.clone()]].concat();
    unended.extend_from_slice(&basecamp_trace::format::trailer((index.start - end.len()) as u64));
    for allow in [false, true] {
        let mut out = Vec::new();
        let err = redactor(b"salt")
            .allowing_truncated(allow)
            .redact(|| TraceReader::new(unended.as_slice(), "in.trace"), &mut out, "out.trace")
            .unwrap_err();
        assert!(err.to_string().starts_with("in.trace: no episode end: the file reads to its footer index"), "{err}");
    }
}
