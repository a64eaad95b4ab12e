//! What each path of the query language means against the proto records:
//! resolution of a path to a section and a field (with its type, checked
//! against the literal it is compared with), and reading that field's
//! values straight from a record's bytes.

use std::borrow::Cow;

use super::QueryError;
use super::parser::{Literal, Op, Segment};
use super::wire::{Malformed, Wire, fields};
use crate::reader::RecordKind;

/// The sections a query can name, and the record each one reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Section {
    PlanExecution,
    MemoryState,
    TokenLogit,
    RewardSignal,
    ErrorContext,
    PolicyTurn,
    Injection,
    EpisodeEnd,
}

pub const SECTIONS: [Section; 8] = [
    Section::PlanExecution,
    Section::MemoryState,
    Section::TokenLogit,
    Section::RewardSignal,
    Section::ErrorContext,
    Section::PolicyTurn,
    Section::Injection,
    Section::EpisodeEnd,
];

impl Section {
    pub fn name(self) -> &'static str {
        match self {
            Section::PlanExecution => "plan_execution",
            Section::MemoryState => "memory_state",
            Section::TokenLogit => "token_logit",
            Section::RewardSignal => "reward_signal",
            Section::ErrorContext => "error_context",
            Section::PolicyTurn => "policy_turn",
            Section::Injection => "injection",
            Section::EpisodeEnd => "episode_end",
        }
    }

    pub fn kind(self) -> RecordKind {
        match self {
            Section::PlanExecution => RecordKind::PlanStep,
            Section::MemoryState => RecordKind::MemoryDelta,
            Section::TokenLogit => RecordKind::TokenLogit,
            Section::RewardSignal => RecordKind::RewardSignal,
            Section::ErrorContext => RecordKind::ErrorContext,
            Section::PolicyTurn => RecordKind::PolicyTurn,
            Section::Injection => RecordKind::Injection,
            Section::EpisodeEnd => RecordKind::EpisodeEnd,
        }
    }

    pub fn of_kind(kind: RecordKind) -> Option<Section> {
        SECTIONS.into_iter().find(|s| s.kind() == kind)
    }

    /// A small bit for fast "does the query read this kind" checks.
    pub fn bit(self) -> u8 {
        1 << (self as u8)
    }

    fn from_name(name: &str) -> Option<Section> {
        SECTIONS.into_iter().find(|s| s.name() == name)
    }

    fn fields(self) -> &'static [FieldDef] {
        match self {
            Section::PlanExecution => PLAN_FIELDS,
            Section::TokenLogit => TOKEN_FIELDS,
            Section::ErrorContext => ERROR_FIELDS,
            Section::PolicyTurn => POLICY_FIELDS,
            Section::Injection => INJECTION_FIELDS,
            Section::EpisodeEnd => EPISODE_END_FIELDS,
            Section::MemoryState | Section::RewardSignal => &[],
        }
    }
}

/// A proto enum's values by number: their short lower-case names, and the
/// prefix that makes them proto names (`step_status_` + `timeout`).
#[derive(Debug, PartialEq)]
pub struct EnumNames {
    prefix: &'static str,
    names: &'static [&'static str],
}

impl EnumNames {
    /// The short name `literal` stands for: itself or its proto name, in any case.
    fn short_name(&self, literal: &str) -> Option<&'static str> {
        let lower = literal.to_ascii_lowercase();
        let short = lower.strip_prefix(self.prefix).unwrap_or(&lower);
        self.names.iter().copied().find(|n| *n == short)
    }
}

const STEP_STATUS: &EnumNames = &EnumNames {
    prefix: "step_status_",
    names: &["unspecified", "ok", "error", "timeout", "fallback", "rolled_back", "refused"],
};
const STEP_KIND: &EnumNames =
    &EnumNames { prefix: "step_kind_", names: &["unspecified", "tool_call", "final_answer", "policy_error"] };
const INJECTION_TRIGGER: &EnumNames = &EnumNames {
    prefix: "injection_trigger_",
    names: &["unspecified", "at_step", "after_tool", "memory_match", "live"],
};
const OUTCOME: &EnumNames =
    &EnumNames { prefix: "outcome_", names: &["unspecified", "completed", "max_steps", "error", "cancelled"] };

/// How a scalar field is stored and shown to the query.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Scalar {
    Str,
    /// `uint32` / `uint64` varint.
    Unsigned,
    /// `int64` varint.
    Signed,
    /// `sint32` (zigzag) varint.
    ZigZag,
    Bool,
    F32,
    /// A proto3 `optional float`: absent is no value, not 0.
    OptionalF32,
    F64,
    /// `bytes` shown as lower-case hex.
    Hex,
    /// A varint enum shown by its lower-case short name.
    Enum(&'static EnumNames),
    /// A `uint64` of microseconds shown as (fractional) milliseconds.
    MicrosAsMillis,
}

struct FieldDef {
    name: &'static str,
    number: u32,
    kind: FieldKind,
}

#[derive(Clone, Copy)]
enum FieldKind {
    Scalar(Scalar),
    /// A string holding JSON; later path segments navigate into it.
    Json,
    /// `repeated string`: a comparison holds when any element satisfies it.
    RepeatedStr,
    /// A string field of a repeated message (`error_context.tool`).
    SubStr(u32),
    /// A `map<string, string>` of JSON values, keyed by the next segment.
    JsonMap,
}

const fn scalar(name: &'static str, number: u32, s: Scalar) -> FieldDef {
    FieldDef { name, number, kind: FieldKind::Scalar(s) }
}

const PLAN_FIELDS: &[FieldDef] = &[
    scalar("index", 1, Scalar::Unsigned),
    scalar("kind", 2, Scalar::Enum(STEP_KIND)),
    scalar("plan_label", 3, Scalar::Str),
    scalar("tool", 4, Scalar::Str),
    scalar("call_id", 5, Scalar::Str),
    FieldDef { name: "arguments", number: 6, kind: FieldKind::Json },
    scalar("input_hash", 7, Scalar::Hex),
    FieldDef { name: "observation", number: 8, kind: FieldKind::Json },
    scalar("result_hash", 9, Scalar::Hex),
    scalar("response_bytes", 10, Scalar::Unsigned),
    scalar("status", 11, Scalar::Enum(STEP_STATUS)),
    scalar("error_type", 12, Scalar::Str),
    scalar("error_message", 13, Scalar::Str),
    scalar("fallback_used", 14, Scalar::Bool),
    scalar("memory_hash_before", 15, Scalar::Hex),
    scalar("memory_hash_after", 16, Scalar::Hex),
    scalar("start_unix_nanos", 17, Scalar::Signed),
    scalar("latency_ms", 18, Scalar::MicrosAsMillis),
    scalar("latency_us", 18, Scalar::Unsigned),
    scalar("timeout_ms", 19, Scalar::Unsigned),
];

const TOKEN_FIELDS: &[FieldDef] = &[
    scalar("position", 1, Scalar::Unsigned),
    scalar("token_id", 2, Scalar::ZigZag),
    scalar("token", 3, Scalar::Str),
    scalar("logprob", 4, Scalar::F32),
    scalar("entropy", 8, Scalar::OptionalF32),
    scalar("kl", 9, Scalar::OptionalF32),
];

const ERROR_FIELDS: &[FieldDef] = &[
    scalar("error_type", 1, Scalar::Str),
    scalar("message", 2, Scalar::Str),
    FieldDef { name: "cause", number: 3, kind: FieldKind::RepeatedStr },
    scalar("stack", 4, Scalar::Str),
    FieldDef { name: "memory", number: 5, kind: FieldKind::JsonMap },
    FieldDef { name: "tool", number: 6, kind: FieldKind::SubStr(1) },
];

const POLICY_FIELDS: &[FieldDef] = &[
    scalar("model", 1, Scalar::Str),
    scalar("content", 2, Scalar::Str),
    FieldDef { name: "tool_calls", number: 3, kind: FieldKind::Json },
    scalar("finish_reason", 4, Scalar::Str),
    scalar("latency_ms", 5, Scalar::MicrosAsMillis),
    scalar("prompt_tokens", 6, Scalar::Unsigned),
    scalar("completion_tokens", 7, Scalar::Unsigned),
    scalar("logprobs_missing", 8, Scalar::Bool),
];

const INJECTION_FIELDS: &[FieldDef] = &[
    scalar("id", 1, Scalar::Str),
    scalar("trigger", 2, Scalar::Enum(INJECTION_TRIGGER)),
    FieldDef { name: "observation", number: 3, kind: FieldKind::Json },
    scalar("description", 4, Scalar::Str),
];

const EPISODE_END_FIELDS: &[FieldDef] = &[
    scalar("outcome", 1, Scalar::Enum(OUTCOME)),
    scalar("end_time_unix_nanos", 2, Scalar::Signed),
    scalar("steps", 3, Scalar::Unsigned),
    scalar("final_memory_hash", 4, Scalar::Hex),
    scalar("final_answer", 5, Scalar::Str),
    scalar("failure_class", 6, Scalar::Str),
];

/// Header fields usable as `episode.NAME`.
const EPISODE_FIELDS: &[&str] =
    &["id", "task", "variant", "namespace", "shard", "shard_count", "training_step", "config_hash"];

/// The fewest hex digits a hash prefix may have: 8 digits tell apart the
/// hashes of millions of steps, and fewer would match steps by chance.
pub const MIN_HASH_PREFIX: usize = 8;

/// How to read values of a path from one record of its section.
#[derive(Debug, Clone, PartialEq)]
pub enum Getter {
    /// The record itself (`exists(section)`).
    Whole,
    Scalar {
        field: u32,
        scalar: Scalar,
    },
    Json {
        field: u32,
        path: Vec<String>,
    },
    RepeatedStr {
        field: u32,
    },
    SubStr {
        field: u32,
        sub: u32,
    },
    JsonMap {
        field: u32,
        key: String,
        path: Vec<String>,
    },
    /// `memory_state.KEY...`: the delta's `after_json` (the group checks the key).
    MemoryAfter {
        path: Vec<String>,
    },
    /// A reward component's `score` (2) or `weight` (3).
    Reward {
        name: String,
        sub: u32,
    },
    RewardSum,
}

/// A path resolved: either a fact of the whole step, or a field of one section's records.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    Step,
    Episode(&'static str),
    Record {
        section: Section,
        /// For `memory_state.KEY`: only deltas of this key are considered.
        memory_key: Option<String>,
        getter: Getter,
    },
}

/// The value type a target holds, for checking literals before any trace is read.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Ty {
    Str,
    Num,
    Bool,
    Enum(&'static EnumNames),
    /// JSON: any literal, null included.
    Any,
    /// `exists(section)` only.
    Nothing,
}

fn section_list() -> String {
    let mut names: Vec<&str> = SECTIONS.iter().map(|s| s.name()).collect();
    names.insert(0, "episode");
    names.join(", ")
}

fn field_list(section: Section) -> String {
    section.fields().iter().map(|f| f.name).collect::<Vec<_>>().join(", ")
}

/// Resolves a path; `for_exists` allows a bare section name.
pub fn resolve(query: &str, path: &[Segment], for_exists: bool) -> Result<Target, QueryError> {
    let err = |seg: &Segment, msg: String| QueryError::new(query, seg.at, msg);
    let first = &path[0];
    let no_more = |target: Target, used: usize| -> Result<Target, QueryError> {
        match path.get(used) {
            Some(seg) => Err(err(seg, format!("'{}' has no fields; remove '.{}'", path[used - 1].name, seg.name))),
            None => Ok(target),
        }
    };
    if first.name == "step" {
        return no_more(Target::Step, 1);
    }
    if first.name == "episode" {
        let Some(field) = path.get(1) else {
            return Err(err(first, format!("name a header field: episode.NAME ({})", EPISODE_FIELDS.join(", "))));
        };
        let Some(&name) =
            EPISODE_FIELDS.iter().find(|&&f| f == field.name || (f == "id" && field.name == "episode_id"))
        else {
            return Err(err(
                field,
                format!("unknown episode field '{}'; episode fields are {}", field.name, EPISODE_FIELDS.join(", ")),
            ));
        };
        return no_more(Target::Episode(name), 2);
    }
    let (section, rest) = match Section::from_name(&first.name) {
        Some(section) => (section, &path[1..]),
        None => {
            if PLAN_FIELDS.iter().any(|f| f.name == first.name) {
                (Section::PlanExecution, path)
            } else {
                return Err(err(
                    first,
                    format!(
                        "unknown section or field '{}'; sections are {}; a bare name is a plan_execution field ({})",
                        first.name,
                        section_list(),
                        field_list(Section::PlanExecution)
                    ),
                ));
            }
        }
    };
    let record = |getter| Target::Record { section, memory_key: None, getter };
    let Some(field_seg) = rest.first() else {
        if for_exists {
            return Ok(record(Getter::Whole));
        }
        let hint = match section {
            Section::MemoryState => "memory_state.KEY (the value a delta wrote to KEY)".to_string(),
            Section::RewardSignal => {
                "reward_signal.NAME (a component's raw score) or reward_signal.weighted_sum".into()
            }
            s => format!("{}.FIELD ({})", s.name(), field_list(s)),
        };
        return Err(err(
            first,
            format!("compare a field, not the whole section: {hint}; or use exists({})", first.name),
        ));
    };
    let tail = |from: usize| rest[from..].iter().map(|s| s.name.clone()).collect::<Vec<_>>();
    match section {
        Section::MemoryState => Ok(Target::Record {
            section,
            memory_key: Some(field_seg.name.clone()),
            getter: if rest.len() == 1 && for_exists { Getter::Whole } else { Getter::MemoryAfter { path: tail(1) } },
        }),
        Section::RewardSignal => {
            if field_seg.name == "weighted_sum" {
                return no_more(record(Getter::RewardSum), path.len() - rest.len() + 1);
            }
            let sub = match rest.get(1).map(|s| s.name.as_str()) {
                None | Some("score") => 2,
                Some("weight") => 3,
                Some(other) => {
                    return Err(err(&rest[1], format!("a reward component has 'score' and 'weight', not '{other}'")));
                }
            };
            no_more(
                record(Getter::Reward { name: field_seg.name.clone(), sub }),
                path.len() - rest.len() + rest.len().min(2),
            )
        }
        _ => {
            let Some(def) = section.fields().iter().find(|f| f.name == field_seg.name) else {
                return Err(err(
                    field_seg,
                    format!(
                        "unknown {} field '{}'; fields are {}",
                        section.name(),
                        field_seg.name,
                        field_list(section)
                    ),
                ));
            };
            let used = path.len() - rest.len() + 1;
            match def.kind {
                FieldKind::Scalar(scalar) => no_more(record(Getter::Scalar { field: def.number, scalar }), used),
                FieldKind::RepeatedStr => no_more(record(Getter::RepeatedStr { field: def.number }), used),
                FieldKind::SubStr(sub) => no_more(record(Getter::SubStr { field: def.number, sub }), used),
                FieldKind::Json => Ok(record(Getter::Json { field: def.number, path: tail(1) })),
                FieldKind::JsonMap => {
                    let Some(key) = rest.get(1) else {
                        return Err(err(field_seg, format!("name a key: {}.{}.KEY", section.name(), def.name)));
                    };
                    Ok(record(Getter::JsonMap { field: def.number, key: key.name.clone(), path: tail(2) }))
                }
            }
        }
    }
}

fn target_type(target: &Target) -> Ty {
    match target {
        Target::Step => Ty::Num,
        Target::Episode(name) => match *name {
            "shard" | "shard_count" | "training_step" => Ty::Num,
            _ => Ty::Str,
        },
        Target::Record { getter, .. } => match getter {
            Getter::Whole => Ty::Nothing,
            Getter::Scalar { scalar, .. } => match scalar {
                Scalar::Str | Scalar::Hex => Ty::Str,
                Scalar::Bool => Ty::Bool,
                Scalar::Enum(names) => Ty::Enum(names),
                _ => Ty::Num,
            },
            Getter::Json { .. } | Getter::JsonMap { .. } | Getter::MemoryAfter { .. } => Ty::Any,
            Getter::RepeatedStr { .. } | Getter::SubStr { .. } => Ty::Str,
            Getter::Reward { .. } | Getter::RewardSum => Ty::Num,
        },
    }
}

/// Checks that `literal` can be compared with `target` using `op`, and
/// normalises enum names (`"TIMEOUT"`, `"STEP_STATUS_TIMEOUT"` -> `"timeout"`).
pub fn check_literal(
    query: &str,
    target: &Target,
    path_at: usize,
    op: Op,
    op_at: usize,
    literal: Literal,
    literal_at: usize,
) -> Result<Literal, QueryError> {
    let ty = target_type(target);
    let mismatch = |what: &str| {
        QueryError::new(
            query,
            literal_at,
            format!("this path holds {what}; it cannot be compared with {}", literal.type_name()),
        )
    };
    if op.is_ordering() && matches!(literal, Literal::Bool(_) | Literal::Null) {
        return Err(QueryError::new(
            query,
            op_at,
            format!("'{}' orders numbers and strings, not {}", op.symbol(), literal.type_name()),
        ));
    }
    let is_hash = matches!(
        target,
        Target::Record { getter: Getter::Scalar { scalar: Scalar::Hex, .. }, .. } | Target::Episode("config_hash")
    );
    if let (true, Literal::Str(text)) = (is_hash, &literal) {
        let hash = hash_literal(text).ok_or_else(|| {
            QueryError::new(
                query,
                literal_at,
                format!(
                    "a hash is a sha256, 32 bytes written in hex (64 digits, or its first {MIN_HASH_PREFIX} or more \
                     as `trace validate` and the reports print them) or in base64 (as `trace parse` prints it); \
                     {text:?} is none of these"
                ),
            )
        })?;
        if matches!(hash, Literal::HashPrefix(_)) && op.is_ordering() {
            return Err(QueryError::new(
                query,
                op_at,
                format!(
                    "a hash prefix can only be compared with == and != (it matches the hashes starting with it), not '{}'",
                    op.symbol()
                ),
            ));
        }
        return Ok(hash);
    }
    match (ty, &literal) {
        (Ty::Nothing, _) => {
            Err(QueryError::new(query, path_at, "a whole section cannot be compared; use exists(...)".into()))
        }
        (Ty::Any, _) | (Ty::Str, Literal::Str(_)) | (Ty::Num, Literal::Num(_)) | (Ty::Bool, Literal::Bool(_)) => {
            Ok(literal)
        }
        (Ty::Enum(e), Literal::Str(s)) => match e.short_name(s) {
            Some(n) if !op.is_ordering() => Ok(Literal::Str(n.to_string())),
            Some(_) => Err(QueryError::new(query, op_at, "enum values can only be compared with == and !=".into())),
            None => {
                Err(QueryError::new(query, literal_at, format!("unknown value {s:?}; one of {}", e.names.join(", "))))
            }
        },
        (Ty::Str | Ty::Enum(_), _) => Err(mismatch("a string")),
        (Ty::Num, _) => Err(mismatch("a number")),
        (Ty::Bool, _) => Err(mismatch("a boolean")),
    }
}

/// A hash literal as the lower-case hex a hash field is compared as: 32
/// bytes (a sha256) in hex of any case, or in the base64 of proto3 JSON
/// (`trace parse`: standard alphabet, padded) or its URL-safe and unpadded
/// forms; or "" (no hash). Or the first [`MIN_HASH_PREFIX`] to 63 hex
/// digits of one ([`Literal::HashPrefix`]): `trace validate` and the
/// reports print the first 12.
fn hash_literal(text: &str) -> Option<Literal> {
    use base64::Engine as _;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD};
    let hex_digits = text.bytes().all(|b| b.is_ascii_hexdigit());
    if text.is_empty() || (text.len() == 64 && hex_digits) {
        return Some(Literal::Str(text.to_ascii_lowercase()));
    }
    // Hex digits only are a prefix, 43 of them too: a sha256's base64 (43
    // characters unpadded) is all hex digits about once in 10^20.
    if hex_digits && (MIN_HASH_PREFIX..64).contains(&text.len()) {
        return Some(Literal::HashPrefix(text.to_ascii_lowercase()));
    }
    [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
        .iter()
        .find_map(|engine| engine.decode(text).ok())
        .filter(|bytes| bytes.len() == 32)
        .map(|bytes| Literal::Str(hex::encode(bytes)))
}

/// A value read from a record.
#[derive(Debug, Clone, PartialEq)]
pub enum Val<'a> {
    Null,
    Bool(bool),
    Num(f64),
    Str(Cow<'a, str>),
    /// A JSON array or object: equal to no literal.
    Composite,
}

impl Val<'_> {
    fn from_json(v: &serde_json::Value) -> Val<'_> {
        match v {
            serde_json::Value::Null => Val::Null,
            serde_json::Value::Bool(b) => Val::Bool(*b),
            serde_json::Value::Number(n) => n.as_f64().map_or(Val::Composite, Val::Num),
            serde_json::Value::String(s) => Val::Str(Cow::Borrowed(s)),
            _ => Val::Composite,
        }
    }

    /// True when the value is not its type's default (for `exists`).
    pub fn is_set(&self) -> bool {
        match self {
            Val::Bool(b) => *b,
            Val::Num(n) => *n != 0.0,
            Val::Str(s) => !s.is_empty(),
            Val::Null | Val::Composite => true,
        }
    }
}

/// `value OP literal`. Equality across types is false (so `!=` is true);
/// ordering holds only between two numbers or two strings.
pub fn compare(value: &Val<'_>, op: Op, literal: &Literal) -> bool {
    use std::cmp::Ordering;
    if let Literal::HashPrefix(prefix) = literal {
        let starts = matches!(value, Val::Str(hash) if hash.starts_with(prefix.as_str()));
        return match op {
            Op::Eq => starts,
            Op::Ne => !starts,
            // Refused when the query is compiled.
            _ => false,
        };
    }
    let ordering: Option<Ordering> = match (value, literal) {
        (Val::Num(a), Literal::Num(b)) => a.partial_cmp(b),
        (Val::Str(a), Literal::Str(b)) => Some(a.as_ref().cmp(b.as_str())),
        (Val::Bool(a), Literal::Bool(b)) => (a == b).then_some(Ordering::Equal).or(Some(Ordering::Less)),
        (Val::Null, Literal::Null) => Some(Ordering::Equal),
        _ => None,
    };
    let comparable_order = matches!((value, literal), (Val::Num(_), Literal::Num(_)) | (Val::Str(_), Literal::Str(_)));
    match op {
        Op::Eq => ordering == Some(Ordering::Equal),
        Op::Ne => ordering != Some(Ordering::Equal),
        _ if !comparable_order => false,
        Op::Lt => ordering == Some(Ordering::Less),
        Op::Le => matches!(ordering, Some(Ordering::Less | Ordering::Equal)),
        Op::Gt => ordering == Some(Ordering::Greater),
        Op::Ge => matches!(ordering, Some(Ordering::Greater | Ordering::Equal)),
    }
}

fn str_of(bytes: &[u8]) -> Cow<'_, str> {
    String::from_utf8_lossy(bytes)
}

fn scalar_value(wire: Option<Wire<'_>>, scalar: Scalar) -> Val<'_> {
    let varint = |w: Option<Wire<'_>>| match w {
        Some(Wire::Varint(v)) => v,
        _ => 0,
    };
    match scalar {
        Scalar::Str => Val::Str(match wire {
            Some(Wire::Len(b)) => str_of(b),
            _ => Cow::Borrowed(""),
        }),
        Scalar::Hex => Val::Str(match wire {
            Some(Wire::Len(b)) => Cow::Owned(hex::encode(b)),
            _ => Cow::Borrowed(""),
        }),
        Scalar::Unsigned => Val::Num(varint(wire) as f64),
        Scalar::Signed => Val::Num(varint(wire) as i64 as f64),
        Scalar::ZigZag => {
            let v = varint(wire) as u32;
            Val::Num(((v >> 1) as i32 ^ -((v & 1) as i32)) as f64)
        }
        Scalar::Bool => Val::Bool(varint(wire) != 0),
        Scalar::MicrosAsMillis => Val::Num(varint(wire) as f64 / 1000.0),
        Scalar::F32 | Scalar::OptionalF32 => Val::Num(match wire {
            Some(Wire::I32(bits)) => f32::from_bits(bits) as f64,
            _ => 0.0,
        }),
        Scalar::F64 => Val::Num(match wire {
            Some(Wire::I64(bits)) => f64::from_bits(bits),
            _ => 0.0,
        }),
        Scalar::Enum(e) => {
            let v = varint(wire);
            match e.names.get(v as usize) {
                Some(name) => Val::Str(Cow::Borrowed(name)),
                None => Val::Str(Cow::Owned(format!("unknown_{v}"))),
            }
        }
    }
}

/// Parses JSON text and walks `path` (object keys, or array indices given
/// as integers); calls `f` with the value found. Empty or invalid JSON and
/// missing keys yield nothing.
fn json_at(text: &[u8], path: &[String], f: &mut dyn FnMut(&Val<'_>) -> bool) -> bool {
    if text.is_empty() {
        return false;
    }
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(text) else {
        return false;
    };
    let mut at = &value;
    for seg in path {
        let next = match at {
            serde_json::Value::Object(map) => map.get(seg),
            serde_json::Value::Array(items) => seg.parse::<usize>().ok().and_then(|i| items.get(i)),
            _ => None,
        };
        match next {
            Some(v) => at = v,
            None => return false,
        }
    }
    f(&Val::from_json(at))
}

/// Calls `f` with each value of `getter` in `body` (the section message);
/// returns true as soon as `f` does.
pub fn any_value(getter: &Getter, body: &[u8], f: &mut dyn FnMut(&Val<'_>) -> bool) -> Result<bool, Malformed> {
    match getter {
        Getter::Whole => Ok(f(&Val::Bool(true))),
        Getter::Scalar { field, scalar } => {
            let wire = super::wire::last_field(body, *field)?;
            if wire.is_none() && *scalar == Scalar::OptionalF32 {
                return Ok(false);
            }
            Ok(f(&scalar_value(wire, *scalar)))
        }
        Getter::Json { field, path } => match super::wire::last_field(body, *field)? {
            Some(Wire::Len(text)) => Ok(json_at(text, path, f)),
            _ => Ok(false),
        },
        Getter::MemoryAfter { path } => match super::wire::last_field(body, 3)? {
            Some(Wire::Len(text)) => Ok(json_at(text, path, f)),
            _ => Ok(false),
        },
        Getter::RepeatedStr { field } => {
            for item in fields(body) {
                if let (n, Wire::Len(b)) = item?
                    && n == *field
                    && f(&Val::Str(str_of(b)))
                {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Getter::SubStr { field, sub } => {
            for item in fields(body) {
                if let (n, Wire::Len(msg)) = item?
                    && n == *field
                    && f(&scalar_value(super::wire::last_field(msg, *sub)?, Scalar::Str))
                {
                    return Ok(true);
                }
            }
            Ok(false)
        }
        Getter::JsonMap { field, key, path } => {
            for item in fields(body) {
                if let (n, Wire::Len(entry)) = item?
                    && n == *field
                    && matches!(super::wire::last_field(entry, 1)?, Some(Wire::Len(k)) if k == key.as_bytes())
                {
                    if let Some(Wire::Len(text)) = super::wire::last_field(entry, 2)? {
                        return Ok(json_at(text, path, f));
                    }
                    return Ok(false);
                }
            }
            Ok(false)
        }
        Getter::Reward { name, sub } => {
            for item in fields(body) {
                if let (1, Wire::Len(component)) = item?
                    && matches!(super::wire::last_field(component, 1)?, Some(Wire::Len(n)) if n == name.as_bytes())
                {
                    let wire = super::wire::last_field(component, *sub)?;
                    return Ok(f(&scalar_value(wire, Scalar::F64)));
                }
            }
            Ok(false)
        }
        Getter::RewardSum => Ok(f(&scalar_value(super::wire::last_field(body, 2)?, Scalar::F64))),
    }
}

/// Whether `getter` has a value in `body`, for `exists`: a proto3
/// `optional` field whenever it was recorded (0 is a value there: the KL of
/// two identical runs), a JSON path whenever the JSON has it (0, "", false
/// and null included), any other scalar when it is not its default.
pub fn has_value(getter: &Getter, body: &[u8]) -> Result<bool, Malformed> {
    let present_is_set = matches!(
        getter,
        Getter::Scalar { scalar: Scalar::OptionalF32, .. }
            | Getter::Json { .. }
            | Getter::JsonMap { .. }
            | Getter::MemoryAfter { .. }
    );
    any_value(getter, body, &mut |v| present_is_set || v.is_set())
}

/// The key of a memory delta (field 1), for the memory_state group filter.
pub fn memory_key(body: &[u8]) -> Result<&[u8], Malformed> {
    Ok(match super::wire::last_field(body, 1)? {
        Some(Wire::Len(k)) => k,
        _ => b"",
    })
}

/// The names of a reward signal's components (field 1, each a message whose
/// field 1 is the name).
pub fn reward_component_names(body: &[u8]) -> impl Iterator<Item = Result<&[u8], Malformed>> {
    fields(body).filter_map(|item| match item {
        Ok((1, Wire::Len(component))) => match super::wire::last_field(component, 1) {
            Ok(Some(Wire::Len(name))) => Some(Ok(name)),
            Ok(_) => Some(Ok(&b""[..])),
            Err(e) => Some(Err(e)),
        },
        Ok(_) => None,
        Err(e) => Some(Err(e)),
    })
}
