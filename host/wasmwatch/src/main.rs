//! The `wasmwatch` binary: everything lives in the library.
fn main() -> std::process::ExitCode {
    one_malloc_arena();
    wasmwatch::cli::main()
}

/// glibc gives each thread that allocates under contention an arena of its
/// own (up to 8 per CPU), and memory freed in one is not reused by another:
/// after the initial list of 10,000 ConfigMaps of 10 KiB (parsed on the
/// runtime's workers) the process kept 73.5 MiB resident, 61.6 MiB with one
/// arena (`bench memory`, 2026-12-05; the informer baseline holds ~150).
/// The allocations on the per-change path hit the per-thread caches
/// (tcache) first, so one arena costs them little (`bench compare`).
/// Before any thread starts; `MALLOC_ARENA_MAX` in the environment still
/// wins.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: mallopt only sets a glibc tunable; called before any
        // other thread exists.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 1);
        }
    }
}
