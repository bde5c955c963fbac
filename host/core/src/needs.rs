//! What a plugin needs granted to do its work, as the plugin declares it,
//! and the check of a manifest entry's capabilities against it.
//!
//! The declaration is a custom section of the component named
//! `wasmwatch:needs` ([`SECTION`]) holding JSON:
//!
//! ```json
//! {"refresh": ["{namespace}"],
//!  "bus": ["{config.connection}/{config.destination|springCloudBus}"]}
//! ```
//!
//! - `refresh`, `restart`: namespaces the plugin refreshes Services or
//!   restarts workloads in; `{namespace}` stands for each namespace its
//!   events come from (`watch.namespaces` and its `events.namespaces`);
//! - `bus`: `connection/destination` pairs it publishes to;
//! - `http`: URLs it calls;
//! - `events`: it emits Kubernetes Events; `secretValues`: it reads Secret
//!   values;
//! - `metadata`: the labels and annotations of the changed object it reads
//!   (`{"labels": [...], "annotations": [...]}`, keys; a key ending in `*`
//!   stands for every key it starts). When every plugin of a kind declares
//!   it, the stored index keeps only those (and the keys the manifest's
//!   label selectors name): a deletion found at a resync still carries
//!   what routes it, and a large cluster's index stays small. Undeclared:
//!   everything is kept;
//! - `only`: host-side prefilters, conditions every object the plugin is
//!   called for meets (see [`crate::prefilter`]): a change failing one
//!   costs no call.
//!
//! In any string, `{config.KEY}` is the string (or number) `KEY` of the
//! plugin's `config`, and `{config.KEY|DEFAULT}` the same with a default;
//! `KEY` may be a dotted path into nested objects (`webhook.url`). A
//! need whose config value is missing is not checked (the plugin's own
//! `check-config` says what is wrong). A guard `{config.KEY=A,B}` (or
//! `{config.KEY|DEFAULT=A,B}`) stands for nothing when the value is one of
//! `A`, `B`, and otherwise skips the need, so a need can depend on the
//! plugin's mode: `{config.mode|restart=restart,alert}{namespace}`. Keys a
//! host does not know are ignored, so a plugin may declare more than an
//! older host checks.
//!
//! A section, not a `check-config` result: it is data read from the
//! component's bytes, so it changes nothing in the plugin contract (the WIT
//! world), costs no call into the sandbox, and plugins without it (every
//! plugin built before it, or whose toolchain cannot add one) load as before,
//! unchecked.
use serde::{Deserialize, Serialize};

use crate::capability::{BusPattern, Capabilities};
use crate::event::ObjectKind;
use crate::manifest::{Manifest, PluginEntry, Problem};

/// The name of the custom section holding a plugin's [`Needs`].
pub const SECTION: &str = "wasmwatch:needs";

/// What a plugin declares it needs granted.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Needs {
    #[serde(default)]
    pub http: Vec<String>,
    #[serde(default)]
    pub refresh: Vec<String>,
    #[serde(default)]
    pub bus: Vec<String>,
    #[serde(default)]
    pub restart: Vec<String>,
    #[serde(default)]
    pub events: bool,
    #[serde(default)]
    pub secret_values: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metadata: Option<MetadataReads>,
    /// Host-side prefilters: conditions every object the plugin is called
    /// for meets ([`crate::prefilter`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub only: Vec<String>,
}

/// The labels and annotations of the changed object a plugin reads.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct MetadataReads {
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default)]
    pub annotations: Vec<String>,
}

impl MetadataReads {
    /// The keys with `{config...}` placeholders filled from `config`; a key
    /// whose placeholder has no value (and no default) is left out.
    pub fn expanded(&self, config: &serde_json::Value) -> MetadataReads {
        let fill = |keys: &[String]| keys.iter().filter_map(|k| expand(k, config)).collect();
        MetadataReads {
            labels: fill(&self.labels),
            annotations: fill(&self.annotations),
        }
    }
}

/// Stands for each namespace the plugin's events come from.
pub const EVENT_NAMESPACE: &str = "{namespace}";

impl Needs {
    /// The declaration in a component's (or core module's) bytes, if it has
    /// one; an error when the binary cannot be read or the section is not
    /// valid JSON of this form.
    pub fn from_wasm(bytes: &[u8]) -> Result<Option<Needs>, String> {
        let sections = custom_sections(bytes, SECTION)?;
        let Some(first) = sections.first() else {
            return Ok(None);
        };
        if sections.len() > 1 {
            return Err(format!(
                "{} custom sections {SECTION:?}; declare it once",
                sections.len()
            ));
        }
        serde_json::from_slice(first)
            .map(Some)
            .map_err(|e| format!("custom section {SECTION:?} is not valid: {e}"))
    }

    /// Whether it declares nothing.
    pub fn is_empty(&self) -> bool {
        *self == Needs::default()
    }
}

/// The payloads of the custom sections named `name` in a Wasm binary,
/// core modules and components nested in a component included.
pub fn custom_sections<'a>(bytes: &'a [u8], name: &str) -> Result<Vec<&'a [u8]>, String> {
    let mut out = Vec::new();
    scan(bytes, name, &mut out, 0)?;
    Ok(out)
}

fn scan<'a>(
    bytes: &'a [u8],
    name: &str,
    out: &mut Vec<&'a [u8]>,
    depth: u32,
) -> Result<(), String> {
    if depth > 16 {
        return Err("components nested too deep".into());
    }
    if bytes.len() < 8 || &bytes[..4] != b"\0asm" {
        return Err("not a WebAssembly binary".into());
    }
    // Modules: version 1, layer 0; components: layer 1.
    let component = bytes[6..8] == [1, 0];
    let mut rest = &bytes[8..];
    while let Some((&id, after)) = rest.split_first() {
        let (size, after) = leb_u32(after).ok_or("a truncated section header")?;
        let size = size as usize;
        if after.len() < size {
            return Err("a truncated section".into());
        }
        let (payload, next) = after.split_at(size);
        match id {
            0 => {
                let (len, p) = leb_u32(payload).ok_or("a truncated custom section name")?;
                let len = len as usize;
                if p.len() < len {
                    return Err("a truncated custom section name".into());
                }
                if &p[..len] == name.as_bytes() {
                    out.push(&p[len..]);
                }
            }
            // A core module (section 1) or a component (section 4) inside
            // a component.
            1 | 4 if component => scan(payload, name, out, depth + 1)?,
            _ => {}
        }
        rest = next;
    }
    Ok(())
}

fn leb_u32(bytes: &[u8]) -> Option<(u32, &[u8])> {
    let mut value: u32 = 0;
    for (i, &b) in bytes.iter().enumerate().take(5) {
        value |= u32::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            return Some((value, &bytes[i + 1..]));
        }
    }
    None
}

/// `template` with `{config.KEY}` / `{config.KEY|DEFAULT}` replaced from
/// `config` (`KEY` a name, or a dotted path into nested objects), and
/// guards `{config.KEY=A,B}` / `{config.KEY|DEFAULT=A,B}` replaced by
/// nothing; `None` when a key is missing and has no default, or when a
/// guard's value is none of its list.
pub(crate) fn expand(template: &str, config: &serde_json::Value) -> Option<String> {
    let mut out = String::new();
    let mut rest = template;
    while let Some(start) = rest.find("{config.") {
        out.push_str(&rest[..start]);
        let after = &rest[start + "{config.".len()..];
        let end = after.find('}')?;
        let (lookup, guard) = match after[..end].split_once('=') {
            Some((l, g)) => (l, Some(g)),
            None => (&after[..end], None),
        };
        let (key, default) = match lookup.split_once('|') {
            Some((k, d)) => (k, Some(d)),
            None => (lookup, None),
        };
        let found = config
            .get(key)
            .or_else(|| key.split('.').try_fold(config, |v, part| v.get(part)));
        let value = match found {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_))) => v.to_string(),
            _ => default?.to_string(),
        };
        match guard {
            Some(list) if !list.split(',').any(|v| v == value) => return None,
            Some(_) => {}
            None => out.push_str(&value),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Some(out)
}

/// The namespaces a plugin's events come from: `None` for every namespace.
pub(crate) fn event_namespaces(manifest: &Manifest, p: &PluginEntry) -> Option<Vec<String>> {
    let all = |l: &[String]| l.iter().any(|n| n == "*");
    match (all(&manifest.watch.namespaces), all(&p.events.namespaces)) {
        (true, true) => None,
        (true, false) => Some(p.events.namespaces.clone()),
        (false, true) => Some(manifest.watch.namespaces.clone()),
        (false, false) => Some(
            p.events
                .namespaces
                .iter()
                .filter(|n| manifest.watch.namespaces.contains(n))
                .cloned()
                .collect(),
        ),
    }
}

fn quoted(list: &[String]) -> String {
    let items: Vec<String> = list.iter().map(|n| format!("{n:?}")).collect();
    format!("[{}]", items.join(", "))
}

/// Where the capabilities of `manifest.plugins[index]` fall short of what
/// the plugin declares it needs: each a warning naming the capability's
/// field, what the plugin does, and what to grant.
pub fn shortfalls(manifest: &Manifest, index: usize, needs: &Needs) -> Vec<Problem> {
    let p = &manifest.plugins[index];
    let at = format!("plugins[{index}].capabilities");
    let caps: &Capabilities = &p.capabilities;
    let mut out = Vec::new();
    let from = event_namespaces(manifest, p);
    for (field, action, templates, grants) in [
        (
            "refresh",
            "refreshes Services",
            &needs.refresh,
            &caps.refresh,
        ),
        (
            "restart",
            "restarts workloads",
            &needs.restart,
            &caps.restart.namespaces,
        ),
    ] {
        let granted = |ns: &str| grants.iter().any(|g| g.matches(ns));
        let grant_text = quoted(&grants.iter().map(|g| g.0.clone()).collect::<Vec<_>>());
        let what = if grants.is_empty() {
            "not granted".to_string()
        } else {
            format!("grants only {grant_text}")
        };
        for t in templates {
            // Guards first: a need of a mode the config does not use is
            // skipped, `{namespace}` included.
            let Some(t) = expand(t, &p.config) else {
                continue;
            };
            if t == EVENT_NAMESPACE {
                match &from {
                    None if !grants.iter().any(|g| g.0 == "*") => out.push(Problem {
                        path: format!("{at}.{field}"),
                        message: format!(
                            "{what}, but the plugin {action} in the namespace of each event it \
                             gets, from any namespace (watch.namespaces, plugins[{index}].events.namespaces): \
                             {} would be refused; grant {field}: [\"*\"] or name the namespaces in events.namespaces",
                            if grants.is_empty() {
                                "every one"
                            } else {
                                "those outside the grant"
                            }
                        ),
                    }),
                    Some(list) => {
                        let missing: Vec<String> =
                            list.iter().filter(|n| !granted(n)).cloned().collect();
                        if !missing.is_empty() {
                            out.push(Problem {
                                path: format!("{at}.{field}"),
                                message: format!(
                                    "{what}, but the plugin {action} in the namespace of each event it \
                                     gets, from {}: those in {} would be refused; add them to {field}",
                                    quoted(list),
                                    quoted(&missing)
                                ),
                            });
                        }
                    }
                    None => {}
                }
            } else if !granted(&t) {
                out.push(Problem {
                    path: format!("{at}.{field}"),
                    message: format!(
                        "{what}, but the plugin {action} in namespace {t:?}: that would be refused; add it to {field}"
                    ),
                });
            }
        }
    }
    for t in &needs.bus {
        let Some(target) = expand(t, &p.config) else {
            continue;
        };
        let Ok(need) = target.parse::<BusPattern>() else {
            continue;
        };
        if !caps
            .bus
            .iter()
            .any(|g| g.matches(&need.connection, &need.destination))
        {
            out.push(Problem {
                path: format!("{at}.bus"),
                message: format!(
                    "{}, but the plugin publishes to {target} (per its config): that would be refused; add {target} to bus",
                    if caps.bus.is_empty() {
                        "not granted".to_string()
                    } else {
                        format!("grants only {}", quoted(&caps.bus.iter().map(|g| String::from(g.clone())).collect::<Vec<_>>()))
                    }
                ),
            });
        }
    }
    for t in &needs.http {
        let Some(url) = expand(t, &p.config) else {
            continue;
        };
        let ok = url::Url::parse(&url).is_ok_and(|u| caps.http.iter().any(|g| g.matches(&u)));
        if !ok {
            out.push(Problem {
                path: format!("{at}.http"),
                message: format!(
                    "no grant matches {url}, which the plugin calls: those calls would be refused"
                ),
            });
        }
    }
    if needs.events && !caps.events {
        out.push(Problem {
            path: format!("{at}.events"),
            message: "not granted, but the plugin emits Kubernetes Events: they would be refused; grant events: true".into(),
        });
    }
    if needs.secret_values && !caps.secret_values && p.events.kinds.contains(&ObjectKind::Secret) {
        out.push(Problem {
            path: format!("{at}.secretValues"),
            message: "false, but the plugin reads Secret values: it would see their keys only; grant secretValues: true or leave Secret out of events.kinds".into(),
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn config_placeholders() {
        let c = serde_json::json!({"connection": "rabbit", "port": 8080});
        assert_eq!(
            expand(
                "{config.connection}/{config.destination|springCloudBus}",
                &c
            )
            .as_deref(),
            Some("rabbit/springCloudBus")
        );
        assert_eq!(
            expand("http://x:{config.port}/", &c).as_deref(),
            Some("http://x:8080/")
        );
        assert_eq!(expand("{config.missing}/x", &c), None);
    }

    #[test]
    fn metadata_keys_take_their_names_from_the_config() {
        let needs: Needs = serde_json::from_str(
            r#"{"metadata": {"annotations": ["{config.annotations.match|reloader.stakater.com/match}", "wasmwatch.io/match", "{config.missing}"]}}"#,
        )
        .unwrap();
        let reads = needs.metadata.unwrap();
        assert_eq!(
            reads.expanded(&json!({})).annotations,
            ["reloader.stakater.com/match", "wasmwatch.io/match"]
        );
        assert_eq!(
            reads
                .expanded(&json!({"annotations": {"match": "acme.io/match"}}))
                .annotations,
            ["acme.io/match", "wasmwatch.io/match"]
        );
        assert!(serde_json::from_str::<Needs>(r#"{"metadata": {"label": []}}"#).is_err());
        assert_eq!(serde_json::from_str::<Needs>("{}").unwrap().metadata, None);
    }

    #[test]
    fn nested_keys_and_guards() {
        let c = serde_json::json!({"mode": "webhook", "webhook": {"url": "http://h/x"}});
        assert_eq!(
            expand("{config.webhook.url}", &c).as_deref(),
            Some("http://h/x")
        );
        assert_eq!(expand("{config.alert.url}", &c), None);
        assert_eq!(
            expand("{config.mode=webhook}{config.webhook.url}", &c).as_deref(),
            Some("http://h/x")
        );
        assert_eq!(
            expand("{config.mode|restart=restart,alert}{namespace}", &c),
            None
        );
        let restart = serde_json::json!({});
        assert_eq!(
            expand("{config.mode|restart=restart,alert}{namespace}", &restart).as_deref(),
            Some("{namespace}")
        );
        assert_eq!(expand("{config.mode=webhook}x", &restart), None);
        let alert = serde_json::json!({"mode": "alert"});
        assert_eq!(
            expand("{config.mode|restart=restart,alert}{namespace}", &alert).as_deref(),
            Some("{namespace}")
        );
    }

    #[test]
    fn sections_are_found_in_modules() {
        // A module with one custom section "wasmwatch:needs" = "{}".
        let mut m = b"\0asm\x01\0\0\0".to_vec();
        let name = SECTION.as_bytes();
        let body = [&[name.len() as u8][..], name, b"{}"].concat();
        m.push(0);
        m.push(body.len() as u8);
        m.extend_from_slice(&body);
        assert_eq!(Needs::from_wasm(&m).unwrap(), Some(Needs::default()));
        assert_eq!(Needs::from_wasm(b"\0asm\x01\0\0\0").unwrap(), None);
        assert!(Needs::from_wasm(b"nope").is_err());
    }
}
