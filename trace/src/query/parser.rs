//! The query grammar (precedence: `not` binds tightest, then `and`, then `or`):
//!
//! ```text
//! query   := or END
//! or      := and (("or" | "||") and)*
//! and     := unary (("and" | "&&") unary)*
//! unary   := ("not" | "!") unary | primary
//! primary := "(" or ")" | "exists" "(" path ")" | path OP literal
//! path    := name ("." (name | string | integer))*
//! OP      := "==" | "!=" | "<" | "<=" | ">" | ">="
//! literal := string | number | "true" | "false" | "null"
//! ```
//!
//! At most [`MAX_NESTING`] levels of '(' and 'not', and [`MAX_CONDITIONS`]
//! conditions.

use super::QueryError;
use super::lexer::{Tok, Token, lex};

/// How deep '(' and 'not' may nest, and how many conditions a query may
/// have: the parser and the evaluator recurse over the tree, so a generated
/// query of thousands of them overflowed the stack (an abort, not an error).
pub const MAX_NESTING: usize = 64;
pub const MAX_CONDITIONS: usize = 256;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    pub fn symbol(self) -> &'static str {
        match self {
            Op::Eq => "==",
            Op::Ne => "!=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }

    pub fn is_ordering(self) -> bool {
        !matches!(self, Op::Eq | Op::Ne)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    Str(String),
    Num(f64),
    Bool(bool),
    Null,
    /// The first hex digits (lower case) of a hash, as `trace validate` and
    /// the reports print it: made by the type check from a string compared
    /// with a hash field, never by the parser.
    HashPrefix(String),
}

impl Literal {
    pub fn type_name(&self) -> &'static str {
        match self {
            Literal::Str(_) => "a string",
            Literal::HashPrefix(_) => "a hash prefix",
            Literal::Num(_) => "a number",
            Literal::Bool(_) => "a boolean",
            Literal::Null => "null",
        }
    }
}

/// One segment of a path and where it starts in the query.
#[derive(Debug, Clone, PartialEq)]
pub struct Segment {
    pub name: String,
    pub at: usize,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Expr {
    And(Box<Expr>, Box<Expr>),
    Or(Box<Expr>, Box<Expr>),
    Not(Box<Expr>),
    Compare { path: Vec<Segment>, op: Op, op_at: usize, literal: Literal, literal_at: usize },
    Exists { path: Vec<Segment> },
}

pub fn parse(query: &str) -> Result<Expr, QueryError> {
    let tokens = lex(query)?;
    let mut p = Parser { query, tokens, pos: 0, nesting: 0, conditions: 0 };
    if p.peek() == &Tok::End {
        return Err(QueryError::new(query, 0, "the query is empty".into()));
    }
    let expr = p.or()?;
    match p.peek() {
        Tok::End => Ok(expr),
        Tok::RParen => Err(p.error_here("this ')' has no matching '('".into())),
        other => Err(p.error_here(format!("expected 'and', 'or' or the end of the query, found {}", other.describe()))),
    }
}

struct Parser<'q> {
    query: &'q str,
    tokens: Vec<Token>,
    pos: usize,
    /// '(' and 'not' open around the current position.
    nesting: usize,
    /// Comparisons and exists() so far.
    conditions: usize,
}

impl Parser<'_> {
    fn peek(&self) -> &Tok {
        &self.tokens[self.pos].tok
    }

    fn at(&self) -> usize {
        self.tokens[self.pos].at
    }

    fn bump(&mut self) -> Token {
        let t = self.tokens[self.pos].clone();
        if self.pos + 1 < self.tokens.len() {
            self.pos += 1;
        }
        t
    }

    fn error_here(&self, message: String) -> QueryError {
        QueryError::new(self.query, self.at(), message)
    }

    fn or(&mut self) -> Result<Expr, QueryError> {
        let mut left = self.and()?;
        while self.peek() == &Tok::Or {
            self.bump();
            let right = self.and()?;
            left = Expr::Or(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn and(&mut self) -> Result<Expr, QueryError> {
        let mut left = self.unary()?;
        while self.peek() == &Tok::And {
            self.bump();
            let right = self.unary()?;
            left = Expr::And(Box::new(left), Box::new(right));
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, QueryError> {
        if self.peek() == &Tok::Not {
            self.enter()?;
            self.bump();
            let inner = self.unary()?;
            self.nesting -= 1;
            return Ok(Expr::Not(Box::new(inner)));
        }
        self.primary()
    }

    /// One more level of '(' or 'not', refused past [`MAX_NESTING`].
    fn enter(&mut self) -> Result<(), QueryError> {
        if self.nesting == MAX_NESTING {
            return Err(self.error_here(format!(
                "the query nests '(' and 'not' more than {MAX_NESTING} levels deep; simplify it"
            )));
        }
        self.nesting += 1;
        Ok(())
    }

    /// One more condition, refused past [`MAX_CONDITIONS`].
    fn condition(&mut self) -> Result<(), QueryError> {
        if self.conditions == MAX_CONDITIONS {
            return Err(self.error_here(format!(
                "the query has more than {MAX_CONDITIONS} conditions; split it into several searches"
            )));
        }
        self.conditions += 1;
        Ok(())
    }

    fn primary(&mut self) -> Result<Expr, QueryError> {
        match self.peek().clone() {
            Tok::LParen => {
                let open = self.at();
                self.enter()?;
                self.bump();
                let inner = self.or()?;
                self.nesting -= 1;
                match self.peek() {
                    Tok::RParen => {
                        self.bump();
                        Ok(inner)
                    }
                    Tok::End => Err(QueryError::new(self.query, open, "this '(' is never closed".into())),
                    other => Err(self.error_here(format!("expected ')', found {}", other.describe()))),
                }
            }
            Tok::Exists => {
                self.condition()?;
                self.bump();
                if self.peek() != &Tok::LParen {
                    return Err(self.error_here(format!("expected '(' after exists, found {}", self.peek().describe())));
                }
                self.bump();
                let path = self.path()?;
                if self.peek() != &Tok::RParen {
                    return Err(
                        self.error_here(format!("expected ')' to close exists(, found {}", self.peek().describe()))
                    );
                }
                self.bump();
                Ok(Expr::Exists { path })
            }
            Tok::Ident(_) => {
                self.condition()?;
                let path = self.path()?;
                let op_at = self.at();
                let op = match self.peek() {
                    Tok::Eq => Op::Eq,
                    Tok::Ne => Op::Ne,
                    Tok::Lt => Op::Lt,
                    Tok::Le => Op::Le,
                    Tok::Gt => Op::Gt,
                    Tok::Ge => Op::Ge,
                    other => {
                        return Err(self.error_here(format!(
                            "expected a comparison (==, !=, <, <=, >, >=) after the path, found {}",
                            other.describe()
                        )));
                    }
                };
                self.bump();
                let literal_at = self.at();
                let literal = match self.peek().clone() {
                    Tok::Str(s) => Literal::Str(s),
                    Tok::Num(n) => Literal::Num(n),
                    Tok::True => Literal::Bool(true),
                    Tok::False => Literal::Bool(false),
                    Tok::Null => Literal::Null,
                    Tok::Ident(name) => {
                        return Err(self.error_here(format!(
                            "expected a value (a \"string\", a number, true, false or null), found '{name}'; quote strings"
                        )));
                    }
                    other => {
                        return Err(self.error_here(format!(
                            "expected a value (a \"string\", a number, true, false or null) after '{}', found {}",
                            op.symbol(),
                            other.describe()
                        )));
                    }
                };
                self.bump();
                Ok(Expr::Compare { path, op, op_at, literal, literal_at })
            }
            other => Err(self.error_here(format!(
                "expected a condition (a path such as plan_execution.tool, exists(...), not, or '('), found {}",
                other.describe()
            ))),
        }
    }

    fn path(&mut self) -> Result<Vec<Segment>, QueryError> {
        let mut segments = Vec::new();
        match self.peek().clone() {
            Tok::Ident(name) => {
                segments.push(Segment { name, at: self.at() });
                self.bump();
            }
            other => {
                return Err(
                    self.error_here(format!("expected a path such as plan_execution.tool, found {}", other.describe()))
                );
            }
        }
        while self.peek() == &Tok::Dot {
            self.bump();
            let at = self.at();
            // The lexer makes any word after a path's '.' a name, keywords
            // and digits included (a memory key called "null", an index "0").
            let name = match self.peek().clone() {
                Tok::Ident(name) | Tok::Str(name) => name,
                other => {
                    return Err(self.error_here(format!("expected a name after '.', found {}", other.describe())));
                }
            };
            self.bump();
            segments.push(Segment { name, at });
        }
        Ok(segments)
    }
}
