//! How a term's saves are going, told where operators look (issue 32):
//! without it, a save refused for good (a 403) stopped every checkpoint
//! while `wasmwatch_checkpoint_lag_versions` stayed 0. No I/O: the shell
//! feeds each save's outcome and reports what this returns.

use std::time::Duration;

use tokio::time::Instant;

/// Failed saves in a row before a Warning Event: one failure is a blip
/// (retried at the next tick), three are a state nobody is storing.
pub const REPORT_AFTER: u32 = 3;

/// The saves of one term.
#[derive(Debug, Clone)]
pub struct SaveHealth {
    /// The last successful save (the term's start before the first).
    last_ok: Instant,
    failed_in_a_row: u32,
}

impl SaveHealth {
    pub fn new(now: Instant) -> Self {
        SaveHealth {
            last_ok: now,
            failed_in_a_row: 0,
        }
    }

    /// Feeds one save's outcome (`Err` with the error's text). Returns the
    /// Warning to report when failures in a row reach [`REPORT_AFTER`]:
    /// once per streak, with the cause.
    pub fn saved(&mut self, outcome: Result<(), &str>, now: Instant) -> Option<String> {
        match outcome {
            Ok(()) => {
                self.last_ok = now;
                self.failed_in_a_row = 0;
                None
            }
            Err(e) => {
                self.failed_in_a_row += 1;
                (self.failed_in_a_row == REPORT_AFTER).then(|| {
                    format!(
                        "{} saves of the checkpoints and index failed in a row; nothing \
                         is stored since {}s ago, a new leader would replay from there: {}",
                        self.failed_in_a_row,
                        self.age(now).as_secs(),
                        explain(e)
                    )
                })
            }
        }
    }

    /// Time since the last successful save, while saves fail; zero once
    /// the last save succeeded (a term with nothing to save does not save,
    /// and is not behind).
    pub fn age(&self, now: Instant) -> Duration {
        if self.failed_in_a_row == 0 {
            return Duration::ZERO;
        }
        now.saturating_duration_since(self.last_ok)
    }

    /// Failed saves since the last successful one.
    pub fn failed_in_a_row(&self) -> u32 {
        self.failed_in_a_row
    }
}

/// An API error's text with what an operator should know about it: a 403
/// from a namespace being deleted is not RBAC (the API server's
/// NamespaceLifecycle refuses new objects there), any other 403 is a
/// missing grant, named by the API server's message (verb, resource, name).
pub fn explain(error: &str) -> String {
    // kube's text of an API error repeats the Status as debug output.
    let error = error.split(" (Status {").next().unwrap_or(error);
    let lower = error.to_ascii_lowercase();
    if lower.contains("because it is being terminated") {
        format!("{error} (the namespace is being deleted; this is not RBAC)")
    } else if lower.contains("forbidden") {
        format!("{error} (RBAC: see deploy/base/leases-rbac.yaml for what the state needs)")
    } else {
        error.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_warning_once_per_streak_of_failures_and_the_age_since_the_last_save() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut h = SaveHealth::new(t0);
        assert_eq!(h.saved(Ok(()), at(2)), None);
        assert_eq!(h.age(at(60)), Duration::ZERO, "nothing failed: not behind");
        let denied = r#"leases.coordination.k8s.io "wasmwatch-state" is forbidden: User "x" cannot update resource "leases""#;
        assert_eq!(h.saved(Err(denied), at(4)), None);
        assert_eq!(h.saved(Err(denied), at(6)), None);
        let w = h.saved(Err(denied), at(8)).expect("the third in a row");
        assert!(w.starts_with("3 saves of the checkpoints and index failed in a row; nothing is stored since 6s ago"), "{w}");
        assert!(
            w.contains("cannot update resource \"leases\"") && w.contains("(RBAC:"),
            "{w}"
        );
        assert_eq!(h.age(at(9)), Duration::from_secs(7));
        assert_eq!(h.failed_in_a_row(), 3);
        assert_eq!(h.saved(Err(denied), at(10)), None, "once per streak");
        assert_eq!(h.saved(Ok(()), at(12)), None);
        assert_eq!(h.age(at(12)), Duration::ZERO);
        for s in [14, 16] {
            assert_eq!(h.saved(Err("timeout"), at(s)), None);
        }
        assert!(h.saved(Err("timeout"), at(18)).is_some(), "a new streak");
    }

    #[test]
    fn a_namespace_being_deleted_is_not_taken_for_rbac() {
        let e = r#"leases.coordination.k8s.io "wasmwatch-state-segment-3" is forbidden: unable to create new content in namespace wasmwatch because it is being terminated"#;
        assert!(explain(e).ends_with("(the namespace is being deleted; this is not RBAC)"));
        assert_eq!(explain("connection reset"), "connection reset");
    }
}
