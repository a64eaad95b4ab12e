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
    }
}
