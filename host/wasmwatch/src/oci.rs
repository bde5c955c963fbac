//! `oci://` modules: the one place where a manifest's registry references
//! become local files, before any plugin loads (`validate`, `plugin run`,
//! `run`, `run --dry-run`, `local`), and `plugin push`.
//!
//! A module whose pinned sha256 is in the cache (`<cache>/oci/sha256/`) is
//! used without contacting the registry; otherwise it is pulled, checked
//! against the pin and cached. Any failure stops the command before a
//! plugin runs, with one line naming the plugin, the reference and the
//! cause. The entry's `module` then holds the cached file's absolute path,
//! so the runtime (which checks the pin again as it reads the file) is
//! unchanged.
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use wasmwatch_core::Manifest;
use wasmwatch_core::units::HumanDuration;
use wasmwatch_oci::{AuthSource, ModuleRef, ModuleStore, Registry, RegistryOptions};

/// How to reach registries: flags of the commands that pull or push.
#[derive(Debug, Clone, clap::Args)]
pub struct RegistryArgs {
    /// A registry (HOST[:PORT], as written in the oci:// reference) spoken to
    /// over plain HTTP; any other only over HTTPS. Repeat, or comma-separate
    /// in the variable.
    #[arg(
        long = "insecure-registry",
        env = "WASMWATCH_INSECURE_REGISTRIES",
        value_delimiter = ',',
        value_name = "HOST:PORT"
    )]
    insecure_registries: Vec<String>,
    /// A PEM file of CA certificates to trust for registries, beside the
    /// system's (a registry with a private CA).
    #[arg(
        long = "registry-ca-file",
        env = "WASMWATCH_REGISTRY_CA_FILE",
        value_name = "FILE"
    )]
    registry_ca_file: Option<PathBuf>,
    /// A docker config.json with registry credentials (`auths`), e.g. a
    /// mounted imagePullSecret's `.dockerconfigjson`. Default:
    /// $DOCKER_CONFIG/config.json, else ~/.docker/config.json, if it exists.
    #[arg(
        long = "registry-config",
        env = "WASMWATCH_REGISTRY_CONFIG",
        value_name = "FILE"
    )]
    registry_config: Option<PathBuf>,
    /// A user for every registry, ahead of the config file; the password
    /// comes from WASMWATCH_REGISTRY_PASSWORD (never a flag).
    #[arg(
        long = "registry-username",
        env = "WASMWATCH_REGISTRY_USERNAME",
        value_name = "USER"
    )]
    registry_username: Option<String>,
    /// The longest one module's pull may take, from the first request to
    /// the last byte (a registry that answers slowly, or not at all, is
    /// given up after it; the command then stops, as on any failed pull).
    #[arg(
        long = "pull-timeout",
        env = "WASMWATCH_PULL_TIMEOUT",
        value_name = "DURATION",
        default_value = "60s",
        value_parser = pull_timeout,
    )]
    pull_timeout: HumanDuration,
}

/// `--pull-timeout`: 1s to 1h.
fn pull_timeout(s: &str) -> Result<HumanDuration, String> {
    let d: HumanDuration = s.parse()?;
    if d.0 < Duration::from_secs(1) || d.0 > Duration::from_secs(3600) {
        return Err(format!("{d} is out of range (1s to 1h)"));
    }
    Ok(d)
}

impl RegistryArgs {
    /// The client options these flags give.
    pub fn options(&self) -> anyhow::Result<RegistryOptions> {
        let explicit = match &self.registry_username {
            Some(user) => {
                let password = std::env::var("WASMWATCH_REGISTRY_PASSWORD").map_err(|_| {
                    anyhow::anyhow!(
                        "--registry-username / WASMWATCH_REGISTRY_USERNAME needs the password in WASMWATCH_REGISTRY_PASSWORD"
                    )
                })?;
                Some((user.clone(), password))
            }
            None => None,
        };
        Ok(RegistryOptions {
            insecure: self
                .insecure_registries
                .iter()
                .map(|r| r.trim().to_string())
                .filter(|r| !r.is_empty())
                .collect(),
            ca_files: self.registry_ca_file.iter().cloned().collect(),
            auth: AuthSource {
                config_file: self.registry_config.clone(),
                explicit,
            },
            pull_timeout: self.pull_timeout.0,
            ..RegistryOptions::default()
        })
    }
}

/// One `oci://` module made local.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub plugin: String,
    pub reference: String,
    pub path: PathBuf,
    /// False when the cached copy was used (no registry contacted).
    pub pulled: bool,
}

/// The cache folder of pulled modules: `--cache-dir`, else the user's cache
/// folder (`$XDG_CACHE_HOME/wasmwatch`, `~/.cache/wasmwatch`).
fn cache_root(cache_dir: Option<&Path>) -> anyhow::Result<PathBuf> {
    match cache_dir {
        Some(d) => Ok(d.to_path_buf()),
        None => wasmwatch_oci::default_cache_dir().context(
            "oci:// modules need a cache folder: set --cache-dir or WASMWATCH_CACHE_DIR \
             (no XDG_CACHE_HOME or HOME to default to)",
        ),
    }
}

/// Whether `resolve_modules` has work: an `oci://` module among the plugins
/// (all of them, or only the one named).
fn has_oci(manifest: &Manifest, only: Option<&str>) -> bool {
    manifest
        .plugins
        .iter()
        .any(|p| p.oci_reference().is_some() && only.is_none_or(|n| n == p.name))
}

/// Makes every `oci://` module of `manifest` (or only plugin `only`'s) a
/// local file: the cached copy of its pinned digest, else pulled, verified
/// and cached. Stops at the first failure, before any plugin is loaded.
pub async fn resolve_modules(
    manifest: &mut Manifest,
    cache_dir: Option<&Path>,
    options: &RegistryOptions,
    only: Option<&str>,
) -> anyhow::Result<Vec<Resolved>> {
    let mut out = Vec::new();
    if !has_oci(manifest, only) {
        return Ok(out);
    }
    let store = ModuleStore::new(&cache_root(cache_dir)?);
    let mut registry: Option<Registry> = None;
    for entry in &mut manifest.plugins {
        if entry.oci_reference().is_none() || only.is_some_and(|n| n != entry.name) {
            continue;
        }
        let plugin = entry.name.clone();
        let reference = entry.module.to_string_lossy().into_owned();
        let module =
            ModuleRef::parse(&reference).map_err(|e| anyhow::anyhow!("plugin {plugin}: {e}"))?;
        let (path, pulled) = match store.get(&entry.sha256) {
            Some(path) => {
                tracing::debug!(plugin, %reference, path = %path.display(), "using the cached module");
                (path, false)
            }
            None => {
                let started = Instant::now();
                let registry = match &mut registry {
                    Some(r) => r,
                    None => registry.insert(
                        Registry::new(options.clone())
                            .map_err(|e| anyhow::anyhow!("plugin {plugin}: {e}"))?,
                    ),
                };
                let bytes = pull_saying_what_it_waits_for(registry, &module, entry, options)
                    .await
                    .map_err(|e| anyhow::anyhow!("plugin {plugin}: cannot pull {e}"))?;
                let path = store.put(&entry.sha256, &bytes).map_err(|e| {
                    anyhow::anyhow!(
                        "plugin {plugin}: {reference}: cannot cache the module in {}: {e}",
                        store.dir().display()
                    )
                })?;
                tracing::info!(
                    plugin,
                    %reference,
                    sha256 = %entry.sha256,
                    bytes = bytes.len(),
                    ms = started.elapsed().as_millis() as u64,
                    "pulled the module"
                );
                (path, true)
            }
        };
        entry.module = path.clone();
        out.push(Resolved {
            plugin,
            reference,
            path,
            pulled,
        });
    }
    Ok(out)
}

/// `registry.pull` for `entry`, logging (warn) which plugin's module start-up
/// is waiting for while the pull is slow: first after a few seconds (half
/// the pull timeout when that is shorter), then every 10 s until it ends.
async fn pull_saying_what_it_waits_for(
    registry: &Registry,
    module: &ModuleRef,
    entry: &wasmwatch_core::manifest::PluginEntry,
    options: &RegistryOptions,
) -> Result<Vec<u8>, wasmwatch_oci::OciError> {
    let started = tokio::time::Instant::now();
    let first = Duration::from_secs(5).min(options.pull_timeout / 2);
    let mut slow = tokio::time::interval_at(started + first, Duration::from_secs(10));
    let pull = registry.pull(module, &entry.sha256);
    tokio::pin!(pull);
    loop {
        tokio::select! {
            result = &mut pull => return result,
            _ = slow.tick() => tracing::warn!(
                plugin = %entry.name,
                reference = %module,
                waited = %HumanDuration(Duration::from_secs(started.elapsed().as_secs())),
                pull_timeout = %HumanDuration(options.pull_timeout),
                "still pulling the plugin's module: waiting for the registry"
            ),
        }
    }
}

/// [`resolve_modules`] for callers outside any async runtime.
pub fn resolve_modules_blocking(
    manifest: &mut Manifest,
    cache_dir: Option<&Path>,
    options: &RegistryOptions,
    only: Option<&str>,
) -> anyhow::Result<Vec<Resolved>> {
    if !has_oci(manifest, only) {
        return Ok(Vec::new());
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(resolve_modules(manifest, cache_dir, options, only))
}

/// `wasmwatch plugin push FILE oci://...`: publishes a component and prints
/// the manifest lines that pin it.
pub fn push(file: &Path, reference: &str, options: &RegistryOptions) -> anyhow::Result<()> {
    let module = ModuleRef::parse(reference)?;
    let bytes = std::fs::read(file).with_context(|| format!("cannot read {}", file.display()))?;
    let registry = Registry::new(options.clone())?;
    let started = Instant::now();
    let pushed = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(registry.push(&module, file, bytes))?;
    println!(
        "pushed {} ({} bytes, {} ms)",
        pushed.reference,
        pushed.size,
        started.elapsed().as_millis()
    );
    if let Some(digest) = &pushed.manifest_digest {
        println!("artifact manifest: {digest}");
    }
    println!("\n# in the plugin manifest:");
    println!("    module: {}", pushed.reference);
    println!("    sha256: {}", pushed.sha256);
    if let Some(digest) = &pushed.manifest_digest {
        println!(
            "# or, to pin the registry's artifact too:\n#   module: oci://{}/{}@{digest}",
            module.registry(),
            module.repository()
        );
    }
    Ok(())
}
