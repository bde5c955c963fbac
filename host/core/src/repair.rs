//! Reading a document past its errors: serde stops at the first one, so a
//! field that fails is reported, taken out of the document (or, when
//! required, replaced by a placeholder) and the document read again, until
//! it reads or no progress is made. Paths are reported as they are in the
//! text the operator wrote, also after elements of a list were taken out.
use std::collections::HashMap;

use serde::de::DeserializeOwned;
use serde_yaml::Value;

use crate::manifest::Problem;

/// One step of a field path.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Seg {
    Key(String),
    Index(usize),
}

fn display(path: &[Seg]) -> String {
    let mut out = String::new();
    for s in path {
        match s {
            Seg::Key(k) if out.is_empty() => out.push_str(k),
            Seg::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Seg::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Whether one path is the other or lies under it.
pub(crate) fn related(a: &str, b: &str) -> bool {
    let under = |long: &str, short: &str| {
        long.strip_prefix(short)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
    };
    under(a, b) || under(b, a)
}

/// The largest number of problems reported (and of documents read).
const MAX_ROUNDS: usize = 100;

/// Deserializes `value` as `T`, collecting every error it can step over.
/// Returns the value read with the faulty parts left out (`None` when the
/// errors could not be stepped over), the errors, and the paths that were
/// left out or filled in (in the document's own coordinates).
pub(crate) fn deserialize_all<T: DeserializeOwned>(
    mut value: Value,
) -> (Option<T>, Vec<Problem>, Vec<String>) {
    let mut errors = Vec::new();
    // Original paths taken out or filled in.
    let mut repaired: Vec<Vec<Seg>> = Vec::new();
    // Per list (original path): the original indices taken out of it.
    let mut removed: HashMap<Vec<Seg>, Vec<usize>> = HashMap::new();
    // Required fields filled in (original path): which placeholder.
    let mut filled: HashMap<Vec<Seg>, usize> = HashMap::new();
    let shown = |r: &Vec<Vec<Seg>>| r.iter().map(|p| display(p)).collect();
    for _ in 0..MAX_ROUNDS {
        let e = match serde_path_to_error::deserialize::<_, T>(value.clone()) {
            Ok(t) => return (Some(t), errors, shown(&repaired)),
            Err(e) => e,
        };
        let mut path: Vec<Seg> = e
            .path()
            .iter()
            .filter_map(|s| match s {
                serde_path_to_error::Segment::Seq { index } => Some(Seg::Index(*index)),
                serde_path_to_error::Segment::Map { key } => Some(Seg::Key(key.clone())),
                serde_path_to_error::Segment::Enum { variant } => Some(Seg::Key(variant.clone())),
                serde_path_to_error::Segment::Unknown => None,
            })
            .collect();
        let mut message = e.into_inner().to_string();
        // serde_yaml may prefix the enclosing mapping's path; ours is exact.
        let shown_path = display(&path);
        if let Some((prefix, rest)) = message.split_once(": ")
            && !prefix.contains(' ')
            && shown_path.starts_with(prefix)
        {
            message = rest.to_string();
        }
        if let Some(field) = quoted_after(&message, "unknown field `")
            && path.last() != Some(&Seg::Key(field.clone()))
        {
            path.push(Seg::Key(field));
        }
        let original = to_original(&path, &removed);

        if let Some(field) = quoted_after(&message, "missing field `") {
            let mut field_path = original.clone();
            field_path.push(Seg::Key(field.clone()));
            // Missing in the text (reported), or taken out by us (reported
            // already) and required: fill it in either way.
            if !repaired.contains(&field_path) {
                errors.push(Problem {
                    path: display(&original),
                    message,
                });
                repaired.push(field_path.clone());
            }
            filled.insert(field_path, 0);
            let mut at = path.clone();
            at.push(Seg::Key(field));
            if !put(&mut value, &at, PLACEHOLDERS[0]()) {
                break;
            }
            continue;
        }
        if let Some(n) = filled.get_mut(&original) {
            // A placeholder of the wrong type: the next one.
            *n += 1;
            if *n >= PLACEHOLDERS.len() || !put(&mut value, &path, PLACEHOLDERS[*n]()) {
                break;
            }
            continue;
        }
        errors.push(Problem {
            path: display(&original),
            message,
        });
        if path.is_empty() || repaired.contains(&original) {
            // The whole document, or a part already repaired: no progress.
            break;
        }
        repaired.push(original.clone());
        if !take_out(&mut value, &path, &original, &mut removed) {
            break;
        }
    }
    (None, errors, shown(&repaired))
}

/// The text between `prefix` and the next backquote, if `message` starts so.
fn quoted_after(message: &str, prefix: &str) -> Option<String> {
    let rest = message.strip_prefix(prefix)?;
    Some(rest[..rest.find('`')?].to_string())
}

/// A path of the current document in the original document's coordinates.
fn to_original(path: &[Seg], removed: &HashMap<Vec<Seg>, Vec<usize>>) -> Vec<Seg> {
    let mut out = Vec::new();
    for s in path {
        match s {
            Seg::Index(i) => {
                let gone = removed.get(&out).map(Vec::as_slice).unwrap_or(&[]);
                let mut original = 0;
                let mut seen = 0;
                loop {
                    if !gone.contains(&original) {
                        if seen == *i {
                            break;
                        }
                        seen += 1;
                    }
                    original += 1;
                }
                out.push(Seg::Index(original));
            }
            key => out.push(key.clone()),
        }
    }
    out
}

fn node_mut<'v>(value: &'v mut Value, path: &[Seg]) -> Option<&'v mut Value> {
    let mut v = value;
    for s in path {
        v = match s {
            Seg::Key(k) => v.as_mapping_mut()?.get_mut(k.as_str())?,
            Seg::Index(i) => v.as_sequence_mut()?.get_mut(*i)?,
        };
    }
    Some(v)
}

/// Removes the node at `path` (current coordinates) from its parent.
fn take_out(
    value: &mut Value,
    path: &[Seg],
    original: &[Seg],
    removed: &mut HashMap<Vec<Seg>, Vec<usize>>,
) -> bool {
    let (last, parent) = path.split_last().expect("not the root");
    let Some(parent_node) = node_mut(value, parent) else {
        return false;
    };
    match last {
        Seg::Key(k) => parent_node
            .as_mapping_mut()
            .and_then(|m| m.remove(k.as_str()))
            .is_some(),
        Seg::Index(i) => {
            let Some(seq) = parent_node.as_sequence_mut() else {
                return false;
            };
            if *i >= seq.len() {
                return false;
            }
            seq.remove(*i);
            let (Some(Seg::Index(orig)), orig_parent) =
                (original.last(), &original[..original.len() - 1])
            else {
                return false;
            };
            removed.entry(orig_parent.to_vec()).or_default().push(*orig);
            true
        }
    }
}

/// What fills in a missing required field, tried in turn until one reads.
const PLACEHOLDERS: [fn() -> Value; 4] = [
    || Value::String(String::new()),
    || Value::Sequence(Vec::new()),
    || Value::Mapping(serde_yaml::Mapping::new()),
    || Value::Bool(false),
];

/// Sets the node at `path` (current coordinates), adding a missing key.
fn put(value: &mut Value, path: &[Seg], new: Value) -> bool {
    let Some((Seg::Key(k), parent)) = path.split_last() else {
        return false;
    };
    let Some(map) = node_mut(value, parent).and_then(Value::as_mapping_mut) else {
        return false;
    };
    map.insert(Value::String(k.clone()), new);
    true
}
