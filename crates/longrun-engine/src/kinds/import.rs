//! The `import` kind: validates every row of an upload (CSV with a header
//! row, or JSON Lines) against a schema, and writes two artifacts: `accepted`
//! (each good row normalised, as JSON Lines) and `errors` (each rejected row:
//! line, field, stable code, message and the raw row, as JSON Lines).
//!
//! `input: {"upload", "format": "csv" | "jsonl", "schema": {"fields": {name:
//! {"type", "required", "enum", "pattern", "min", "max", "max_length"}}},
//! "max_errors"?, "max_error_rate"?}`. Within the policy it succeeds with
//! `result.summary {rows_total, rows_accepted, rows_rejected}`; past it, it
//! fails with `too_many_row_errors`, and both artifacts are still published,
//! so row-level errors are read without running it again.
//!
//! The upload is streamed: parsing and validation run on a blocking thread
//! reading through a bridge, and both outputs are channels feeding the
//! artifact uploads, so memory is flat in the file's size. Cancellation is
//! checked between rows; a cancelled import makes both uploads fail, so it
//! leaves no artifact.

use std::io::{BufRead, Read, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use longrun_core::validate::Invalid;
use longrun_core::{Id, IdKind};
use longrun_store::ProgressUpdate;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::bytes::artifacts::ByteReader;
use longrun_worker::task::{Handler, KindInfo, TaskContext, TaskError};

/// The `import` kind: an uploaded CSV or JSON Lines file validated row by row.
pub struct Import;

const MAX_FIELDS: usize = 256;
const MAX_ENUM: usize = 1000;
const MAX_PATTERN: usize = 1000;
/// Bytes gathered before a piece of output goes to its upload.
const OUT_BUFFER: usize = 256 * 1024;
/// Rows between two looks at the cancellation flag.
const CHECK_EVERY: u64 = 4096;
/// Longest row (a line of JSON Lines, a CSV record): memory stays bounded
/// whatever the file holds, an unclosed CSV quote included.
pub const MAX_ROW_BYTES: u64 = 16 * 1024 * 1024;
/// What of a too-long row the errors artifact keeps.
const RAW_KEPT: usize = 1024;

/// Counts the bytes read past the start of the record being parsed, and
/// fails the read when a record grows past [`MAX_ROW_BYTES`].
struct RowBound<R> {
    inner: R,
    read: u64,
    record_start: std::rc::Rc<std::cell::Cell<u64>>,
}

impl<R: Read> Read for RowBound<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.read.saturating_sub(self.record_start.get()) > MAX_ROW_BYTES + READ_BUFFER as u64 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a row is longer than {MAX_ROW_BYTES} bytes (an unclosed quote?)"),
            ));
        }
        let n = self.inner.read(buf)?;
        self.read += n as u64;
        Ok(n)
    }
}

/// The reading buffer of both formats.
const READ_BUFFER: usize = 256 * 1024;

/// Reads one line of at most [`MAX_ROW_BYTES`] into `line` (without its
/// newline); a longer one is consumed to its end and reported `true`, with
/// only its first bytes kept. `None` at the end of the file.
fn read_line(reader: &mut impl BufRead, line: &mut Vec<u8>) -> std::io::Result<Option<bool>> {
    line.clear();
    let mut too_long = false;
    let mut any = false;
    loop {
        let chunk = reader.fill_buf()?;
        if chunk.is_empty() {
            return Ok(any.then_some(too_long));
        }
        any = true;
        let (part, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        if !too_long {
            if (line.len() + part.len()) as u64 > MAX_ROW_BYTES {
                too_long = true;
                line.truncate(RAW_KEPT);
            } else {
                line.extend_from_slice(part);
            }
        }
        let consumed = done.unwrap_or(chunk.len());
        reader.consume(consumed);
        if done.is_some() {
            return Ok(Some(too_long));
        }
    }
}

/// An import's file format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// Comma-separated, RFC 4180, with a header line.
    Csv,
    /// One JSON object per line.
    JsonLines,
}

/// What a field's values must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FieldType {
    /// Any text.
    String,
    /// A whole number.
    Integer,
    /// A finite number.
    Number,
    /// `true` or `false`.
    Boolean,
    /// An RFC 3339 timestamp.
    DateTime,
}

/// One field of an import's schema.
#[derive(Debug, Clone)]
pub struct Field {
    /// Its name (a CSV header, a JSON member).
    pub name: String,
    /// What its values must be.
    pub kind: FieldType,
    /// A row without it is rejected.
    pub required: bool,
    /// The only values allowed, if listed.
    pub allowed: Option<Vec<Value>>,
    /// A text value must match it.
    pub pattern: Option<regex::Regex>,
    /// The smallest number allowed.
    pub min: Option<f64>,
    /// The largest number allowed.
    pub max: Option<f64>,
    /// The longest text allowed, in characters.
    pub max_length: Option<usize>,
}

/// A validated `import` input.
#[derive(Debug, Clone)]
pub struct ImportInput {
    /// The upload holding the file.
    pub upload: Id,
    /// The file's format.
    pub format: Format,
    /// In name order.
    pub fields: Vec<Field>,
    /// More rejected rows than this fail the import (`too_many_row_errors`).
    pub max_errors: Option<u64>,
    /// A larger share of rejected rows (0–1) fails the import.
    pub max_error_rate: Option<f64>,
}

fn invalid(message: impl Into<String>) -> Invalid {
    Invalid {
        field: "input",
        message: message.into(),
    }
}

fn only_keys(object: &serde_json::Map<String, Value>, allowed: &[&str], what: &str) -> Result<(), Invalid> {
    match object.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(key) => Err(invalid(format!(
            "{what}: unknown member {key:?}; expected {}",
            allowed.join(", ")
        ))),
        None => Ok(()),
    }
}

impl ImportInput {
    /// Checks an `import` input.
    pub fn parse(input: &Value) -> Result<Self, Invalid> {
        let object = input.as_object().ok_or_else(|| invalid("must be an object"))?;
        only_keys(
            object,
            &["upload", "format", "schema", "max_errors", "max_error_rate"],
            "input",
        )?;
        let upload = object
            .get("upload")
            .and_then(Value::as_str)
            .and_then(|s| Id::parse(IdKind::Upload, s))
            .ok_or_else(|| invalid("upload must be an upload id (upl_…)"))?;
        let format = match object.get("format").and_then(Value::as_str) {
            Some("csv") => Format::Csv,
            Some("jsonl") => Format::JsonLines,
            _ => return Err(invalid("format must be \"csv\" or \"jsonl\"")),
        };
        let schema = object
            .get("schema")
            .and_then(Value::as_object)
            .ok_or_else(|| invalid("schema must be an object with fields"))?;
        only_keys(schema, &["fields"], "schema")?;
        let declared = schema
            .get("fields")
            .and_then(Value::as_object)
            .filter(|f| !f.is_empty() && f.len() <= MAX_FIELDS)
            .ok_or_else(|| invalid(format!("schema.fields must name 1 to {MAX_FIELDS} fields")))?;
        let mut fields = Vec::with_capacity(declared.len());
        for (name, spec) in declared {
            fields.push(parse_field(name, spec)?);
        }
        let max_errors = match object.get("max_errors") {
            None => None,
            Some(v) => Some(
                v.as_u64()
                    .ok_or_else(|| invalid("max_errors must be a non-negative integer"))?,
            ),
        };
        let max_error_rate = match object.get("max_error_rate") {
            None => None,
            Some(v) => Some(
                v.as_f64()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| invalid("max_error_rate must be a number from 0 to 1"))?,
            ),
        };
        Ok(Self {
            upload,
            format,
            fields,
            max_errors,
            max_error_rate,
        })
    }

    /// Whether `rejected` of `total` rows is within the error policy (no
    /// policy: any number of rejected rows).
    pub fn within_policy(&self, total: u64, rejected: u64) -> bool {
        let count_ok = self.max_errors.is_none_or(|max| rejected <= max);
        let rate_ok = self
            .max_error_rate
            .is_none_or(|rate| total == 0 || (rejected as f64) <= rate * total as f64);
        count_ok && rate_ok
    }
}

fn parse_field(name: &str, spec: &Value) -> Result<Field, Invalid> {
    let what = format!("schema.fields.{name}");
    let spec = spec
        .as_object()
        .ok_or_else(|| invalid(format!("{what} must be an object")))?;
    only_keys(
        spec,
        &["type", "required", "enum", "pattern", "min", "max", "max_length"],
        &what,
    )?;
    let kind = match spec.get("type").and_then(Value::as_str) {
        Some("string") => FieldType::String,
        Some("integer") => FieldType::Integer,
        Some("number") => FieldType::Number,
        Some("boolean") => FieldType::Boolean,
        Some("date-time") => FieldType::DateTime,
        _ => {
            return Err(invalid(format!(
                "{what}.type must be string, integer, number, boolean or date-time"
            )));
        }
    };
    let required = match spec.get("required") {
        None => false,
        Some(v) => v
            .as_bool()
            .ok_or_else(|| invalid(format!("{what}.required must be a boolean")))?,
    };
    let allowed = match spec.get("enum") {
        None => None,
        Some(v) => Some(
            v.as_array()
                .filter(|a| !a.is_empty() && a.len() <= MAX_ENUM)
                .ok_or_else(|| invalid(format!("{what}.enum must list 1 to {MAX_ENUM} values")))?
                .clone(),
        ),
    };
    let pattern = match spec.get("pattern") {
        None => None,
        Some(v) => {
            let text = v
                .as_str()
                .filter(|p| p.len() <= MAX_PATTERN)
                .ok_or_else(|| invalid(format!("{what}.pattern must be a regular expression")))?;
            Some(
                regex::RegexBuilder::new(text)
                    .size_limit(1 << 20)
                    .build()
                    .map_err(|e| invalid(format!("{what}.pattern: {e}")))?,
            )
        }
    };
    let number = |key: &str| -> Result<Option<f64>, Invalid> {
        match spec.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| invalid(format!("{what}.{key} must be a number"))),
        }
    };
    let max_length = match spec.get("max_length") {
        None => None,
        Some(v) => Some(
            v.as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .ok_or_else(|| invalid(format!("{what}.max_length must be a non-negative integer")))?,
        ),
    };
    Ok(Field {
        name: name.to_owned(),
        kind,
        required,
        allowed,
        pattern,
        min: number("min")?,
        max: number("max")?,
        max_length,
    })
}

/// Why a row was rejected: its first problem.
#[derive(Debug, Clone, PartialEq)]
pub struct RowError {
    /// The field at fault, if one is.
    pub field: Option<String>,
    /// Stable: `required`, `invalid_type`, `not_in_enum`, `pattern_mismatch`,
    /// `below_min`, `above_max`, `too_long`, `malformed_row`, `invalid_encoding`.
    pub code: &'static str,
    /// For people.
    pub message: String,
}

impl RowError {
    fn of(field: &Field, code: &'static str, message: impl Into<String>) -> Self {
        Self {
            field: Some(field.name.clone()),
            code,
            message: message.into(),
        }
    }

    fn row(code: &'static str, message: impl Into<String>) -> Self {
        Self {
            field: None,
            code,
            message: message.into(),
        }
    }
}

/// One field's value as the file holds it.
enum Raw<'a> {
    Text(&'a str),
    Json(&'a Value),
}

/// Checks one value against its field and returns it normalised.
fn check(field: &Field, raw: Raw<'_>) -> Result<Value, RowError> {
    let wrong = |expected: &str| RowError::of(field, "invalid_type", format!("{} must be {expected}", field.name));
    let value = match (field.kind, raw) {
        (FieldType::String, Raw::Text(s)) => Value::String(s.to_owned()),
        (FieldType::String, Raw::Json(Value::String(s))) => Value::String(s.clone()),
        (FieldType::String, Raw::Json(_)) => return Err(wrong("a string")),
        (FieldType::Integer, Raw::Text(s)) => json!(s.trim().parse::<i64>().map_err(|_| wrong("an integer"))?),
        (FieldType::Integer, Raw::Json(v)) => json!(v.as_i64().ok_or_else(|| wrong("an integer"))?),
        (FieldType::Number, Raw::Text(s)) => {
            let n = s
                .trim()
                .parse::<f64>()
                .ok()
                .filter(|n| n.is_finite())
                .ok_or_else(|| wrong("a number"))?;
            json!(n)
        }
        (FieldType::Number, Raw::Json(v)) => {
            if !v.is_number() {
                return Err(wrong("a number"));
            }
            v.clone()
        }
        (FieldType::Boolean, Raw::Text(s)) => match s.trim() {
            t if t.eq_ignore_ascii_case("true") => Value::Bool(true),
            t if t.eq_ignore_ascii_case("false") => Value::Bool(false),
            _ => return Err(wrong("true or false")),
        },
        (FieldType::Boolean, Raw::Json(v)) => Value::Bool(v.as_bool().ok_or_else(|| wrong("true or false"))?),
        (FieldType::DateTime, raw) => {
            let text = match raw {
                Raw::Text(s) => s.trim(),
                Raw::Json(Value::String(s)) => s.as_str(),
                Raw::Json(_) => return Err(wrong("an RFC 3339 date-time")),
            };
            let at = time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
                .map_err(|_| wrong("an RFC 3339 date-time"))?
                .to_offset(time::UtcOffset::UTC);
            Value::String(
                at.format(&time::format_description::well_known::Rfc3339)
                    .map_err(|_| wrong("an RFC 3339 date-time"))?,
            )
        }
    };
    if let Some(allowed) = &field.allowed
        && !allowed.contains(&value)
    {
        return Err(RowError::of(
            field,
            "not_in_enum",
            format!("{} is not one of the allowed values", field.name),
        ));
    }
    if let Value::String(s) = &value {
        if let Some(max) = field.max_length
            && s.chars().count() > max
        {
            return Err(RowError::of(
                field,
                "too_long",
                format!("{} is longer than {max} characters", field.name),
            ));
        }
        if let Some(pattern) = &field.pattern
            && !pattern.is_match(s)
        {
            return Err(RowError::of(
                field,
                "pattern_mismatch",
                format!("{} does not match its pattern", field.name),
            ));
        }
    }
    if let Some(n) = value.as_f64().filter(|_| value.is_number()) {
        if let Some(min) = field.min
            && n < min
        {
            return Err(RowError::of(
                field,
                "below_min",
                format!("{} is below {min}", field.name),
            ));
        }
        if let Some(max) = field.max
            && n > max
        {
            return Err(RowError::of(
                field,
                "above_max",
                format!("{} is above {max}", field.name),
            ));
        }
    }
    Ok(value)
}

/// A row's fields, checked in name order, into a JSON object line.
fn normalise<'a>(
    fields: &[Field],
    mut get: impl FnMut(usize) -> Option<Raw<'a>>,
    out: &mut Vec<u8>,
) -> Result<(), RowError> {
    let start = out.len();
    out.push(b'{');
    let mut first = true;
    for (i, field) in fields.iter().enumerate() {
        let raw = match get(i) {
            Some(Raw::Text("")) | Some(Raw::Json(Value::Null)) | None => {
                if field.required {
                    out.truncate(start);
                    return Err(RowError::of(field, "required", format!("{} is required", field.name)));
                }
                continue;
            }
            Some(raw) => raw,
        };
        let value = check(field, raw).inspect_err(|_| out.truncate(start))?;
        if !first {
            out.push(b',');
        }
        first = false;
        serde_json::to_writer(&mut *out, &field.name).expect("writing to a Vec");
        out.push(b':');
        serde_json::to_writer(&mut *out, &value).expect("writing to a Vec");
    }
    out.extend_from_slice(b"}\n");
    Ok(())
}

/// Counts of an import.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Summary {
    /// Rows read.
    pub rows_total: u64,
    /// Rows written to the accepted artifact.
    pub rows_accepted: u64,
    /// Rows written to the rejected artifact.
    pub rows_rejected: u64,
}

/// Why an import stopped before the end of its file.
#[derive(Debug)]
pub enum Stop {
    /// Cancellation was requested.
    Cancelled,
    /// The file cannot be read as its format says (not a row's fault).
    Unreadable(String),
    /// Reading the upload or writing an artifact failed.
    Io(std::io::Error),
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Self {
        Stop::Io(e)
    }
}

fn error_line(out: &mut Vec<u8>, line: u64, error: &RowError, raw: &str) {
    let entry = json!({
        "line": line,
        "field": error.field,
        "code": error.code,
        "message": error.message,
        "raw": raw,
    });
    serde_json::to_writer(&mut *out, &entry).expect("writing to a Vec");
    out.push(b'\n');
}

/// Reads every row of `input`, writing accepted rows to `accepted` and
/// rejected ones to `errors`; `rows` counts rows as they go, `cancel`
/// stops it between rows. Synchronous: run it on a blocking thread.
pub fn process(
    input: &ImportInput,
    source: impl Read,
    accepted: &mut impl Write,
    errors: &mut impl Write,
    rows: &AtomicU64,
    cancel: &AtomicBool,
) -> Result<Summary, Stop> {
    let mut summary = Summary::default();
    let mut good = Vec::with_capacity(OUT_BUFFER + 4096);
    let mut bad = Vec::with_capacity(4096);
    let mut flush = |good: &mut Vec<u8>, bad: &mut Vec<u8>, force: bool| -> std::io::Result<()> {
        if force || good.len() >= OUT_BUFFER {
            accepted.write_all(good)?;
            good.clear();
        }
        if force || bad.len() >= OUT_BUFFER {
            errors.write_all(bad)?;
            bad.clear();
        }
        Ok(())
    };
    let tally = |summary: &mut Summary, ok: bool| -> Result<(), Stop> {
        summary.rows_total += 1;
        if ok {
            summary.rows_accepted += 1;
        } else {
            summary.rows_rejected += 1;
        }
        if summary.rows_total.is_multiple_of(CHECK_EVERY) {
            rows.store(summary.rows_total, Ordering::Relaxed);
            if cancel.load(Ordering::Relaxed) {
                return Err(Stop::Cancelled);
            }
        }
        Ok(())
    };
    match input.format {
        Format::Csv => {
            let record_start = std::rc::Rc::new(std::cell::Cell::new(0));
            let bounded = RowBound {
                inner: source,
                read: 0,
                record_start: record_start.clone(),
            };
            let mut reader = csv::ReaderBuilder::new()
                .has_headers(true)
                .flexible(true)
                .buffer_capacity(READ_BUFFER)
                .from_reader(bounded);
            let header = reader
                .byte_headers()
                .map_err(|e| Stop::Unreadable(format!("the CSV header cannot be read: {e}")))?
                .clone();
            let names: Vec<&str> = header
                .iter()
                .map(|h| std::str::from_utf8(h).unwrap_or("").trim())
                .collect();
            let columns: Vec<Option<usize>> = input
                .fields
                .iter()
                .map(|f| names.iter().position(|n| *n == f.name))
                .collect();
            if let Some(missing) = input
                .fields
                .iter()
                .zip(&columns)
                .find(|(f, c)| f.required && c.is_none())
            {
                return Err(Stop::Unreadable(format!(
                    "the CSV header has no column {:?}, which the schema requires",
                    missing.0.name
                )));
            }
            let mut record = csv::ByteRecord::new();
            loop {
                match reader.read_byte_record(&mut record) {
                    Ok(false) => break,
                    Ok(true) => {}
                    Err(e) => match e.kind() {
                        csv::ErrorKind::Io(io) if io.kind() == std::io::ErrorKind::InvalidData => {
                            return Err(Stop::Unreadable(format!("the CSV cannot be read: {io}")));
                        }
                        csv::ErrorKind::Io(_) => {
                            return Err(Stop::Io(std::io::Error::other(e.to_string())));
                        }
                        _ => return Err(Stop::Unreadable(format!("the CSV cannot be read: {e}"))),
                    },
                }
                let line = record.position().map_or(0, |p| p.line());
                record_start.set(reader.position().byte());
                let outcome = if record.len() != header.len() {
                    Err(RowError::row(
                        "malformed_row",
                        format!("the row has {} fields; the header has {}", record.len(), header.len()),
                    ))
                } else if record.iter().any(|field| std::str::from_utf8(field).is_err()) {
                    Err(RowError::row("invalid_encoding", "the row is not valid UTF-8"))
                } else {
                    let text = |c: usize| std::str::from_utf8(&record[c]).unwrap_or("");
                    normalise(&input.fields, |i| columns[i].map(|c| Raw::Text(text(c))), &mut good)
                };
                if let Err(error) = &outcome {
                    error_line(&mut bad, line, error, &raw_csv(&record));
                }
                tally(&mut summary, outcome.is_ok())?;
                flush(&mut good, &mut bad, false)?;
            }
        }
        Format::JsonLines => {
            let mut reader = std::io::BufReader::with_capacity(READ_BUFFER, source);
            let mut line = Vec::new();
            let mut number = 0u64;
            while let Some(too_long) = read_line(&mut reader, &mut line)? {
                number += 1;
                let text = line.strip_suffix(b"\r").unwrap_or(&line);
                if !too_long && text.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let outcome = if too_long {
                    Err(RowError::row(
                        "malformed_row",
                        format!("the line is longer than {MAX_ROW_BYTES} bytes"),
                    ))
                } else {
                    match serde_json::from_slice::<Value>(text) {
                        Ok(Value::Object(object)) => normalise(
                            &input.fields,
                            |i| object.get(&input.fields[i].name).map(Raw::Json),
                            &mut good,
                        ),
                        Ok(_) => Err(RowError::row("malformed_row", "the line is not a JSON object")),
                        Err(e) => Err(RowError::row("malformed_row", format!("the line is not JSON: {e}"))),
                    }
                };
                if let Err(error) = &outcome {
                    error_line(&mut bad, number, error, &String::from_utf8_lossy(text));
                }
                tally(&mut summary, outcome.is_ok())?;
                flush(&mut good, &mut bad, false)?;
            }
        }
    }
    rows.store(summary.rows_total, Ordering::Relaxed);
    flush(&mut good, &mut bad, true)?;
    Ok(summary)
}

/// A CSV record as one line of text (quoted as needed), for the errors artifact.
fn raw_csv(record: &csv::ByteRecord) -> String {
    let mut writer = csv::WriterBuilder::new()
        .terminator(csv::Terminator::Any(b'\n'))
        .from_writer(Vec::new());
    let _ = writer.write_byte_record(record);
    let bytes = writer.into_inner().unwrap_or_default();
    String::from_utf8_lossy(bytes.strip_suffix(b"\n").unwrap_or(&bytes)).into_owned()
}

/// A `Write` whose bytes go, piece by piece, to an upload reading the other
/// end of a channel. `fail` makes that upload fail (so it stores nothing).
struct ChannelWriter {
    tx: mpsc::Sender<std::io::Result<Bytes>>,
}

impl Write for ChannelWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.tx
            .blocking_send(Ok(Bytes::copy_from_slice(buf)))
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::BrokenPipe, "the upload stopped reading"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl ChannelWriter {
    fn fail(&self) {
        let _ = self.tx.blocking_send(Err(std::io::Error::other("the import stopped")));
    }
}

fn channel() -> (ChannelWriter, ByteReader) {
    let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(8);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    (
        ChannelWriter { tx },
        Box::pin(tokio_util::io::StreamReader::new(stream)),
    )
}

#[async_trait]
impl Handler for Import {
    fn info(&self) -> KindInfo {
        KindInfo {
            name: "import".into(),
            // It only writes its own artifacts; a re-run replaces them.
            rerun_safe: true,
            max_attempts: 3,
            // A pause stops it between rows; it resumes from the first row
            // (its artifacts are written whole, by one attempt).
            pausable: true,
        }
    }

    fn validate(&self, input: &Value) -> Result<(), Invalid> {
        ImportInput::parse(input).map(|_| ())
    }

    async fn run(&self, ctx: TaskContext) -> Result<Option<Value>, TaskError> {
        let input = ImportInput::parse(ctx.input()).map_err(|e| TaskError::fatal("invalid_input", e.message))?;
        let source = ctx.open_upload(&input.upload).await?;
        let (mut accepted_out, accepted_in) = channel();
        let (mut errors_out, errors_in) = channel();
        let rows = Arc::new(AtomicU64::new(0));
        let cancel = Arc::new(AtomicBool::new(false));
        let bridge = tokio_util::io::SyncIoBridge::new(source);
        let work = {
            let (input, rows, cancel) = (input.clone(), rows.clone(), cancel.clone());
            tokio::task::spawn_blocking(move || {
                let outcome = process(&input, bridge, &mut accepted_out, &mut errors_out, &rows, &cancel);
                if outcome.is_err() {
                    accepted_out.fail();
                    errors_out.fail();
                }
                outcome
            })
        };
        let uploads = async {
            tokio::join!(
                ctx.upload_named("accepted", "application/jsonl", accepted_in),
                ctx.upload_named("errors", "application/jsonl", errors_in),
            )
        };
        let watch = async {
            let mut work = work;
            let mut tick = tokio::time::interval(Duration::from_millis(500));
            loop {
                tokio::select! {
                    done = &mut work => return done,
                    () = ctx.cancelled(), if !cancel.load(Ordering::Relaxed) => cancel.store(true, Ordering::Relaxed),
                    () = ctx.pause_requested(), if !cancel.load(Ordering::Relaxed) => {
                        cancel.store(true, Ordering::Relaxed);
                    }
                    _ = tick.tick() => {
                        let done = rows.load(Ordering::Relaxed) as f64;
                        let _ = ctx.progress(ProgressUpdate {
                            completed_units: Some(done),
                            total_units: None,
                            unit: Some("rows".into()),
                            phase: Some("VALIDATING".into()),
                            details: None,
                        }).await;
                    }
                }
            }
        };
        let (processed, (accepted, errors)) = tokio::join!(watch, uploads);
        let summary = match processed.map_err(|e| TaskError::Retryable(format!("the import thread failed: {e}")))? {
            Ok(summary) => summary,
            Err(Stop::Cancelled) if ctx.is_cancelled() => return Err(TaskError::Cancelled),
            Err(Stop::Cancelled) => return Err(TaskError::Paused),
            Err(Stop::Unreadable(why)) => return Err(TaskError::fatal("invalid_upload", why)),
            Err(Stop::Io(e)) => return Err(TaskError::Retryable(format!("reading the upload failed: {e}"))),
        };
        accepted?;
        errors?;
        ctx.progress(ProgressUpdate {
            completed_units: Some(summary.rows_total as f64),
            total_units: Some(summary.rows_total as f64),
            unit: Some("rows".into()),
            phase: Some("DONE".into()),
            details: None,
        })
        .await?;
        let counts = json!({
            "rows_total": summary.rows_total,
            "rows_accepted": summary.rows_accepted,
            "rows_rejected": summary.rows_rejected,
        });
        if !input.within_policy(summary.rows_total, summary.rows_rejected) {
            return Err(TaskError::fatal(
                "too_many_row_errors",
                format!(
                    "{} of {} rows were rejected, past the error policy; the errors artifact lists them",
                    summary.rows_rejected, summary.rows_total
                ),
            ));
        }
        Ok(Some(json!({ "summary": counts })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn input(format: &str) -> ImportInput {
        ImportInput::parse(&json!({
            "upload": Id::generate(IdKind::Upload).as_str(),
            "format": format,
            "schema": {"fields": {
                "id": {"type": "integer", "required": true, "min": 1},
                "email": {"type": "string", "required": true, "pattern": "^[^@]+@[^@]+$", "max_length": 40},
                "plan": {"type": "string", "enum": ["free", "pro"]},
                "active": {"type": "boolean"},
                "balance": {"type": "number", "max": 1000},
                "since": {"type": "date-time"},
            }},
            "max_errors": 2,
        }))
        .unwrap()
    }

    fn run(input: &ImportInput, file: &str) -> (Summary, Vec<Value>, Vec<Value>) {
        let (mut good, mut bad) = (Vec::new(), Vec::new());
        let summary = process(
            input,
            file.as_bytes(),
            &mut good,
            &mut bad,
            &AtomicU64::new(0),
            &AtomicBool::new(false),
        )
        .unwrap();
        let lines = |b: &[u8]| -> Vec<Value> {
            String::from_utf8(b.to_vec())
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        };
        (summary, lines(&good), lines(&bad))
    }

    #[test]
    fn csv_rows_are_normalised_or_rejected_with_their_line_and_code() {
        let file = "id,email,plan,active,balance,since\n\
                    1,a@x.io,pro,TRUE,12.5,2024-01-02T03:04:05+02:00\n\
                    2,not-an-email,free,false,1,\n\
                    \"3\",\"c@x.io\",,,,\n\
                    x,d@x.io,pro,true,1,\n\
                    5,e@x.io,gold,true,1,\n\
                    6,f@x.io\n";
        let (summary, good, bad) = run(&input("csv"), file);
        assert_eq!(
            summary,
            Summary {
                rows_total: 6,
                rows_accepted: 2,
                rows_rejected: 4
            }
        );
        assert_eq!(
            good[0],
            json!({"id": 1, "email": "a@x.io", "plan": "pro", "active": true, "balance": 12.5, "since": "2024-01-02T01:04:05Z"})
        );
        assert_eq!(good[1], json!({"id": 3, "email": "c@x.io"}));
        let codes: Vec<(u64, &str)> = bad
            .iter()
            .map(|e| (e["line"].as_u64().unwrap(), e["code"].as_str().unwrap()))
            .collect();
        assert_eq!(
            codes,
            vec![
                (3, "pattern_mismatch"),
                (5, "invalid_type"),
                (6, "not_in_enum"),
                (7, "malformed_row")
            ]
        );
        assert_eq!(bad[0]["field"], "email");
        assert_eq!(bad[0]["raw"], "2,not-an-email,free,false,1,");
        assert!(!input("csv").within_policy(6, 4) && input("csv").within_policy(6, 2));
    }

    #[test]
    fn jsonl_rows_are_checked_by_type() {
        let file = "{\"id\": 1, \"email\": \"a@x.io\", \"balance\": 5}\n\n\
                    {\"id\": \"1\", \"email\": \"a@x.io\"}\n\
                    [1]\n\
                    {\"email\": \"a@x.io\"}\n\
                    {\"id\": 2, \"email\": \"b@x.io\", \"balance\": 5000}\n";
        let (summary, good, bad) = run(&input("jsonl"), file);
        assert_eq!((summary.rows_total, summary.rows_accepted), (5, 1));
        assert_eq!(good[0], json!({"id": 1, "email": "a@x.io", "balance": 5}));
        let codes: Vec<(u64, &str)> = bad
            .iter()
            .map(|e| (e["line"].as_u64().unwrap(), e["code"].as_str().unwrap()))
            .collect();
        assert_eq!(
            codes,
            vec![
                (3, "invalid_type"),
                (4, "malformed_row"),
                (5, "required"),
                (6, "above_max")
            ]
        );
    }

    #[test]
    fn rows_past_the_bound_do_not_grow_memory() {
        let huge = "x".repeat(MAX_ROW_BYTES as usize + 10);
        let file = format!("{{\"id\": 1, \"email\": \"a@b\"}}\n\"{huge}\"\n{{\"id\": 2, \"email\": \"c@d\"}}\n");
        let (summary, good, bad) = run(&input("jsonl"), &file);
        assert_eq!((summary.rows_total, good.len()), (3, 2));
        assert_eq!(
            (bad[0]["line"].as_u64(), bad[0]["code"].as_str()),
            (Some(2), Some("malformed_row"))
        );
        assert!(bad[0]["raw"].as_str().unwrap().len() <= RAW_KEPT);
        // An unclosed quote would swallow the file into one record: refused.
        let huge = "x".repeat(MAX_ROW_BYTES as usize + 2 * READ_BUFFER);
        let file = format!("id,email\n1,\"{huge}\n2,a@b\n");
        let stopped = process(
            &input("csv"),
            file.as_bytes(),
            &mut Vec::new(),
            &mut Vec::new(),
            &AtomicU64::new(0),
            &AtomicBool::new(false),
        );
        assert!(matches!(stopped, Err(Stop::Unreadable(why)) if why.contains("longer than")));
    }

    #[test]
    fn a_missing_required_column_makes_the_file_unreadable() {
        let stopped = process(
            &input("csv"),
            "id,plan\n1,pro\n".as_bytes(),
            &mut Vec::new(),
            &mut Vec::new(),
            &AtomicU64::new(0),
            &AtomicBool::new(false),
        );
        assert!(matches!(stopped, Err(Stop::Unreadable(why)) if why.contains("email")));
    }

    #[test]
    fn inputs_are_validated_at_submission() {
        let upload = Id::generate(IdKind::Upload);
        let base = json!({"upload": upload.as_str(), "format": "csv", "schema": {"fields": {"a": {"type": "string"}}}});
        assert!(ImportInput::parse(&base).is_ok());
        let mut bad = Vec::new();
        for (path, value) in [
            ("/upload", json!("op_123")),
            ("/format", json!("xml")),
            ("/schema/fields", json!({})),
            ("/schema/fields/a/type", json!("uuid")),
            ("/schema/fields/a/pattern", json!("(")),
            ("/schema/fields/a/enum", json!([])),
            ("/max_error_rate", json!(2)),
            ("/max_errors", json!(-1)),
        ] {
            let mut v = base.clone();
            let (parent, key) = path.rsplit_once('/').unwrap();
            let target = if parent.is_empty() {
                &mut v
            } else {
                v.pointer_mut(parent).unwrap()
            };
            target[key] = value;
            bad.push(v);
        }
        for v in bad {
            assert!(ImportInput::parse(&v).is_err(), "{v}");
        }
    }
}
