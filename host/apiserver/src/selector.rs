//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`exists) and
//! field selectors (`=`, `==`, `!=` on a per-resource set of fields).

use serde_json::Value;

use crate::error::ApiError;
use crate::resources::ResourceType;

#[derive(Debug, Clone, PartialEq)]
enum Op {
    Eq(String),
    NotEq(String),
    In(Vec<String>),
    NotIn(Vec<String>),
    Exists,
    NotExists,
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

/// Split on commas that are not inside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn parse_set(rest: &str, whole: &str) -> Result<Vec<String>, ApiError> {
    let rest = rest.trim();
    let inner = rest
        .strip_prefix('(')
        .and_then(|r| r.strip_suffix(')'))
        .ok_or_else(|| bad_label(whole, "expected a parenthesised set of values"))?;
    Ok(inner
        .split(',')
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .collect())
}

fn bad_label(sel: &str, why: &str) -> ApiError {
    ApiError::bad_request(format!("unable to parse requirement: found '{sel}', {why}"))
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 316
        && k.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

impl LabelSelector {
    pub fn parse(s: &str) -> Result<Self, ApiError> {
        let mut reqs = Vec::new();
        for part in split_top(s) {
            let p = part.trim();
            if p.is_empty() {
                continue;
            }
            let req = if let Some(k) = p.strip_prefix('!') {
                Requirement {
                    key: k.trim().to_string(),
                    op: Op::NotExists,
                }
            } else if let Some((k, v)) = p.split_once("!=") {
                Requirement {
                    key: k.trim().to_string(),
                    op: Op::NotEq(v.trim().to_string()),
                }
            } else if let Some((k, v)) = p.split_once("==") {
                Requirement {
                    key: k.trim().to_string(),
                    op: Op::Eq(v.trim().to_string()),
                }
            } else if let Some((k, v)) = p.split_once('=') {
                Requirement {
                    key: k.trim().to_string(),
                    op: Op::Eq(v.trim().to_string()),
                }
            } else if let Some((k, rest)) = p.split_once(" notin ") {
                Requirement {
                    key: k.trim().to_string(),
                    op: Op::NotIn(parse_set(rest, p)?),
                }
            } else if let Some((k, rest)) = p.split_once(" in ") {
                Requirement {
                    key: k.trim().to_string(),
                    op: Op::In(parse_set(rest, p)?),
                }
            } else {
                Requirement {
                    key: p.to_string(),
                    op: Op::Exists,
                }
            };
            if !valid_key(&req.key) {
                return Err(bad_label(p, "invalid label key"));
            }
            reqs.push(req);
        }
        Ok(LabelSelector { reqs })
    }

    pub fn is_empty(&self) -> bool {
        self.reqs.is_empty()
    }

    /// Whether an object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        if self.reqs.is_empty() {
            return true;
        }
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
        self.reqs.iter().all(|r| match &r.op {
            Op::Eq(v) => get(&r.key) == Some(v.as_str()),
            Op::NotEq(v) => get(&r.key) != Some(v.as_str()),
            Op::In(vs) => get(&r.key).is_some_and(|x| vs.iter().any(|v| v == x)),
            Op::NotIn(vs) => get(&r.key).is_none_or(|x| !vs.iter().any(|v| v == x)),
            Op::Exists => get(&r.key).is_some(),
            Op::NotExists => get(&r.key).is_none(),
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
