//! The agent's policy: what decides the next tool call or the final answer.
//!
//! The agent loop builds a [`PolicyRequest`] (episode, turn, messages, tool
//! specs), calls [`Policy::respond`], records the answer in the trace
//! ([`PolicyResponse::to_policy_turn`], [`PolicyResponse::token_logits`]),
//! records each [`ToolArguments::Invalid`] call as a policy error, and hands
//! the rest to the executor (which refuses unknown tools).
//!
//! - [`types`]: messages, tool specs, responses and their trace records;
//! - [`openai`]: any OpenAI-compatible chat-completions endpoint;
//! - [`scripted`]: responses from a JSONL file, for tests and replay;
//! - [`raw_logits`]: full-vocabulary logits any of them may send with a turn;
//! - [`throttle`]: fewer requests at once while an endpoint answers 429.

pub mod openai;
pub mod raw_logits;
pub mod scripted;
pub mod throttle;
pub mod types;

pub use openai::{ApiKeySource, OpenAiConfig, OpenAiError, OpenAiPolicy, RetryPolicy};
pub use raw_logits::{RawLogits, RawLogitsSource};
pub use scripted::{ScriptedConfig, ScriptedError, ScriptedPolicy};
pub use types::{
    ChatMessage, FinishReason, InvalidArguments, PolicyRequest, PolicyResponse, TokenLogprob, ToolArguments, ToolCall,
    ToolChoice, ToolSpec, TopLogprob, Usage,
};

/// Which policy to run.
#[derive(Debug, Clone, PartialEq)]
pub enum PolicyConfig {
    /// Boxed: a client's settings are much larger than a script's path.
    OpenAi(Box<OpenAiConfig>),
    Scripted(ScriptedConfig),
}

/// An error of building or asking a policy: the kind's own error.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PolicyError {
    #[error(transparent)]
    OpenAi(#[from] OpenAiError),
    #[error(transparent)]
    Scripted(#[from] ScriptedError),
}

impl PolicyError {
    /// A fixed, bounded name for metrics labels and event reasons.
    pub fn category(&self) -> &'static str {
        match self {
            Self::OpenAi(e) => e.category(),
            Self::Scripted(e) => e.category(),
        }
    }
}

/// A policy of either kind, behind one `respond`.
#[derive(Debug, Clone)]
pub enum Policy {
    /// Boxed: the HTTP client is much larger than a script, and a policy is built once.
    OpenAi(Box<OpenAiPolicy>),
    Scripted(ScriptedPolicy),
}

impl Policy {
    /// Builds the policy: loads the API key or reads and checks the script.
    pub fn from_config(config: &PolicyConfig) -> Result<Self, PolicyError> {
        Ok(match config {
            PolicyConfig::OpenAi(config) => Self::OpenAi(Box::new(OpenAiPolicy::new((**config).clone())?)),
            PolicyConfig::Scripted(config) => Self::Scripted(ScriptedPolicy::load(config)?),
        })
    }

    /// The categories of every error [`Policy::respond`] can return.
    pub fn turn_error_categories(&self) -> &'static [&'static str] {
        match self {
            Self::OpenAi(_) => openai::TURN_ERROR_CATEGORIES,
            Self::Scripted(_) => scripted::TURN_ERROR_CATEGORIES,
        }
    }

    /// The policy's next turn for `request`.
    pub async fn respond(&self, request: &PolicyRequest<'_>) -> Result<PolicyResponse, PolicyError> {
        match self {
            Self::OpenAi(policy) => Ok(policy.respond(request).await?),
            Self::Scripted(policy) => Ok(policy.respond(request).await?),
        }
    }

    /// The throttle that says when an episode of this policy may start:
    /// an endpoint's ([`OpenAiPolicy::throttle`]); a script has none.
    pub fn throttle(&self) -> Option<&std::sync::Arc<throttle::Throttle>> {
        match self {
            Self::OpenAi(policy) => policy.throttle(),
            Self::Scripted(_) => None,
        }
    }

    /// The configured model (for the trace header and summaries).
    pub fn model(&self) -> &str {
        match self {
            Self::OpenAi(policy) => &policy.config().model,
            Self::Scripted(_) => scripted::SCRIPTED_MODEL,
        }
    }

    /// How many alternatives per token the policy asks for (the trace
    /// header's `top_k`); 0 when it asks for no logprobs.
    pub fn top_k(&self) -> u32 {
        match self {
            Self::OpenAi(policy) if policy.config().logprobs => policy.config().top_logprobs,
            Self::OpenAi(_) => 0,
            Self::Scripted(_) => 0,
        }
    }
}
