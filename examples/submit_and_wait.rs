//! Submit an export and wait for it, the safe way, then download the result.
//!
//! ```sh
//! LONGRUN_TOKEN=lr_… cargo run -p longrun-client --example submit_and_wait
//! ```

use longrun_client::{Client, Submission};
use serde_json::json;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = std::env::var("LONGRUN_SERVER").unwrap_or_else(|_| "http://127.0.0.1:8080".into());
    let token = std::env::var("LONGRUN_TOKEN")?;
    let client = Client::new(server, token);

    // One idempotency key for this logical submission, reused on every retry:
    // a lost answer can never create a second export.
    let submitted = client
        .submit(&Submission::new("export", json!({"rows": 100_000, "format": "csv"})))
        .await?;
    println!(
        "submitted {} (key {})",
        submitted.operation.id, submitted.idempotency_key
    );

    // Long-polls; each answer is a new version.
    let done = client
        .wait(&submitted.operation.id, |op| {
            if let Some(p) = &op.progress {
                println!(
                    "{} {:?}/{:?} {}",
                    op.state,
                    p.completed_units,
                    p.total_units,
                    p.unit.clone().unwrap_or_default()
                );
            }
        })
        .await?;
    println!("{} ended {}", done.id, done.state);
    if done.state == "succeeded" {
        let mut file = tokio::fs::File::create("export.csv").await?;
        let downloaded = client.download_result(&done.id, &mut file, |_, _| {}).await?;
        println!(
            "wrote export.csv: {} bytes, sha256 {} (verified)",
            downloaded.bytes, downloaded.sha256
        );
    }
    Ok(())
}
