//! A parse check of the PromQL the chart's alerts use, and the series they read. promtool is
//! not available here (it is only published as a prebuilt binary or a heavy build of all of
//! Prometheus), so this is a recursive-descent parser of the PromQL subset alert rules use:
//! numbers, strings, vector selectors with label matchers, range selectors, `offset`,
//! function calls, aggregations with `by`/`without`, and binary operators with `bool`,
//! `on`/`ignoring` and `group_left`/`group_right`. It refuses what it does not know (an
//! unknown function, an unbalanced bracket, a matcher that is not `label op "string"`, a
//! malformed duration, a range vector where an instant vector is wanted and the reverse), so
//! an expression it accepts is well formed for Prometheus too. It does not check operator
//! precedence or types beyond range versus instant vectors.

/// One vector selector of an expression: the metric name and its label matchers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selector {
    pub metric: String,
    /// (label, operator, value)
    pub matchers: Vec<(String, String, String)>,
}

const AGGREGATIONS: &[&str] =
    &["sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values", "bottomk", "topk", "quantile"];

/// PromQL's functions that take a range vector (`rate(x[5m])`).
const RANGE_FUNCTIONS: &[&str] = &[
    "rate",
    "irate",
    "increase",
    "delta",
    "idelta",
    "deriv",
    "changes",
    "resets",
    "predict_linear",
    "holt_winters",
    "absent_over_time",
    "present_over_time",
    "avg_over_time",
    "min_over_time",
    "max_over_time",
    "sum_over_time",
    "count_over_time",
    "quantile_over_time",
    "stddev_over_time",
    "stdvar_over_time",
    "last_over_time",
];

/// PromQL's functions that take instant vectors or scalars.
const INSTANT_FUNCTIONS: &[&str] = &[
    "abs",
    "absent",
    "ceil",
    "clamp",
    "clamp_max",
    "clamp_min",
    "day_of_month",
    "day_of_week",
    "days_in_month",
    "exp",
    "floor",
    "histogram_quantile",
    "hour",
    "label_join",
    "label_replace",
    "ln",
    "log2",
    "log10",
    "minute",
    "month",
    "round",
    "scalar",
    "sgn",
    "sort",
    "sort_desc",
    "sqrt",
    "time",
    "timestamp",
    "vector",
    "year",
];

const BINARY_KEYWORDS: &[&str] = &["and", "or", "unless"];

#[derive(Debug, Clone, PartialEq)]
enum Token {
    Ident(String),
    Number,
    Str(String),
    Duration,
    Punct(&'static str),
}

fn tokenize(expr: &str) -> Result<Vec<Token>, String> {
    const PUNCT: &[&str] = &[
        "==", "!=", ">=", "<=", "=~", "!~", "(", ")", "{", "}", "[", "]", ",", "+", "-", "*", "/", "%", "^", ">", "<",
        "=",
    ];
    let chars: Vec<char> = expr.chars().collect();
    let (mut tokens, mut i) = (Vec::new(), 0);
    let mut in_range = false;
    while i < chars.len() {
        let c = chars[i];
        if c.is_whitespace() {
            i += 1;
        } else if c == '"' || c == '\'' {
            let start = i + 1;
            i = start;
            while i < chars.len() && chars[i] != c {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            if i >= chars.len() {
                return Err(format!("unterminated string in {expr:?}"));
            }
            tokens.push(Token::Str(chars[start..i].iter().collect()));
            i += 1;
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                i += 1;
            }
            tokens.push(Token::Ident(chars[start..i].iter().collect()));
        } else if c.is_ascii_digit() || c == '.' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                i += 1;
            }
            let text: String = chars[start..i].iter().collect();
            if in_range || text.ends_with(|c: char| c.is_ascii_alphabetic()) {
                if !is_duration(&text) {
                    return Err(format!("{text:?} is not a duration in {expr:?}"));
                }
                tokens.push(Token::Duration);
            } else if text.parse::<f64>().is_ok() {
                tokens.push(Token::Number);
            } else {
                return Err(format!("{text:?} is not a number in {expr:?}"));
            }
        } else {
            let rest: String = chars[i..].iter().take(2).collect();
            let Some(p) = PUNCT.iter().find(|p| rest.starts_with(**p)) else {
                return Err(format!("unexpected {c:?} in {expr:?}"));
            };
            in_range = match *p {
                "[" => true,
                "]" => false,
                _ => in_range,
            };
            tokens.push(Token::Punct(p));
            i += p.len();
        }
    }
    Ok(tokens)
}

/// `5m`, `1h30m`, `500ms`: one or more number-unit pairs.
fn is_duration(text: &str) -> bool {
    let mut rest = text;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !c.is_ascii_digit()).unwrap_or(rest.len());
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let Some(unit) = ["ms", "s", "m", "h", "d", "w", "y"].into_iter().find(|u| rest.starts_with(u)) else {
            return false;
        };
        rest = &rest[unit.len()..];
    }
    true
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Scalar,
    Instant,
    Range,
    String,
}

struct Parser<'a> {
    tokens: &'a [Token],
    pos: usize,
    expr: &'a str,
    selectors: Vec<Selector>,
}

impl Parser<'_> {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn next(&mut self) -> Option<Token> {
        let t = self.tokens.get(self.pos).cloned();
        self.pos += 1;
        t
    }

    fn error<T>(&self, what: &str) -> Result<T, String> {
        Err(format!("{what} at token {} ({:?}) of {:?}", self.pos, self.peek(), self.expr))
    }

    fn expect(&mut self, p: &'static str) -> Result<(), String> {
        if self.next() == Some(Token::Punct(p)) { Ok(()) } else { self.error(&format!("expected {p:?}")) }
    }

    fn is_punct(&self, p: &str) -> bool {
        matches!(self.peek(), Some(Token::Punct(q)) if *q == p)
    }

    fn is_ident(&self, word: &str) -> bool {
        matches!(self.peek(), Some(Token::Ident(w)) if w == word)
    }

    /// expr := unary (binop unary)*
    fn expr(&mut self) -> Result<Kind, String> {
        let mut kind = self.unary()?;
        loop {
            let op = match self.peek() {
                Some(Token::Punct(p))
                    if ["+", "-", "*", "/", "%", "^", "==", "!=", ">", "<", ">=", "<="].contains(p) =>
                {
                    (*p).to_string()
                }
                Some(Token::Ident(w)) if BINARY_KEYWORDS.contains(&w.as_str()) => w.clone(),
                _ => return Ok(kind),
            };
            self.pos += 1;
            if self.is_ident("bool") {
                self.pos += 1;
            }
            for modifier in ["on", "ignoring"] {
                if self.is_ident(modifier) {
                    self.pos += 1;
                    self.label_list()?;
                }
            }
            for modifier in ["group_left", "group_right"] {
                if self.is_ident(modifier) {
                    self.pos += 1;
                    if self.is_punct("(") {
                        self.label_list()?;
                    }
                }
            }
            let right = self.unary()?;
            if [kind, right].iter().any(|k| matches!(k, Kind::Range | Kind::String)) {
                return self.error(&format!("{op} needs scalars or instant vectors"));
            }
            if BINARY_KEYWORDS.contains(&op.as_str()) && (kind != Kind::Instant || right != Kind::Instant) {
                return self.error(&format!("{op} needs instant vectors on both sides"));
            }
            if right == Kind::Instant {
                kind = Kind::Instant;
            }
        }
    }

    fn unary(&mut self) -> Result<Kind, String> {
        if self.is_punct("-") || self.is_punct("+") {
            self.pos += 1;
        }
        self.primary()
    }

    fn primary(&mut self) -> Result<Kind, String> {
        match self.next() {
            Some(Token::Number) => Ok(Kind::Scalar),
            Some(Token::Str(_)) => Ok(Kind::String),
            Some(Token::Punct("(")) => {
                let kind = self.expr()?;
                self.expect(")")?;
                self.range_suffix(kind)
            }
            Some(Token::Punct("{")) => {
                self.pos -= 1;
                self.selector(String::new())
            }
            Some(Token::Ident(name)) if AGGREGATIONS.contains(&name.as_str()) => self.aggregation(&name),
            Some(Token::Ident(name)) if self.is_punct("(") => self.call(&name),
            Some(Token::Ident(name)) => {
                if BINARY_KEYWORDS.contains(&name.as_str())
                    || ["by", "without", "offset", "bool"].contains(&name.as_str())
                {
                    return self.error(&format!("keyword {name:?} where a value is wanted"));
                }
                self.selector(name)
            }
            _ => self.error("expected a value"),
        }
    }

    /// AGG [by|without (labels)] ( [param ,] expr ) [by|without (labels)]
    fn aggregation(&mut self, name: &str) -> Result<Kind, String> {
        let mut grouped = false;
        if self.is_ident("by") || self.is_ident("without") {
            self.pos += 1;
            self.label_list()?;
            grouped = true;
        }
        self.expect("(")?;
        if ["count_values", "bottomk", "topk", "quantile"].contains(&name) {
            self.expr()?;
            self.expect(",")?;
        }
        if self.expr()? != Kind::Instant {
            return self.error(&format!("{name} needs an instant vector"));
        }
        self.expect(")")?;
        if !grouped && (self.is_ident("by") || self.is_ident("without")) {
            self.pos += 1;
            self.label_list()?;
        }
        Ok(Kind::Instant)
    }

    fn call(&mut self, name: &str) -> Result<Kind, String> {
        let range = RANGE_FUNCTIONS.contains(&name);
        if !range && !INSTANT_FUNCTIONS.contains(&name) {
            return self.error(&format!("unknown function {name:?}"));
        }
        self.expect("(")?;
        let mut first = true;
        while !self.is_punct(")") {
            if !first {
                self.expect(",")?;
            }
            let kind = self.expr()?;
            if first && range && kind != Kind::Range {
                return self.error(&format!("{name} needs a range vector (a selector with [duration])"));
            }
            if first && !range && kind == Kind::Range {
                return self.error(&format!("{name} takes no range vector"));
            }
            first = false;
        }
        self.expect(")")?;
        let kind = if ["time", "scalar"].contains(&name) { Kind::Scalar } else { Kind::Instant };
        self.range_suffix(kind)
    }

    /// NAME? { label op "value", ... } [duration]? (offset duration)?
    fn selector(&mut self, metric: String) -> Result<Kind, String> {
        let mut matchers = Vec::new();
        if self.is_punct("{") {
            self.pos += 1;
            while !self.is_punct("}") {
                let Some(Token::Ident(label)) = self.next() else { return self.error("expected a label name") };
                let op = match self.next() {
                    Some(Token::Punct(p)) if ["=", "!=", "=~", "!~"].contains(&p) => p.to_string(),
                    _ => return self.error("expected =, !=, =~ or !~"),
                };
                let Some(Token::Str(value)) = self.next() else { return self.error("expected a quoted label value") };
                matchers.push((label, op, value));
                if !self.is_punct("}") {
                    self.expect(",")?;
                }
            }
            self.pos += 1;
        }
        if metric.is_empty() && matchers.is_empty() {
            return self.error("a selector needs a metric name or a matcher");
        }
        self.selectors.push(Selector { metric, matchers });
        self.range_suffix(Kind::Instant)
    }

    /// `[5m]` turns an instant vector into a range vector (a subquery `[5m:1m]` is not
    /// supported); `offset 5m` may follow either.
    fn range_suffix(&mut self, kind: Kind) -> Result<Kind, String> {
        let mut kind = kind;
        if self.is_punct("[") {
            if kind != Kind::Instant {
                return self.error("only an instant vector takes a range");
            }
            self.pos += 1;
            if self.next() != Some(Token::Duration) {
                return self.error("expected a duration");
            }
            self.expect("]")?;
            kind = Kind::Range;
        }
        if self.is_ident("offset") {
            self.pos += 1;
            if self.next() != Some(Token::Duration) {
                return self.error("expected a duration after offset");
            }
        }
        Ok(kind)
    }

    fn label_list(&mut self) -> Result<(), String> {
        self.expect("(")?;
        while !self.is_punct(")") {
            let Some(Token::Ident(_)) = self.next() else { return self.error("expected a label name") };
            if !self.is_punct(")") {
                self.expect(",")?;
            }
        }
        self.pos += 1;
        Ok(())
    }
}

/// Parse an alert expression (it must be an instant vector) and return its selectors.
pub fn selectors(expr: &str) -> Result<Vec<Selector>, String> {
    let tokens = tokenize(expr)?;
    let mut parser = Parser { tokens: &tokens, pos: 0, expr, selectors: Vec::new() };
    let kind = parser.expr()?;
    if parser.pos != tokens.len() {
        return parser.error("unexpected trailing input");
    }
    if kind != Kind::Instant {
        return Err(format!("{expr:?} is not an instant vector, as an alert expression must be"));
    }
    Ok(parser.selectors)
}
