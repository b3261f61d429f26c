//! The `export` kind: a CSV (RFC 4180, header row) or JSON Lines export of a
//! deterministic synthetic customer table, `input: {"rows": N, "format":
//! "csv" | "jsonl"}`. Rows are generated and streamed to the artifact store
//! in chunks — memory stays bounded whatever N is — with progress in rows and
//! a cancellation check between chunks; a cancelled export leaves nothing.
//! Safe to re-run: the same input always produces the same bytes.
//!
//! Resumable: the file is stored as pieces of `PIECE_ROWS` rows, each
//! followed by a checkpoint `{"rows_done", "bytes"}`. A pause ends the
//! current piece early; a resumed, retried (after a crash) or
//! `from_checkpoint` re-run attempt appends from the checkpoint, and the
//! pieces are joined into one artifact at the end: the same bytes (and
//! SHA-256) as an uninterrupted run, each row stored once.

use std::pin::pin;

use async_trait::async_trait;
use longrun_core::validate::Invalid;
use longrun_store::{DEFAULT_ARTIFACT, ProgressUpdate};
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt;

use longrun_worker::task::{Handler, KindInfo, TaskContext, TaskError};

/// The most rows one export may ask for.
pub const MAX_ROWS: u64 = 100_000_000;
/// Rows generated between progress reports and cancellation checks.
const CHUNK_ROWS: u64 = 50_000;
/// Rows per stored piece: a checkpoint is saved after each, so a pause or a
/// crash costs at most this many rows (about 20 MB of CSV).
const PIECE_ROWS: u64 = 200_000;
// Pieces end where chunks end: the renderer runs ahead in chunks from where
// the run resumed, and each piece takes whole chunks up to its end.
const _: () = assert!(PIECE_ROWS.is_multiple_of(CHUNK_ROWS));
/// Bytes in flight between the generator and the upload.
const PIPE_BYTES: usize = 1024 * 1024;
/// Chunks rendered ahead of the piece being stored (about 5 MB each).
const RENDER_AHEAD: usize = 3;

/// The `export` kind: generated rows streamed to an artifact, in pieces it can resume from.
pub struct Export;

/// An export's file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated, RFC 4180, with a header line.
    Csv,
    /// One JSON object per line.
    JsonLines,
}

impl Format {
    /// The artifact's content type.
    pub fn content_type(self) -> &'static str {
        match self {
            Format::Csv => "text/csv; charset=utf-8",
            Format::JsonLines => "application/jsonl",
        }
    }
}

/// A validated `export` input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExportInput {
    /// Rows to generate.
    pub rows: u64,
    /// Their format.
    pub format: Format,
}

fn invalid(message: impl Into<String>) -> Invalid {
    Invalid {
        field: "input",
        message: message.into(),
    }
}

impl ExportInput {
    /// Checks an `export` input.
    pub fn parse(input: &Value) -> Result<Self, Invalid> {
        let object = input.as_object().ok_or_else(|| invalid("must be an object"))?;
        if let Some(key) = object.keys().find(|k| !matches!(k.as_str(), "rows" | "format")) {
            return Err(invalid(format!("unknown field {key:?}; expected rows, format")));
        }
        let rows = object
            .get("rows")
            .and_then(Value::as_f64)
            .filter(|r| r.fract() == 0.0 && *r >= 1.0 && *r <= MAX_ROWS as f64)
            .ok_or_else(|| invalid(format!("rows must be an integer between 1 and {MAX_ROWS}")))?
            as u64;
        let format = match object.get("format").and_then(Value::as_str) {
            None | Some("csv") => Format::Csv,
            Some("jsonl") => Format::JsonLines,
            Some(_) => return Err(invalid("format must be \"csv\" or \"jsonl\"")),
        };
        Ok(Self { rows, format })
    }
}

const FIRST: [&str; 16] = [
    "Ada",
    "Grace",
    "Alan",
    "Edsger",
    "Barbara",
    "Donald",
    "Frances",
    "Ken",
    "Margaret",
    "Dennis",
    "Radia",
    "Linus",
    "Katherine",
    "John",
    "Sophie",
    "Niklaus",
];
const LAST: [&str; 16] = [
    "Lovelace", "Hopper", "Turing", "Dijkstra", "Liskov", "Knuth", "Allen", "Thompson", "Hamilton", "Ritchie",
    "Perlman", "Torvalds", "Johnson", "McCarthy", "Wilson", "Wirth",
];
const COMPANIES: [&str; 8] = [
    "Acme, Inc.",
    "Initech",
    "Globex \"International\"",
    "Umbrella",
    "Hooli",
    "Vandelay Industries",
    "Stark, Ltd.",
    "Wayne Enterprises",
];
const COUNTRIES: [&str; 10] = ["DE", "FR", "GB", "US", "JP", "BR", "IN", "NG", "AU", "CA"];

/// SplitMix64: a fixed, fast mix of the row number, so every row is the same on every run.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// One synthetic customer.
struct Row {
    id: u64,
    name: String,
    email: String,
    company: &'static str,
    country: &'static str,
    created_at: String,
    balance_cents: u64,
}

fn row(n: u64) -> Row {
    let h = mix(n);
    let (first, last) = (FIRST[(h & 15) as usize], LAST[((h >> 4) & 15) as usize]);
    // Seconds since 2020-01-01T00:00:00Z, within about five years.
    let t = 1_577_836_800 + (h >> 8) % 157_766_400;
    let date = time::OffsetDateTime::from_unix_timestamp(t as i64).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let created_at = format!(
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}Z",
        date.year(),
        date.month() as u8,
        date.day(),
        date.hour(),
        date.minute(),
        date.second()
    );
    Row {
        id: n + 1,
        name: format!("{first} {last}"),
        email: format!("{}.{}{}@example.com", first.to_lowercase(), last.to_lowercase(), n + 1),
        company: COMPANIES[((h >> 12) % 8) as usize],
        country: COUNTRIES[((h >> 16) % 10) as usize],
        created_at,
        balance_cents: (h >> 20) % 10_000_000,
    }
}

/// The first line of a CSV export.
pub const CSV_HEADER: &str = "id,name,email,company,country,created_at,balance\r\n";

/// RFC 4180: quote fields with a comma, quote, CR or LF; double inner quotes.
fn csv_field(out: &mut String, field: &str) {
    if field.contains([',', '"', '\r', '\n']) {
        out.push('"');
        out.push_str(&field.replace('"', "\"\""));
        out.push('"');
    } else {
        out.push_str(field);
    }
}

fn write_row(out: &mut String, format: Format, r: &Row) {
    let balance = format!("{}.{:02}", r.balance_cents / 100, r.balance_cents % 100);
    match format {
        Format::Csv => {
            out.push_str(&r.id.to_string());
            for field in [&r.name, &r.email, r.company, r.country, &r.created_at, &balance] {
                out.push(',');
                csv_field(out, field);
            }
            out.push_str("\r\n");
        }
        Format::JsonLines => {
            let line = json!({
                "id": r.id, "name": r.name, "email": r.email, "company": r.company,
                "country": r.country, "created_at": r.created_at, "balance": balance,
            });
            out.push_str(&line.to_string());
            out.push('\n');
        }
    }
}

/// Rows `from..to` in `format`.
pub fn render(format: Format, from: u64, to: u64) -> String {
    let mut out = String::with_capacity(((to - from) * 110) as usize);
    match format {
        Format::Csv => (from..to).for_each(|n| write_csv_row(&mut out, n)),
        Format::JsonLines => (from..to).for_each(|n| write_row(&mut out, format, &row(n))),
    }
    out
}

/// The CSV line of row `n` written straight into `out`: the bytes of
/// `write_row(.., Format::Csv, &row(n))` (tested) without a string per
/// field, since rendering bounds an export's speed.
fn write_csv_row(out: &mut String, n: u64) {
    let h = mix(n);
    let (first, last) = (FIRST[(h & 15) as usize], LAST[((h >> 4) & 15) as usize]);
    let t = 1_577_836_800 + (h >> 8) % 157_766_400;
    let date = time::OffsetDateTime::from_unix_timestamp(t as i64).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    let id = n + 1;
    push_number(out, id, 1);
    out.push(',');
    // Names and countries hold no character CSV quotes; companies may.
    out.push_str(first);
    out.push(' ');
    out.push_str(last);
    out.push(',');
    out.extend(first.chars().map(|c| c.to_ascii_lowercase()));
    out.push('.');
    out.extend(last.chars().map(|c| c.to_ascii_lowercase()));
    push_number(out, id, 1);
    out.push_str("@example.com,");
    csv_field(out, COMPANIES[((h >> 12) % 8) as usize]);
    out.push(',');
    out.push_str(COUNTRIES[((h >> 16) % 10) as usize]);
    out.push(',');
    push_number(out, u64::try_from(date.year()).unwrap_or(0), 4);
    out.push('-');
    push_number(out, u64::from(date.month() as u8), 2);
    out.push('-');
    push_number(out, u64::from(date.day()), 2);
    out.push('T');
    push_number(out, u64::from(date.hour()), 2);
    out.push(':');
    push_number(out, u64::from(date.minute()), 2);
    out.push(':');
    push_number(out, u64::from(date.second()), 2);
    out.push_str("Z,");
    let cents = (h >> 20) % 10_000_000;
    push_number(out, cents / 100, 1);
    out.push('.');
    push_number(out, cents % 100, 2);
    out.push_str("\r\n");
}

/// `value` in decimal, zero-padded to `width` digits.
fn push_number(out: &mut String, mut value: u64, width: usize) {
    let mut digits = [b'0'; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (value % 10) as u8;
        value /= 10;
        if value == 0 {
            break;
        }
    }
    let start = start.min(digits.len().saturating_sub(width));
    out.push_str(std::str::from_utf8(&digits[start..]).expect("digits are ASCII"));
}

#[async_trait]
impl Handler for Export {
    fn info(&self) -> KindInfo {
        KindInfo {
            name: "export".into(),
            rerun_safe: true,
            max_attempts: 3,
            pausable: true,
        }
    }

    fn validate(&self, input: &Value) -> Result<(), Invalid> {
        ExportInput::parse(input).map(|_| ())
    }

    async fn run(&self, ctx: TaskContext) -> Result<Option<Value>, TaskError> {
        let input = ExportInput::parse(ctx.input()).map_err(|e| TaskError::fatal("invalid_input", e.message))?;
        // Where an earlier attempt, or a pause, left off: rows done and the
        // bytes of pieces holding them.
        let (mut done, mut offset) = resume_point(ctx.checkpoint().as_ref(), input.rows);
        // Rows are rendered ahead, on a blocking thread, while the pieces
        // before them are stored, synced and recorded: rendering and storing
        // overlap instead of taking turns. At most `RENDER_AHEAD` chunks
        // wait in memory; dropping the receiver stops the renderer.
        let (chunks_tx, mut chunks) = tokio::sync::mpsc::channel::<(u64, String)>(RENDER_AHEAD);
        let (format, rows, first) = (input.format, input.rows, done);
        tokio::task::spawn_blocking(move || {
            let mut at = first;
            while at < rows {
                let to = (at + CHUNK_ROWS).min(rows);
                if chunks_tx.blocking_send((to, render(format, at, to))).is_err() {
                    return;
                }
                at = to;
            }
        });
        while done < input.rows {
            let end = (done + PIECE_ROWS).min(input.rows);
            let (mut writer, reader) = tokio::io::duplex(PIPE_BYTES);
            let mut upload = pin!(ctx.upload_piece(DEFAULT_ARTIFACT, offset, Box::pin(reader)));
            let from = done;
            let chunks = &mut chunks;
            let generate = async {
                if from == 0 && input.format == Format::Csv {
                    writer.write_all(CSV_HEADER.as_bytes()).await.map_err(pipe_error)?;
                }
                let mut at = from;
                while at < end {
                    if ctx.is_cancelled() {
                        return Err(TaskError::Cancelled);
                    }
                    if ctx.is_pause_requested() {
                        // End the piece here: what is written is kept.
                        break;
                    }
                    let (to, chunk) = chunks
                        .recv()
                        .await
                        .ok_or_else(|| TaskError::Retryable("the export's renderer stopped".into()))?;
                    writer.write_all(chunk.as_bytes()).await.map_err(pipe_error)?;
                    at = to;
                    ctx.progress(ProgressUpdate {
                        completed_units: Some(at as f64),
                        total_units: Some(input.rows as f64),
                        unit: Some("rows".into()),
                        phase: Some("WRITING".into()),
                        details: None,
                    })
                    .await?;
                }
                writer.shutdown().await.map_err(pipe_error)?;
                Ok::<u64, TaskError>(at)
            };
            let mut generate = pin!(generate);
            // Drive both; if generation stops (cancelled, failed), the piece's
            // upload is dropped with it and leaves nothing.
            let mut rows_written = None;
            let piece_end = loop {
                tokio::select! {
                    result = &mut generate, if rows_written.is_none() => rows_written = Some(result?),
                    result = &mut upload => break result?,
                }
            };
            let rows_written = match rows_written {
                Some(rows) => rows,
                None => generate.await?,
            };
            (done, offset) = (rows_written, piece_end);
            // Stored before it counts: a crash or a pause resumes here.
            ctx.save_checkpoint(json!({"rows_done": done, "bytes": offset})).await?;
            if ctx.is_pause_requested() && done < input.rows {
                return Err(TaskError::Paused);
            }
        }
        let uploaded = ctx
            .join_pieces(DEFAULT_ARTIFACT, input.format.content_type(), offset)
            .await?;
        Ok(Some(
            json!({"rows": input.rows, "size_bytes": uploaded.size_bytes, "sha256": uploaded.sha256}),
        ))
    }
}

/// Rows done and bytes stored, from a checkpoint this kind saved; a fresh
/// start for none (or one that does not fit this input).
fn resume_point(checkpoint: Option<&Value>, rows: u64) -> (u64, u64) {
    let field = |name: &str| checkpoint.and_then(|c| c.get(name)).and_then(Value::as_u64);
    match (field("rows_done"), field("bytes")) {
        (Some(done), Some(bytes)) if done <= rows && (done == 0) == (bytes == 0) => (done, bytes),
        _ => (0, 0),
    }
}

fn pipe_error(e: std::io::Error) -> TaskError {
    TaskError::Retryable(format!("the upload stopped reading: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn input_validation() {
        assert_eq!(
            ExportInput::parse(&json!({"rows": 10})).unwrap(),
            ExportInput {
                rows: 10,
                format: Format::Csv
            }
        );
        assert_eq!(
            ExportInput::parse(&json!({"rows": 1e3, "format": "jsonl"}))
                .unwrap()
                .rows,
            1000
        );
        for bad in [
            json!({}),
            json!({"rows": 0}),
            json!({"rows": 1.5}),
            json!({"rows": 10, "format": "xml"}),
            json!({"rows": 1, "x": 1}),
            json!(null),
        ] {
            assert!(ExportInput::parse(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn csv_rows_written_straight_are_the_rows_written_field_by_field() {
        for n in (0..5_000).chain([9_999, 39_999_999, 99_999_999, u64::from(u32::MAX)]) {
            let (mut fast, mut reference) = (String::new(), String::new());
            write_csv_row(&mut fast, n);
            write_row(&mut reference, Format::Csv, &row(n));
            assert_eq!(fast, reference, "row {n}");
        }
    }

    #[test]
    fn rows_are_deterministic_and_csv_is_quoted() {
        assert_eq!(render(Format::Csv, 0, 100), render(Format::Csv, 0, 100));
        let csv = render(Format::Csv, 0, 2000);
        assert_eq!(csv.matches("\r\n").count(), 2000);
        assert!(csv.contains("\"Acme, Inc.\"") && csv.contains("\"Globex \"\"International\"\"\""));
        let jsonl = render(Format::JsonLines, 0, 3);
        let first: Value = serde_json::from_str(jsonl.lines().next().unwrap()).unwrap();
        assert_eq!(first["id"], 1);
        assert!(first["email"].as_str().unwrap().ends_with("1@example.com"));
    }
}
