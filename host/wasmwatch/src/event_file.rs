//! Event files for `wasmwatch plugin run`: a ConfigMap or Secret as `kubectl
//! get -o yaml` prints it, or an envelope that adds the change type:
//!
//! ```yaml
//! change: modified          # added | modified | deleted | resynced
//! replay: false             # optional
//! previous: { ... }         # optional: the last handled version, for changed keys
//! object: { ... }           # the ConfigMap or Secret
//! ```
use std::path::Path;

use anyhow::{Context, bail};
use serde_json::Value;
use wasmwatch_core::{ChangeEvent, ChangeType, ObjectSnapshot};

/// Reads an event file. `default_change` applies when the file is a bare
/// object (or an envelope without `change`).
pub fn read(path: &Path, default_change: ChangeType) -> anyhow::Result<ChangeEvent> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read event file {}", path.display()))?;
    parse(&text, default_change).with_context(|| format!("invalid event file {}", path.display()))
}

pub fn parse(text: &str, default_change: ChangeType) -> anyhow::Result<ChangeEvent> {
    let doc: Value = serde_yaml::from_str(text).context("not a YAML document")?;
    let Some(map) = doc.as_object() else {
        bail!("expected a ConfigMap or Secret, or a mapping with `object`");
    };
    if !map.contains_key("object") {
        let object = ObjectSnapshot::from_json(&doc)?;
        return Ok(ChangeEvent::new(default_change, object, None));
    }
    for key in map.keys() {
        if !["change", "replay", "previous", "object"].contains(&key.as_str()) {
            bail!("unknown field `{key}`; expected change, replay, previous or object");
        }
    }
    let change = match map.get("change") {
        None => default_change,
        Some(Value::String(s)) => s.parse().map_err(anyhow::Error::msg).context("change")?,
        Some(other) => bail!("change: expected a string, got {other}"),
    };
    let object = ObjectSnapshot::from_json(&map["object"]).context("object")?;
    let previous = match map.get("previous") {
        Some(p) => Some(ObjectSnapshot::from_json(p).context("previous")?),
        None => None,
    };
    let mut event = ChangeEvent::new(change, object, previous.as_ref());
    event.replay = match map.get("replay") {
        None => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => bail!("replay: expected true or false, got {other}"),
    };
    Ok(event)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_object_and_envelope() {
        let bare =
            "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: ns}\ndata: {k: v}\n";
        let ev = parse(bare, ChangeType::Modified).unwrap();
        assert_eq!(ev.change, ChangeType::Modified);
        assert_eq!(ev.object.name, "a");
        let env = "change: resynced\nreplay: true\nprevious: {kind: ConfigMap, metadata: {name: a}, data: {k: old}}\nobject: {kind: ConfigMap, metadata: {name: a}, data: {k: v, j: w}}\n";
        let ev = parse(env, ChangeType::Modified).unwrap();
        assert_eq!(ev.change, ChangeType::Resynced);
        assert!(ev.replay);
        assert_eq!(ev.changed_keys, vec!["j", "k"]);
    }

    #[test]
    fn errors_name_the_problem() {
        let e = parse(
            "change: updated\nobject: {kind: ConfigMap, metadata: {name: a}}",
            ChangeType::Added,
        )
        .unwrap_err();
        assert!(
            format!("{e:#}").contains("unknown change type \"updated\""),
            "{e:#}"
        );
        let e = parse("kind: Pod\nmetadata: {name: p}", ChangeType::Added).unwrap_err();
        assert!(format!("{e:#}").contains("kind \"Pod\""), "{e:#}");
        let e = parse("objekt: {}\nobject: {}", ChangeType::Added).unwrap_err();
        assert!(format!("{e:#}").contains("unknown field `objekt`"), "{e:#}");
    }
}
