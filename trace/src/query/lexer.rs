//! Tokens of the query language, each with the byte range it came from so
//! that every error can put a caret under the offending text.

use super::QueryError;

#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    Ident(String),
    Str(String),
    Num(f64),
    Dot,
    LParen,
    RParen,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    And,
    Or,
    Not,
    True,
    False,
    Null,
    Exists,
    End,
}

impl Tok {
    /// How the token is named in "expected ..., found ..." messages.
    pub fn describe(&self) -> String {
        match self {
            Tok::Ident(s) => format!("'{s}'"),
            Tok::Str(s) => format!("the string {s:?}"),
            Tok::Num(n) => format!("the number {n}"),
            Tok::Dot => "'.'".into(),
            Tok::LParen => "'('".into(),
            Tok::RParen => "')'".into(),
            Tok::Eq => "'=='".into(),
            Tok::Ne => "'!='".into(),
            Tok::Lt => "'<'".into(),
            Tok::Le => "'<='".into(),
            Tok::Gt => "'>'".into(),
            Tok::Ge => "'>='".into(),
            Tok::And => "'and'".into(),
            Tok::Or => "'or'".into(),
            Tok::Not => "'not'".into(),
            Tok::True => "'true'".into(),
            Tok::False => "'false'".into(),
            Tok::Null => "'null'".into(),
            Tok::Exists => "'exists'".into(),
            Tok::End => "the end of the query".into(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct Token {
    pub tok: Tok,
    /// Byte offset of the token's first character in the query.
    pub at: usize,
}

pub fn lex(query: &str) -> Result<Vec<Token>, QueryError> {
    let bytes = query.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let err = |at: usize, msg: String| QueryError::new(query, at, msg);
    while i < bytes.len() {
        let c = bytes[i];
        let at = i;
        let two = |s: &[u8]| bytes[i..].starts_with(s);
        // A path segment after '.' is a name whatever it starts with: `grid.1.0`
        // is three names (not `grid` and the number 1.0), `codes.1e3` the key
        // "1e3", `memory_state.2fa` the key "2fa", `x.null` the key "null".
        let after_dot =
            matches!(out.as_slice(), [.., Token { tok: Tok::Ident(_) | Tok::Str(_), .. }, Token { tok: Tok::Dot, .. }]);
        if after_dot && is_name_byte(c) {
            let len = bytes[i..].iter().take_while(|&&b| is_name_byte(b)).count();
            out.push(Token { tok: Tok::Ident(query[i..i + len].to_string()), at });
            i += len;
            continue;
        }
        let (tok, len) = match c {
            b' ' | b'\t' | b'\n' | b'\r' => {
                i += 1;
                continue;
            }
            // `.5` where a value may stand (after an operator, a parenthesis,
            // or at the start): a number, as `-.5` and `0.5` are.
            b'.' if bytes.get(i + 1).is_some_and(u8::is_ascii_digit)
                && !matches!(out.last(), Some(Token { tok: Tok::Ident(_) | Tok::Str(_) | Tok::RParen, .. })) =>
            {
                lex_number(query, at)?
            }
            b'.' => (Tok::Dot, 1),
            b'(' => (Tok::LParen, 1),
            b')' => (Tok::RParen, 1),
            b'=' if two(b"==") => (Tok::Eq, 2),
            b'=' => return Err(err(at, "'=' is not an operator; use '==' to compare".into())),
            b'!' if two(b"!=") => (Tok::Ne, 2),
            b'!' => (Tok::Not, 1),
            b'<' if two(b"<=") => (Tok::Le, 2),
            b'<' => (Tok::Lt, 1),
            b'>' if two(b">=") => (Tok::Ge, 2),
            b'>' => (Tok::Gt, 1),
            b'&' if two(b"&&") => (Tok::And, 2),
            b'|' if two(b"||") => (Tok::Or, 2),
            b'"' | b'\'' => {
                let (s, len) = lex_string(query, at)?;
                (Tok::Str(s), len)
            }
            b'-' | b'0'..=b'9' => lex_number(query, at)?,
            c if c.is_ascii_alphabetic() || c == b'_' => {
                let mut j = i + 1;
                while j < bytes.len() && is_name_byte(bytes[j]) {
                    j += 1;
                }
                let word = &query[i..j];
                let tok = match word {
                    "and" | "AND" => Tok::And,
                    "or" | "OR" => Tok::Or,
                    "not" | "NOT" => Tok::Not,
                    // Every keyword in lower case or in capitals alike.
                    "true" | "TRUE" => Tok::True,
                    "false" | "FALSE" => Tok::False,
                    "null" | "NULL" => Tok::Null,
                    "exists" | "EXISTS" => Tok::Exists,
                    _ => Tok::Ident(word.to_string()),
                };
                (tok, j - i)
            }
            _ => {
                let ch = query[i..].chars().next().expect("i is inside the query");
                return Err(err(at, format!("unexpected character {ch:?}")));
            }
        };
        out.push(Token { tok, at });
        i += len;
    }
    out.push(Token { tok: Tok::End, at: query.len() });
    Ok(out)
}

/// The character of a `\u` escape at `here`, its `u` just read: four hex
/// digits, and for a high surrogate the `\u` escape of its low half.
fn unicode_escape(
    query: &str,
    here: usize,
    chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>,
) -> Result<char, QueryError> {
    let four_digits = |chars: &mut std::iter::Peekable<std::str::CharIndices<'_>>| {
        let mut digits = String::new();
        while digits.len() < 4 {
            match chars.next_if(|(_, c)| c.is_ascii_hexdigit()) {
                Some((_, c)) => digits.push(c),
                None => break,
            }
        }
        match u32::from_str_radix(&digits, 16) {
            Ok(n) if digits.len() == 4 => Ok(n),
            _ => Err(QueryError::new(
                query,
                here,
                format!("'\\u{digits}' is not an escape: '\\u' takes four hex digits, as in '\\u00e9'"),
            )),
        }
    };
    let first = four_digits(chars)?;
    let code = match first {
        0xD800..=0xDBFF => {
            let low = match (chars.next_if(|&(_, c)| c == '\\'), chars.next_if(|&(_, c)| c == 'u')) {
                (Some(_), Some(_)) => Some(four_digits(chars)?),
                _ => None,
            };
            match low {
                Some(low @ 0xDC00..=0xDFFF) => 0x10000 + ((first - 0xD800) << 10) + (low - 0xDC00),
                _ => {
                    return Err(QueryError::new(
                        query,
                        here,
                        format!(
                            "'\\u{first:04x}' is the first half of a surrogate pair: follow it with the second \
                             ('\\udc00' to '\\udfff'), or type the character itself"
                        ),
                    ));
                }
            }
        }
        0xDC00..=0xDFFF => {
            return Err(QueryError::new(
                query,
                here,
                format!("'\\u{first:04x}' is the second half of a surrogate pair, without the first"),
            ));
        }
        n => n,
    };
    Ok(char::from_u32(code).expect("a code point outside the surrogates is a char"))
}

/// A number starting at `i` (a digit, `-` or `.`): digits with at most one
/// `.`, and an exponent. Returns the token and its length in bytes.
fn lex_number(query: &str, i: usize) -> Result<(Tok, usize), QueryError> {
    let bytes = query.as_bytes();
    let mut j = i + 1;
    while j < bytes.len() && bytes[j].is_ascii_digit() {
        j += 1;
    }
    if j + 1 < bytes.len() && bytes[j] == b'.' && bytes[j + 1].is_ascii_digit() {
        j += 1;
        while j < bytes.len() && bytes[j].is_ascii_digit() {
            j += 1;
        }
    }
    if j < bytes.len() && (bytes[j] == b'e' || bytes[j] == b'E') {
        let mut k = j + 1;
        if k < bytes.len() && (bytes[k] == b'+' || bytes[k] == b'-') {
            k += 1;
        }
        if k < bytes.len() && bytes[k].is_ascii_digit() {
            while k < bytes.len() && bytes[k].is_ascii_digit() {
                k += 1;
            }
            j = k;
        }
    }
    let text = &query[i..j];
    let n: f64 = text.parse().map_err(|_| QueryError::new(query, i, format!("'{text}' is not a number")))?;
    Ok((Tok::Num(n), j - i))
}

/// Letters, digits, `_` and `-`: what an unquoted name is made of.
fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b == b'-'
}

/// A quoted string starting at `at`: `"..."` or `'...'` with `\"`, `\'`,
/// `\\`, `\/`, `\n`, `\t`, `\r` and `\u` + four hex digits (`\u00e9`; a
/// character beyond U+FFFF as a surrogate pair, as in JSON). Returns the value and the length in bytes.
fn lex_string(query: &str, at: usize) -> Result<(String, usize), QueryError> {
    let quote = query.as_bytes()[at] as char;
    let mut out = String::new();
    let mut chars = query[at + 1..].char_indices().peekable();
    while let Some((off, c)) = chars.next() {
        let here = at + 1 + off;
        match c {
            c if c == quote => return Ok((out, here + 1 - at)),
            '\\' => {
                let Some((_, e)) = chars.next() else { break };
                match e {
                    '"' | '\'' | '\\' | '/' => out.push(e),
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    'r' => out.push('\r'),
                    'u' => out.push(unicode_escape(query, here, &mut chars)?),
                    other => {
                        return Err(QueryError::new(query, here, format!("unknown escape '\\{other}' in a string")));
                    }
                }
            }
            c => out.push(c),
        }
    }
    Err(QueryError::new(query, at, "this string is never closed".into()))
}
