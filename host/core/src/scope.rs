//! What one watch stream covers: one namespace, or all of them; and which
//! namespaces' objects are delivered ([`NamespaceScope`]).
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::selector::LabelSelector;

/// One namespace, or all of them (one cluster-wide stream). The state
/// Lease writes it as the namespace, or `*` for all ([`Scope::key`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    All,
    Namespace(String),
}

impl Scope {
    /// As the state Lease writes it: the namespace, or `*`.
    pub fn key(&self) -> &str {
        match self {
            Scope::All => "*",
            Scope::Namespace(ns) => ns,
        }
    }

    /// Reads [`Scope::key`]'s form.
    pub fn from_key(key: &str) -> Scope {
        match key {
            "*" => Scope::All,
            ns => Scope::Namespace(ns.to_string()),
        }
    }

    /// The namespace, `None` for all.
    pub fn namespace(&self) -> Option<&str> {
        match self {
            Scope::All => None,
            Scope::Namespace(ns) => Some(ns),
        }
    }

    /// Whether objects of `namespace` are in it.
    pub fn contains(&self, namespace: &str) -> bool {
        self.namespace().is_none_or(|ns| ns == namespace)
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.key())
    }
}

/// Which namespaces' objects reach the plugins, beyond `watch.namespaces`:
/// none of `watch.ignoreNamespaces`, and with `watch.namespaceSelector`
/// only those whose labels match, as a watch of Namespaces reports them.
///
/// I/O-free: the host feeds it the Namespace watch's events
/// ([`NamespaceEvent`]) and asks [`NamespaceScope::admits`] for each
/// change before routing it. A namespace is in scope from the event that
/// shows it matching until the one that shows it not matching, or gone:
/// the API server sends a watch with a label selector a `DELETED` when a
/// namespace loses the labels and an `ADDED` when it gains them, and a
/// modification with labels that do not match counts as leaving too (a
/// watch without the selector). A relist adds what it lists as it comes
/// and, once complete, drops what it did not list.
#[derive(Debug, Clone, Default)]
pub struct NamespaceScope {
    ignored: BTreeSet<String>,
    selector: Option<LabelSelector>,
    /// The namespaces whose labels match the selector, as last seen.
    selected: BTreeSet<String>,
    /// During a (re)list: the matching namespaces listed so far.
    listing: Option<BTreeSet<String>>,
    /// Whether a first list completed (always, without a selector).
    synced: bool,
}

/// What the Namespace watch saw (kube-runtime's watcher events).
#[derive(Debug, Clone, Copy)]
pub enum NamespaceEvent<'a> {
    /// A (re)list begins.
    ListStart,
    /// A namespace of the list.
    Listed {
        name: &'a str,
        labels: &'a BTreeMap<String, String>,
    },
    /// The list is complete.
    ListDone,
    /// A namespace added or modified.
    Applied {
        name: &'a str,
        labels: &'a BTreeMap<String, String>,
    },
    /// A namespace deleted, or out of the watch's selector.
    Deleted { name: &'a str },
}

/// A namespace that came into scope or left it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScopeChange {
    Entered(String),
    Left(String),
}

impl NamespaceScope {
    /// `ignored` namespaces are never in scope; with a `selector`, only
    /// the matching namespaces the watch reported are.
    pub fn new(ignored: &[String], selector: Option<LabelSelector>) -> Self {
        NamespaceScope {
            ignored: ignored.iter().cloned().collect(),
            synced: selector.is_none(),
            selector,
            ..Default::default()
        }
    }

    /// The manifest's `watch.ignoreNamespaces` and `watch.namespaceSelector`.
    pub fn of(watch: &crate::manifest::WatchSpec) -> Self {
        NamespaceScope::new(&watch.ignore_namespaces, watch.namespace_selector.clone())
    }

    /// The selector Namespaces must match, if any (then the host watches
    /// Namespaces and feeds [`NamespaceScope::handle`]).
    pub fn selector(&self) -> Option<&LabelSelector> {
        self.selector.as_ref()
    }

    /// Whether objects of `namespace` are delivered.
    pub fn admits(&self, namespace: &str) -> bool {
        !self.ignored.contains(namespace)
            && (self.selector.is_none() || self.selected.contains(namespace))
    }

    /// Whether the Namespace watch's first list is in (no selector: yes).
    pub fn is_synced(&self) -> bool {
        self.synced
    }

    /// The namespaces the selector matches (ignored ones included).
    pub fn selected(&self) -> impl Iterator<Item = &str> {
        self.selected.iter().map(String::as_str)
    }

    /// Applies one event of the Namespace watch; what came into scope or
    /// left it. Ignored namespaces never do.
    pub fn handle(&mut self, event: NamespaceEvent<'_>) -> Vec<ScopeChange> {
        let Some(selector) = &self.selector else {
            return Vec::new();
        };
        let mut changes = Vec::new();
        match event {
            NamespaceEvent::ListStart => self.listing = Some(BTreeSet::new()),
            NamespaceEvent::Listed { name, labels } => {
                if selector.matches(labels) {
                    self.listing
                        .get_or_insert_with(BTreeSet::new)
                        .insert(name.to_string());
                    self.enter(name, &mut changes);
                } else {
                    self.leave(name, &mut changes);
                }
            }
            NamespaceEvent::ListDone => {
                let listed = self.listing.take().unwrap_or_default();
                let gone: Vec<String> = self.selected.difference(&listed).cloned().collect();
                for name in gone {
                    self.leave(&name, &mut changes);
                }
                self.synced = true;
            }
            NamespaceEvent::Applied { name, labels } => {
                if selector.matches(labels) {
                    if let Some(l) = &mut self.listing {
                        l.insert(name.to_string());
                    }
                    self.enter(name, &mut changes);
                } else {
                    self.leave(name, &mut changes);
                }
            }
            NamespaceEvent::Deleted { name } => {
                if let Some(l) = &mut self.listing {
                    l.remove(name);
                }
                self.leave(name, &mut changes);
            }
        }
        changes
    }

    fn enter(&mut self, name: &str, changes: &mut Vec<ScopeChange>) {
        if self.selected.insert(name.to_string()) && !self.ignored.contains(name) {
            changes.push(ScopeChange::Entered(name.to_string()));
        }
    }

    fn leave(&mut self, name: &str, changes: &mut Vec<ScopeChange>) {
        if self.selected.remove(name) && !self.ignored.contains(name) {
            changes.push(ScopeChange::Left(name.to_string()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_round_trips_and_all_contains_every_namespace() {
        for s in [Scope::All, Scope::Namespace("prod".into())] {
            assert_eq!(Scope::from_key(s.key()), s);
        }
        assert!(Scope::All.contains("x"));
        assert!(Scope::Namespace("prod".into()).contains("prod"));
        assert!(!Scope::Namespace("prod".into()).contains("dev"));
    }

    fn labels(kv: &[(&str, &str)]) -> BTreeMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn entered(n: &str) -> ScopeChange {
        ScopeChange::Entered(n.into())
    }

    fn left(n: &str) -> ScopeChange {
        ScopeChange::Left(n.into())
    }

    #[test]
    fn without_a_selector_every_namespace_but_the_ignored_is_in_scope() {
        let mut s = NamespaceScope::new(&["kube-system".into()], None);
        assert!(s.is_synced());
        assert!(s.admits("shop"));
        assert!(!s.admits("kube-system"));
        let none = labels(&[]);
        let ev = NamespaceEvent::Applied {
            name: "shop",
            labels: &none,
        };
        assert_eq!(s.handle(ev), []);
        assert!(s.admits("shop"));
    }

    #[test]
    fn namespaces_enter_and_leave_as_their_labels_change() {
        let mut s = NamespaceScope::new(&[], Some("team=shop".parse().unwrap()));
        assert!(!s.is_synced());
        assert!(!s.admits("shop"), "nothing before the first list");
        let shop = labels(&[("team", "shop")]);
        let other = labels(&[("team", "billing")]);
        assert_eq!(s.handle(NamespaceEvent::ListStart), []);
        let listed = |name, labels| NamespaceEvent::Listed { name, labels };
        assert_eq!(s.handle(listed("a", &shop)), [entered("a")]);
        assert_eq!(s.handle(listed("b", &other)), []);
        assert_eq!(s.handle(NamespaceEvent::ListDone), []);
        assert!(s.is_synced());
        assert!(s.admits("a") && !s.admits("b"));
        // b gains the label, a loses it (a watch without the selector) ...
        let applied = |name, labels| NamespaceEvent::Applied { name, labels };
        assert_eq!(s.handle(applied("b", &shop)), [entered("b")]);
        assert_eq!(s.handle(applied("a", &other)), [left("a")]);
        assert!(!s.admits("a") && s.admits("b"));
        // ... or leaves the selector's watch as a deletion.
        assert_eq!(s.handle(NamespaceEvent::Deleted { name: "b" }), [left("b")]);
        assert!(!s.admits("b"));
        // Repeats change nothing.
        assert_eq!(s.handle(NamespaceEvent::Deleted { name: "b" }), []);
        assert_eq!(s.handle(applied("c", &shop)), [entered("c")]);
        assert_eq!(s.handle(applied("c", &shop)), []);
        assert_eq!(s.selected().collect::<Vec<_>>(), ["c"]);
    }

    #[test]
    fn a_relist_keeps_the_scope_until_it_is_complete_then_drops_what_it_missed() {
        let mut s = NamespaceScope::new(&[], Some("team".parse().unwrap()));
        let shop = labels(&[("team", "shop")]);
        s.handle(NamespaceEvent::ListStart);
        for name in ["a", "b"] {
            s.handle(NamespaceEvent::Listed {
                name,
                labels: &shop,
            });
        }
        s.handle(NamespaceEvent::ListDone);
        // The watch failed; meanwhile b lost its label and c gained one.
        assert_eq!(s.handle(NamespaceEvent::ListStart), []);
        assert_eq!(
            s.handle(NamespaceEvent::Listed {
                name: "c",
                labels: &shop
            }),
            [entered("c")]
        );
        assert!(s.admits("b"), "b stays until the list is complete");
        assert_eq!(
            s.handle(NamespaceEvent::Listed {
                name: "a",
                labels: &shop
            }),
            []
        );
        assert_eq!(s.handle(NamespaceEvent::ListDone), [left("b")]);
        assert_eq!(s.selected().collect::<Vec<_>>(), ["a", "c"]);
    }

    #[test]
    fn ignored_namespaces_never_enter_even_when_they_match() {
        let mut s = NamespaceScope::new(&["kube-system".into()], Some("team".parse().unwrap()));
        let l = labels(&[("team", "platform")]);
        let ev = NamespaceEvent::Applied {
            name: "kube-system",
            labels: &l,
        };
        assert_eq!(s.handle(ev), []);
        assert!(!s.admits("kube-system"));
        assert_eq!(
            s.handle(NamespaceEvent::Deleted {
                name: "kube-system"
            }),
            []
        );
    }

    #[test]
    fn reloaders_legacy_selector_reads_as_reloader_converts_it() {
        let mut s = NamespaceScope::new(&[], Some("reloader:enabled".parse().unwrap()));
        let on = labels(&[("reloader", "enabled")]);
        let off = labels(&[("reloader", "disabled")]);
        for (name, labels) in [("on", &on), ("off", &off)] {
            s.handle(NamespaceEvent::Applied { name, labels });
        }
        assert!(s.admits("on") && !s.admits("off"));
    }
}
