//! The scripted policy from JSONL files on disk, through the [`Policy`] enum
//! the agent loop uses: a 50-episode script, a shared script, and every way a
//! script can be wrong or run out.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use basecamp_sandbox::policy::{
    ChatMessage, Policy, PolicyConfig, PolicyError, PolicyRequest, ScriptedConfig, ScriptedError, ToolArguments,
};
use serde_json::json;

fn write_script(dir: &tempfile::TempDir, text: &str) -> PathBuf {
    let path = dir.path().join("policy.jsonl");
    std::fs::write(&path, text).expect("write script");
    path
}

fn load(path: &std::path::Path) -> Result<Policy, PolicyError> {
    Policy::from_config(&PolicyConfig::Scripted(ScriptedConfig { path: path.to_owned() }))
}

fn ask(episode: &str, turn: u32) -> PolicyRequest<'static> {
    PolicyRequest::new(episode, turn, vec![ChatMessage::user("help")], vec![])
}

/// A test set's integer ids (`"id": 7`) are read as their decimal text; a
/// script may name them the same way (before: "invalid type: integer").
#[tokio::test]
async fn an_episode_line_may_name_an_integer_id() {
    let dir = tempfile::tempdir().unwrap();
    let policy = load(&write_script(&dir, "{\"episode\": 7, \"turns\": [{\"content\": \"Done.\"}]}\n")).unwrap();
    assert_eq!(policy.respond(&ask("7", 0)).await.unwrap().content.as_deref(), Some("Done."));
}

#[tokio::test]
async fn fifty_episodes_each_follow_their_own_script() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::new();
    for i in 1..=50 {
        let line = json!({"episode": format!("ep-{i}"), "turns": [
            {"tool_calls": [{"name": "lookup_order", "arguments": {"order_id": format!("A{i}")}}]},
            {"content": format!("Order A{i} has shipped.")}
        ]});
        writeln!(text, "{line}").unwrap();
    }
    let policy = load(&write_script(&dir, &text)).unwrap();
    assert_eq!(policy.model(), "scripted");

    for i in 1..=50 {
        let episode = format!("ep-{i}");
        let first = policy.respond(&ask(&episode, 0)).await.unwrap();
        assert_eq!(first.tool_calls.len(), 1);
        assert_eq!(first.tool_calls[0].id, "call_0_0");
        assert_eq!(first.tool_calls[0].arguments, ToolArguments::Parsed(json!({"order_id": format!("A{i}")})));
        assert!(first.to_policy_turn().logprobs_missing, "a scripted tool turn without logprobs is flagged");
        let second = policy.respond(&ask(&episode, 1)).await.unwrap();
        assert!(second.is_final());
        assert_eq!(second.content, Some(format!("Order A{i} has shipped.")));
    }
    // Answers depend only on (episode, turn): asking again gives the same.
    let again = policy.respond(&ask("ep-7", 1)).await.unwrap();
    assert_eq!(again.content.as_deref(), Some("Order A7 has shipped."));
}

#[tokio::test]
async fn a_shared_script_is_replayed_for_every_episode() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_script(
        &dir,
        concat!(
            r#"{"tool_calls": [{"id": "c1", "name": "lookup_order", "arguments": "{\"order_id\": \"A1\"}"}], "logprobs": [{"token": "lo", "logprob": -0.1, "token_id": 7, "top_logprobs": [{"token": "lo", "logprob": -0.1, "token_id": 7}]}]}"#,
            "\n",
            r#"{"content": "Shipped."}"#,
            "\n"
        ),
    );
    let policy = load(&path).unwrap();
    for episode in ["a", "b"] {
        let first = policy.respond(&ask(episode, 0)).await.unwrap();
        assert_eq!(first.tool_calls[0].id, "c1");
        assert_eq!(first.tool_calls[0].arguments, ToolArguments::Parsed(json!({"order_id": "A1"})));
        assert!(!first.to_policy_turn().logprobs_missing);
        assert_eq!(first.token_logits()[0].token_id, 7);
        assert!(policy.respond(&ask(episode, 1)).await.unwrap().is_final());
    }
    let err = policy.respond(&ask("a", 2)).await.unwrap_err();
    assert_eq!(err.category(), "ScriptedPolicyOutOfTurns");
    assert!(
        err.to_string().starts_with(&format!("{}:2: the script shared by every episode has 2 turns", path.display())),
        "{err}"
    );
}

#[tokio::test]
async fn scripted_invalid_json_and_unknown_tools_pass_through_as_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_script(
        &dir,
        r#"{"tool_calls": [{"name": "lookup_order", "arguments": "{\"order_id\": "}, {"name": "no_such_tool", "arguments": {}}]}"#,
    );
    let policy = load(&path).unwrap();
    let response = policy.respond(&ask("x", 0)).await.unwrap();
    let invalid: Vec<_> = response.invalid_tool_calls().collect();
    assert_eq!(invalid.len(), 1);
    assert_eq!(invalid[0].1.error_type, "invalid_json");
    assert_eq!(response.tool_calls[1].name, "no_such_tool");
}

#[tokio::test]
async fn unknown_episode_and_exhausted_episode_name_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_script(
        &dir,
        "{\"episode\": \"ep-1\", \"turns\": [{\"content\": \"a\"}]}\n{\"episode\": \"ep-2\", \"turns\": [{\"content\": \"b\"}]}\n",
    );
    let policy = load(&path).unwrap();
    let Policy::Scripted(scripted) = &policy else { panic!("a scripted policy") };
    assert_eq!(scripted.episodes(), vec!["ep-1", "ep-2"]);
    assert_eq!(scripted.missing_episodes(["ep-1", "ep-9", "ep-2", "ep-10"]), vec!["ep-9", "ep-10"]);

    let err = policy.respond(&ask("ep-9", 0)).await.unwrap_err();
    assert_eq!(err.category(), "ScriptedPolicyUnknownEpisode");
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains("no script for episode `ep-9` (it scripts 2 episodes: ep-1, ep-2)"), "{message}");

    let err = policy.respond(&ask("ep-2", 1)).await.unwrap_err();
    assert!(
        matches!(err, PolicyError::Scripted(ScriptedError::OutOfTurns { line: 2, turns: 1, requested: 1, .. })),
        "{err:?}"
    );
    assert!(err.to_string().contains("for episode `ep-2` has 1 turns"), "{err}");
}

#[tokio::test]
async fn scripted_failures_and_delays() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_script(
        &dir,
        "{\"episode\": \"slow\", \"turns\": [{\"content\": \"late\", \"delay_ms\": 150}]}\n{\"episode\": \"down\", \"turns\": [{\"error\": \"policy server restarting\"}]}\n",
    );
    let policy = load(&path).unwrap();

    let started = Instant::now();
    let late = policy.respond(&ask("slow", 0)).await.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(150));
    assert!(late.latency >= Duration::from_millis(150));

    let err = policy.respond(&ask("down", 0)).await.unwrap_err();
    assert_eq!(err.category(), "ScriptedPolicyFailure");
    assert_eq!(
        err.to_string(),
        format!("{}:2: scripted failure for episode `down` turn 0: policy server restarting", path.display())
    );
}

#[test]
fn load_errors_name_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_script(
        &dir,
        "{\"content\": \"a\"}\n{\"content\": \"b\", \"tool_calls\": [{\"name\": \"t\", \"argument\": {}}]}\n",
    );
    let err = load(&path).unwrap_err();
    assert_eq!(err.category(), "ScriptedPolicyInvalidLine");
    let message = err.to_string();
    assert!(
        message.starts_with(&format!("{}:2: invalid response: unknown field `argument`", path.display())),
        "{message}"
    );

    let missing = dir.path().join("nope.jsonl");
    let err = load(&missing).unwrap_err();
    assert_eq!(err.category(), "ScriptedPolicyUnreadable");
    assert!(err.to_string().contains("nope.jsonl"), "{err}");
}

#[test]
fn a_line_that_is_not_utf8_is_named_with_its_line_and_the_lines_before_it_are_checked_first() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.jsonl");
    // Line 2 saved as Latin-1: "café" with the byte 0xE9.
    std::fs::write(&path, b"{\"content\": \"a\"}\n{\"content\": \"caf\xe9\"}\n{\"content\": \"c\"}\n").unwrap();
    let err = load(&path).unwrap_err();
    // Before: "cannot read scripted policy ...: stream did not contain valid UTF-8", no line.
    assert_eq!(err.category(), "ScriptedPolicyInvalidLine");
    assert_eq!(
        err.to_string(),
        format!(
            "{}:2: the line is not UTF-8 text (byte 0xE9 at column 17); save the scripted policy as UTF-8",
            path.display()
        )
    );
    // A mistake on an earlier line is named first, as it was.
    std::fs::write(&path, b"{\"contnet\": \"a\"}\n{\"content\": \"caf\xe9\"}\n").unwrap();
    let err = load(&path).unwrap_err().to_string();
    assert!(err.starts_with(&format!("{}:1: invalid response: unknown field `contnet`", path.display())), "{err}");
}
