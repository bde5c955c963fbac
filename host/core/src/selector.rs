//! Kubernetes label selectors, in their string form:
//! `a=b`, `a==b`, `a!=b`, `a in (x,y)`, `a notin (x)`, `a`, `!a`, joined by commas.
use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector. The empty selector matches everything.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    raw: String,
    reqs: Vec<Requirement>,
}

impl LabelSelector {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.reqs.iter().all(|r| match r {
            Requirement::Eq(k, v) => labels.get(k) == Some(v),
            Requirement::NotEq(k, v) => labels.get(k) != Some(v),
            Requirement::In(k, vs) => labels.get(k).is_some_and(|l| vs.contains(l)),
            Requirement::NotIn(k, vs) => labels.get(k).is_none_or(|l| !vs.contains(l)),
            Requirement::Exists(k) => labels.contains_key(k),
            Requirement::NotExists(k) => !labels.contains_key(k),
        })
    }

    pub fn as_str(&self) -> &str {
        &self.raw
    }

    /// The label keys it reads.
    pub fn keys(&self) -> impl Iterator<Item = &str> {
        self.reqs.iter().map(Requirement::key)
    }

    /// Why no object's labels can satisfy all of `selectors` at once, if
    /// none can: two requirements on one key that exclude each other
    /// (`a=true,a=false`, `a=x` with `a notin (x)`, `a` with `!a`), within
    /// one selector or across them.
    pub fn never_matches(selectors: &[&LabelSelector]) -> Option<String> {
        let mut by_key: BTreeMap<&str, Vec<&Requirement>> = BTreeMap::new();
        for r in selectors.iter().flat_map(|s| &s.reqs) {
            by_key.entry(r.key()).or_default().push(r);
        }
        for (key, reqs) in by_key {
            let (mut present, mut absent) = (false, false);
            // None: any value; Some: only these.
            let mut allowed: Option<Vec<&str>> = None;
            let mut excluded: Vec<&str> = Vec::new();
            for r in &reqs {
                let only: Option<Vec<&str>> = match r {
                    Requirement::Eq(_, v) => Some(vec![v.as_str()]),
                    Requirement::In(_, vs) => Some(vs.iter().map(String::as_str).collect()),
                    Requirement::NotEq(_, v) => {
                        excluded.push(v);
                        None
                    }
                    Requirement::NotIn(_, vs) => {
                        excluded.extend(vs.iter().map(String::as_str));
                        None
                    }
                    Requirement::Exists(_) => {
                        present = true;
                        None
                    }
                    Requirement::NotExists(_) => {
                        absent = true;
                        None
                    }
                };
                if let Some(only) = only {
                    present = true;
                    allowed = Some(match allowed {
                        None => only,
                        Some(a) => a.into_iter().filter(|v| only.contains(v)).collect(),
                    });
                }
            }
            let empty = allowed
                .as_ref()
                .is_some_and(|a| a.iter().all(|v| excluded.contains(v)));
            if (present && absent) || empty {
                let texts: Vec<String> = reqs
                    .iter()
                    .map(|r| format!("{:?}", r.to_string()))
                    .collect();
                return Some(format!(
                    "label {key:?} cannot satisfy {} at once",
                    texts.join(" and ")
                ));
            }
        }
        None
    }
}

impl Requirement {
    fn key(&self) -> &str {
        match self {
            Requirement::Eq(k, _)
            | Requirement::NotEq(k, _)
            | Requirement::In(k, _)
            | Requirement::NotIn(k, _)
            | Requirement::Exists(k)
            | Requirement::NotExists(k) => k,
        }
    }
}

impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Requirement::Eq(k, v) => write!(f, "{k}={v}"),
            Requirement::NotEq(k, v) => write!(f, "{k}!={v}"),
            Requirement::In(k, vs) => write!(f, "{k} in ({})", vs.join(",")),
            Requirement::NotIn(k, vs) => write!(f, "{k} notin ({})", vs.join(",")),
            Requirement::Exists(k) => write!(f, "{k}"),
            Requirement::NotExists(k) => write!(f, "!{k}"),
        }
    }
}

impl fmt::Display for LabelSelector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

/// A label name part (and a non-empty value): at most 63 of `[A-Za-z0-9-_.]`,
/// starting and ending alphanumeric, as kube-apiserver checks selectors
/// (one it refuses would fail every list and watch of the kind).
fn valid_name_part(n: &str) -> bool {
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    !n.is_empty()
        && n.len() <= 63
        && edge(n.chars().next())
        && edge(n.chars().last())
        && n.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

/// A qualified label key: `[prefix/]name`, the prefix a lower-case DNS
/// subdomain of at most 253 characters.
fn valid_key(k: &str) -> bool {
    let (prefix, name) = match k.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, k),
    };
    let label = |l: &str| {
        !l.is_empty()
            && l.len() <= 63
            && !l.starts_with('-')
            && !l.ends_with('-')
            && l.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    valid_name_part(name) && prefix.is_none_or(|p| p.len() <= 253 && p.split('.').all(label))
}

fn valid_value(v: &str) -> bool {
    v.is_empty() || valid_name_part(v)
}

/// Splits on commas that are not inside parentheses.
fn split_top(s: &str) -> Result<Vec<&str>, String> {
    let (mut depth, mut start, mut out) = (0i32, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        if !(0..=1).contains(&depth) {
            return Err("unbalanced parentheses".into());
        }
    }
    if depth != 0 {
        return Err("unbalanced parentheses".into());
    }
    out.push(&s[start..]);
    Ok(out)
}

fn parse_requirement(part: &str) -> Result<Requirement, String> {
    let p = part.trim();
    let key = |k: &str| -> Result<String, String> {
        let k = k.trim();
        if valid_key(k) {
            Ok(k.to_string())
        } else {
            Err(format!("invalid label key {k:?}"))
        }
    };
    let value = |v: &str| -> Result<String, String> {
        let v = v.trim();
        if valid_value(v) {
            Ok(v.to_string())
        } else {
            Err(format!("invalid label value {v:?}"))
        }
    };
    if let Some(k) = p.strip_prefix('!') {
        return Ok(Requirement::NotExists(key(k)?));
    }
    if let Some((k, v)) = p.split_once("!=") {
        return Ok(Requirement::NotEq(key(k)?, value(v)?));
    }
    if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
        return Ok(Requirement::Eq(key(k)?, value(v)?));
    }
    for (op, notin) in [(" notin ", true), (" in ", false)] {
        if let Some((k, set)) = p.split_once(op) {
            let set = set.trim();
            let inner = set
                .strip_prefix('(')
                .and_then(|s| s.strip_suffix(')'))
                .ok_or_else(|| format!("expected a parenthesised set after {:?}", op.trim()))?;
            let values = inner.split(',').map(value).collect::<Result<Vec<_>, _>>()?;
            return Ok(if notin {
                Requirement::NotIn(key(k)?, values)
            } else {
                Requirement::In(key(k)?, values)
            });
        }
    }
    Ok(Requirement::Exists(key(p)?))
}

/// Stakater Reloader's legacy forms of a requirement, as its
/// `--namespace-selector` and `--resource-label-selector` convert them
/// (`GetNamespaceLabelSelector`): `k:v` is `k=v`, and `k:*` and `k=*` are
/// `k` (the label exists, any value). Neither `:` nor `*` can appear in a
/// valid selector's keys or values, so no valid selector changes meaning.
/// The selector with its requirements converted, `None` when none was.
fn reloader_legacy(s: &str) -> Option<String> {
    let parts = split_top(s).ok()?;
    let mut changed = false;
    let converted: Vec<String> = parts
        .iter()
        .map(|part| {
            let p = part.trim();
            let legacy = if p.contains('(') {
                None
            } else if let Some((k, v)) = p.split_once(':') {
                Some(match v.trim() {
                    "*" => k.trim().to_string(),
                    v => format!("{}={v}", k.trim()),
                })
            } else {
                p.split_once('=')
                    .filter(|(k, v)| v.trim() == "*" && !k.ends_with('!') && !k.contains('='))
                    .map(|(k, _)| k.trim().to_string())
            };
            match legacy {
                Some(l) => {
                    changed = true;
                    l
                }
                None => part.to_string(),
            }
        })
        .collect();
    changed.then(|| converted.join(","))
}

impl FromStr for LabelSelector {
    type Err = String;
    /// The string form, and Reloader's legacy forms (`k:v`, `k:*`, `k=*`;
    /// see [`reloader_legacy`]), which [`LabelSelector::as_str`] then
    /// gives converted, as the API server must get them.
    fn from_str(s: &str) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Ok(LabelSelector::default());
        }
        let raw = reloader_legacy(s).unwrap_or_else(|| s.to_string());
        let reqs = split_top(&raw)
            .and_then(|parts| parts.into_iter().map(parse_requirement).collect())
            .map_err(|e| format!("invalid label selector {s:?}: {e}"))?;
        Ok(LabelSelector { raw, reqs })
    }
}

impl<'de> serde::Deserialize<'de> for LabelSelector {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        String::deserialize(d)?
            .parse()
            .map_err(serde::de::Error::custom)
    }
}

impl schemars::JsonSchema for LabelSelector {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "LabelSelector".into()
    }
    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "A Kubernetes label selector in its string form: a=b, a!=b, a in (x,y), a notin (x), a, !a, joined by commas.",
            "type": "string"
        })
    }
}

impl serde::Serialize for LabelSelector {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.raw)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What kube-apiserver refuses (400 on every list and watch) is refused
    /// when the manifest is read, not retried forever by the watch loop.
    #[test]
    fn keys_and_values_follow_kubes_rules() {
        for bad in [
            "app=-web",
            "app=web_",
            "-app=web",
            "a/b/c=x",
            "Example.com/x=y",
            "example.com/=y",
            "app in (web, .x)",
        ] {
            assert!(bad.parse::<LabelSelector>().is_err(), "{bad} accepted");
        }
        for good in [
            "app=",
            "app=web-1",
            "example.com/tier=a.b_c",
            "spring.cloud.kubernetes.config=true",
            "!x.io/y",
            "app in (a,b)",
        ] {
            assert!(good.parse::<LabelSelector>().is_ok(), "{good} refused");
        }
    }

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn matching() {
        let l = labels(&[
            ("app", "web"),
            ("tier", "front"),
            ("spring.cloud.kubernetes.config", "true"),
        ]);
        for (sel, want) in [
            ("", true),
            ("app=web", true),
            ("app==web,tier=front", true),
            ("app!=web", false),
            ("app in (api, web)", true),
            ("app notin (web)", false),
            ("missing notin (x)", true),
            ("tier", true),
            ("!tier", false),
            ("!missing", true),
            ("spring.cloud.kubernetes.config=true", true),
            ("app in (api),tier", false),
        ] {
            let s: LabelSelector = sel.parse().unwrap();
            assert_eq!(s.matches(&l), want, "{sel}");
        }
    }

    #[test]
    fn contradictions_are_found_within_and_across_selectors() {
        let sel = |s: &str| s.parse::<LabelSelector>().unwrap();
        let never = |s: &[&str]| {
            let sels: Vec<LabelSelector> = s.iter().map(|s| sel(s)).collect();
            LabelSelector::never_matches(&sels.iter().collect::<Vec<_>>())
        };
        assert_eq!(
            never(&["a=true,a=false"]).unwrap(),
            r#"label "a" cannot satisfy "a=true" and "a=false" at once"#
        );
        assert!(never(&["team=shop", "team=billing"]).is_some());
        assert!(never(&["a in (x,y)", "a notin (x,y)"]).is_some());
        assert!(never(&["a", "!a"]).is_some());
        assert!(never(&["a=x", "!a"]).is_some());
        for fine in [
            &["a=true,b=false"][..],
            &["a in (x,y)", "a notin (x)"],
            &["a!=x", "!a"],
            &["a", "a!=x"],
            &["team=shop", "team=shop,tier"],
            &[""],
        ] {
            assert_eq!(never(fine), None, "{fine:?}");
        }
    }

    /// Reloader's `--namespace-selector` / `--resource-label-selector`
    /// values as its `GetNamespaceLabelSelector` converts them.
    #[test]
    fn reloaders_legacy_forms_are_converted() {
        for (given, want) in [
            ("reloader:enabled", "reloader=enabled"),
            ("reloader:*", "reloader"),
            ("reloader=*", "reloader"),
            ("team:shop, env:*", "team=shop,env"),
            (
                "example.com/team:shop,tier=front",
                "example.com/team=shop,tier=front",
            ),
            ("app in (a,b),team:shop", "app in (a,b),team=shop"),
            // Valid selectors are left as they are.
            ("team=shop, env", "team=shop, env"),
            ("app in (a,b)", "app in (a,b)"),
        ] {
            let s: LabelSelector = given.parse().unwrap();
            assert_eq!(s.as_str(), want, "{given}");
            assert_eq!(s, want.parse().unwrap(), "{given}");
        }
        let l = labels(&[("reloader", "enabled")]);
        assert!("reloader:*".parse::<LabelSelector>().unwrap().matches(&l));
        assert!(!"reloader:off".parse::<LabelSelector>().unwrap().matches(&l));
        // Still refused: what no form makes valid.
        for bad in ["a!=*", "a:b:c", "a=b:c", "a==*"] {
            let e = bad.parse::<LabelSelector>().unwrap_err();
            assert!(
                e.starts_with(&format!("invalid label selector {bad:?}")),
                "{e}"
            );
        }
    }

    #[test]
    fn errors_name_the_selector() {
        let e = "app in web".parse::<LabelSelector>().unwrap_err();
        assert!(e.contains("invalid label selector \"app in web\""), "{e}");
        assert!("a=(b".parse::<LabelSelector>().is_err());
        assert!(
            "a b=c"
                .parse::<LabelSelector>()
                .unwrap_err()
                .contains("invalid label key")
        );
        assert!(
            "a=b c"
                .parse::<LabelSelector>()
                .unwrap_err()
                .contains("invalid label value")
        );
    }
}
