//! `wasmwatch validate`: every problem of a manifest in one run.
//!
//! Errors are what `wasmwatch run` refuses (fields, values, pins, modules,
//! each plugin's config check); warnings are what it would start with but
//! can never work: a plugin filter that selects nothing, a grant short of
//! what the plugin declares it needs (`wasmwatch:needs`, see
//! [`wasmwatch_core::needs`]). Each line names the field. The exit code is
//! 1 with errors, and with warnings too under `--strict`; else 0.
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use wasmwatch_core::manifest::{Checked, Problem};
use wasmwatch_core::needs::{Needs, shortfalls};
use wasmwatch_core::prefilter::Prefilter;
use wasmwatch_core::{Manifest, StaticLookups};
use wasmwatch_runtime::LoadError;

/// Whether `path` is `of` or lies under it (`plugins[1]` holds
/// `plugins[1].limits.memory`), or the other way round.
fn related(path: &str, of: &str) -> bool {
    let under = |long: &str, short: &str| {
        long.strip_prefix(short)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with(['.', '[']))
    };
    under(path, of) || under(of, path)
}

/// The field a load error is about.
fn load_error_field(e: &LoadError) -> &'static str {
    match e {
        LoadError::ConfigRejected { .. } | LoadError::ConfigCheck { .. } => "config",
        LoadError::Digest { .. } => "sha256",
        _ => "module",
    }
}

pub(crate) fn run(
    manifest_path: &Path,
    plugin_dirs: &[crate::plugin_dir::PluginDirMap],
    cache_dir: Option<PathBuf>,
    registry: &wasmwatch_oci::RegistryOptions,
    strict: bool,
) -> anyhow::Result<ExitCode> {
    let shown = manifest_path.display();
    let text = match std::fs::read_to_string(manifest_path) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("error: {shown}: cannot read it: {e}");
            return Ok(ExitCode::FAILURE);
        }
    };
    let base = manifest_path.parent().unwrap_or(Path::new("."));
    let Checked { manifest, errors } = Manifest::check(&text, base);
    let mut errors = errors;
    let mut warnings: Vec<Problem> = Vec::new();
    let mut loaded = 0;
    let mut pull_failed = None;
    if let Some(mut m) = manifest {
        for unused in crate::plugin_dir::apply(&mut m, plugin_dirs) {
            eprintln!(
                "note: --plugin-dir {}={}: no module of {shown} is under {}",
                unused.from.display(),
                unused.to.display(),
                unused.from.display()
            );
        }
        // The plugins no error is about: these are loaded and checked.
        let sound: Vec<usize> = (0..m.plugins.len())
            .filter(|i| {
                let at = format!("plugins[{i}]");
                !errors
                    .iter()
                    .any(|e| !e.path.is_empty() && related(&e.path, &at))
            })
            .collect();
        warnings.extend(
            m.warnings()
                .into_iter()
                .filter(|w| !errors.iter().any(|e| related(&w.path, &e.path))),
        );
        let mut to_load = m.clone();
        to_load.plugins = sound.iter().map(|&i| m.plugins[i].clone()).collect();
        match crate::oci::resolve_modules_blocking(
            &mut to_load,
            cache_dir.as_deref(),
            registry,
            None,
        ) {
            // A module that cannot be pulled stops the command, with the
            // problems found so far and the pull's one line last (nothing
            // is loaded).
            Err(e) => pull_failed = Some(crate::cli::error_chain(&e)),
            Ok(pulled) => {
                for (&i, entry) in sound.iter().zip(&to_load.plugins) {
                    m.plugins[i] = entry.clone();
                }
                let rt = crate::cli::runtime(cache_dir, StaticLookups::default())?;
                for &i in &sound {
                    let entry = &m.plugins[i];
                    if let Err(e) = rt.load_blocking(entry, &m.base_dir) {
                        errors.push(Problem {
                            path: format!("plugins[{i}].{}", load_error_field(&e)),
                            message: e.to_string(),
                        });
                        continue;
                    }
                    loaded += 1;
                    let path = entry.module_path(&m.base_dir);
                    println!(
                        "plugin {}: ok ({})",
                        entry.name,
                        match pulled.iter().find(|r| r.plugin == entry.name) {
                            Some(r) => format!(
                                "{}, {} {}",
                                r.reference,
                                if r.pulled { "pulled to" } else { "cached at" },
                                r.path.display()
                            ),
                            None => path.display().to_string(),
                        }
                    );
                    let needs = std::fs::read(&path)
                        .map_err(|e| e.to_string())
                        .and_then(|bytes| Needs::from_wasm(&bytes));
                    match needs {
                        Ok(Some(needs)) => {
                            warnings.extend(shortfalls(&m, i, &needs));
                            let (prefilter, unknown) = Prefilter::of(&needs.only, &entry.config);
                            if !prefilter.is_empty() {
                                println!(
                                    "plugin {}: called only for objects that meet its prefilter: {prefilter}",
                                    entry.name
                                );
                            }
                            warnings.extend(unknown.into_iter().map(|e| Problem {
                                path: format!("plugins[{i}].module"),
                                message: format!(
                                    "a prefilter the plugin declares is left out (the plugin is called without it): {e}"
                                ),
                            }));
                        }
                        Ok(None) => {}
                        Err(e) => warnings.push(Problem {
                            path: format!("plugins[{i}].module"),
                            message: format!("cannot read what the plugin needs granted: {e}"),
                        }),
                    }
                }
            }
        }
    }
    // The manifest's own problems first, then each plugin's, in its order.
    let plugin_index = |p: &Problem| {
        p.path
            .strip_prefix("plugins[")
            .and_then(|r| r.split(']').next()?.parse::<usize>().ok())
    };
    errors.sort_by_key(plugin_index);
    warnings.sort_by_key(plugin_index);
    for e in &errors {
        eprintln!("error: {e}");
    }
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    if let Some(e) = pull_failed {
        eprintln!("error: {e}");
        return Ok(ExitCode::FAILURE);
    }
    let counts = |n: usize, what: &str| format!("{n} {what}{}", if n == 1 { "" } else { "s" });
    if !errors.is_empty() {
        eprintln!(
            "{shown}: invalid: {}, {}",
            counts(errors.len(), "error"),
            counts(warnings.len(), "warning")
        );
        return Ok(ExitCode::FAILURE);
    }
    if warnings.is_empty() {
        println!("{shown}: valid, {loaded} plugin(s)");
        return Ok(ExitCode::SUCCESS);
    }
    if strict {
        eprintln!(
            "{shown}: valid, {loaded} plugin(s), but {} (--strict fails on warnings)",
            counts(warnings.len(), "warning")
        );
        return Ok(ExitCode::FAILURE);
    }
    println!(
        "{shown}: valid, {loaded} plugin(s), {} (--strict makes warnings fail)",
        counts(warnings.len(), "warning")
    );
    Ok(ExitCode::SUCCESS)
}
