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

/// An RFC 1123 subdomain, as Kubernetes checks object names
/// (`IsDNS1123Subdomain`): at most 253 characters of dot-separated parts,
/// each of lowercase letters, digits and '-', starting and ending with a
/// letter or digit. A part may be longer than 63 characters: that limit is
/// a label's, not a name's (object names, RuntimeClass and Secret names,
/// label key prefixes).
pub fn is_dns_subdomain(name: &str) -> bool {
    dns_subdomain_violation(name).is_none()
}

/// Which rule of [`is_dns_subdomain`] `name` breaks, said for a message
/// ("it is 300 characters; ..."), or `None` when it breaks none.
pub fn dns_subdomain_violation(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("it is empty".into());
    }
    if name.len() > 253 {
        return Some(format!("it is {} characters; Kubernetes names are at most 253", name.chars().count()));
    }
    let allowed = |c: &char| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '-' | '.');
    if let Some(other) = name.chars().find(|c| !allowed(c)) {
        return Some(format!("it has {other:?}; names have only lowercase letters, digits, '-' and '.'"));
    }
    let parts = name.split('.');
    if parts.clone().any(str::is_empty) {
        return Some("it has an empty part between dots ('.' at an end, or two together)".into());
    }
    if parts.clone().any(|part| part.starts_with('-') || part.ends_with('-')) {
        return Some("each part between dots must start and end with a letter or digit, not '-'".into());
    }
    None
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
        // No 63-character limit on a part (before: refused as a label would be).
        assert!(is_dns_subdomain(&"a".repeat(253)) && is_dns_subdomain(&format!("{}.b", "a".repeat(100))));
        assert!(!is_dns_label(&"a".repeat(64)));
        assert!(is_tool_name("track_order-v2"));
        assert!(!is_tool_name("track order"));
        assert!(!is_tool_name(&"x".repeat(65)));
        assert!(is_qualified_name("app.kubernetes.io/name") && is_qualified_name("Team_A.x"));
        assert!(is_qualified_name(&format!("{}.io/x", "p".repeat(70))), "a prefix is a subdomain");
        for bad in ["", "a b", "/x", "Example.com/x", "a/b/c", "x-", &"x".repeat(64)] {
            assert!(!is_qualified_name(bad), "{bad:?}");
        }
        assert!(is_label_value("") && is_label_value("v1.2_A") && is_label_value(&"v".repeat(63)));
        for bad in ["-x", "x.", "a b", "ü", &"v".repeat(64)] {
            assert!(!is_label_value(bad), "{bad:?}");
        }
    }

    #[test]
    fn a_name_that_is_not_a_subdomain_is_told_which_rule_it_breaks() {
        let said = |name: &str| dns_subdomain_violation(name).unwrap_or_default();
        assert_eq!(said(&"a".repeat(254)), "it is 254 characters; Kubernetes names are at most 253");
        assert_eq!(said("Shop"), "it has 'S'; names have only lowercase letters, digits, '-' and '.'");
        assert_eq!(said("shop_a"), "it has '_'; names have only lowercase letters, digits, '-' and '.'");
        assert_eq!(said("a..b"), "it has an empty part between dots ('.' at an end, or two together)");
        assert_eq!(said("a.-b"), "each part between dots must start and end with a letter or digit, not '-'");
        assert_eq!(said(""), "it is empty");
        assert_eq!(dns_subdomain_violation("a-b.c1"), None);
    }
}
