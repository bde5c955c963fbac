//! The compiled-artifact cache. Artifacts are native code, so only files this
//! host wrote itself are ever loaded: the cache lives in a folder the host
//! creates with mode 0700 (`<cache>/compiled/`), artifacts are named by the module's sha256 and the
//! engine's compatibility hash, and users never supply precompiled artifacts
//! (modules are always given as `.wasm` and pinned by their sha256).
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use wasmtime::Engine;
use wasmtime::component::Component;

/// The folder compiled artifacts live in: `compiled/` inside the cache
/// folder. The cache folder itself is the operator's (it also holds pulled
/// modules) and keeps its mode; `compiled/` is this host's own and is made
/// private (0700) at every start, so that no other user can plant native
/// code in it, whatever the cache folder's mode.
pub(crate) fn compiled_dir(cache_dir: &Path) -> PathBuf {
    cache_dir.join("compiled")
}

pub(crate) fn prepare_dir(cache_dir: &Path) -> std::io::Result<()> {
    let dir = compiled_dir(cache_dir);
    std::fs::create_dir_all(&dir)?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// The artifact's file name: module digest and engine compatibility hash.
pub(crate) fn artifact_path(dir: &Path, engine: &Engine, module_sha256: &str) -> PathBuf {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    dir.join(format!("{module_sha256}-{:016x}.cwasm", h.finish()))
}

/// Compiles `bytes`, through the cache when there is one.
pub(crate) fn compile(
    engine: &Engine,
    cache_dir: Option<&Path>,
    bytes: &[u8],
    sha256: &str,
) -> wasmtime::Result<Component> {
    let Some(dir) = cache_dir else {
        return Component::new(engine, bytes);
    };
    let path = artifact_path(&compiled_dir(dir), engine, sha256);
    if path.exists() {
        match load_own_artifact(engine, &path) {
            Ok(c) => return Ok(c),
            Err(e) => {
                tracing::warn!(path = %path.display(), "ignoring unusable cached artifact: {e:#}");
                let _ = std::fs::remove_file(&path);
            }
        }
    }
    let artifact = engine.precompile_component(bytes)?;
    // Unique per writer: several runtimes in one process (the local run's
    // two replicas) may compile the same module at once; a shared name let
    // one rename away the other's file.
    static WRITERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = path.with_extension(format!("tmp{}-{n}", std::process::id()));
    std::fs::write(&tmp, &artifact)?;
    std::fs::rename(&tmp, &path)?;
    load_own_artifact(engine, &path)
}

#[allow(unsafe_code)]
fn load_own_artifact(engine: &Engine, path: &Path) -> wasmtime::Result<Component> {
    // Read into memory rather than map the file: a mapped artifact that is
    // later truncated or rewritten in place would crash the host (SIGBUS).
    let bytes = std::fs::read(path)?;
    // SAFETY: `path` is inside the host's private cache folder and was written
    // by `compile` above from a module whose sha256 is in its name; wasmtime
    // still checks the artifact's header and engine compatibility. No
    // user-supplied file is ever deserialised.
    unsafe { Component::deserialize(engine, &bytes) }
}
