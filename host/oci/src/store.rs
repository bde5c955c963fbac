//! Pulled modules on disk, named by their sha256: `<cache>/oci/sha256/<hex>.wasm`.
//! A pinned digest names immutable content, so a file found here is used
//! without asking the registry. Files are written through a temporary file
//! and a rename (a reader never sees half a module); the folders it
//! creates are 0700 (one that exists, such as `--cache-dir`, keeps its mode). The
//! runtime checks every module's sha256 against its pin when it loads it, so
//! a damaged or planted file is refused, never run.
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The folder of pulled modules under a cache folder.
#[derive(Debug, Clone)]
pub struct ModuleStore {
    dir: PathBuf,
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// Creates `dir` and its missing parents, each 0700 (less what the umask
/// takes). A folder that exists keeps its mode: `--cache-dir` may be a
/// folder the operator made and shares, and only what wasmwatch creates is
/// its to make private.
fn private_dir(dir: &Path) -> std::io::Result<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir)
}

impl ModuleStore {
    /// The store under the cache folder `cache_dir`.
    pub fn new(cache_dir: &Path) -> ModuleStore {
        ModuleStore {
            dir: cache_dir.join("oci").join("sha256"),
        }
    }

    /// The folder holding the modules.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Where the module with this sha256 (64 lowercase hex digits) is kept.
    pub fn path(&self, sha256: &str) -> PathBuf {
        assert!(is_sha256_hex(sha256), "not a sha256: {sha256:?}");
        self.dir.join(format!("{sha256}.wasm"))
    }

    /// The cached module, if there is one.
    pub fn get(&self, sha256: &str) -> Option<PathBuf> {
        let path = self.path(sha256);
        path.is_file().then_some(path)
    }

    /// Stores verified bytes (the caller checked their sha256) and returns
    /// the file's path.
    pub fn put(&self, sha256: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
        let path = self.path(sha256);
        // The cache root and `oci` too, if missing: the runtime may not have
        // made it yet.
        private_dir(&self.dir)?;
        // Unique per writer: two replicas in one process may pull at once.
        static WRITERS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = WRITERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!(".{sha256}.tmp{}-{n}", std::process::id()));
        let write = || -> std::io::Result<()> {
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create_new(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                options.mode(0o600);
            }
            let mut file = options.open(&tmp)?;
            file.write_all(bytes)?;
            file.sync_all()?;
            std::fs::rename(&tmp, &path)
        };
        write().inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })?;
        Ok(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn put_then_get_in_private_folders() {
        let cache = tempfile::tempdir().unwrap();
        let root = cache.path().join("wasmwatch");
        let store = ModuleStore::new(&root);
        let sha = "ab".repeat(32);
        assert_eq!(store.get(&sha), None);
        let path = store.put(&sha, b"\0asm").unwrap();
        assert_eq!(path, root.join("oci/sha256").join(format!("{sha}.wasm")));
        assert_eq!(store.get(&sha), Some(path.clone()));
        assert_eq!(std::fs::read(&path).unwrap(), b"\0asm");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            for d in [root.clone(), root.join("oci"), root.join("oci/sha256")] {
                let mode = std::fs::metadata(&d).unwrap().permissions().mode();
                assert_eq!(mode & 0o777, 0o700, "{}", d.display());
            }
        }
        // No temporary files left behind.
        let names: Vec<_> = std::fs::read_dir(store.dir()).unwrap().collect();
        assert_eq!(names.len(), 1);
    }
}
