//! What one watch stream covers: one namespace, or all of them.
use std::fmt;

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
}
