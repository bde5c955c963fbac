//! Prometheus metrics, served in the OpenMetrics text format on the admin
//! port's `/metrics`, by the `prometheus-client` crate.
//!
//! Each `wasmwatch_` family is a field of [`Metrics`]. Names follow
//! Prometheus conventions (`wasmwatch_` prefix, base units). Counters are
//! registered without `_total`: the OpenMetrics encoder adds it to the
//! samples, so the series read `wasmwatch_..._total` (the `# HELP` and
//! `# TYPE` lines name the family without it). [`ProcessCollector`] adds
//! the usual `process_*` metrics, read from /proc/self on each scrape.
//!
//! Beside them, Stakater Reloader's `reloader_reload_executed_total`
//! (`success="true"|"false"`, both series from the start), so a Reloader
//! dashboard reads wasmwatch's restarts, and with the manifest's
//! `metrics.reloaderByNamespace` its
//! `reloader_reload_executed_total_by_namespace{namespace,success}`: see
//! [`Metrics::reloaded`].
use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeMetric, MetricEncoder,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::{Metric, Registry};
use wasmwatch_core::manifest::MetricsSpec;

/// The content type of [`Metrics::render`].
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The labels of one series: names and values, in the family's order.
type Labels = Vec<(&'static str, String)>;

/// A family of counters or histograms; a series is picked by its label
/// values, given in the order of the family's label names.
#[derive(Debug, Clone)]
pub struct Labelled<M> {
    names: &'static [&'static str],
    family: Family<Labels, M>,
    /// The first [`SERIES_FOUND_FAST`] series made, by their values: found
    /// without building their labels. Each change counts in a few
    /// families; building and hashing a label set each time was ~2% of
    /// the CPU per change in issue 35's realistic mix. Handles share the
    /// family's series; no series is ever removed.
    made: Arc<std::sync::RwLock<Made<M>>>,
}

/// Series by their label values ([`Labelled`]).
type Made<M> = Vec<(Box<[String]>, M)>;

/// Series per family [`Labelled`] finds without building labels (a
/// family's series are a few kinds, plugins, outcomes).
const SERIES_FOUND_FAST: usize = 64;

impl<M: Clone> Labelled<M> {
    fn new(names: &'static [&'static str], family: Family<Labels, M>) -> Self {
        Labelled {
            names,
            family,
            made: Default::default(),
        }
    }

    fn with(&self, values: &[&str], f: impl FnOnce(&M)) {
        debug_assert_eq!(values.len(), self.names.len(), "{:?}", self.names);
        let same = |v: &[String]| v.iter().map(String::as_str).eq(values.iter().copied());
        {
            let made = self.made.read().unwrap_or_else(|e| e.into_inner());
            if let Some((_, m)) = made.iter().find(|(v, _)| same(v)) {
                f(m);
                return;
            }
        }
        let labels: Labels = self
            .names
            .iter()
            .zip(values)
            .map(|(k, v)| (*k, v.to_string()))
            .collect();
        let m = self.family.get_or_create(&labels).clone();
        let mut made = self.made.write().unwrap_or_else(|e| e.into_inner());
        if made.len() < SERIES_FOUND_FAST && !made.iter().any(|(v, _)| same(v)) {
            made.push((values.iter().map(|v| v.to_string()).collect(), m.clone()));
        }
        drop(made);
        f(&m);
    }
}

/// Encoded as its family, but with `# HELP` and `# TYPE` even before its
/// first series (prometheus-client leaves empty families out).
impl<M> EncodeMetric for Labelled<M>
where
    Family<Labels, M>: EncodeMetric,
{
    fn encode(&self, encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        self.family.encode(encoder)
    }

    fn metric_type(&self) -> MetricType {
        self.family.metric_type()
    }
}

impl Labelled<Counter> {
    /// Counter: add one.
    pub fn inc(&self, values: &[&str]) {
        self.with(values, |c| {
            c.inc();
        });
    }

    /// Counter: add `by`.
    pub fn add(&self, values: &[&str], by: u64) {
        self.with(values, |c| {
            c.inc_by(by);
        });
    }
}

impl Labelled<Histogram> {
    /// Histogram: observe one value.
    pub fn observe(&self, values: &[&str], v: f64) {
        self.with(values, |h| h.observe(v));
    }
}

/// Reloader's `reloader_reload_executed_total_by_namespace`: counters per
/// (namespace, success) whose samples are named exactly as the family, as
/// Reloader's Go client writes them in the Prometheus text format. In
/// OpenMetrics a counter's samples are `<family>_total`, so as a counter
/// this family would come out as `..._by_namespace_total`, a series no
/// Reloader dashboard reads: it is encoded with type `unknown`, whose
/// samples carry the family's name (Prometheus stores the series the same,
/// and `rate()` works on it).
#[derive(Debug, Clone, Default)]
pub struct ReloadsByNamespace {
    /// (namespace, success) → count.
    counts: Arc<Mutex<BTreeMap<(String, bool), u64>>>,
}

impl ReloadsByNamespace {
    fn inc(&self, namespace: &str, success: bool) {
        *self
            .counts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry((namespace.to_string(), success))
            .or_default() += 1;
    }
}

impl EncodeMetric for ReloadsByNamespace {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        for ((namespace, success), n) in counts.iter() {
            // Go's order: label names sorted.
            let labels = [
                ("namespace", namespace.as_str()),
                ("success", if *success { "true" } else { "false" }),
            ];
            encoder.encode_family(&labels)?.encode_gauge(n)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Unknown
    }
}

/// Registers `metric` (which shares its value with the returned clone).
fn register<M: Metric + Clone>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M {
    // The registry ends every help text with a full stop.
    let help = help.strip_suffix('.').unwrap_or(help);
    registry.register(name, help, metric.clone());
    metric
}

fn counters(
    registry: &mut Registry,
    name: &str,
    help: &str,
    names: &'static [&'static str],
) -> Labelled<Counter> {
    let family = Family::default();
    register(registry, name, help, Labelled::new(names, family))
}

const LATENCY: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0,
];

fn latency() -> Histogram {
    Histogram::new(LATENCY.iter().copied())
}

/// Every metric wasmwatch exports, and the registry that encodes them.
#[derive(Debug)]
pub struct Metrics {
    pub events_received: Labelled<Counter>,
    pub events_handled: Labelled<Counter>,
    pub plugin_invocations: Labelled<Counter>,
    /// Changes folded into a plugin's waiting call on the same object.
    pub changes_folded: Labelled<Counter>,
    /// Plugin calls not made: the change failed a prefilter the plugin
    /// declares (issue 35).
    pub plugin_calls_skipped: Labelled<Counter>,
    pub plugin_duration: Labelled<Histogram>,
    pub actions: Labelled<Counter>,
    pub action_retries: Labelled<Counter>,
    pub dead_letters: Labelled<Counter>,
    pub k8s_events_dropped: Counter,
    pub queue_depth: Gauge,
    pub checkpoint_lag_versions: Gauge,
    pub checkpoint_lag_seconds: Gauge<f64, AtomicU64>,
    pub checkpoint_save_age_seconds: Gauge<f64, AtomicU64>,
    pub checkpoint_save_failures: Gauge,
    pub checkpoint_writes: Labelled<Counter>,
    pub leader: Gauge,
    pub leader_transitions: Labelled<Counter>,
    pub watch_restarts: Labelled<Counter>,
    pub resyncs: Labelled<Counter>,
    /// Reloader's `reloader_reload_executed_total{success}`.
    pub reloader_reloads: Labelled<Counter>,
    /// Reloader's `reloader_reload_executed_total_by_namespace`, when the
    /// manifest's `metrics.reloaderByNamespace` asks for it.
    pub reloader_reloads_by_namespace: Option<ReloadsByNamespace>,
    registry: Registry,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new(&MetricsSpec::default())
    }
}

impl Metrics {
    /// Every family, and the optional ones `spec` (the manifest's
    /// `metrics`) asks for.
    pub fn new(spec: &MetricsSpec) -> Self {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(ProcessCollector::new()));
        let r = &mut registry;
        // Registered as `reloader_reload_executed`: the encoder names the
        // samples `reloader_reload_executed_total`, Reloader's series.
        // Both series exist from the start, at 0, as Reloader pre-sets them.
        let reloader_reloads = counters(
            r,
            "reloader_reload_executed",
            "Restarts that patched a workload's pod template (success=\"true\") or failed \
             (success=\"false\", every failed attempt), counted as Stakater Reloader counts reloads.",
            &["success"],
        );
        reloader_reloads.add(&["true"], 0);
        reloader_reloads.add(&["false"], 0);
        let reloader_reloads_by_namespace = spec.reloader_by_namespace.then(|| {
            register(
                r,
                "reloader_reload_executed_total_by_namespace",
                "Restarts that patched a workload's pod template or failed, per namespace, \
                 counted as Stakater Reloader counts reloads.",
                ReloadsByNamespace::default(),
            )
        });
        Metrics {
            reloader_reloads,
            reloader_reloads_by_namespace,
            events_received: counters(
                r,
                "wasmwatch_events_received",
                "Changes delivered by the watches, per kind.",
                &["kind"],
            ),
            events_handled: counters(
                r,
                "wasmwatch_events_handled",
                "Changes fully handled (every action done or dead-lettered), per kind.",
                &["kind"],
            ),
            plugin_invocations: counters(
                r,
                "wasmwatch_plugin_invocations",
                "Plugin calls, per plugin and outcome (ok, error).",
                &["plugin", "outcome"],
            ),
            changes_folded: counters(
                r,
                "wasmwatch_changes_folded",
                "Changes decided together with a newer change of the same object \
                 (they arrived while the plugin's call on it still waited for its turn), \
                 per plugin.",
                &["plugin"],
            ),
            plugin_calls_skipped: counters(
                r,
                "wasmwatch_plugin_calls_skipped",
                "Plugin calls not made because the change failed a prefilter the plugin declares \
                 (wasmwatch:needs only), per plugin and condition.",
                &["plugin", "condition"],
            ),
            plugin_duration: register(
                r,
                "wasmwatch_plugin_duration_seconds",
                "Time of one plugin call (fresh sandbox + handle), per plugin and outcome.",
                Labelled::new(
                    &["plugin", "outcome"],
                    Family::new_with_constructor(latency),
                ),
            ),
            actions: counters(
                r,
                "wasmwatch_actions",
                "Action attempts, per action type and outcome (done, retrying, dead_lettered, abandoned).",
                &["type", "outcome"],
            ),
            action_retries: counters(
                r,
                "wasmwatch_action_retries",
                "Action attempts that failed and will be retried, per action type.",
                &["type"],
            ),
            dead_letters: counters(
                r,
                "wasmwatch_dead_letters",
                "Actions given up after their retry budget or a permanent failure, per action type.",
                &["type"],
            ),
            k8s_events_dropped: register(
                r,
                "wasmwatch_k8s_events_dropped",
                "Kubernetes Events about actions (Refreshed, RefreshPublished, RefreshFailed) not written because the Event queue was full.",
                Counter::default(),
            ),
            queue_depth: register(
                r,
                "wasmwatch_queue_depth",
                "Actions waiting for their debounce window or running.",
                Gauge::default(),
            ),
            checkpoint_lag_versions: register(
                r,
                "wasmwatch_checkpoint_lag_versions",
                "Changes a new leader would replay now: received and not handled, or \
                 handled and not in the stored checkpoint yet.",
                Gauge::default(),
            ),
            checkpoint_lag_seconds: register(
                r,
                "wasmwatch_checkpoint_lag_seconds",
                "Age of the oldest change not yet passed by the checkpoint (0 when none).",
                Gauge::default(),
            ),
            checkpoint_save_age_seconds: register(
                r,
                "wasmwatch_checkpoint_save_age_seconds",
                "While saves of the checkpoints and index fail: seconds since the last \
                 one stored (a new leader would replay from there); 0 when the last save \
                 succeeded or this replica does not lead.",
                Gauge::default(),
            ),
            checkpoint_save_failures: register(
                r,
                "wasmwatch_checkpoint_save_failures",
                "Saves of the checkpoints and index failed in a row (a Warning Event \
                 CheckpointSaveFailed on the state Lease at 3).",
                Gauge::default(),
            ),
            checkpoint_writes: counters(
                r,
                "wasmwatch_checkpoint_writes",
                "Writes of the state Lease, per outcome (ok, error, fenced).",
                &["outcome"],
            ),
            leader: register(
                r,
                "wasmwatch_leader",
                "1 while this replica leads.",
                Gauge::default(),
            ),
            leader_transitions: counters(
                r,
                "wasmwatch_leader_transitions",
                "Times this replica started or stopped leading.",
                &["to"],
            ),
            watch_restarts: counters(
                r,
                "wasmwatch_watch_restarts",
                "Watch requests started again (stream ended, idle, error), per kind.",
                &["kind"],
            ),
            resyncs: counters(
                r,
                "wasmwatch_resyncs",
                "Relists after 410 Gone (history expired), per kind.",
                &["kind"],
            ),
            registry: std::mem::take(r),
        }
    }

    /// One restart attempt of a workload in `namespace`: `true` when it
    /// patched the pod template, `false` when it failed (the executors'
    /// `on_reload`).
    pub fn reloaded(&self, namespace: &str, success: bool) {
        self.reloader_reloads
            .inc(&[if success { "true" } else { "false" }]);
        if let Some(by_namespace) = &self.reloader_reloads_by_namespace {
            by_namespace.inc(namespace, success);
        }
    }

    /// The OpenMetrics text of every family, ending in `# EOF`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("encoding into a String does not fail");
        out
    }
}

/// /proc reports CPU times in clock ticks of USER_HZ, 100 on the Linux
/// platforms wasmwatch runs on (Prometheus' procfs assumes the same).
const USER_HZ: f64 = 100.0;

/// The `process_*` metrics of the official Prometheus clients, read from
/// /proc/self on each scrape; where a file is missing (not Linux), its
/// metrics are left out.
#[derive(Debug)]
pub struct ProcessCollector {
    /// Seconds since the epoch; fixed, so read once.
    start_time: Option<f64>,
}

impl ProcessCollector {
    pub fn new() -> ProcessCollector {
        let btime = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<u64>().ok())
        });
        let start_time = btime
            .zip(stat())
            .map(|(boot, s)| boot as f64 + s.start_ticks as f64 / USER_HZ);
        ProcessCollector { start_time }
    }
}

impl Default for ProcessCollector {
    fn default() -> Self {
        Self::new()
    }
}

/// What /proc/self/stat says about the process.
struct Stat {
    cpu_seconds: f64,
    start_ticks: u64,
    virtual_bytes: u64,
}

fn stat() -> Option<Stat> {
    let text = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name, field 2, is in parentheses and may hold spaces;
    // what follows starts at field 3 (proc(5)).
    let fields: Vec<&str> = text.rsplit_once(')')?.1.split_whitespace().collect();
    let field = |n: usize| fields.get(n - 3)?.parse::<u64>().ok();
    Some(Stat {
        cpu_seconds: (field(14)? + field(15)?) as f64 / USER_HZ,
        start_ticks: field(22)?,
        virtual_bytes: field(23)?,
    })
}

fn resident_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let kib = status.lines().find_map(|l| l.strip_prefix("VmRSS:"))?;
    Some(kib.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()? * 1024)
}

fn open_fds() -> Option<u64> {
    Some(std::fs::read_dir("/proc/self/fd").ok()?.count() as u64)
}

fn max_fds() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let soft = limits
        .lines()
        .find_map(|l| l.strip_prefix("Max open files"))?
        .split_whitespace()
        .next()?;
    soft.parse().ok()
}

fn gauge(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: Option<impl EncodeGaugeValue>,
) -> Result<(), std::fmt::Error> {
    let Some(value) = value else {
        return Ok(());
    };
    let gauge = ConstGauge::new(value);
    gauge.encode(encoder.encode_descriptor(name, help, None, gauge.metric_type())?)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let stat = stat();
        if let Some(s) = &stat {
            let cpu = ConstCounter::new(s.cpu_seconds);
            cpu.encode(encoder.encode_descriptor(
                "process_cpu_seconds",
                "Total user and system CPU time spent in seconds.",
                None,
                cpu.metric_type(),
            )?)?;
        }
        let e = &mut encoder;
        gauge(
            e,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            resident_bytes(),
        )?;
        gauge(
            e,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            stat.map(|s| s.virtual_bytes),
        )?;
        gauge(
            e,
            "process_open_fds",
            "Number of open file descriptors.",
            open_fds(),
        )?;
        gauge(
            e,
            "process_max_fds",
            "Maximum number of open file descriptors.",
            max_fds(),
        )?;
        gauge(
            e,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            self.start_time,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_found_without_labels_are_the_family_s_series() {
        let m = Metrics::default();
        // More series than are found fast: every one still counts, in the
        // family that renders (a handle kept by one clone is the
        // registry's series).
        let plugins: Vec<String> = (0..SERIES_FOUND_FAST + 6)
            .map(|i| format!("p{i}"))
            .collect();
        for round in 0..3 {
            for (i, p) in plugins.iter().enumerate() {
                if round < 2 || i % 2 == 0 {
                    m.plugin_invocations.inc(&[p, "ok"]);
                }
            }
        }
        m.plugin_invocations.inc(&["p1", "error"]);
        let text = m.render();
        for (i, p) in plugins.iter().enumerate() {
            let n = if i % 2 == 0 { 3 } else { 2 };
            let line = format!(
                "wasmwatch_plugin_invocations_total{{plugin=\"{p}\",outcome=\"ok\"}} {n}\n"
            );
            assert!(text.contains(&line), "{line} in {text}");
        }
        assert!(
            text.contains(
                "wasmwatch_plugin_invocations_total{plugin=\"p1\",outcome=\"error\"} 1\n"
            )
        );
        assert_eq!(
            m.plugin_invocations.made.read().unwrap().len(),
            SERIES_FOUND_FAST
        );
    }

    #[test]
    fn encodes_openmetrics_counters_gauges_histograms_and_process_metrics() {
        let m = Metrics::default();
        m.events_received.inc(&["ConfigMap"]);
        m.events_received.inc(&["ConfigMap"]);
        m.queue_depth.set(3);
        m.checkpoint_lag_seconds.set(0.5);
        m.plugin_duration.observe(&["http-refresh", "ok"], 0.000_07);
        m.actions.inc(&["refreshService", "done"]);
        m.events_handled.inc(&["a\"b"]);
        let text = m.render();
        // Counter: the family without `_total`, the series with it.
        assert!(text.contains("# HELP wasmwatch_events_received Changes delivered by the watches, per kind.\n# TYPE wasmwatch_events_received counter\nwasmwatch_events_received_total{kind=\"ConfigMap\"} 2\n"), "{text}");
        assert!(
            text.contains("wasmwatch_actions_total{type=\"refreshService\",outcome=\"done\"} 1\n"),
            "{text}"
        );
        // Gauges.
        assert!(
            text.contains("# TYPE wasmwatch_queue_depth gauge\nwasmwatch_queue_depth 3\n"),
            "{text}"
        );
        assert!(
            text.contains("\nwasmwatch_checkpoint_lag_seconds 0.5\n"),
            "{text}"
        );
        // Histogram.
        assert!(
            text.contains("# TYPE wasmwatch_plugin_duration_seconds histogram\n"),
            "{text}"
        );
        // (`le` comes first; label order means nothing to Prometheus.)
        assert!(text.contains("wasmwatch_plugin_duration_seconds_bucket{le=\"0.00005\",plugin=\"http-refresh\",outcome=\"ok\"} 0\n"), "{text}");
        assert!(text.contains("wasmwatch_plugin_duration_seconds_bucket{le=\"0.0001\",plugin=\"http-refresh\",outcome=\"ok\"} 1\n"), "{text}");
        assert!(text.contains("wasmwatch_plugin_duration_seconds_bucket{le=\"+Inf\",plugin=\"http-refresh\",outcome=\"ok\"} 1\n"), "{text}");
        assert!(text.contains("wasmwatch_plugin_duration_seconds_count{plugin=\"http-refresh\",outcome=\"ok\"} 1\n"), "{text}");
        // A family without series yet still has its HELP and TYPE.
        assert!(text.contains("# HELP wasmwatch_dead_letters Actions given up after their retry budget or a permanent failure, per action type.\n# TYPE wasmwatch_dead_letters counter\n# HELP "), "{text}");
        // Label values are escaped.
        assert!(text.contains("kind=\"a\\\"b\""), "{text}");
        // Process metrics, from /proc/self.
        let sample = |name: &str| -> f64 {
            text.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("no {name}: {text}"))
        };
        assert!(
            text.contains("# TYPE process_cpu_seconds counter\n"),
            "{text}"
        );
        assert!(sample("process_cpu_seconds_total") >= 0.0);
        assert!(sample("process_resident_memory_bytes") > 0.0);
        assert!(sample("process_virtual_memory_bytes") >= sample("process_resident_memory_bytes"));
        assert!(sample("process_open_fds") >= 3.0);
        assert!(sample("process_max_fds") >= sample("process_open_fds"));
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = sample("process_start_time_seconds");
        assert!(
            started <= now + 1.0 && started > now - 24.0 * 3600.0,
            "{started} vs {now}"
        );
        // A complete OpenMetrics exposition ends with the EOF marker.
        assert!(text.ends_with("\n# EOF\n"), "{text}");
    }

    /// Reloader's series, as its Go client writes them in the Prometheus
    /// text format: `reloader_reload_executed_total{success}` both at 0
    /// from the start; the by-namespace family only when asked for, its
    /// samples named as the family (not `..._by_namespace_total`).
    #[test]
    fn reloader_series_read_as_reloaders() {
        let m = Metrics::default();
        let text = m.render();
        // (Series come in no particular order; Prometheus needs none.)
        for line in [
            "# TYPE reloader_reload_executed counter",
            "reloader_reload_executed_total{success=\"true\"} 0",
            "reloader_reload_executed_total{success=\"false\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line}: {text}");
        }
        assert!(!text.contains("by_namespace"), "{text}");
        m.reloaded("shop", true);
        m.reloaded("shop", false);
        let text = m.render();
        assert!(
            text.contains("\nreloader_reload_executed_total{success=\"true\"} 1\n"),
            "{text}"
        );
        assert!(
            text.contains("\nreloader_reload_executed_total{success=\"false\"} 1\n"),
            "{text}"
        );

        let m = Metrics::new(&MetricsSpec {
            reloader_by_namespace: true,
        });
        // The family, no series before the first restart (Reloader has
        // none either).
        assert!(
            m.render()
                .contains("# TYPE reloader_reload_executed_total_by_namespace unknown\n# HELP "),
            "{}",
            m.render()
        );
        m.reloaded("shop", true);
        m.reloaded("shop", false);
        m.reloaded("shop", false);
        m.reloaded("web", true);
        let text = m.render();
        for line in [
            "reloader_reload_executed_total{success=\"true\"} 2",
            "reloader_reload_executed_total{success=\"false\"} 2",
            "reloader_reload_executed_total_by_namespace{namespace=\"shop\",success=\"false\"} 2",
            "reloader_reload_executed_total_by_namespace{namespace=\"shop\",success=\"true\"} 1",
            "reloader_reload_executed_total_by_namespace{namespace=\"web\",success=\"true\"} 1",
        ] {
            assert!(text.lines().any(|l| l == line), "no {line}: {text}");
        }
        assert!(
            !text.contains("reloader_reload_executed_total_by_namespace_total"),
            "{text}"
        );
        assert!(text.ends_with("\n# EOF\n"), "{text}");
    }

    /// The series names scrapers and dashboards see: unchanged by the move
    /// to prometheus-client (counters still end in `_total`).
    #[test]
    fn exposes_the_same_series_names() {
        let m = Metrics::default();
        for c in [
            &m.events_received,
            &m.events_handled,
            &m.plugin_invocations,
            &m.changes_folded,
            &m.plugin_calls_skipped,
            &m.actions,
            &m.action_retries,
            &m.dead_letters,
            &m.checkpoint_writes,
            &m.leader_transitions,
            &m.watch_restarts,
            &m.resyncs,
        ] {
            c.inc(&vec!["x"; c.names.len()]);
        }
        m.plugin_duration.observe(&["p", "ok"], 0.3);
        let text = m.render();
        let names: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| l.starts_with("wasmwatch_"))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        assert_eq!(
            names.into_iter().collect::<Vec<_>>(),
            [
                "wasmwatch_action_retries_total",
                "wasmwatch_actions_total",
                "wasmwatch_changes_folded_total",
                "wasmwatch_checkpoint_lag_seconds",
                "wasmwatch_checkpoint_lag_versions",
                "wasmwatch_checkpoint_save_age_seconds",
                "wasmwatch_checkpoint_save_failures",
                "wasmwatch_checkpoint_writes_total",
                "wasmwatch_dead_letters_total",
                "wasmwatch_events_handled_total",
                "wasmwatch_events_received_total",
                "wasmwatch_k8s_events_dropped_total",
                "wasmwatch_leader",
                "wasmwatch_leader_transitions_total",
                "wasmwatch_plugin_calls_skipped_total",
                "wasmwatch_plugin_duration_seconds_bucket",
                "wasmwatch_plugin_duration_seconds_count",
                "wasmwatch_plugin_duration_seconds_sum",
                "wasmwatch_plugin_invocations_total",
                "wasmwatch_queue_depth",
                "wasmwatch_resyncs_total",
                "wasmwatch_watch_restarts_total",
            ]
        );
    }
}
