//! Label selectors, parsed as kube-apiserver parses them
//! (`k8s.io/apimachinery/pkg/labels`): a lexer and a recursive-descent parser
//! for `=`, `==`, `!=`, `in`, `notin`, exists, `!`exists, `>` and `<`, with
//! keys validated as qualified names and values as label values; and field
//! selectors (`=`, `==`, `!=` on a per-resource set of fields).

use serde_json::Value;

use crate::error::ApiError;
use crate::resources::ResourceType;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    /// `=`, `==` and `in`: the label is one of the values.
    In(Vec<String>),
    /// `!=` and `notin`: the label is missing or none of the values.
    NotIn(Vec<String>),
    Exists,
    NotExists,
    /// The label is an integer greater than this.
    Gt(i64),
    /// The label is an integer less than this.
    Lt(i64),
}

#[derive(Debug, Clone, PartialEq)]
struct Requirement {
    key: String,
    op: Op,
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    reqs: Vec<Requirement>,
}

/// A token of the label selector grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    End,
    Ident,
    /// `!`
    Not,
    /// `!=`
    NotEquals,
    /// `=`
    Equals,
    /// `==`
    DoubleEquals,
    /// `>`
    Greater,
    /// `<`
    Less,
    /// `in`
    In,
    /// `notin`
    NotIn,
    /// `(`
    Open,
    /// `)`
    Close,
    /// `,`
    Comma,
}

fn is_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_symbol(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

/// Split a selector into tokens and their text; the last is always `End`.
fn lex(s: &str) -> Vec<(Tok, &str)> {
    let mut out = Vec::new();
    let mut rest = s;
    loop {
        rest = rest.trim_start_matches(is_space);
        let Some(c) = rest.chars().next() else {
            out.push((Tok::End, ""));
            return out;
        };
        let (tok, len) = if is_symbol(c) {
            // Two-character operators first, as the longest match.
            match (c, rest[1..].chars().next()) {
                ('!', Some('=')) => (Tok::NotEquals, 2),
                ('=', Some('=')) => (Tok::DoubleEquals, 2),
                ('!', _) => (Tok::Not, 1),
                ('=', _) => (Tok::Equals, 1),
                ('(', _) => (Tok::Open, 1),
                (')', _) => (Tok::Close, 1),
                (',', _) => (Tok::Comma, 1),
                ('>', _) => (Tok::Greater, 1),
                _ => (Tok::Less, 1),
            }
        } else {
            // An identifier runs to the next blank or operator character.
            let len = rest
                .find(|c| is_space(c) || is_symbol(c))
                .unwrap_or(rest.len());
            let tok = match &rest[..len] {
                "in" => Tok::In,
                "notin" => Tok::NotIn,
                _ => Tok::Ident,
            };
            (tok, len)
        };
        out.push((tok, &rest[..len]));
        rest = &rest[len..];
    }
}

/// Whether `in` and `notin` are operators (after a key) or plain words (keys
/// and values).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    Operator,
    Value,
}

struct Parser<'a> {
    toks: Vec<(Tok, &'a str)>,
    pos: usize,
}

impl<'a> Parser<'a> {
    fn peek(&self, ctx: Ctx) -> (Tok, &'a str) {
        let (tok, lit) = self.toks[self.pos];
        match tok {
            Tok::In | Tok::NotIn if ctx == Ctx::Value => (Tok::Ident, lit),
            _ => (tok, lit),
        }
    }

    fn next(&mut self, ctx: Ctx) -> (Tok, &'a str) {
        let t = self.peek(ctx);
        // `End` is never consumed past.
        self.pos = (self.pos + 1).min(self.toks.len() - 1);
        t
    }

    /// `requirement ("," requirement)*`, or nothing.
    fn selector(&mut self) -> Result<Vec<Requirement>, String> {
        let mut reqs = Vec::new();
        loop {
            match self.peek(Ctx::Value) {
                (Tok::End, _) => return Ok(reqs),
                (Tok::Ident | Tok::Not, _) => {
                    let r = self
                        .requirement()
                        .map_err(|e| format!("unable to parse requirement: {e}"))?;
                    reqs.push(r);
                    match self.next(Ctx::Value) {
                        (Tok::End, _) => return Ok(reqs),
                        (Tok::Comma, _) => match self.peek(Ctx::Value) {
                            (Tok::Ident | Tok::Not, _) => {}
                            (_, lit) => {
                                return Err(format!(
                                    "found '{lit}', expected: identifier after ','"
                                ));
                            }
                        },
                        (_, lit) => {
                            return Err(format!("found '{lit}', expected: ',' or 'end of string'"));
                        }
                    }
                }
                (_, lit) => {
                    return Err(format!(
                        "found '{lit}', expected: !, identifier, or 'end of string'"
                    ));
                }
            }
        }
    }

    /// `["!"] key [operator value(s)]`
    fn requirement(&mut self) -> Result<Requirement, String> {
        let mut tok = self.next(Ctx::Value);
        let negated = tok.0 == Tok::Not;
        if negated {
            tok = self.next(Ctx::Value);
        }
        let (Tok::Ident, key) = tok else {
            return Err(format!("found '{}', expected: identifier", tok.1));
        };
        let key_errors = qualified_name_errors(key);
        if !key_errors.is_empty() {
            return Err(format!(
                "<nil>: Invalid value: {key:?}: {}",
                key_errors.join("; ")
            ));
        }
        let bare = matches!(self.peek(Ctx::Value).0, Tok::End | Tok::Comma);
        if negated || bare {
            let op = if negated { Op::NotExists } else { Op::Exists };
            return Ok(Requirement {
                key: key.to_owned(),
                op,
            });
        }
        let (tok, lit) = self.next(Ctx::Operator);
        let values = match tok {
            Tok::In | Tok::NotIn => self.value_set()?,
            Tok::Equals | Tok::DoubleEquals | Tok::NotEquals | Tok::Greater | Tok::Less => {
                vec![self.exact_value()?]
            }
            _ => {
                return Err(format!(
                    "found '{lit}', expected: '=', '!=', '==', 'in', notin'"
                ));
            }
        };
        new_requirement(key, tok, values)
    }

    /// `"(" [value ("," value)*] ")"`; a missing value is "", and the set is
    /// sorted without duplicates. Follows kube's corner cases: `()` and `(,)`
    /// are `{""}`, while `(a,,)` is an error.
    fn value_set(&mut self) -> Result<Vec<String>, String> {
        let (tok, lit) = self.next(Ctx::Value);
        if tok != Tok::Open {
            return Err(format!("found '{lit}' expected: '('"));
        }
        let mut values = Vec::new();
        match self.peek(Ctx::Value) {
            (Tok::Close, _) => values.push(String::new()),
            (Tok::Ident | Tok::Comma, _) => loop {
                match self.next(Ctx::Value) {
                    (Tok::Ident, v) => {
                        values.push(v.to_owned());
                        match self.peek(Ctx::Value) {
                            (Tok::Comma, _) => {}
                            (Tok::Close, _) => break,
                            (_, lit) => {
                                return Err(format!("found '{lit}', expected: ',' or ')'"));
                            }
                        }
                    }
                    (Tok::Comma, _) => {
                        if values.is_empty() {
                            values.push(String::new());
                        }
                        match self.peek(Ctx::Value).0 {
                            Tok::Close => {
                                values.push(String::new());
                                break;
                            }
                            Tok::Comma => {
                                self.next(Ctx::Value);
                                values.push(String::new());
                            }
                            _ => {}
                        }
                    }
                    (_, lit) => return Err(format!("found '{lit}', expected: ',', or identifier")),
                }
            },
            (_, lit) => return Err(format!("found '{lit}', expected: ',', ')' or identifier")),
        }
        // The loop stops before ")".
        self.next(Ctx::Value);
        values.sort();
        values.dedup();
        Ok(values)
    }

    /// One value after `=`, `==`, `!=`, `>` or `<`; nothing is "".
    fn exact_value(&mut self) -> Result<String, String> {
        match self.peek(Ctx::Value).0 {
            Tok::End | Tok::Comma => Ok(String::new()),
            _ => match self.next(Ctx::Value) {
                (Tok::Ident, v) => Ok(v.to_owned()),
                (_, lit) => Err(format!("found '{lit}', expected: identifier")),
            },
        }
    }
}

/// Check the values of a requirement as `labels.NewRequirement` does and
/// build it.
fn new_requirement(key: &str, tok: Tok, values: Vec<String>) -> Result<Requirement, String> {
    let mut errors = Vec::new();
    let mut number = None;
    if matches!(tok, Tok::Greater | Tok::Less) {
        for (i, v) in values.iter().enumerate() {
            match v.parse::<i64>() {
                Ok(n) => number = Some(n),
                Err(_) => errors.push(format!(
                    "values[{i}]: Invalid value: {v:?}: for 'Gt', 'Lt' operators, the value must be an integer"
                )),
            }
        }
    }
    for (i, v) in values.iter().enumerate() {
        let errs = label_value_errors(v);
        if !errs.is_empty() {
            errors.push(format!(
                "values[{i}][{key}]: Invalid value: {v:?}: {}",
                errs.join("; ")
            ));
        }
    }
    errors.dedup();
    match errors.len() {
        0 => {}
        1 => return Err(errors.remove(0)),
        _ => return Err(format!("[{}]", errors.join(", "))),
    }
    let op = match (tok, number) {
        (Tok::NotEquals | Tok::NotIn, _) => Op::NotIn(values),
        (Tok::Greater, Some(n)) => Op::Gt(n),
        (Tok::Less, Some(n)) => Op::Lt(n),
        _ => Op::In(values),
    };
    Ok(Requirement {
        key: key.to_owned(),
        op,
    })
}

const QUALIFIED_NAME_MSG: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
use crate::objects::SUBDOMAIN_MSG;
const LABEL_VALUE_MSG: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`
fn is_qualified_part(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A lowercase RFC 1123 subdomain of at most 253 characters.
fn subdomain_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 253 {
        errs.push("must be no more than 253 characters".to_owned());
    }
    let label_ok = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
    };
    if !s.split('.').all(label_ok) {
        errs.push(SUBDOMAIN_MSG.to_owned());
    }
    errs
}

/// Why `s` is not a qualified name (a label key): `[prefix/]name`.
fn qualified_name_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = s.split('/').collect();
    let name = match parts[..] {
        [name] => name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_owned());
            } else {
                errs.extend(
                    subdomain_errors(prefix)
                        .into_iter()
                        .map(|e| format!("prefix part {e}")),
                );
            }
            name
        }
        _ => {
            return vec![format!(
                "a qualified name {QUALIFIED_NAME_MSG} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )];
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_owned());
    } else if name.len() > 63 {
        errs.push("name part must be no more than 63 characters".to_owned());
    }
    if !is_qualified_part(name) {
        errs.push(format!("name part {QUALIFIED_NAME_MSG}"));
    }
    errs
}

/// Why `s` is not a label value (empty, or a qualified name part of at most
/// 63 characters).
fn label_value_errors(s: &str) -> Vec<String> {
    let mut errs = Vec::new();
    if s.len() > 63 {
        errs.push("must be no more than 63 characters".to_owned());
    }
    if !s.is_empty() && !is_qualified_part(s) {
        errs.push(LABEL_VALUE_MSG.to_owned());
    }
    errs
}

impl LabelSelector {
    /// Parse a `labelSelector`; errors are 400 with kube-apiserver's message.
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut p = Parser {
            toks: lex(s),
            pos: 0,
        };
        let reqs = p.selector().map_err(ApiError::bad_request)?;
        Ok(LabelSelector { reqs })
    }

    /// A `metav1.LabelSelector` object (`matchLabels`, `matchExpressions`
    /// with In, NotIn, Exists, DoesNotExist), as kube's
    /// `LabelSelectorAsSelector` reads it: absent, null or `{}` selects
    /// everything. Errors are kube's reasons, without a field path.
    pub fn from_object(sel: Option<&Value>) -> Result<Self, String> {
        let mut reqs = Vec::new();
        let Some(sel) = sel.filter(|s| !s.is_null()) else {
            return Ok(LabelSelector { reqs });
        };
        let key_ok = |key: &str| {
            let errs = qualified_name_errors(key);
            if errs.is_empty() {
                Ok(())
            } else {
                Err(format!("key: Invalid value: {key:?}: {}", errs.join("; ")))
            }
        };
        if let Some(m) = sel.get("matchLabels").and_then(Value::as_object) {
            for (k, v) in m {
                key_ok(k)?;
                let v = v.as_str().unwrap_or_default().to_owned();
                reqs.push(new_requirement(k, Tok::Equals, vec![v])?);
            }
        }
        for e in sel
            .get("matchExpressions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let key = e.get("key").and_then(Value::as_str).unwrap_or_default();
            key_ok(key)?;
            let mut values: Vec<String> = e
                .get("values")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|v| v.as_str().unwrap_or_default().to_owned())
                .collect();
            let op = e
                .get("operator")
                .and_then(Value::as_str)
                .unwrap_or_default();
            let (tok, needs_values) = match op {
                "In" => (Tok::In, true),
                "NotIn" => (Tok::NotIn, true),
                "Exists" | "DoesNotExist" => (Tok::End, false),
                _ => return Err(format!("{op:?} is not a valid label selector operator")),
            };
            match (needs_values, values.is_empty()) {
                (true, true) => {
                    return Err(
                        "values: Invalid value: []string{}: for 'in', 'notin' operators, values set can't be empty"
                            .into(),
                    );
                }
                (false, false) => {
                    return Err(format!(
                        "values: Invalid value: {values:?}: values set must be empty for exists and does not exist"
                    ));
                }
                _ => {}
            }
            if needs_values {
                values.sort();
                values.dedup();
                reqs.push(new_requirement(key, tok, values)?);
            } else {
                let op = if op == "Exists" {
                    Op::Exists
                } else {
                    Op::NotExists
                };
                reqs.push(Requirement {
                    key: key.to_owned(),
                    op,
                });
            }
        }
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        self.matches_labels(obj.pointer("/metadata/labels"))
    }

    /// Whether a label map (`metadata.labels`; absent: no labels) satisfies
    /// every requirement.
    pub fn matches_labels(&self, labels: Option<&Value>) -> bool {
        if self.reqs.is_empty() {
            return true;
        }
        let labels = labels.and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        let number = |k: &str| get(k).and_then(|v| v.parse::<i64>().ok());
        self.reqs.iter().all(|r| match &r.op {
            Op::In(vs) => get(&r.key).is_some_and(|x| vs.iter().any(|v| v == x)),
            Op::NotIn(vs) => get(&r.key).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Op::Exists => get(&r.key).is_some(),
            Op::NotExists => get(&r.key).is_none(),
            Op::Gt(n) => number(&r.key).is_some_and(|x| x > *n),
            Op::Lt(n) => number(&r.key).is_some_and(|x| x < *n),
        })
    }
}

/// A parsed field selector.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    reqs: Vec<(String, bool, String)>,
}

/// Fields a resource supports in field selectors, as (selector name, JSON pointer).
fn supported_fields(rt: &ResourceType) -> Vec<(&'static str, &'static str)> {
    let mut f = vec![
        ("metadata.name", "/metadata/name"),
        ("metadata.namespace", "/metadata/namespace"),
    ];
    match (rt.group, rt.plural) {
        ("", "secrets") => f.push(("type", "/type")),
        ("", "pods") => {
            f.push(("spec.nodeName", "/spec/nodeName"));
            f.push(("status.phase", "/status/phase"));
            f.push(("spec.serviceAccountName", "/spec/serviceAccountName"));
        }
        ("", "namespaces") => f.push(("status.phase", "/status/phase")),
        ("", "events") => {
            f.push(("involvedObject.kind", "/involvedObject/kind"));
            f.push(("involvedObject.namespace", "/involvedObject/namespace"));
            f.push(("involvedObject.name", "/involvedObject/name"));
            f.push(("involvedObject.uid", "/involvedObject/uid"));
            f.push(("reason", "/reason"));
            f.push(("type", "/type"));
        }
        ("events.k8s.io", "events") => {
            f.push(("regarding.kind", "/regarding/kind"));
            f.push(("regarding.namespace", "/regarding/namespace"));
            f.push(("regarding.name", "/regarding/name"));
            f.push(("reason", "/reason"));
            f.push(("type", "/type"));
        }
        _ => {}
    }
    f
}

impl FieldSelector {
    pub fn parse(s: &str, rt: &ResourceType) -> Result<Self, ApiError> {
        let fields = supported_fields(rt);
        let mut reqs = Vec::new();
        for part in s.split(',') {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let (k, eq, v) = if let Some((k, v)) = p.split_once("!=") {
                (k, false, v)
            } else if let Some((k, v)) = p.split_once("==") {
                (k, true, v)
            } else if let Some((k, v)) = p.split_once('=') {
                (k, true, v)
            } else {
                return Err(ApiError::bad_request(format!(
                    "invalid selector: '{s}'; can't understand '{p}'"
                )));
            };
            let k = k.trim();
            let Some((_, ptr)) = fields.iter().find(|(name, _)| *name == k) else {
                return Err(ApiError::bad_request(format!(
                    "\"{k}\" is not a known field selector: only \"{}\"",
                    fields
                        .iter()
                        .map(|(n, _)| *n)
                        .collect::<Vec<_>>()
                        .join("\", \"")
                )));
            };
            reqs.push((ptr.to_string(), eq, v.trim().to_string()));
        }
        Ok(FieldSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.reqs.iter().all(|(ptr, eq, v)| {
            let actual = match obj.pointer(ptr) {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Null) | None => String::new(),
                Some(other) => other.to_string(),
            };
            (actual == *v) == *eq
        })
    }
}

/// Label and field selector together.
#[derive(Debug, Clone, Default)]
pub struct Selectors {
    pub labels: LabelSelector,
    pub fields: FieldSelector,
}

impl Selectors {
    pub fn matches(&self, obj: &Value) -> bool {
        self.labels.matches(obj) && self.fields.matches(obj)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::{RESOURCES, lookup_core};
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns", "labels": labels}, "type": "Opaque"})
    }

    #[test]
    fn label_ops() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m("app=web"));
        assert!(m("app==web,tier"));
        assert!(!m("app!=web"));
        assert!(m("app in (web, api)"));
        assert!(!m("app notin (web)"));
        assert!(m("missing notin (x)"));
        assert!(m("!missing"));
        assert!(!m("!app"));
        assert!(m("app in (a,web),tier=front"));
        assert!(m(""));
        assert!(LabelSelector::parse("a in x").is_err());
    }

    /// The 400 message for a selector kube-apiserver refuses.
    fn err(s: &str) -> String {
        let e = LabelSelector::parse(s).expect_err(s);
        assert_eq!((e.code, e.reason.as_ref()), (400, "BadRequest"), "{s}");
        e.message
    }

    #[test]
    fn label_selector_objects() {
        let sel = |v: Value| LabelSelector::from_object(Some(&v));
        let s = sel(json!({
            "matchLabels": {"app": "web"},
            "matchExpressions": [
                {"key": "tier", "operator": "NotIn", "values": ["db"]},
                {"key": "team", "operator": "Exists"},
                {"key": "legacy", "operator": "DoesNotExist"},
            ],
        }))
        .unwrap();
        assert!(s.matches(&obj(json!({"app": "web", "team": "a"}))));
        assert!(!s.matches(&obj(json!({"app": "web", "team": "a", "tier": "db"}))));
        assert!(!s.matches(&obj(json!({"app": "web", "team": "a", "legacy": ""}))));
        assert!(!s.matches(&obj(json!({"app": "web"}))));
        assert!(LabelSelector::from_object(None).unwrap().is_empty());
        assert!(sel(json!({})).unwrap().matches(&obj(json!({}))));
        assert!(
            sel(json!({"matchExpressions": [{"key": "a", "operator": "In", "values": []}]}))
                .is_err()
        );
        assert!(
            sel(json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}))
                .is_err()
        );
        assert!(
            sel(json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}))
                .is_err()
        );
        assert!(sel(json!({"matchLabels": {"bad key": "x"}})).is_err());
    }

    #[test]
    fn label_operators_without_blanks() {
        let o = obj(json!({"app": "web", "n": "3", "text": "x"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m("app in(web)"));
        assert!(m("app in(api,web)"));
        assert!(!m("app notin(web)"));
        assert!(m("app notin(api)"));
        assert!(m("app  in  (  web  )"));
        assert!(m("app=web,n>2"));
        assert!(m("n>2"));
        assert!(!m("n>3"));
        assert!(m("n<4"));
        assert!(!m("n<3"));
        assert!(m("n > 2 , n < 4"));
        // Not an integer, or missing: never greater or less.
        assert!(!m("text>0"));
        assert!(!m("text<0"));
        assert!(!m("missing>0"));
        assert!(!m("missing<0"));
        assert!(m("app,!missing"));
        assert!(m("!missing,app"));
        // `in` and `notin` are plain words where a key or value is expected.
        let w = obj(json!({"in": "notin"}));
        assert!(LabelSelector::parse("in=notin").unwrap().matches(&w));
        assert!(
            LabelSelector::parse("in in (in,notin)")
                .unwrap()
                .matches(&w)
        );
        // Empty values.
        let e = obj(json!({"app": ""}));
        let me = |s: &str| LabelSelector::parse(s).unwrap().matches(&e);
        assert!(me("app="));
        assert!(me("app=,app"));
        assert!(me("app in ()"));
        assert!(me("app in (,)"));
        assert!(me("app in (x,)"));
        assert!(me("app in (,x)"));
        assert!(me("app in (x,,y)"));
        assert!(!me("app!="));
        assert!(me("example.com/app-1.x_y!=z"));
        assert!(LabelSelector::parse(" \t ").unwrap().is_empty());
    }

    #[test]
    fn label_syntax_errors_are_kubes() {
        assert_eq!(
            err("a in x"),
            "unable to parse requirement: found 'x' expected: '('"
        );
        assert_eq!(
            err("a b"),
            "unable to parse requirement: found 'b', expected: '=', '!=', '==', 'in', notin'"
        );
        assert_eq!(err("a=b c"), "found 'c', expected: ',' or 'end of string'");
        assert_eq!(err("a=b,"), "found '', expected: identifier after ','");
        assert_eq!(err("a=b,,c"), "found ',', expected: identifier after ','");
        assert_eq!(
            err(",a"),
            "found ',', expected: !, identifier, or 'end of string'"
        );
        assert_eq!(
            err("=a"),
            "found '=', expected: !, identifier, or 'end of string'"
        );
        assert_eq!(
            err("!"),
            "unable to parse requirement: found '', expected: identifier"
        );
        assert_eq!(err("!a=b"), "found '=', expected: ',' or 'end of string'");
        assert_eq!(
            err("a=(b)"),
            "unable to parse requirement: found '(', expected: identifier"
        );
        assert_eq!(
            err("a in (b c)"),
            "unable to parse requirement: found 'c', expected: ',' or ')'"
        );
        assert_eq!(
            err("a in (b"),
            "unable to parse requirement: found '', expected: ',' or ')'"
        );
        assert_eq!(
            err("a in (b,"),
            "unable to parse requirement: found '', expected: ',', or identifier"
        );
        assert_eq!(
            err("a in (b,,)"),
            "unable to parse requirement: found ')', expected: ',', or identifier"
        );
        assert_eq!(
            err("a in (=)"),
            "unable to parse requirement: found '=', expected: ',', ')' or identifier"
        );
        assert_eq!(
            err("a in"),
            "unable to parse requirement: found '' expected: '('"
        );
    }

    #[test]
    fn label_validation_errors_are_kubes() {
        const NAME: &str = "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')";
        const VALUE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";
        assert_eq!(
            err("-a=b"),
            format!("unable to parse requirement: <nil>: Invalid value: \"-a\": name part {NAME}")
        );
        assert_eq!(
            err("Example.com/a"),
            "unable to parse requirement: <nil>: Invalid value: \"Example.com/a\": prefix part a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')"
        );
        assert_eq!(
            err("/a"),
            "unable to parse requirement: <nil>: Invalid value: \"/a\": prefix part must be non-empty"
        );
        assert_eq!(
            err("a/"),
            format!(
                "unable to parse requirement: <nil>: Invalid value: \"a/\": name part must be non-empty; name part {NAME}"
            )
        );
        assert_eq!(
            err("a/b/c"),
            format!(
                "unable to parse requirement: <nil>: Invalid value: \"a/b/c\": a qualified name {NAME} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
            )
        );
        let long = "k".repeat(64);
        assert_eq!(
            err(&long),
            format!(
                "unable to parse requirement: <nil>: Invalid value: \"{long}\": name part must be no more than 63 characters"
            )
        );
        assert_eq!(
            err("a=b*"),
            format!("unable to parse requirement: values[0][a]: Invalid value: \"b*\": {VALUE}")
        );
        assert_eq!(
            err("a in (x*,b)"),
            format!("unable to parse requirement: values[1][a]: Invalid value: \"x*\": {VALUE}")
        );
        let long = "v".repeat(64);
        assert_eq!(
            err(&format!("a={long}")),
            format!(
                "unable to parse requirement: values[0][a]: Invalid value: \"{long}\": must be no more than 63 characters"
            )
        );
        assert_eq!(
            err("n>x"),
            "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
        assert_eq!(
            err("n<"),
            "unable to parse requirement: values[0]: Invalid value: \"\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
        assert_eq!(
            err("n>-5"),
            format!("unable to parse requirement: values[0][n]: Invalid value: \"-5\": {VALUE}")
        );
        assert_eq!(
            err("n<1.5"),
            "unable to parse requirement: values[0]: Invalid value: \"1.5\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
        assert_eq!(
            err("n>_1"),
            format!(
                "unable to parse requirement: [values[0]: Invalid value: \"_1\": for 'Gt', 'Lt' operators, the value must be an integer, values[0][n]: Invalid value: \"_1\": {VALUE}]"
            )
        );
    }

    #[test]
    fn field_ops() {
        let secrets = &RESOURCES[lookup_core("secrets").unwrap()];
        let o = obj(json!({}));
        let m = |s: &str| FieldSelector::parse(s, secrets).unwrap().matches(&o);
        assert!(m("metadata.name=a"));
        assert!(m("metadata.namespace!=other,type=Opaque"));
        assert!(!m("metadata.name==b"));
        assert!(FieldSelector::parse("spec.foo=1", secrets).is_err());
    }
}
