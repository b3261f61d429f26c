//! A worker build links the wire types and the pure domain, nothing of the
//! server: no database driver, no object storage, no engine. Read from the
//! manifests themselves, so a dependency added to any crate a worker links
//! is caught here (`cargo tree -p longrun-worker -e normal` shows the same).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The `[dependencies]` of a manifest: the names before `=` or `.workspace`.
fn normal_dependencies(manifest: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(manifest).unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    let mut in_section = false;
    let mut names = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_section = line == "[dependencies]";
            continue;
        }
        if !in_section || line.is_empty() || line.starts_with('#') {
            continue;
        }
        let name = line.split(['=', '.', ' ']).next().unwrap_or_default().trim();
        names.push(name.to_owned());
    }
    names
}

fn crates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

#[test]
fn a_worker_links_no_database_driver_no_object_storage_and_no_engine() {
    // Every workspace crate a worker build reaches, and every crate any of them names.
    let mut seen = BTreeSet::new();
    let mut named = BTreeSet::new();
    let mut todo = vec!["longrun-worker".to_owned()];
    while let Some(krate) = todo.pop() {
        if !seen.insert(krate.clone()) {
            continue;
        }
        for dep in normal_dependencies(&crates_dir().join(&krate).join("Cargo.toml")) {
            if dep.starts_with("longrun-") {
                todo.push(dep.clone());
            }
            named.insert(dep);
        }
    }
    assert_eq!(
        seen,
        BTreeSet::from(["longrun-api", "longrun-core", "longrun-worker"].map(String::from)),
        "a worker build reaches only the wire types and the pure domain"
    );
    for forbidden in [
        "sqlx",
        "rusqlite",
        "object_store",
        "longrun-store",
        "longrun-engine",
        "csv",
        "regex",
    ] {
        assert!(!named.contains(forbidden), "a worker build links {forbidden}");
    }
}

#[test]
fn the_example_remote_worker_is_built_against_this_crate_alone() {
    let example = std::fs::read_to_string(crates_dir().join("../examples/remote_worker.rs")).unwrap();
    let workspace_crates: BTreeSet<&str> = example
        .lines()
        .filter_map(|l| l.trim().strip_prefix("use longrun_"))
        .map(|rest| rest.split("::").next().unwrap_or_default())
        .collect();
    assert_eq!(workspace_crates, BTreeSet::from(["worker"]));
}
