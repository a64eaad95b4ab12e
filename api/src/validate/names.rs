//! Name rules: Kubernetes names and the tool names OpenAI-compatible APIs
//! accept.

/// An RFC 1123 label: 1-63 lowercase letters, digits and '-', starting and
/// ending with a letter or digit (variant names, profile names).
pub fn is_dns_label(name: &str) -> bool {
    let bytes = name.as_bytes();
    (1..=63).contains(&bytes.len())
        && bytes.iter().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// An RFC 1123 subdomain: dot-separated labels, at most 253 characters
/// (object names, RuntimeClass names, queue names).
pub fn is_dns_subdomain(name: &str) -> bool {
    name.len() <= 253 && name.split('.').all(is_dns_label)
}

/// A label or annotation key: an optional prefix (a DNS subdomain) and
/// '/', then a name of 1-63 letters, digits, '-', '_' and '.', starting
/// and ending with a letter or digit (`app.kubernetes.io/name`, `team`).
pub fn is_qualified_name(key: &str) -> bool {
    let (prefix, name) = match key.split_once('/') {
        Some((prefix, name)) => (Some(prefix), name),
        None => (None, key),
    };
    prefix.is_none_or(|p| !p.is_empty() && is_dns_subdomain(p)) && (1..=63).contains(&name.len()) && is_label_text(name)
}

/// A label value: empty, or at most 63 letters, digits, '-', '_' and '.',
/// starting and ending with a letter or digit.
pub fn is_label_value(value: &str) -> bool {
    value.is_empty() || (value.len() <= 63 && is_label_text(value))
}

fn is_label_text(text: &str) -> bool {
    let bytes = text.as_bytes();
    bytes.iter().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// A function name the chat-completions API accepts: 1-64 of letters,
/// digits, '_' and '-'.
pub fn is_tool_name(name: &str) -> bool {
    (1..=64).contains(&name.len()) && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert!(is_dns_label("variant-a"));
        assert!(!is_dns_label("Variant"));
        assert!(!is_dns_label("-a"));
        assert!(!is_dns_label(""));
        assert!(is_dns_subdomain("gvisor.runsc"));
        assert!(is_tool_name("track_order-v2"));
        assert!(!is_tool_name("track order"));
        assert!(!is_tool_name(&"x".repeat(65)));
        assert!(is_qualified_name("app.kubernetes.io/name") && is_qualified_name("Team_A.x"));
        for bad in ["", "a b", "/x", "Example.com/x", "a/b/c", "x-", &"x".repeat(64)] {
            assert!(!is_qualified_name(bad), "{bad:?}");
        }
        assert!(is_label_value("") && is_label_value("v1.2_A") && is_label_value(&"v".repeat(63)));
        for bad in ["-x", "x.", "a b", "ü", &"v".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
    }
}
