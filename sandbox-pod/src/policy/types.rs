//! What goes to a policy and what comes back, independent of where the
//! policy runs: chat messages and tool specs (serialised in the OpenAI
//! chat-completions format, which test sets use too), and the response with
//! its tool calls, logprobs, usage and latency.
//!
//! A tool call's arguments are either parsed JSON or the raw text with the
//! reason it could not be used ([`ToolArguments::Invalid`]): the agent loop
//! records the latter as a policy error on that call and goes on. The
//! conversions to trace records ([`PolicyResponse::to_policy_turn`],
//! [`PolicyResponse::token_logits`]) live here so every policy kind writes
//! the same records.

use std::borrow::Cow;
use std::time::Duration;

use basecamp_trace::pb;

use super::raw_logits::RawLogits;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// One message of the conversation, in the OpenAI chat-completions shape
/// (`{"role": "tool", "tool_call_id": ..., "content": ...}` and so on).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum ChatMessage {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<MessageToolCall>,
    },
    Tool {
        tool_call_id: String,
        content: String,
    },
}

impl ChatMessage {
    pub fn system(content: impl Into<String>) -> Self {
        Self::System { content: content.into() }
    }

    pub fn user(content: impl Into<String>) -> Self {
        Self::User { content: content.into() }
    }

    /// A tool's observation, answering the call `tool_call_id`.
    pub fn tool(tool_call_id: impl Into<String>, content: impl Into<String>) -> Self {
        Self::Tool { tool_call_id: tool_call_id.into(), content: content.into() }
    }
}

/// A tool call inside an assistant message of the history: arguments are the
/// JSON text the model produced (invalid or not), as the API expects them back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MessageToolCall {
    pub id: String,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: FunctionCall,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    pub name: String,
    pub arguments: String,
}

fn function_type() -> String {
    "function".to_owned()
}

/// A tool the policy may call: serialises as an OpenAI `tools` entry,
/// `{"type": "function", "function": {"name", "description", "parameters"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "OpenAiTool", into = "OpenAiTool")]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// A JSON schema of the arguments object.
    pub parameters: Value,
}

impl ToolSpec {
    pub fn new(name: impl Into<String>, description: impl Into<String>, parameters: Value) -> Self {
        Self { name: name.into(), description: description.into(), parameters }
    }
}

#[derive(Serialize, Deserialize)]
struct OpenAiTool {
    #[serde(rename = "type")]
    kind: String,
    function: OpenAiFunction,
}

#[derive(Serialize, Deserialize)]
struct OpenAiFunction {
    name: String,
    #[serde(default)]
    description: String,
    #[serde(default = "empty_object_schema")]
    parameters: Value,
}

fn empty_object_schema() -> Value {
    json!({"type": "object", "properties": {}})
}

impl TryFrom<OpenAiTool> for ToolSpec {
    type Error = String;

    fn try_from(tool: OpenAiTool) -> Result<Self, String> {
        if tool.kind != "function" {
            return Err(format!(
                "tool `{}` has type `{}`; only `function` tools are supported",
                tool.function.name, tool.kind
            ));
        }
        Ok(Self {
            name: tool.function.name,
            description: tool.function.description,
            parameters: tool.function.parameters,
        })
    }
}

impl From<ToolSpec> for OpenAiTool {
    fn from(spec: ToolSpec) -> Self {
        Self {
            kind: "function".to_owned(),
            function: OpenAiFunction { name: spec.name, description: spec.description, parameters: spec.parameters },
        }
    }
}

/// Whether and which tool the policy must call (OpenAI `tool_choice`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ToolChoice {
    #[default]
    Auto,
    None,
    Required,
    /// Must call this tool.
    Function(String),
}

impl ToolChoice {
    /// The `tool_choice` value of a chat-completions request.
    pub fn to_openai(&self) -> Value {
        match self {
            Self::Auto => json!("auto"),
            Self::None => json!("none"),
            Self::Required => json!("required"),
            Self::Function(name) => json!({"type": "function", "function": {"name": name}}),
        }
    }
}

/// One call to the policy: the conversation so far and the tools on offer.
/// The agent loop lends them (`Cow::Borrowed`): a turn does not copy the
/// conversation, nor the tools' schemas.
#[derive(Debug)]
pub struct PolicyRequest<'a> {
    /// The episode (test set row id); a scripted policy picks its script by it.
    pub episode_id: String,
    /// 0-based index of this policy call within the episode; a scripted
    /// policy answers with that turn of the script.
    pub turn: u32,
    pub messages: Cow<'a, [ChatMessage]>,
    pub tools: Cow<'a, [ToolSpec]>,
    pub tool_choice: ToolChoice,
    /// The last failed attempt while the policy retries this request.
    pub retrying: Retrying,
}

/// The last failed attempt of a request that the policy is still retrying,
/// and whether it waits for its place among the requests at once (the
/// endpoint answered 429): a caller that stops waiting (the plan-step
/// timeout) says why it waited, the policy's server failing or limiting
/// the run, not the model thinking.
#[derive(Debug, Default)]
pub struct Retrying {
    last: std::sync::Mutex<Option<(u32, super::PolicyError)>>,
    queued: std::sync::atomic::AtomicBool,
}

impl Retrying {
    /// Notes that attempt `attempt` failed with `error` and another follows.
    pub fn note(&self, attempt: u32, error: super::PolicyError) {
        *self.last.lock().unwrap_or_else(|p| p.into_inner()) = Some((attempt, error));
    }

    /// The last failed attempt noted: its number and error.
    pub fn last(&self) -> Option<(u32, super::PolicyError)> {
        self.last.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Notes whether the request waits for its place among the requests at
    /// once ([`Throttle::request`](super::throttle::Throttle::request)).
    pub fn set_queued(&self, queued: bool) {
        self.queued.store(queued, std::sync::atomic::Ordering::Release);
    }

    /// The request waits for its place among the requests at once.
    pub fn queued(&self) -> bool {
        self.queued.load(std::sync::atomic::Ordering::Acquire)
    }
}

impl<'a> PolicyRequest<'a> {
    pub fn new(
        episode_id: impl Into<String>,
        turn: u32,
        messages: impl Into<Cow<'a, [ChatMessage]>>,
        tools: impl Into<Cow<'a, [ToolSpec]>>,
    ) -> Self {
        Self {
            episode_id: episode_id.into(),
            turn,
            messages: messages.into(),
            tools: tools.into(),
            tool_choice: ToolChoice::Auto,
            retrying: Retrying::default(),
        }
    }
}

/// One tool call the policy asked for. The name is passed through as the
/// model wrote it: an unknown tool is for the executor to refuse.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: ToolArguments,
}

/// A tool call's arguments: parsed, or the reason they cannot be used.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolArguments {
    /// A JSON object.
    Parsed(Value),
    /// Not JSON, or JSON but not an object: a policy error on this call.
    Invalid(InvalidArguments),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidArguments {
    /// The text the model produced, unchanged.
    pub raw: String,
    /// `invalid_json` or `invalid_arguments`: the trace's `error_type`.
    pub error_type: &'static str,
    pub message: String,
}

impl ToolArguments {
    /// Parses the `arguments` string of an OpenAI tool call. An empty string
    /// means no arguments (`{}`), as several servers send for argument-less tools.
    pub fn parse(raw: &str) -> Self {
        if raw.trim().is_empty() {
            return Self::Parsed(Value::Object(Default::default()));
        }
        match serde_json::from_str::<Value>(raw) {
            Ok(value) => Self::from_value(value, raw.to_owned()),
            Err(e) => Self::Invalid(InvalidArguments {
                raw: raw.to_owned(),
                error_type: "invalid_json",
                message: format!("tool call arguments are not valid JSON: {e}"),
            }),
        }
    }

    /// Arguments that arrived as a JSON value already (some servers send an
    /// object instead of a string); only an object is accepted.
    pub fn from_value(value: Value, raw: String) -> Self {
        if value.is_object() {
            Self::Parsed(value)
        } else {
            Self::Invalid(InvalidArguments {
                raw,
                error_type: "invalid_arguments",
                message: format!("tool call arguments must be a JSON object, got {}", crate::tools::json_type(&value)),
            })
        }
    }

    pub fn as_value(&self) -> Option<&Value> {
        match self {
            Self::Parsed(value) => Some(value),
            Self::Invalid(_) => None,
        }
    }

    pub fn invalid(&self) -> Option<&InvalidArguments> {
        match self {
            Self::Parsed(_) => None,
            Self::Invalid(invalid) => Some(invalid),
        }
    }

    /// The arguments as JSON text: compact JSON when parsed, the raw text otherwise.
    pub fn to_json_text(&self) -> String {
        match self {
            Self::Parsed(value) => value.to_string(),
            Self::Invalid(invalid) => invalid.raw.clone(),
        }
    }
}

/// Why generation stopped (OpenAI `finish_reason`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    Other(String),
}

impl FinishReason {
    pub fn parse(text: &str) -> Self {
        match text {
            "stop" => Self::Stop,
            "length" => Self::Length,
            "tool_calls" | "function_call" => Self::ToolCalls,
            "content_filter" => Self::ContentFilter,
            other => Self::Other(other.to_owned()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            Self::Stop => "stop",
            Self::Length => "length",
            Self::ToolCalls => "tool_calls",
            Self::ContentFilter => "content_filter",
            Self::Other(other) => other,
        }
    }
}

/// One generated token with its logprob and the top-k alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub token: String,
    /// When the server reports token ids.
    pub token_id: Option<i32>,
    pub logprob: f32,
    pub top: Vec<TopLogprob>,
    /// The entropy (nats) of the token's distribution, when a replay carries
    /// what the raw logits gave when the trace was recorded.
    pub entropy: Option<f32>,
    /// KL(p‖q) (nats) against the reference logits, likewise; may be +inf.
    pub kl: Option<f32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TopLogprob {
    pub token: String,
    pub token_id: Option<i32>,
    pub logprob: f32,
}

impl TokenLogprob {
    /// The trace record for the token at `position`; ids the server did not report are -1.
    pub fn to_token_logit(&self, position: u32) -> pb::TokenLogit {
        pb::TokenLogit {
            position,
            token_id: self.token_id.unwrap_or(-1),
            token: self.token.as_str().into(),
            logprob: self.logprob,
            top_ids: self.top.iter().map(|t| t.token_id.unwrap_or(-1)).collect(),
            top_tokens: self.top.iter().map(|t| t.token.as_str().into()).collect(),
            top_logprobs: self.top.iter().map(|t| t.logprob).collect(),
            entropy: self.entropy,
            kl: self.kl,
        }
    }
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Usage {
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
}

/// The policy's answer to one [`PolicyRequest`].
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyResponse {
    /// The model that answered (as the server reports it, else as configured).
    pub model: String,
    pub content: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub finish_reason: Option<FinishReason>,
    /// `None` when the server returned no logprobs for this turn.
    pub logprobs: Option<Vec<TokenLogprob>>,
    /// Full-vocabulary logits sent with the turn; when present the
    /// `token_logit` records are derived from them (`crate::logits`).
    pub raw_logits: Option<RawLogits>,
    pub usage: Option<Usage>,
    /// From the first attempt's start to the answer, retries included.
    pub latency: Duration,
    /// HTTP attempts it took (1 for a scripted policy).
    pub attempts: u32,
    /// Things wrong with the answer that did not stop it being used (a
    /// malformed logprobs block, a tool call without an id); for the trace.
    pub warnings: Vec<String>,
}

impl PolicyResponse {
    /// True for a final answer: no tool calls.
    pub fn is_final(&self) -> bool {
        self.tool_calls.is_empty()
    }

    /// A tool-call turn that came back without logprobs (flagged in the trace,
    /// never silently dropped).
    pub fn logprobs_missing(&self) -> bool {
        !self.tool_calls.is_empty() && self.logprobs.as_ref().is_none_or(Vec::is_empty) && self.raw_logits.is_none()
    }

    /// The tool calls whose arguments cannot be used: policy errors to record.
    pub fn invalid_tool_calls(&self) -> impl Iterator<Item = (&ToolCall, &InvalidArguments)> {
        self.tool_calls.iter().filter_map(|call| call.arguments.invalid().map(|invalid| (call, invalid)))
    }

    /// The `token_logit` records of this turn, positions from 0.
    pub fn token_logits(&self) -> Vec<pb::TokenLogit> {
        self.logprobs
            .iter()
            .flatten()
            .enumerate()
            .map(|(position, token)| token.to_token_logit(u32::try_from(position).unwrap_or(u32::MAX)))
            .collect()
    }

    /// The tool calls in the OpenAI wire shape, arguments as JSON text.
    pub fn tool_calls_json(&self) -> Value {
        Value::Array(
            self.tool_calls
                .iter()
                .map(|call| {
                    json!({
                        "id": call.id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments.to_json_text()},
                    })
                })
                .collect(),
        )
    }

    /// The trace's `policy_turn` record.
    pub fn to_policy_turn(&self) -> pb::PolicyTurn {
        let usage = self.usage.unwrap_or_default();
        pb::PolicyTurn {
            model: self.model.clone(),
            content: self.content.clone().unwrap_or_default(),
            tool_calls_json: if self.tool_calls.is_empty() {
                String::new()
            } else {
                self.tool_calls_json().to_string()
            },
            finish_reason: self.finish_reason.as_ref().map(|r| r.as_str().to_owned()).unwrap_or_default(),
            latency_micros: u64::try_from(self.latency.as_micros()).unwrap_or(u64::MAX),
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            logprobs_missing: self.logprobs_missing(),
        }
    }

    /// The assistant message to append to the history before the tools' answers.
    pub fn to_assistant_message(&self) -> ChatMessage {
        ChatMessage::Assistant {
            content: self.content.clone(),
            tool_calls: self
                .tool_calls
                .iter()
                .map(|call| MessageToolCall {
                    id: call.id.clone(),
                    kind: function_type(),
                    function: FunctionCall { name: call.name.clone(), arguments: call.arguments.to_json_text() },
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_use_the_openai_shape() {
        let messages = vec![
            ChatMessage::system("be brief"),
            ChatMessage::user("where is my order?"),
            ChatMessage::Assistant {
                content: None,
                tool_calls: vec![MessageToolCall {
                    id: "call_1".into(),
                    kind: "function".into(),
                    function: FunctionCall { name: "lookup".into(), arguments: r#"{"id":7}"#.into() },
                }],
            },
            ChatMessage::tool("call_1", r#"{"status":"shipped"}"#),
        ];
        let value = serde_json::to_value(&messages).unwrap();
        assert_eq!(
            value,
            json!([
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "where is my order?"},
                {"role": "assistant", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "lookup", "arguments": "{\"id\":7}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "{\"status\":\"shipped\"}"},
            ])
        );
        let back: Vec<ChatMessage> = serde_json::from_value(value).unwrap();
        assert_eq!(back, messages);
    }

    #[test]
    fn tool_specs_use_the_openai_tools_shape() {
        let spec = ToolSpec::new(
            "lookup",
            "Find an order",
            json!({"type": "object", "properties": {"id": {"type": "integer"}}}),
        );
        let value = serde_json::to_value(&spec).unwrap();
        assert_eq!(value["type"], "function");
        assert_eq!(value["function"]["name"], "lookup");
        assert_eq!(value["function"]["parameters"]["properties"]["id"]["type"], "integer");
        assert_eq!(serde_json::from_value::<ToolSpec>(value).unwrap(), spec);
        let err =
            serde_json::from_value::<ToolSpec>(json!({"type": "retrieval", "function": {"name": "x"}})).unwrap_err();
        assert!(err.to_string().contains("only `function` tools"), "{err}");
    }

    #[test]
    fn arguments_parse_or_explain() {
        assert_eq!(ToolArguments::parse(r#"{"a": 1}"#), ToolArguments::Parsed(json!({"a": 1})));
        assert_eq!(ToolArguments::parse(""), ToolArguments::Parsed(json!({})));
        let invalid = ToolArguments::parse(r#"{"a": 1"#);
        let details = invalid.invalid().unwrap();
        assert_eq!(details.error_type, "invalid_json");
        assert_eq!(details.raw, r#"{"a": 1"#);
        assert_eq!(invalid.to_json_text(), r#"{"a": 1"#);
        let not_object = ToolArguments::parse("[1, 2]");
        assert_eq!(not_object.invalid().unwrap().error_type, "invalid_arguments");
        assert!(not_object.invalid().unwrap().message.contains("an array"));
    }

    fn response(tool_calls: Vec<ToolCall>, logprobs: Option<Vec<TokenLogprob>>) -> PolicyResponse {
        PolicyResponse {
            model: "m".into(),
            content: None,
            tool_calls,
            finish_reason: Some(FinishReason::ToolCalls),
            logprobs,
            raw_logits: None,
            usage: Some(Usage { prompt_tokens: 10, completion_tokens: 3 }),
            latency: Duration::from_millis(12),
            attempts: 1,
            warnings: vec![],
        }
    }

    fn call() -> ToolCall {
        ToolCall { id: "c1".into(), name: "lookup".into(), arguments: ToolArguments::parse(r#"{"id":7}"#) }
    }

    #[test]
    fn policy_turn_flags_tool_turns_without_logprobs() {
        assert!(response(vec![call()], None).to_policy_turn().logprobs_missing);
        assert!(response(vec![call()], Some(vec![])).to_policy_turn().logprobs_missing);
        // A final answer without logprobs is not a tool turn.
        assert!(!response(vec![], None).to_policy_turn().logprobs_missing);
        let token =
            TokenLogprob { token: "x".into(), token_id: None, logprob: -0.5, top: vec![], entropy: None, kl: None };
        let turn = response(vec![call()], Some(vec![token])).to_policy_turn();
        assert!(!turn.logprobs_missing);
        assert_eq!(turn.latency_micros, 12_000);
        assert_eq!(turn.prompt_tokens, 10);
        assert_eq!(turn.finish_reason, "tool_calls");
        let calls: Value = serde_json::from_str(&turn.tool_calls_json).unwrap();
        assert_eq!(calls[0]["function"]["arguments"], r#"{"id":7}"#);
    }

    #[test]
    fn logprobs_become_token_logit_records() {
        let tokens = vec![
            TokenLogprob {
                token: "look".into(),
                token_id: Some(42),
                logprob: -0.1,
                top: vec![
                    TopLogprob { token: "look".into(), token_id: Some(42), logprob: -0.1 },
                    TopLogprob { token: "find".into(), token_id: None, logprob: -2.5 },
                ],
                entropy: None,
                kl: None,
            },
            TokenLogprob { token: "up".into(), token_id: None, logprob: -0.01, top: vec![], entropy: None, kl: None },
        ];
        let records = response(vec![call()], Some(tokens)).token_logits();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].token_id, 42);
        assert_eq!(records[0].top_ids[..], [42, -1]);
        assert_eq!(records[0].top_tokens[..], ["look", "find"]);
        assert_eq!(records[1].position, 1);
        assert_eq!(records[1].token_id, -1);
    }

    #[test]
    fn assistant_message_keeps_invalid_arguments_verbatim() {
        let bad = ToolCall { id: "c2".into(), name: "lookup".into(), arguments: ToolArguments::parse("{oops") };
        let resp = response(vec![call(), bad], None);
        assert_eq!(resp.invalid_tool_calls().count(), 1);
        let ChatMessage::Assistant { tool_calls, .. } = resp.to_assistant_message() else { panic!("assistant") };
        assert_eq!(tool_calls[1].function.arguments, "{oops");
    }
}
