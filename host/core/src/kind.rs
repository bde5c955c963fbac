//! Watched kinds beyond ConfigMap and Secret (issue 34 §1).
//!
//! A [`CustomKind`] is an interned group/version/kind: `Copy`, compared by
//! a number, ordered and written by its canonical name
//! (`secrets-store.csi.x-k8s.io/v1/SecretProviderClassPodStatus`), so that
//! anything stored in that order does not depend on which kind was named
//! first. The registry only grows, by one entry per distinct name a
//! manifest, a stored index or a plugin names: a handful per process.
//!
//! What a kind's *content* is (the field paths whose values count as its
//! data) is not part of the kind: it comes with the manifest's
//! `watch.kinds` entry ([`crate::manifest::CustomKindSpec`]).
use std::collections::HashMap;
use std::sync::{LazyLock, RwLock};

use sha2::{Digest, Sha256};

/// A kind named by group, version and kind (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CustomKind(u32);

struct Entry {
    group: &'static str,
    version: &'static str,
    kind: &'static str,
    /// `group/version/Kind`, or `version/Kind` in the core group.
    name: &'static str,
    /// `group/version`, or `version` in the core group.
    api_version: &'static str,
    /// Lowercase kind (at most 30 characters) and 8 hex digits of a
    /// SHA-256 of `name`: short enough for annotation keys (63), and two
    /// groups' kinds of the same name differ.
    stem: &'static str,
}

#[derive(Default)]
struct Registry {
    entries: Vec<&'static Entry>,
    by_name: HashMap<&'static str, u32>,
}

static REGISTRY: LazyLock<RwLock<Registry>> = LazyLock::new(Default::default);

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

impl CustomKind {
    /// The kind `group`/`version`/`kind` (an empty group is the core group).
    pub fn intern(group: &str, version: &str, kind: &str) -> CustomKind {
        let api_version = if group.is_empty() {
            version.to_string()
        } else {
            format!("{group}/{version}")
        };
        let name = format!("{api_version}/{kind}");
        if let Some(&id) = REGISTRY
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .by_name
            .get(name.as_str())
        {
            return CustomKind(id);
        }
        let mut reg = REGISTRY.write().unwrap_or_else(|e| e.into_inner());
        if let Some(&id) = reg.by_name.get(name.as_str()) {
            return CustomKind(id);
        }
        let lower: String = kind.to_ascii_lowercase().chars().take(30).collect();
        let hash = hex::encode(&Sha256::digest(name.as_bytes())[..4]);
        let entry: &'static Entry = Box::leak(Box::new(Entry {
            group: leak(group.to_string()),
            version: leak(version.to_string()),
            kind: leak(kind.to_string()),
            api_version: leak(api_version),
            stem: leak(format!("{lower}-{hash}")),
            name: leak(name),
        }));
        let id = reg.entries.len() as u32;
        reg.entries.push(entry);
        reg.by_name.insert(entry.name, id);
        CustomKind(id)
    }

    /// The kind if it was interned already; never interns (for names a
    /// plugin makes up).
    pub fn find(group: &str, version: &str, kind: &str) -> Option<CustomKind> {
        let name = if group.is_empty() {
            format!("{version}/{kind}")
        } else {
            format!("{group}/{version}/{kind}")
        };
        let reg = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
        reg.by_name.get(name.as_str()).map(|&id| CustomKind(id))
    }

    fn entry(self) -> &'static Entry {
        REGISTRY.read().unwrap_or_else(|e| e.into_inner()).entries[self.0 as usize]
    }

    pub fn group(self) -> &'static str {
        self.entry().group
    }

    pub fn version(self) -> &'static str {
        self.entry().version
    }

    pub fn kind(self) -> &'static str {
        self.entry().kind
    }

    /// `group/version` (`version` in the core group).
    pub fn api_version(self) -> &'static str {
        self.entry().api_version
    }

    /// `group/version/Kind`, as manifests and stored indexes write it.
    pub fn name(self) -> &'static str {
        self.entry().name
    }

    /// See the field's docs: the kind's part of its annotation keys.
    pub fn stem(self) -> &'static str {
        self.entry().stem
    }

    /// Every kind interned so far, in name order.
    pub fn all() -> Vec<CustomKind> {
        let reg = REGISTRY.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<CustomKind> = (0..reg.entries.len() as u32).map(CustomKind).collect();
        all.sort_by_key(|k| reg.entries[k.0 as usize].name);
        all
    }

    /// Reads `apiVersion/Kind` (`group/version/Kind`, or `version/Kind` in
    /// the core group).
    pub fn parse(name: &str) -> Result<CustomKind, String> {
        let bad = || {
            format!(
                "{name:?} is not a kind: expected ConfigMap, Secret or apiVersion/Kind \
                 (such as secrets-store.csi.x-k8s.io/v1/SecretProviderClassPodStatus)"
            )
        };
        let (api_version, kind) = name.rsplit_once('/').ok_or_else(bad)?;
        let (group, version) = match api_version.split_once('/') {
            Some(("", _)) => return Err(bad()),
            Some((g, v)) => (g, v),
            None => ("", api_version),
        };
        let dns_ok = |s: &str| {
            s.split('.').all(|l| {
                !l.is_empty()
                    && l.len() <= 63
                    && l.bytes()
                        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            })
        };
        if version.is_empty()
            || !version
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit())
            || (!group.is_empty() && !dns_ok(group))
            || !kind.starts_with(|c: char| c.is_ascii_uppercase())
            || !kind.bytes().all(|b| b.is_ascii_alphanumeric())
        {
            return Err(bad());
        }
        Ok(CustomKind::intern(group, version, kind))
    }
}

impl PartialOrd for CustomKind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for CustomKind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if self.0 == other.0 {
            return std::cmp::Ordering::Equal;
        }
        self.name().cmp(other.name())
    }
}

impl std::fmt::Debug for CustomKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_interned_once_and_ordered_by_name() {
        let z = CustomKind::parse("zeta.example.com/v1/Thing").unwrap();
        let a = CustomKind::parse("alpha.example.com/v1/Thing").unwrap();
        assert_eq!(z, CustomKind::intern("zeta.example.com", "v1", "Thing"));
        assert!(a < z, "ordered by name, not by when interned");
        assert_eq!(z.api_version(), "zeta.example.com/v1");
        assert_eq!(z.kind(), "Thing");
        assert_ne!(z.stem(), a.stem(), "same kind in two groups");
        assert!(z.stem().starts_with("thing-"), "{}", z.stem());
        let core = CustomKind::parse("v1/Pod").unwrap();
        assert_eq!((core.group(), core.api_version()), ("", "v1"));
        let long = CustomKind::parse(&format!("x.io/v1/{}", "A".repeat(80))).unwrap();
        assert_eq!(long.stem().len(), 30 + 1 + 8);
    }

    #[test]
    fn a_malformed_name_is_refused_with_the_expected_form() {
        for bad in [
            "Thing",
            "x.io/Thing/v1",
            "X.io/v1/Thing",
            "x.io/v1/thing",
            "/v1/A",
        ] {
            let e = CustomKind::parse(bad).unwrap_err();
            assert!(e.contains("apiVersion/Kind"), "{bad}: {e}");
        }
    }
}
