//! The documents stay a map a newcomer can use (issue 49): the API
//! reference lists exactly the paths the server serves, the README stays a
//! front door (under its line budget, no commit hashes: dated measurements
//! live in `docs/benchmarks/`), and every relative link of every Markdown
//! file resolves inside the repository.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::helpers::spawn_app;

/// The README's budget, in lines.
const README_MAX_LINES: usize = 200;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

#[tokio::test]
async fn the_endpoint_index_of_docs_api_md_is_the_served_openapi() {
    let app = spawn_app().await;
    let document: Value = app
        .http
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut served = BTreeSet::new();
    for (path, item) in document["paths"].as_object().expect("paths") {
        for method in item.as_object().expect("a path item").keys() {
            if ["get", "put", "post", "delete", "patch", "head", "options"].contains(&method.as_str()) {
                served.insert(format!("{} {path}", method.to_uppercase()));
            }
        }
    }
    let text = std::fs::read_to_string(repo().join("docs/api.md")).unwrap();
    let index = &text[text.find("## Endpoint index").expect("an endpoint index")..];
    // Rows of the index: | `METHOD /path` | what it is |
    let documented: BTreeSet<String> = index
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(endpoint, _)| endpoint.to_owned()))
        .collect();
    let missing: Vec<_> = served.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&served).collect();
    assert!(
        missing.is_empty() && stale.is_empty(),
        "docs/api.md's endpoint index and /openapi.json differ:\n  served, not documented: {missing:#?}\n  documented, not served: {stale:#?}"
    );
    app.shutdown().await;
}

#[test]
fn the_readme_is_a_front_door() {
    let readme = std::fs::read_to_string(repo().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= README_MAX_LINES,
        "README.md has {lines} lines, its budget is {README_MAX_LINES}"
    );
    // A commit hash: 7 to 40 hex digits with at least one digit and one letter.
    let hashes: Vec<&str> = readme
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|w| {
            (7..=40).contains(&w.len())
                && w.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
                && w.chars().any(|c| c.is_ascii_digit())
                && w.chars().any(|c| c.is_ascii_alphabetic())
        })
        .collect();
    assert!(
        hashes.is_empty(),
        "commit hashes in README.md (dated runs go to docs/benchmarks/): {hashes:?}"
    );
}

/// Every Markdown file of the repository, but what tools write.
fn markdown_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if path.is_dir() {
            if !name.starts_with('.') && !["target", "node_modules", "longrun-data"].contains(&name.as_str()) {
                markdown_files(&path, found);
            }
        } else if name.ends_with(".md") {
            found.push(path);
        }
    }
}

#[test]
fn every_relative_link_in_the_docs_resolves_inside_the_repository() {
    let root = repo();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    assert!(files.len() > 10, "found the docs: {files:?}");
    let mut broken = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let mut in_code = false;
        for line in text.lines() {
            if line.trim_start().starts_with("```") {
                in_code = !in_code;
            }
            if in_code {
                continue;
            }
            for (at, _) in line.match_indices("](") {
                let rest = &line[at + 2..];
                let Some(end) = rest.find(')') else { continue };
                let target = rest[..end].trim();
                if target.is_empty()
                    || target.starts_with('#')
                    || target.contains("://")
                    || target.starts_with("mailto:")
                {
                    continue;
                }
                let path = target.split('#').next().unwrap();
                let resolved = file.parent().unwrap().join(path);
                let inside = resolved.canonicalize().map(|p| p.starts_with(&root)).unwrap_or(false);
                if !inside {
                    broken.push(format!("{}: {target}", file.strip_prefix(&root).unwrap().display()));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "links that do not resolve inside the repository:\n{}",
        broken.join("\n")
    );
}

/// The Rust files under `dir`, with their text.
fn rust_files(dir: &Path, found: &mut Vec<(PathBuf, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            found.push((path, text));
        }
    }
}

/// The server's layers, as docs/ARCHITECTURE.md draws them: the
/// application holds no HTTP type and imports neither edge; the two edges
/// (`http`, `console`) do not import each other; what lies below the
/// application imports none of the three. A module that reached up would
/// close an import circle.
#[test]
fn the_server_imports_only_downward_and_its_application_holds_no_http_type() {
    let src = repo().join("crates/longrun-server/src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let edges = [
        "crate::http",
        "crate::console",
        "crate::router",
        "crate::server",
        "crate::listen",
    ];
    let below = [
        "cache",
        "changes",
        "handoff",
        "keys",
        "metrics",
        "ratelimit",
        "source",
        "stats",
    ];
    let mut broken = Vec::new();
    for (path, text) in &files {
        let name = path.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
        let forbidden: Vec<&str> = if name == "app.rs" || name.starts_with("app/") {
            edges.iter().copied().chain(["axum", "hyper", "tower"]).collect()
        } else if name == "http.rs" || name.starts_with("http/") {
            vec!["crate::console", "crate::router", "crate::server"]
        } else if name == "console.rs" || name.starts_with("console/") {
            vec!["crate::http", "crate::router", "crate::server"]
        } else if below.iter().any(|b| name == format!("{b}.rs")) {
            edges.iter().copied().chain(["crate::app"]).collect()
        } else {
            continue;
        };
        for line in text.lines().filter(|l| !l.trim_start().starts_with("//")) {
            for f in &forbidden {
                if line.contains(f) {
                    broken.push(format!("{name}: {}", line.trim()));
                }
            }
        }
    }
    assert!(
        files.len() > 30 && broken.is_empty(),
        "imports that run up a layer: {broken:#?}"
    );
}

#[test]
fn the_architecture_map_carries_no_figures() {
    let map = std::fs::read_to_string(repo().join("docs/ARCHITECTURE.md")).unwrap();
    let figures: Vec<&str> = map
        .lines()
        .filter(|l| {
            [
                "jobs/s",
                "k/s",
                "submits/s",
                "req/s",
                "requests/s",
                "p50",
                "p99",
                "graphile",
            ]
            .iter()
            .any(|f| l.contains(f))
        })
        .collect();
    assert!(figures.is_empty(), "figures belong in docs/benchmarks/: {figures:#?}");
}
