//! Keeps the backends drivers (docs/ARCHITECTURE.md, "One plan, two drivers"): a file
//! under `src/postgres*` or `src/sqlite*` never spells an event or webhook
//! name (they come from `plan::EventType` and `plan::WebhookType`) and
//! never looks at a decision of the rules (`Decision`, `IntentChange`,
//! `decide_*`, a claim's rules): deciding is the plan layer's, once for
//! both. Nor does it build an operation or an event of its own: their
//! columns are decoded once (`shared/columns.rs`).

use std::path::{Path, PathBuf};

/// History event names, as a backend would spell them in Rust.
const EVENT_NAMES: [&str; 14] = [
    "created",
    "started",
    "progress",
    "cancel_requested",
    "pause_requested",
    "pause_withdrawn",
    "paused",
    "resumed",
    "retry_scheduled",
    "updated",
    "pause_not_honoured",
    "succeeded",
    "failed",
    "cancelled",
];

/// Event names that are no state's name, as SQL would spell them (a
/// state's name in SQL is a state, which the schema's checks spell too).
const EVENT_ONLY_NAMES: [&str; 10] = [
    "created",
    "started",
    "progress",
    "cancel_requested",
    "pause_requested",
    "pause_withdrawn",
    "resumed",
    "retry_scheduled",
    "updated",
    "pause_not_honoured",
];

/// What only the plan layer may name: the decision types, the rules,
/// which webhook a change queues (`WebhookType`: a claim asks
/// `start_delivery_queued`), and a claim's rules (who is served, how many,
/// in which order; `plan/claim.rs`).
const DECISIONS: [&str; 8] = [
    "Decision",
    "IntentChange",
    "decide_",
    "WebhookType",
    "claim_allowance",
    "round_robin",
    "records_served_order",
    "deadline_error_before_start",
];

/// Whether `line` names `word` (not as a part of a longer identifier; a
/// word ending in `_` is a prefix).
fn names(line: &str, word: &str) -> bool {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    line.match_indices(word).any(|(at, _)| {
        let before = line[..at].chars().next_back();
        let after = line[at + word.len()..].chars().next();
        !before.is_some_and(ident) && (word.ends_with('_') || !after.is_some_and(ident))
    })
}

fn backend_files() -> Vec<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = vec![src.join("postgres.rs"), src.join("sqlite.rs")];
    for dir in ["postgres", "sqlite"] {
        for entry in std::fs::read_dir(src.join(dir)).expect("backend folder") {
            let path = entry.expect("entry").path();
            if path.extension().is_some_and(|e| e == "rs") {
                files.push(path);
            }
        }
    }
    files
}

/// The file's code before its tests (`#[cfg(test)]` modules come last).
fn code_of(path: &Path) -> String {
    let text = std::fs::read_to_string(path).expect("readable source");
    match text.find("#[cfg(test)]") {
        Some(tests) => text[..tests].to_owned(),
        None => text,
    }
}

/// Every line of the backends' code (before their tests) that `offends`,
/// as `path:line: text`.
fn lines_where(offends: impl Fn(&str) -> bool) -> Vec<String> {
    let mut found = Vec::new();
    for path in backend_files() {
        for (n, line) in code_of(&path).lines().enumerate() {
            if offends(line) {
                found.push(format!("{}:{}: {}", path.display(), n + 1, line.trim()));
            }
        }
    }
    found
}

fn is_comment(line: &str) -> bool {
    line.trim_start().starts_with("//")
}

#[test]
fn backends_spell_no_event_or_webhook_name() {
    let found = lines_where(|line| {
        let rust = EVENT_NAMES.iter().map(|name| format!("\"{name}\""));
        let sql = EVENT_ONLY_NAMES.iter().map(|name| format!("'{name}'"));
        rust.chain(sql).any(|quoted| line.contains(&quoted))
            || line.contains("\"operation.")
            || line.contains("'operation.")
    });
    assert!(
        found.is_empty(),
        "event or webhook names in a backend:\n{}",
        found.join("\n")
    );
}

#[test]
fn backends_decide_nothing() {
    let found = lines_where(|line| !is_comment(line) && DECISIONS.iter().any(|name| names(line, name)));
    assert!(found.is_empty(), "decisions in a backend:\n{}", found.join("\n"));
}

/// An operation's and an event's columns are decoded once
/// (`shared/columns.rs`, through each driver's `Columns`): a backend builds
/// neither record of its own.
#[test]
fn backends_build_no_operation_or_event_of_their_own() {
    let found = lines_where(|line| {
        // `Operation {` or `Event {`, not as the end of a longer name.
        let builds = |literal: &str| {
            line.match_indices(literal)
                .any(|(at, _)| !line[..at].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
        };
        !is_comment(line) && (builds("Operation {") || builds("Event {"))
    });
    assert!(
        found.is_empty(),
        "a record decoded in a backend (see shared/columns.rs):\n{}",
        found.join("\n")
    );
}
