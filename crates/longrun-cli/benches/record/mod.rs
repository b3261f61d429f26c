//! A bench's dated record: the tables it prints, kept in a Markdown file of
//! `docs/benchmarks/` named by the date and the bench, with the commit, the
//! machine and the command that produced them. The history lives in git.
//! `LONGRUN_BENCH_RECORD=0` prints only.

use std::fmt::Write as _;
use std::path::PathBuf;

use longrun_core::{Clock, SystemClock};

/// The lines of one bench run's results, printed as they come.
pub struct Record {
    name: &'static str,
    lines: Vec<String>,
}

impl Record {
    /// The record of the bench `name` (the file's suffix).
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            lines: Vec::new(),
        }
    }

    /// Prints `line` and keeps it.
    pub fn line(&mut self, line: impl Into<String>) {
        let line = line.into();
        println!("{line}");
        self.lines.push(line);
    }

    /// Writes the record; returns its path (`None` when switched off).
    pub fn write(&self) -> Option<PathBuf> {
        if std::env::var("LONGRUN_BENCH_RECORD").is_ok_and(|v| v == "0") {
            return None;
        }
        let now = SystemClock.now().to_rfc3339();
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/benchmarks");
        let mut path = dir.join(format!("{}-{}.md", &now[..10], self.name));
        if path.exists() {
            path = dir.join(format!(
                "{}-{}-{}.md",
                &now[..10],
                self.name,
                now[11..16].replace(':', "")
            ));
        }
        let mut text = String::new();
        let _ = writeln!(text, "# `{}` bench, {}\n", self.name, &now[..16]);
        let _ = writeln!(text, "- commit: `{}`", commit());
        let _ = writeln!(text, "- machine: {}", machine());
        let _ = writeln!(text, "- command: `{}`\n", command());
        for line in &self.lines {
            let _ = writeln!(text, "{line}");
        }
        match std::fs::write(&path, text) {
            Ok(()) => {
                eprintln!("record written to {}", path.display());
                Some(path)
            }
            Err(e) => {
                eprintln!("could not write the record {}: {e}", path.display());
                None
            }
        }
    }
}

/// The commit measured, `+` marking uncommitted changes.
fn commit() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
    };
    let head = git(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty = git(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    if dirty { format!("{head}+") } else { head }
}

/// Cores, processor and memory, as the kernel reports them.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let read = |path: &str, key: &str| {
        std::fs::read_to_string(path).ok().and_then(|text| {
            text.lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
    };
    let cpu = read("/proc/cpuinfo", "model name").unwrap_or_else(|| "unknown processor".into());
    let memory = read("/proc/meminfo", "MemTotal").unwrap_or_else(|| "unknown memory".into());
    format!("{cores} cores, {cpu}, {memory}")
}

/// The bench's arguments and the `LONGRUN_*` settings it ran with.
fn command() -> String {
    let mut settings: Vec<String> = std::env::vars()
        .filter(|(k, _)| k.starts_with("LONGRUN_") && k != "LONGRUN_BENCH_RECORD")
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    settings.sort();
    let bench = std::env::args()
        .next()
        .and_then(|a| {
            std::path::Path::new(&a)
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    let bench = bench.split('-').next().unwrap_or_default().to_owned();
    let mut parts = settings;
    parts.push(format!("cargo bench -p longrun-cli --bench {bench}"));
    parts.join(" ")
}
