//! The command line.
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use wasmwatch_core::units::HumanDuration;
use wasmwatch_core::{ChangeType, Manifest, StaticLookups};
use wasmwatch_kube::elector::{Elector, ElectorConfig, default_identity};
use wasmwatch_runtime::{Runtime, RuntimeConfig};

#[derive(Debug, Parser)]
#[command(
    name = "wasmwatch",
    version,
    about = "Refresh apps when their ConfigMaps and Secrets change, as decided by sandboxed WebAssembly plugins"
)]
pub struct Args {
    /// Where compiled plugins (and pulled modules) are cached between runs
    /// [default: $XDG_CACHE_HOME/wasmwatch or ~/.cache/wasmwatch, when
    /// writable].
    #[arg(long, env = "WASMWATCH_CACHE_DIR", global = true)]
    cache_dir: Option<PathBuf>,
    /// Compile plugins afresh on every start: no compile cache (pulled
    /// modules still need a folder: --cache-dir or the default).
    #[arg(long, global = true, conflicts_with = "cache_dir")]
    no_cache: bool,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text, global = true)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check a plugin manifest fully: fields, plugin pins, imports, worlds and
    /// each plugin's own config check (errors: what `run` refuses), and what
    /// can never work (warnings: a plugin filter that selects nothing, a
    /// grant short of what the plugin declares it needs). Reports every
    /// problem found, each naming its field; exit code 1 on errors (and on
    /// warnings with --strict), else 0.
    Validate {
        /// The manifest (YAML).
        manifest: PathBuf,
        /// Fail (exit code 1) on warnings too, as on errors.
        #[arg(long)]
        strict: bool,
        /// Read the modules the manifest names under IMAGE_DIR from
        /// LOCAL_DIR instead, e.g. `/usr/lib/wasmwatch/plugins=./plugins`
        /// to check the deploy manifest outside the image (repeatable).
        #[arg(long = "plugin-dir", value_name = "IMAGE_DIR=LOCAL_DIR")]
        plugin_dirs: Vec<crate::plugin_dir::PluginDirMap>,
        /// How to reach registries for `oci://` modules.
        #[command(flatten)]
        registry: crate::oci::RegistryArgs,
    },
    /// About the manifest format.
    #[command(subcommand)]
    Manifest(ManifestCommand),
    /// Work with one plugin.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Run only leader election and the admin port (`/leader`, `/healthz`,
    /// `/readyz`): a leader-election sidecar for another app. SIGTERM releases
    /// the lease so that another replica takes over at once.
    Elect(ElectArgs),
    /// Run the service: watch ConfigMaps and Secrets, ask the plugins, and
    /// execute what they decide (with `ha.enabled`, only while this replica
    /// leads, replaying what changed while nobody led).
    Run(RunArgs),
    /// The whole main job on an embedded local cluster: a local API server
    /// (kubectl works against the kubeconfig it writes), a sample app and
    /// two replicas electing a leader, with the plugins of the manifest.
    Local {
        /// The plugin manifest (YAML); its `ha` Lease names are used, and
        /// the replicas elect a leader even without `ha.enabled`.
        #[arg(long)]
        manifest: PathBuf,
        /// Where the kubeconfig is written.
        #[arg(long, default_value = ".wasmwatch-local")]
        dir: PathBuf,
        /// Make one change, wait for its refresh and rollout, exit 0 (1 if
        /// they do not come within --timeout).
        #[arg(long)]
        scripted: bool,
        /// How long --scripted waits for the refresh and the rollout.
        #[arg(long, default_value = "60s")]
        timeout: HumanDuration,
        /// Port of the local API server (0: any free port).
        #[arg(long, default_value_t = 0)]
        port: u16,
        /// How to reach registries for `oci://` modules.
        #[command(flatten)]
        registry: crate::oci::RegistryArgs,
    },
}

/// `run`'s admission webhook (see `wasmwatch::webhook`): off unless
/// `--webhook-addr` is given.
#[derive(Debug, clap::Args)]
struct WebhookArgs {
    /// Serve the mutating admission webhook (HTTPS, `POST /mutate`) here,
    /// e.g. 0.0.0.0:8443: an update that drops a restart's records (a
    /// GitOps apply) gets them back. Needs --webhook-cert-dir or
    /// --webhook-generate-cert.
    #[arg(long)]
    webhook_addr: Option<std::net::SocketAddr>,
    /// A folder with `tls.crt` and `tls.key` (a mounted cert-manager
    /// Secret), read again when they change.
    #[arg(long, conflicts_with = "webhook_generate_cert")]
    webhook_cert_dir: Option<PathBuf>,
    /// Generate a CA and a certificate, keep them in Secret
    /// --webhook-secret of --namespace (POD_NAMESPACE), and write the CA
    /// into MutatingWebhookConfiguration --webhook-configuration's
    /// caBundle. Delete the Secret to have a new pair made (replicas pick
    /// it up within a minute).
    #[arg(long)]
    webhook_generate_cert: bool,
    /// The Secret keeping the generated CA and certificate (`ca.crt`,
    /// `tls.crt`, `tls.key`).
    #[arg(
        long,
        default_value = "wasmwatch-webhook-tls",
        requires = "webhook_generate_cert"
    )]
    webhook_secret: String,
    /// The MutatingWebhookConfiguration whose webhooks get the generated
    /// CA as their caBundle.
    #[arg(long, default_value = "wasmwatch", requires = "webhook_generate_cert")]
    webhook_configuration: String,
    /// A name (or IP address) the generated certificate is for; repeatable
    /// (default: wasmwatch-webhook.<namespace>.svc). A pair already in the
    /// Secret is used as it is.
    #[arg(long = "webhook-dns-name", requires = "webhook_generate_cert")]
    webhook_dns_names: Vec<String>,
}

impl WebhookArgs {
    fn options(self, namespace: &str) -> anyhow::Result<Option<crate::webhook::WebhookOptions>> {
        let Some(addr) = self.webhook_addr else {
            anyhow::ensure!(
                self.webhook_cert_dir.is_none() && !self.webhook_generate_cert,
                "--webhook-cert-dir and --webhook-generate-cert need --webhook-addr"
            );
            return Ok(None);
        };
        let tls = match (self.webhook_cert_dir, self.webhook_generate_cert) {
            (Some(dir), false) => crate::webhook::WebhookTls::Dir(dir),
            (None, true) => crate::webhook::WebhookTls::Generate {
                namespace: namespace.to_string(),
                secret: self.webhook_secret,
                configuration: self.webhook_configuration,
                names: if self.webhook_dns_names.is_empty() {
                    vec![format!("wasmwatch-webhook.{namespace}.svc")]
                } else {
                    self.webhook_dns_names
                },
            },
            _ => anyhow::bail!(
                "--webhook-addr needs a certificate: --webhook-cert-dir DIR (tls.crt, tls.key) \
                 or --webhook-generate-cert"
            ),
        };
        Ok(Some(crate::webhook::WebhookOptions { addr, tls }))
    }
}

/// `--discovery-interval`: a duration from 1s to 1h.
fn discovery_interval(s: &str) -> Result<HumanDuration, String> {
    let d: HumanDuration = s.parse()?;
    if d.0 < std::time::Duration::from_secs(1) || d.0 > std::time::Duration::from_secs(3600) {
        return Err(format!("{d} is out of range (1s to 1h)"));
    }
    Ok(d)
}

/// `--checkpoint-interval`: a duration from 1ms to 1h (0 would make the
/// save timer panic).
fn checkpoint_interval(s: &str) -> Result<HumanDuration, String> {
    let d: HumanDuration = s.parse()?;
    if d.0.is_zero() || d.0 > std::time::Duration::from_secs(3600) {
        return Err(format!("{d} is out of range (1ms to 1h)"));
    }
    Ok(d)
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// The plugin manifest (YAML).
    #[arg(long)]
    manifest: PathBuf,
    /// Decide from the same live caches, print each decision as a JSON line
    /// with what `run` would execute, and execute nothing.
    #[arg(long)]
    dry_run: bool,
    /// This replica's identity (default: POD_NAME, else the host name).
    #[arg(long)]
    identity: Option<String>,
    /// Namespace of the Leases when the manifest's `ha.namespace` is unset.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    namespace: String,
    /// Address of the admin HTTP port (/healthz, /readyz, /leader, /metrics).
    #[arg(long, default_value = "0.0.0.0:8080")]
    admin_addr: std::net::SocketAddr,
    /// Print every executed, retried or dead-lettered action as a JSON line.
    #[arg(long)]
    print_actions: bool,
    /// How often the leader writes its checkpoints when they moved (1ms to 1h).
    #[arg(long, default_value = "2s", value_parser = checkpoint_interval)]
    checkpoint_interval: HumanDuration,
    /// Threads that run the host's tasks and the plugins (default 1).
    /// Plugin calls of different objects run in parallel on up to this many.
    /// One thread did more with less: in `bench compare` (2 cores, the API
    /// server on the same machine) it cost about a quarter less CPU per
    /// change at 100 changes/s than 2, and handled 17,100-17,700 changes/s
    /// from the in-process writer against 9,200-11,700 (no thread wakes
    /// another for each change). Deadlines do not depend on it: a separate
    /// thread advances the plugins' epoch, and a running plugin yields at
    /// every tick.
    #[arg(long, env = "WASMWATCH_WORKER_THREADS", value_parser = clap::value_parser!(u16).range(1..=256))]
    worker_threads: Option<u16>,
    /// Read the modules the manifest names under IMAGE_DIR from LOCAL_DIR
    /// instead (e.g. /usr/lib/wasmwatch/plugins=./plugins): the install's
    /// manifest run outside the image, as `validate --plugin-dir` checks
    /// it. Repeatable.
    #[arg(long = "plugin-dir", value_name = "IMAGE_DIR=LOCAL_DIR")]
    plugin_dirs: Vec<crate::plugin_dir::PluginDirMap>,
    /// How often the API discovery of custom workload kinds (Argo
    /// Rollouts) is read again: a CRD installed while running is used, and
    /// one deleted is dropped, within this long (1s to 1h).
    #[arg(long, env = "WASMWATCH_DISCOVERY_INTERVAL", default_value = "30s", value_parser = discovery_interval)]
    discovery_interval: HumanDuration,
    /// The optional mutating admission webhook.
    #[command(flatten)]
    webhook: WebhookArgs,
    /// How to reach registries for `oci://` modules.
    #[command(flatten)]
    registry: crate::oci::RegistryArgs,
}

/// The runtime of `run`: `threads` workers (default 1, see
/// `--worker-threads`). Tokio's default is a worker per CPU of the node: 64
/// threads on a 64-core node for a controller that mostly waits, and each
/// change woke some of them for nothing.
fn run_runtime(threads: Option<u16>) -> std::io::Result<tokio::runtime::Runtime> {
    let threads = threads.map_or(1, usize::from);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads)
        .enable_all()
        .build()
}

#[derive(Debug, clap::Args)]
struct ElectArgs {
    /// Namespace of the Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    namespace: String,
    /// Name of the Lease.
    #[arg(long, default_value = "wasmwatch-leader")]
    lease_name: String,
    /// This replica's identity (default: POD_NAME, else the host name).
    #[arg(long)]
    identity: Option<String>,
    /// Address of the admin HTTP port.
    #[arg(long, default_value = "0.0.0.0:8080")]
    admin_addr: std::net::SocketAddr,
    /// How long a Lease is valid after its last renewal: a replica that
    /// stops renewing is replaced after at most this long.
    #[arg(long, default_value = "15s")]
    lease_duration: HumanDuration,
    /// How long the leader keeps trying to renew before it stops leading
    /// (shorter than --lease-duration).
    #[arg(long, default_value = "10s")]
    renew_deadline: HumanDuration,
    /// How often replicas try to take or renew the Lease.
    #[arg(long, default_value = "2s")]
    retry_period: HumanDuration,
}

#[derive(Debug, Subcommand)]
enum ManifestCommand {
    /// Print the manifest's JSON Schema (draft 7), as in
    /// deploy/manifest.schema.json, for editors: with the YAML language
    /// server, a first line `# yaml-language-server: $schema=<file or URL>`
    /// checks a manifest as it is typed.
    Schema,
}

#[derive(Debug, Subcommand)]
enum PluginCommand {
    /// Run one plugin on one event and print the actions it returns, with the
    /// host's capability verdict on each, as JSON. Nothing is executed.
    Run {
        /// The plugin manifest (YAML).
        #[arg(long)]
        manifest: PathBuf,
        /// The plugin's name in the manifest.
        #[arg(long)]
        plugin: String,
        /// A ConfigMap or Secret as `kubectl get -o yaml` prints it, or an
        /// envelope `{change, previous, replay, object}`.
        #[arg(long)]
        event: PathBuf,
        /// The change type when the event file does not say.
        #[arg(long, default_value = "modified")]
        change: ChangeType,
        /// YAML with `services` and `workloads` the plugin's lookups answer from.
        #[arg(long)]
        lookups: Option<PathBuf>,
        /// How to reach registries for `oci://` modules.
        #[command(flatten)]
        registry: crate::oci::RegistryArgs,
    },
    /// Publish a component to an OCI registry (a Wasm OCI artifact: config
    /// application/vnd.wasm.config.v0+json, layer application/wasm) and
    /// print the `module:` and `sha256:` lines that pin it in a manifest.
    Push {
        /// The component (.wasm).
        file: PathBuf,
        /// oci://REGISTRY/REPOSITORY:TAG
        reference: String,
        /// How to reach registries to push to.
        #[command(flatten)]
        registry: crate::oci::RegistryArgs,
    },
    /// Create a ready plugin project NAME/: source, SDK, WIT, build script,
    /// a manifest entry and a test case for `plugin test`.
    New {
        /// The plugin's language.
        #[arg(long, value_enum)]
        lang: crate::scaffold::Lang,
        /// The plugin's name (a DNS-1123 label), also the project's folder.
        name: String,
        /// Where to create the project folder.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Run one plugin over fixture events and compare its decisions with
    /// golden files: each NAME.event.yaml (an event file as for `plugin
    /// run`) against NAME.expected.json beside it, with NAME.lookups.yaml
    /// or lookups.yaml as its lookups. Exit code 0 when all match, 1 when
    /// any differs (a diff is printed) or cannot run.
    Test {
        /// The plugin manifest (YAML).
        #[arg(long)]
        manifest: PathBuf,
        /// The plugin's name in the manifest.
        #[arg(long)]
        plugin: String,
        /// Write the golden files from what the plugin decides now, instead
        /// of comparing.
        #[arg(long)]
        update: bool,
        /// Event files and folders of them.
        #[arg(required = true)]
        cases: Vec<PathBuf>,
        /// How to reach registries for `oci://` modules.
        #[command(flatten)]
        registry: crate::oci::RegistryArgs,
    },
}

/// Runs the command line and returns the process's exit code.
pub fn main() -> ExitCode {
    let args = Args::parse();
    // The local run prints its own story (refreshes, restarts); routine
    // logs would drown it. RUST_LOG still wins.
    let default_level = match args.command {
        Command::Local { .. } => "warn",
        _ => "info",
    };
    init_tracing(args.log_format, default_level);
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", error_chain(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error and its causes on one line, `: `-separated, leaving out a cause
/// whose text the one before already contains (kube and others print their
/// source in their own message, and `{:#}` would repeat it at every level).
pub fn error_chain(e: &anyhow::Error) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut previous = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if !previous.contains(&text) && !parts.last().is_some_and(|l| l.contains(&text)) {
            parts.push(text.clone());
        }
        previous = text;
    }
    parts.join(": ")
}

fn init_tracing(format: LogFormat, default_level: &str) {
    use std::io::IsTerminal as _;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_level));
    // Colours only for a person at a terminal: not in files, pipes or
    // container logs, and not when NO_COLOR is set.
    let colour = std::io::stderr().is_terminal()
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().try_init(),
    };
}

/// The manifest's entry for `plugin`, or an error listing the names it has.
pub(crate) fn manifest_plugin<'m>(
    m: &'m Manifest,
    manifest: &Path,
    plugin: &str,
) -> anyhow::Result<&'m wasmwatch_core::manifest::PluginEntry> {
    m.plugin(plugin).with_context(|| {
        let names: Vec<&str> = m.plugins.iter().map(|p| p.name.as_str()).collect();
        format!(
            "no plugin named {plugin:?} in {}; it has: {}",
            manifest.display(),
            names.join(", ")
        )
    })
}

pub(crate) fn runtime(
    cache_dir: Option<PathBuf>,
    lookups: StaticLookups,
) -> anyhow::Result<Runtime> {
    let config = RuntimeConfig {
        cache_dir,
        ..RuntimeConfig::default()
    };
    Runtime::new(config, Arc::new(lookups))
        .map_err(|e| anyhow::anyhow!("cannot start the plugin runtime: {e:#}"))
}

/// The compile cache every command uses: the one given, else the default
/// folder when it can be created and written (a read-only root in a
/// container has none: then plugins compile at every start, as before).
fn effective_cache_dir(given: Option<PathBuf>, no_cache: bool) -> Option<PathBuf> {
    if no_cache {
        return None;
    }
    if given.is_some() {
        return given;
    }
    let dir = wasmwatch_oci::default_cache_dir()?;
    let writable = std::fs::create_dir_all(&dir).is_ok() && {
        let probe = dir.join(format!(".probe-{}", std::process::id()));
        let ok = std::fs::write(&probe, b"").is_ok();
        let _ = std::fs::remove_file(&probe);
        ok
    };
    if !writable {
        tracing::debug!(dir = %dir.display(), "default cache folder not writable; compiling without a cache");
    }
    writable.then_some(dir)
}

fn run(args: Args) -> anyhow::Result<ExitCode> {
    let args = Args {
        cache_dir: effective_cache_dir(args.cache_dir, args.no_cache),
        ..args
    };
    match args.command {
        Command::Validate {
            manifest,
            strict,
            plugin_dirs,
            registry,
        } => crate::validate::run(
            &manifest,
            &plugin_dirs,
            args.cache_dir,
            &registry.options()?,
            strict,
        ),
        Command::Manifest(ManifestCommand::Schema) => {
            println!(
                "{}",
                serde_json::to_string_pretty(&Manifest::json_schema())?
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::Run {
            manifest,
            plugin,
            event,
            change,
            lookups,
            registry,
        }) => {
            let mut m = Manifest::from_file(&manifest)?;
            crate::oci::resolve_modules_blocking(
                &mut m,
                args.cache_dir.as_deref(),
                &registry.options()?,
                Some(&plugin),
            )?;
            let entry = manifest_plugin(&m, &manifest, &plugin)?;
            let lookups = match lookups {
                Some(path) => {
                    let text = std::fs::read_to_string(&path)
                        .with_context(|| format!("cannot read lookups file {}", path.display()))?;
                    serde_yaml::from_str(&text)
                        .with_context(|| format!("invalid lookups file {}", path.display()))?
                }
                None => StaticLookups::default(),
            };
            let event = crate::event_file::read(&event, change)?;
            let rt = runtime(args.cache_dir, lookups)?;
            let loaded = rt.load_blocking(entry, &m.base_dir)?;
            if !loaded.filter().matches(&event) {
                eprintln!(
                    "note: plugin {plugin:?} would not get this event (its manifest entry's `events` filter does not select it); running it anyway"
                );
            }
            if m.watch.ignore_namespaces.contains(&event.object.namespace) {
                eprintln!(
                    "note: namespace {:?} is in watch.ignoreNamespaces: `run` never delivers its changes; running the plugin anyway",
                    event.object.namespace
                );
            }
            let decision = loaded.handle_blocking(&event)?;
            println!("{}", serde_json::to_string_pretty(&decision)?);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::New { lang, name, dir }) => {
            let project = crate::scaffold::new_project(lang, &name, &dir)?;
            println!(
                "created {}: build with {}/build.sh, then `wasmwatch plugin test --manifest {0}/wasmwatch.yaml --plugin {name} {0}/tests`",
                project.display(),
                project.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::Test {
            manifest,
            plugin,
            update,
            cases,
            registry,
        }) => {
            let summary = crate::plugin_test::run(
                &manifest,
                &plugin,
                &cases,
                update,
                args.cache_dir,
                &registry.options()?,
            )?;
            Ok(if summary.failed == 0 {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Plugin(PluginCommand::Push {
            file,
            reference,
            registry,
        }) => {
            crate::oci::push(&file, &reference, &registry.options()?)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Run(run) => {
            let rt = run_runtime(run.worker_threads)?;
            if run.dry_run {
                rt.block_on(crate::dryrun::run(
                    &run.manifest,
                    &run.plugin_dirs,
                    &run.namespace,
                    args.cache_dir,
                    &run.registry.options()?,
                    shutdown_signal(),
                ))?;
                return Ok(ExitCode::SUCCESS);
            }
            let webhook = run.webhook.options(&run.namespace)?;
            let options = crate::run::RunOptions {
                manifest: run.manifest,
                cache_dir: args.cache_dir,
                registry: run.registry.options()?,
                admin_addr: run.admin_addr,
                identity: run.identity.unwrap_or_else(default_identity),
                namespace: run.namespace,
                reports: if run.print_actions {
                    crate::run::Reports::Json
                } else {
                    crate::run::Reports::Quiet
                },
                announce: true,
                kube_config: None,
                checkpoint_interval: run.checkpoint_interval.0,
                force_ha: false,
                plugin_dirs: run.plugin_dirs,
                discovery_interval: run.discovery_interval.0,
                webhook,
            };
            on_worker(&rt, crate::run::run(options, shutdown_signal()))?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Local {
            manifest,
            dir,
            scripted,
            timeout,
            port,
            registry,
        } => {
            let rt = tokio::runtime::Runtime::new()?;
            let ok = rt.block_on(crate::local::run(
                crate::local::LocalOptions {
                    manifest,
                    dir,
                    cache_dir: args.cache_dir,
                    registry: registry.options()?,
                    scripted,
                    timeout: timeout.0,
                    port,
                },
                shutdown_signal(),
            ))?;
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Elect(elect) => {
            let rt = tokio::runtime::Runtime::new()?;
            rt.block_on(run_elect(elect))?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// Completes on the first SIGTERM or Ctrl-C; a second one exits at once.
async fn shutdown_signal() {
    async fn one() {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = tokio::signal::ctrl_c().await;
    }
    one().await;
    tracing::info!("shutting down (signal again to exit at once)");
    tokio::spawn(async {
        one().await;
        std::process::exit(130);
    });
}

async fn run_elect(args: ElectArgs) -> anyhow::Result<()> {
    let config = ElectorConfig {
        namespace: args.namespace,
        lease_name: args.lease_name,
        identity: args.identity.unwrap_or_else(default_identity),
        lease_duration: args.lease_duration.0,
        renew_deadline: args.renew_deadline.0,
        retry_period: args.retry_period.0,
    };
    let client = kube::Client::try_default()
        .await
        .context("cannot configure the Kubernetes client")?;
    let identity = config.identity.clone();
    let (elector, leadership) = Elector::new(client, config).map_err(anyhow::Error::msg)?;
    let listener = crate::admin::bind(args.admin_addr)
        .await
        .with_context(|| format!("cannot listen on {}", args.admin_addr))?;
    let addr = listener.local_addr()?;
    let (_ready_tx, ready) = tokio::sync::watch::channel(true);
    let admin = tokio::spawn(crate::admin::serve(
        listener,
        crate::admin::AdminState {
            leadership,
            fence: Some(elector.fence()),
            ready,
            metrics: None,
        },
    ));
    tracing::info!(%identity, "admin port listening on http://{addr}");
    println!("listening on http://{addr}");
    elector.run(shutdown_signal()).await;
    admin.abort();
    Ok(())
}

/// Runs `f` as a task on `rt`'s workers, not on the calling thread:
/// `block_on` would poll it on the main thread, so every change the term
/// loop handles would hop between that thread and the workers (two thread
/// wake-ups per hop; measured with `bench compare`, issue 24).
fn on_worker<F>(rt: &tokio::runtime::Runtime, f: F) -> F::Output
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    match rt.block_on(rt.spawn(f)) {
        Ok(out) => out,
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory as _;

    /// Every flag and argument of every subcommand says what it is for.
    #[test]
    fn every_flag_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                let id = arg.get_id().as_str();
                if id == "help" || id == "version" {
                    continue;
                }
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {id}"));
                }
            }
            for sub in cmd.get_subcommands() {
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Args::command(), "wasmwatch", &mut missing);
        assert!(missing.is_empty(), "without help: {missing:?}");
    }

    /// Registry flags are offered by the commands that pull or push only.
    #[test]
    fn registry_flags_only_where_modules_are_pulled_or_pushed() {
        let root = super::Args::command();
        let has = |path: &[&str]| {
            let mut cmd = &root;
            for p in path {
                cmd = cmd.find_subcommand(p).unwrap();
            }
            cmd.get_arguments()
                .any(|a| a.get_long() == Some("insecure-registry"))
        };
        for pulls in [
            &["validate"][..],
            &["run"],
            &["local"],
            &["plugin", "run"],
            &["plugin", "test"],
            &["plugin", "push"],
        ] {
            assert!(has(pulls), "{pulls:?}");
        }
        for other in [&["elect"][..], &["plugin", "new"], &["manifest", "schema"]] {
            assert!(!has(other), "{other:?}");
        }
        assert!(
            !root
                .get_arguments()
                .any(|a| a.get_long() == Some("insecure-registry"))
        );
    }
}
