//! Prometheus metrics, served as text (exposition format 0.0.4) on the
//! admin port's `/metrics`.
//!
//! A deliberately small registry: counters, gauges and histograms with
//! label sets, each family a field of [`Metrics`]. Names follow Prometheus
//! conventions (`wasmwatch_` prefix, `_total` for counters, base units).
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Type {
    Counter,
    Gauge,
    Histogram(&'static [f64]),
}

#[derive(Debug, Default, Clone)]
struct Series {
    value: f64,
    /// Histograms: cumulative counts per bucket, sum, count.
    buckets: Vec<u64>,
    sum: f64,
    count: u64,
}

/// One metric family and its series, keyed by label values.
#[derive(Debug)]
pub struct Family {
    name: &'static str,
    help: &'static str,
    kind: Type,
    labels: &'static [&'static str],
    series: Mutex<BTreeMap<Vec<String>, Series>>,
}

impl Family {
    const fn new(
        name: &'static str,
        help: &'static str,
        kind: Type,
        labels: &'static [&'static str],
    ) -> Family {
        Family {
            name,
            help,
            kind,
            labels,
            series: Mutex::new(BTreeMap::new()),
        }
    }

    fn with(&self, values: &[&str], f: impl FnOnce(&mut Series)) {
        debug_assert_eq!(values.len(), self.labels.len(), "{}", self.name);
        let key = values.iter().map(|v| v.to_string()).collect();
        let mut series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        f(series.entry(key).or_default());
    }

    /// Counter: add one.
    pub fn inc(&self, values: &[&str]) {
        self.add(values, 1.0);
    }

    pub fn add(&self, values: &[&str], by: f64) {
        self.with(values, |s| s.value += by);
    }

    /// Gauge: set.
    pub fn set(&self, values: &[&str], to: f64) {
        self.with(values, |s| s.value = to);
    }

    /// Histogram: observe one value.
    pub fn observe(&self, values: &[&str], v: f64) {
        let Type::Histogram(bounds) = self.kind else {
            return;
        };
        self.with(values, |s| {
            if s.buckets.is_empty() {
                s.buckets = vec![0; bounds.len()];
            }
            for (i, b) in bounds.iter().enumerate() {
                if v <= *b {
                    s.buckets[i] += 1;
                }
            }
            s.sum += v;
            s.count += 1;
        });
    }

    /// The current value of one series (counters and gauges), for tests.
    pub fn get(&self, values: &[&str]) -> f64 {
        let key: Vec<String> = values.iter().map(|v| v.to_string()).collect();
        self.series
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .map_or(0.0, |s| s.value)
    }

    fn render(&self, out: &mut String) {
        let kind = match self.kind {
            Type::Counter => "counter",
            Type::Gauge => "gauge",
            Type::Histogram(_) => "histogram",
        };
        let _ = writeln!(out, "# HELP {} {}", self.name, self.help);
        let _ = writeln!(out, "# TYPE {} {kind}", self.name);
        let series = self.series.lock().unwrap_or_else(|e| e.into_inner());
        for (values, s) in series.iter() {
            let labels = |extra: Option<(&str, String)>| {
                let mut parts: Vec<String> = self
                    .labels
                    .iter()
                    .zip(values)
                    .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
                    .collect();
                if let Some((k, v)) = extra {
                    parts.push(format!("{k}=\"{v}\""));
                }
                if parts.is_empty() {
                    String::new()
                } else {
                    format!("{{{}}}", parts.join(","))
                }
            };
            match self.kind {
                Type::Counter | Type::Gauge => {
                    let _ = writeln!(out, "{}{} {}", self.name, labels(None), s.value);
                }
                Type::Histogram(bounds) => {
                    for (b, c) in bounds.iter().zip(&s.buckets) {
                        let _ = writeln!(
                            out,
                            "{}_bucket{} {c}",
                            self.name,
                            labels(Some(("le", b.to_string())))
                        );
                    }
                    let _ = writeln!(
                        out,
                        "{}_bucket{} {}",
                        self.name,
                        labels(Some(("le", "+Inf".into()))),
                        s.count
                    );
                    let _ = writeln!(out, "{}_sum{} {}", self.name, labels(None), s.sum);
                    let _ = writeln!(out, "{}_count{} {}", self.name, labels(None), s.count);
                }
            }
        }
    }
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

const LATENCY: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

/// Every metric wasmwatch exports.
#[derive(Debug)]
pub struct Metrics {
    pub events_received: Family,
    pub events_handled: Family,
    pub plugin_invocations: Family,
    pub plugin_duration: Family,
    pub actions: Family,
    pub action_retries: Family,
    pub dead_letters: Family,
    pub queue_depth: Family,
    pub checkpoint_lag_versions: Family,
    pub checkpoint_lag_seconds: Family,
    pub checkpoint_writes: Family,
    pub leader: Family,
    pub leader_transitions: Family,
    pub watch_restarts: Family,
    pub resyncs: Family,
}

impl Default for Metrics {
    fn default() -> Self {
        use Type::*;
        Metrics {
            events_received: Family::new(
                "wasmwatch_events_received_total",
                "Changes delivered by the watches, per kind.",
                Counter,
                &["kind"],
            ),
            events_handled: Family::new(
                "wasmwatch_events_handled_total",
                "Changes fully handled (every action done or dead-lettered), per kind.",
                Counter,
                &["kind"],
            ),
            plugin_invocations: Family::new(
                "wasmwatch_plugin_invocations_total",
                "Plugin calls, per plugin and outcome (ok, error).",
                Counter,
                &["plugin", "outcome"],
            ),
            plugin_duration: Family::new(
                "wasmwatch_plugin_duration_seconds",
                "Time of one plugin call (fresh sandbox + handle), per plugin and outcome.",
                Histogram(LATENCY),
                &["plugin", "outcome"],
            ),
            actions: Family::new(
                "wasmwatch_actions_total",
                "Action attempts, per action type and outcome (done, retrying, dead_lettered, abandoned).",
                Counter,
                &["type", "outcome"],
            ),
            action_retries: Family::new(
                "wasmwatch_action_retries_total",
                "Action attempts that failed and will be retried, per action type.",
                Counter,
                &["type"],
            ),
            dead_letters: Family::new(
                "wasmwatch_dead_letters_total",
                "Actions given up after their retry budget or a permanent failure, per action type.",
                Counter,
                &["type"],
            ),
            queue_depth: Family::new(
                "wasmwatch_queue_depth",
                "Actions waiting for their debounce window or running.",
                Gauge,
                &[],
            ),
            checkpoint_lag_versions: Family::new(
                "wasmwatch_checkpoint_lag_versions",
                "Changes received but not yet passed by the checkpoint.",
                Gauge,
                &[],
            ),
            checkpoint_lag_seconds: Family::new(
                "wasmwatch_checkpoint_lag_seconds",
                "Age of the oldest change not yet passed by the checkpoint (0 when none).",
                Gauge,
                &[],
            ),
            checkpoint_writes: Family::new(
                "wasmwatch_checkpoint_writes_total",
                "Writes of the state Lease, per outcome (ok, error, fenced).",
                Counter,
                &["outcome"],
            ),
            leader: Family::new(
                "wasmwatch_leader",
                "1 while this replica leads.",
                Gauge,
                &[],
            ),
            leader_transitions: Family::new(
                "wasmwatch_leader_transitions_total",
                "Times this replica started or stopped leading.",
                Counter,
                &["to"],
            ),
            watch_restarts: Family::new(
                "wasmwatch_watch_restarts_total",
                "Watch requests started again (stream ended, idle, error), per kind.",
                Counter,
                &["kind"],
            ),
            resyncs: Family::new(
                "wasmwatch_resyncs_total",
                "Relists after 410 Gone (history expired), per kind.",
                Counter,
                &["kind"],
            ),
        }
    }
}

impl Metrics {
    fn families(&self) -> [&Family; 15] {
        [
            &self.events_received,
            &self.events_handled,
            &self.plugin_invocations,
            &self.plugin_duration,
            &self.actions,
            &self.action_retries,
            &self.dead_letters,
            &self.queue_depth,
            &self.checkpoint_lag_versions,
            &self.checkpoint_lag_seconds,
            &self.checkpoint_writes,
            &self.leader,
            &self.leader_transitions,
            &self.watch_restarts,
            &self.resyncs,
        ]
    }

    /// The text exposition of every family.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for f in self.families() {
            f.render(&mut out);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_gauges_and_histograms() {
        let m = Metrics::default();
        m.events_received.inc(&["ConfigMap"]);
        m.events_received.inc(&["ConfigMap"]);
        m.queue_depth.set(&[], 3.0);
        m.plugin_duration.observe(&["http-refresh", "ok"], 0.000_07);
        m.actions.inc(&["refreshService", "done"]);
        m.events_handled.inc(&["a\"b"]);
        let text = m.render();
        assert!(text.contains("# TYPE wasmwatch_events_received_total counter\nwasmwatch_events_received_total{kind=\"ConfigMap\"} 2\n"), "{text}");
        assert!(text.contains("wasmwatch_queue_depth 3\n"), "{text}");
        assert!(text.contains("wasmwatch_plugin_duration_seconds_bucket{plugin=\"http-refresh\",outcome=\"ok\",le=\"0.00005\"} 0\n"), "{text}");
        assert!(text.contains("wasmwatch_plugin_duration_seconds_bucket{plugin=\"http-refresh\",outcome=\"ok\",le=\"0.0001\"} 1\n"), "{text}");
        assert!(text.contains("wasmwatch_plugin_duration_seconds_count{plugin=\"http-refresh\",outcome=\"ok\"} 1\n"), "{text}");
        assert!(text.contains("kind=\"a\\\"b\""), "{text}");
        assert_eq!(m.events_received.get(&["ConfigMap"]), 2.0);
    }
}
