//! The syntax of `spec.dataPipeline.preprocessor`: which preprocessor turns
//! traces into training rows. Parsed here, in the one crate every other one
//! depends on, so that `harness validate` (and the operator) refuse exactly
//! what `basecamp data preprocess` would refuse when the trainer runs it.
//!
//! - `builtin:trajectory`: the built-in trajectory preprocessor;
//! - `exec:PROGRAM ARGS...`: a subprocess, its words split as a shell splits
//!   them (`exec:python3 "my prep.py" --mode 'a b'`);
//! - `python:package.module.function`: a Python function, imported by name.
//!
//! Running them is the sandbox's business (`basecamp_sandbox::preprocess`).

use std::fmt;
use std::str::FromStr;

/// The built-in trajectory preprocessor's name.
pub const TRAJECTORY: &str = "builtin:trajectory";

/// The accepted forms, as error messages list them.
pub const FORMS: &str = "builtin:trajectory, exec:PROGRAM ARGS..., python:module.function";

/// Which preprocessor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Preprocessor {
    /// `builtin:trajectory`.
    Trajectory,
    /// `exec:PROGRAM ARGS...`: the program and its arguments, never empty.
    Exec(Vec<String>),
    /// `python:module.function`.
    Python {
        /// The dotted module path (`shop.prep`).
        module: String,
        /// The function in it.
        function: String,
    },
}

/// A preprocessor name that is none of the accepted forms.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PreprocessorSyntaxError {
    /// Not one of [`FORMS`] (an unknown prefix, an empty command, a Python
    /// path without a function or with characters a Python name cannot have).
    #[error("preprocessor {0:?} is not one of {FORMS}")]
    Unknown(String),
    /// An `exec:` command that a shell could not split into words either.
    #[error("preprocessor {0}: its command has an unclosed quote or a trailing backslash")]
    UnclosedQuote(String),
}

/// A Python identifier as the preprocessor syntax allows it: ASCII letters,
/// digits and `_`.
fn is_python_name(part: &str) -> bool {
    !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

impl Preprocessor {
    /// The Python function at a dotted path (`pkg.module.function`: what
    /// follows `python:`, and how JSON harness files name their
    /// preprocessor), or `None` when `path` is not one.
    pub fn from_python_path(path: &str) -> Option<Self> {
        let (module, function) = path.rsplit_once('.')?;
        (module.split('.').all(is_python_name) && is_python_name(function))
            .then(|| Self::Python { module: module.into(), function: function.into() })
    }
}

impl FromStr for Preprocessor {
    type Err = PreprocessorSyntaxError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let unknown = || PreprocessorSyntaxError::Unknown(s.to_string());
        if s == TRAJECTORY {
            return Ok(Self::Trajectory);
        }
        if let Some(command) = s.strip_prefix("exec:") {
            // Split as a shell splits words: `exec:python3 "my prep.py" --mode 'a b'`.
            let argv = shlex::split(command).ok_or_else(|| PreprocessorSyntaxError::UnclosedQuote(s.to_string()))?;
            return if argv.is_empty() { Err(unknown()) } else { Ok(Self::Exec(argv)) };
        }
        s.strip_prefix("python:").and_then(Self::from_python_path).ok_or_else(unknown)
    }
}

impl fmt::Display for Preprocessor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Trajectory => f.write_str(TRAJECTORY),
            Self::Exec(argv) => {
                let command = shlex::try_join(argv.iter().map(String::as_str)).unwrap_or_else(|_| argv.join(" "));
                write!(f, "exec:{command}")
            }
            Self::Python { module, function } => write!(f, "python:{module}.{function}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_form_parses_and_prints_back() {
        assert_eq!("builtin:trajectory".parse::<Preprocessor>().unwrap(), Preprocessor::Trajectory);
        let python = "python:shop.prep.shipping_delay_filter".parse::<Preprocessor>().unwrap();
        assert_eq!(
            python,
            Preprocessor::Python { module: "shop.prep".into(), function: "shipping_delay_filter".into() }
        );
        assert_eq!(python.to_string(), "python:shop.prep.shipping_delay_filter");
        // Words are split as a shell splits them.
        assert_eq!(
            "exec:python3 \"my prep.py\" --mode 'a b'".parse::<Preprocessor>().unwrap(),
            Preprocessor::Exec(vec!["python3".into(), "my prep.py".into(), "--mode".into(), "a b".into()])
        );
        assert_eq!(
            Preprocessor::Exec(vec!["python3".into(), "my prep.py".into()]).to_string(),
            "exec:python3 'my prep.py'"
        );
    }

    #[test]
    fn anything_else_is_refused_naming_the_accepted_forms() {
        for bad in ["shipping_delay_filter", "python:nofunction", "exec:", "exec:  ", "python:a b.c", "python:.f", ""] {
            let err = bad.parse::<Preprocessor>().unwrap_err();
            assert_eq!(err, PreprocessorSyntaxError::Unknown(bad.into()));
            assert!(err.to_string().contains(FORMS), "{err}");
        }
        let err = "exec:python3 \"prep.py".parse::<Preprocessor>().unwrap_err();
        assert_eq!(
            err.to_string(),
            "preprocessor exec:python3 \"prep.py: its command has an unclosed quote or a trailing backslash"
        );
    }

    #[test]
    fn a_bare_dotted_path_is_a_python_preprocessor() {
        assert_eq!(
            Preprocessor::from_python_path("deepseek.harness.preprocess.shipping_delay_filter"),
            Some(Preprocessor::Python {
                module: "deepseek.harness.preprocess".into(),
                function: "shipping_delay_filter".into()
            })
        );
        for not_one in ["shipping_delay_filter", "a..b", "a.b-c", "builtin:trajectory", "a.b "] {
            assert_eq!(Preprocessor::from_python_path(not_one), None, "{not_one}");
        }
    }
}
