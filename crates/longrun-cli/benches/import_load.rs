//! Uploads and the import kind at size: a 10 M-row CSV (~1 GB, 1 % bad
//! rows) — validation alone on one core, the upload to a release server over
//! loopback (whole, and cut at half then resumed), and the import end to end
//! with the server's peak RSS.
//!
//! `cargo bench -p longrun-cli --bench import_load` (LONGRUN_IMPORT_ROWS=10000000).

mod own_server;

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use longrun_client::{Client, Submission};
use longrun_engine::kinds::import::{ImportInput, process};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const PLANS: [&str; 3] = ["free", "pro", "enterprise"];

/// `rows` customers, every 100th with an email that fails its pattern.
fn write_csv(path: &std::path::Path, rows: u64) -> u64 {
    let mut out = std::io::BufWriter::with_capacity(1 << 20, std::fs::File::create(path).unwrap());
    out.write_all(b"id,email,name,plan,balance,active,created_at\n")
        .unwrap();
    for i in 1..=rows {
        let at = "@";
        let email_at = if i % 100 == 0 { "." } else { at };
        writeln!(
            out,
            "{i},customer{i}{email_at}example.com,Customer Number {i},{},{}.{:02},{},2024-{:02}-{:02}T{:02}:{:02}:00Z",
            PLANS[(i % 3) as usize],
            i % 100_000,
            i % 100,
            i % 2 == 0,
            1 + i % 12,
            1 + i % 28,
            i % 24,
            i % 60
        )
        .unwrap();
    }
    out.flush().unwrap();
    std::fs::metadata(path).unwrap().len()
}

fn input(upload: &str) -> Value {
    json!({
        "upload": upload,
        "format": "csv",
        "schema": {"fields": {
            "id": {"type": "integer", "required": true, "min": 1},
            "email": {"type": "string", "required": true, "pattern": "^[^@]+@[^@]+$", "max_length": 254},
            "name": {"type": "string", "max_length": 200},
            "plan": {"type": "string", "enum": PLANS},
            "balance": {"type": "number", "min": 0},
            "active": {"type": "boolean"},
            "created_at": {"type": "date-time"},
        }},
        "max_error_rate": 0.02,
    })
}

/// A proxy cutting, once, the first connection whose request passes `cut_after` bytes.
async fn cutting_proxy(upstream: String, cut_after: u64) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let cut = Arc::new(AtomicUsize::new(0));
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let (cut, upstream) = (cut.clone(), upstream.clone());
            tokio::spawn(async move {
                let server = tokio::net::TcpStream::connect(upstream).await.unwrap();
                let (mut client_read, mut client_write) = client.into_split();
                let (mut server_read, mut server_write) = server.into_split();
                let answers = tokio::spawn(async move { tokio::io::copy(&mut server_read, &mut client_write).await });
                let mut buffer = vec![0u8; 256 * 1024];
                let mut relayed = 0u64;
                while let Ok(n) = client_read.read(&mut buffer).await {
                    if n == 0 {
                        break;
                    }
                    if relayed + n as u64 > cut_after && cut.fetch_add(1, Ordering::SeqCst) == 0 {
                        answers.abort();
                        return;
                    }
                    if server_write.write_all(&buffer[..n]).await.is_err() {
                        break;
                    }
                    relayed += n as u64;
                }
                let _ = answers.await;
            });
        }
    });
    format!("http://{addr}")
}

fn main() {
    let rows: u64 = std::env::var("LONGRUN_IMPORT_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000);
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("customers.csv");
    let started = Instant::now();
    let size = write_csv(&path, rows);
    let mib = size as f64 / (1 << 20) as f64;
    println!(
        "import bench: {rows} rows, {mib:.0} MiB CSV, 1 % bad rows (written in {:.1} s)",
        started.elapsed().as_secs_f64()
    );

    // Validation alone, one core, outputs discarded.
    let parsed = ImportInput::parse(&input("upl_aaaaaaaaaaaaaaaaaaaaaaaaaa")).unwrap();
    let started = Instant::now();
    let summary = process(
        &parsed,
        std::fs::File::open(&path).unwrap(),
        &mut std::io::sink(),
        &mut std::io::sink(),
        &AtomicU64::new(0),
        &AtomicBool::new(false),
    )
    .unwrap_or_else(|_| panic!("the file is readable"));
    let seconds = started.elapsed().as_secs_f64();
    println!(
        "  validation alone (one thread, no IO out): {:.2} M rows/s, {:.0} MiB/s, {seconds:.1} s; {} rejected; bench RSS peak {:.0} MiB",
        rows as f64 / seconds / 1e6,
        mib / seconds,
        summary.rows_rejected,
        own_server::peak_rss_mib("self")
    );

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut server = own_server::OwnServer::start().await;
        let (base, token) = (server.base.clone(), server.token.clone());
        let client = Client::new(base.clone(), token.clone());
        let started = Instant::now();
        let uploaded = client.upload_file(&path, "text/csv", |_, _| {}).await.unwrap();
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "  upload over loopback (SDK, SHA-256 on both sides): {:.0} MiB/s, {seconds:.1} s",
            mib / seconds
        );

        let proxy = cutting_proxy(base.trim_start_matches("http://").to_owned(), size / 2).await;
        let through = Client::new(proxy, token.clone());
        let started = Instant::now();
        let resumed = through.upload_file(&path, "text/csv", |_, _| {}).await.unwrap();
        let seconds = started.elapsed().as_secs_f64();
        assert_eq!(resumed.upload.sha256, uploaded.upload.sha256);
        println!(
            "  upload cut at half and resumed ({} resume): {:.0} MiB/s overall, {seconds:.1} s (pieces joined into one object on completion)",
            resumed.resumed,
            mib / seconds
        );

        let started = Instant::now();
        let submitted = client
            .submit(&Submission::new("import", input(&uploaded.upload.id)))
            .await
            .unwrap();
        let done = client.wait(&submitted.operation.id, |_| {}).await.unwrap();
        let seconds = started.elapsed().as_secs_f64();
        let result = done.result.clone().unwrap_or_default();
        assert_eq!(done.state, "succeeded", "{done:?}");
        println!(
            "  import end to end (submit → succeeded, accepted and errors artifacts stored): {:.2} M rows/s, {seconds:.1} s; summary {}; server RSS peak {:.0} MiB",
            rows as f64 / seconds / 1e6,
            result["summary"],
            server.peak_rss_mib()
        );
        let _ = server.child.kill().await;
    });
}
