//! What a new leader may trust of the stored index (issue 33), stored in
//! the state Lease beside it and committed with it:
//!
//! ```text
//! wasmwatch.io/index-trust: |
//!   term replica-a/7 0b5a…(the leader Lease's UID)
//!   configmap-at default=1200,prod=1187
//!   configmap-unhandled prod/app-config prod/feature-flags
//! ```
//!
//! Per stream (kind and namespace), the version its watch had got to when
//! the stored index part was taken (`at`), and the objects whose content
//! as stored may not have reached the apps (`unhandled`: changes still in
//! their turns, retries or pipeline at the save, or not verified since a
//! claim). A successor skips a replayed change up to `at` of any other
//! object (see [`crate::watchloop::WatchLoop::trusting`]): a SIGTERM
//! handover then replays only what was not handled, not every change
//! after the checkpoint.
//!
//! A stream with no `at` is not trusted (every object unverified, as
//! before this existed). The `term` line binds it to the state as this
//! binary wrote it: a binary from before it keeps the annotation as found
//! while it leads, and the next claim, finding another term stored, drops
//! it. Text over a kilobyte is packed ([`super::segments::pack`]); past
//! [`TRUST_BYTES`] packed, or [`MAX_UNHANDLED`] names a stream, nothing is
//! trusted.

use std::collections::{BTreeMap, BTreeSet};

use wasmwatch_core::{ObjectKind, Scope};

use super::{Checkpoints, segments};
use crate::watchloop::Trusted;

/// The state Lease's annotation.
pub const TRUST_ANNOTATION: &str = "wasmwatch.io/index-trust";

/// Most objects named unhandled per stream; more, and the stream is not
/// trusted (a backlog that large replays its changes anyway).
pub const MAX_UNHANDLED: usize = 1_000;

/// Largest annotation value, packed (the index's tail has 16 KiB of the
/// Lease's 256 KiB of annotations).
pub const TRUST_BYTES: usize = 32 * 1024;

/// Per stream, the objects whose stored content may not have reached the
/// apps; `None`: every object (too many to name, or not known).
pub type Unhandled = BTreeMap<(ObjectKind, Scope), Option<BTreeSet<(String, String)>>>;

/// A kind's name in the annotation: `configmap`, `secret`, or a custom
/// kind's `apiVersion/Kind` (issue 34 §1).
fn kind_key(kind: ObjectKind) -> String {
    match kind {
        ObjectKind::Custom(k) => k.name().to_string(),
        builtin => builtin.as_str().to_ascii_lowercase(),
    }
}

/// The kind [`kind_key`] names (a custom kind is interned).
fn kind_of_key(key: &str) -> Option<ObjectKind> {
    match key {
        "configmap" => Some(ObjectKind::ConfigMap),
        "secret" => Some(ObjectKind::Secret),
        other if other.contains('/') => ObjectKind::parse(other).ok(),
        _ => None,
    }
}

/// The annotation's content.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Trust {
    /// `holder/transitions lease-uid` of the term that wrote it.
    pub term: String,
    /// Per stream trusted, where its stored index part was taken.
    pub at: Checkpoints,
    pub unhandled: BTreeMap<ObjectKind, BTreeSet<(String, String)>>,
}

impl Trust {
    /// What a save commits: the streams of `unhandled` named (not `None`)
    /// whose stored part's version `at` knows.
    pub fn of(term: String, at: &Checkpoints, unhandled: &Unhandled) -> Trust {
        let mut trust = Trust {
            term,
            ..Default::default()
        };
        for ((kind, scope), names) in unhandled {
            if let (Some(names), Some(v)) = (names, at.get(*kind, scope)) {
                trust.at.set(*kind, scope, v);
                if !names.is_empty() {
                    trust
                        .unhandled
                        .entry(*kind)
                        .or_default()
                        .extend(names.iter().cloned());
                }
            }
        }
        trust
    }

    /// What a stream of `kind` and `scope` resuming with the stored index
    /// may trust.
    pub fn trusted(&self, kind: ObjectKind, scope: &Scope) -> Option<Trusted> {
        let at = self.at.get(kind, scope)?.parse().ok()?;
        let unhandled = self
            .unhandled
            .get(&kind)
            .map(|names| {
                names
                    .iter()
                    .filter(|(ns, _)| scope.contains(ns))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        Some(Trusted { at, unhandled })
    }

    /// The annotation's value; `None` when it trusts nothing or is too
    /// large.
    pub fn format(&self) -> Option<String> {
        let mut text = format!("term {}\n", self.term);
        let mut any = false;
        for kind in ObjectKind::known() {
            let Some(at) = self.at.format(kind) else {
                continue;
            };
            any = true;
            let name = kind_key(kind);
            text.push_str(&format!("{name}-at {at}\n"));
            let names = self.unhandled.get(&kind).into_iter().flatten();
            let names: Vec<String> = names.map(|(ns, n)| format!("{ns}/{n}")).collect();
            if !names.is_empty() {
                text.push_str(&format!("{name}-unhandled {}\n", names.join(" ")));
            }
        }
        if !any {
            return None;
        }
        if text.len() <= 1024 {
            return Some(text);
        }
        let packed = segments::pack(&text);
        (packed.len() <= TRUST_BYTES).then_some(packed)
    }

    pub fn parse(value: &str) -> Result<Trust, String> {
        let text = segments::unpack(value)?;
        let mut trust = Trust::default();
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (key, rest) = line.split_once(' ').unwrap_or((line, ""));
            if key == "term" {
                trust.term = rest.to_string();
                continue;
            }
            let Some((kind, what)) = key.rsplit_once('-') else {
                return Err(format!("{TRUST_ANNOTATION}: cannot read {line:?}"));
            };
            let kind = kind_of_key(kind)
                .ok_or_else(|| format!("{TRUST_ANNOTATION}: unknown kind in {line:?}"))?;
            match what {
                "at" => trust
                    .at
                    .parse_into(kind, rest)
                    .map_err(|e| format!("{TRUST_ANNOTATION}: {e}"))?,
                "unhandled" => {
                    let names = trust.unhandled.entry(kind).or_default();
                    for name in rest.split_whitespace() {
                        let (ns, n) = name.split_once('/').ok_or_else(|| {
                            format!("{TRUST_ANNOTATION}: {name:?} is not namespace/name")
                        })?;
                        names.insert((ns.to_string(), n.to_string()));
                    }
                }
                _ => return Err(format!("{TRUST_ANNOTATION}: cannot read {line:?}")),
            }
        }
        if trust.term.is_empty() {
            return Err(format!("{TRUST_ANNOTATION}: no term"));
        }
        Ok(trust)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> BTreeSet<(String, String)> {
        list.iter()
            .map(|n| {
                let (ns, n) = n.split_once('/').unwrap();
                (ns.to_string(), n.to_string())
            })
            .collect()
    }

    /// A custom kind's streams are trusted like ConfigMaps' (issue 34 §1),
    /// under its `apiVersion/Kind`, whatever `-` its group holds.
    #[test]
    fn a_custom_kinds_trust_round_trips() {
        let kind = ObjectKind::parse("secrets-store.csi.x-k8s.io/v1/SecretProviderClassPodStatus")
            .unwrap();
        let prod = Scope::from_key("prod");
        let mut at = Checkpoints::default();
        at.set(kind, &prod, "42");
        let unhandled: Unhandled = [(
            (kind, prod.clone()),
            Some(names(&["prod/api-1-prod-vault"])),
        )]
        .into();
        let trust = Trust::of("a/3 uid".into(), &at, &unhandled);
        let text = trust.format().unwrap();
        assert!(
            text.contains(
                "secrets-store.csi.x-k8s.io/v1/SecretProviderClassPodStatus-at prod=42\n"
            ),
            "{text}"
        );
        let read = Trust::parse(&text).unwrap();
        assert_eq!(read, trust);
        assert_eq!(
            read.trusted(kind, &prod),
            Some(Trusted {
                at: 42,
                unhandled: names(&["prod/api-1-prod-vault"])
            })
        );
        assert!(Trust::parse("term a/1 u\nPolicy-at prod=1").is_err());
    }

    #[test]
    fn a_trust_round_trips_and_names_only_streams_it_knows() {
        let mut at = Checkpoints::default();
        let (prod, dev, gone) = (
            Scope::from_key("prod"),
            Scope::from_key("dev"),
            Scope::from_key("gone"),
        );
        at.set(ObjectKind::ConfigMap, &prod, "120");
        at.set(ObjectKind::ConfigMap, &dev, "118");
        at.set(ObjectKind::Secret, &prod, "99");
        let unhandled: Unhandled = [
            (
                (ObjectKind::ConfigMap, prod.clone()),
                Some(names(&["prod/app"])),
            ),
            // Too many to name: not trusted.
            ((ObjectKind::ConfigMap, dev.clone()), None),
            ((ObjectKind::Secret, prod.clone()), Some(BTreeSet::new())),
            // No stored part known: not trusted.
            ((ObjectKind::Secret, gone.clone()), Some(BTreeSet::new())),
        ]
        .into();
        let trust = Trust::of("a/3 uid".into(), &at, &unhandled);
        let text = trust.format().unwrap();
        assert_eq!(
            text,
            "term a/3 uid\nconfigmap-at prod=120\nconfigmap-unhandled prod/app\nsecret-at prod=99\n"
        );
        let read = Trust::parse(&text).unwrap();
        assert_eq!(read, trust);
        assert_eq!(
            read.trusted(ObjectKind::ConfigMap, &prod),
            Some(Trusted {
                at: 120,
                unhandled: names(&["prod/app"])
            })
        );
        assert_eq!(read.trusted(ObjectKind::ConfigMap, &dev), None);
        assert_eq!(
            read.trusted(ObjectKind::Secret, &prod).map(|t| t.at),
            Some(99)
        );
        assert_eq!(read.trusted(ObjectKind::Secret, &gone), None);
    }

    #[test]
    fn a_long_list_packs_and_nothing_trusted_writes_nothing() {
        let scope = Scope::from_key("prod");
        let mut at = Checkpoints::default();
        at.set(ObjectKind::ConfigMap, &scope, "7");
        let many: BTreeSet<(String, String)> = (0..MAX_UNHANDLED)
            .map(|i| ("prod".to_string(), format!("config-{i}")))
            .collect();
        let unhandled: Unhandled =
            [((ObjectKind::ConfigMap, scope.clone()), Some(many.clone()))].into();
        let text = Trust::of("a/1 u".into(), &at, &unhandled).format().unwrap();
        assert!(text.starts_with("z1:") && text.len() < TRUST_BYTES);
        let read = Trust::parse(&text).unwrap();
        assert_eq!(read.unhandled[&ObjectKind::ConfigMap], many);
        let none: Unhandled = [((ObjectKind::ConfigMap, scope), None)].into();
        assert_eq!(Trust::of("a/1 u".into(), &at, &none).format(), None);
        assert!(Trust::parse("configmap-at prod=7").is_err(), "no term");
        assert!(Trust::parse("term a/1 u\nconfigmap-unhandled prod").is_err());
    }
}
