//! The artifact path against a real S3-compatible server: `moto` from PyPI,
//! started here on a loopback port (installed by `scripts/test`).

use std::sync::Arc;
use std::time::Duration;

use longrun_engine::bytes::artifacts::{ArtifactStore, S3Artifacts, S3Settings};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use crate::helpers::{Options, manual_clock, peers_required, spawn_app_with};

pub(crate) struct Moto {
    child: std::process::Child,
    endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `python3 -m moto.server` on a free port; `None` (loudly) if moto is missing.
pub(crate) async fn start_moto() -> Option<Moto> {
    let probe = std::process::Command::new("python3")
        .args(["-c", "import moto.server"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        assert!(
            !peers_required(),
            "LONGRUN_REQUIRE_PEERS is set but python3 cannot import moto.server"
        );
        eprintln!("SKIPPED: the S3 artifact tests (pip install 'moto[server]' to run them)");
        return None;
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = std::process::Command::new("python3")
        .args(["-m", "moto.server", "-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("moto starts");
    let moto = Moto {
        child,
        endpoint: format!("http://127.0.0.1:{port}"),
    };
    let http = reqwest::Client::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while http.get(&moto.endpoint).send().await.is_err() {
        assert!(tokio::time::Instant::now() < deadline, "moto did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let created = http
        .put(format!("{}/longrun-test", moto.endpoint))
        .send()
        .await
        .unwrap();
    assert!(created.status().is_success(), "bucket creation: {}", created.status());
    Some(moto)
}

pub(crate) fn s3_store(moto: &Moto) -> Arc<dyn ArtifactStore> {
    Arc::new(
        S3Artifacts::new(S3Settings {
            bucket: "longrun-test".into(),
            prefix: "artifacts".into(),
            endpoint: Some(moto.endpoint.clone()),
            access_key_id: "test".into(),
            secret_access_key: "test".into(),
            region: "us-east-1".into(),
        })
        .unwrap(),
    )
}

#[tokio::test]
async fn exports_downloads_ranges_cleanup_and_expiry_on_s3() {
    let Some(moto) = start_moto().await else { return };
    let store = s3_store(&moto);
    let clock = manual_clock();
    let app = spawn_app_with(Options {
        clock: Some(clock.clone()),
        artifact_store: Some(store.clone()),
        ..Options::default()
    })
    .await;

    let op = app
        .submit_ok(
            "s3-export",
            &json!({"kind": "export", "input": {"rows": 20_000, "format": "csv"}}),
        )
        .await;
    let id = op["id"].as_str().unwrap().to_owned();
    let done = app.wait_for_state(&id, "succeeded").await;
    let artifact_id = done["result"]["artifact"]["id"].as_str().unwrap();
    // One object: the artifact (an export of one piece is that piece, kept).
    let record = app
        .store
        .result_get(&longrun_core::Id::from_trusted(artifact_id.to_owned()))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(store.list().await.unwrap(), vec![record.storage_key.clone()]);

    let resource: Value = app
        .request(Method::GET, &format!("/v1/operations/{id}/result"), &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let url = app.url(resource["download"]["url"].as_str().unwrap());
    let bytes = app.http.get(&url).send().await.unwrap().bytes().await.unwrap();
    assert_eq!(
        data_encoding::HEXLOWER.encode(&Sha256::digest(&bytes)),
        resource["sha256"].as_str().unwrap()
    );
    assert_eq!(String::from_utf8_lossy(&bytes).matches("\r\n").count(), 20_001);
    let rest = app.http.get(&url).header("Range", "bytes=4096-").send().await.unwrap();
    assert_eq!(rest.status(), StatusCode::PARTIAL_CONTENT);
    assert_eq!(rest.bytes().await.unwrap(), bytes.slice(4096..));

    // A cancelled export leaves no object behind.
    let cancelled = app
        .submit_ok("s3-cancel", &json!({"kind": "export", "input": {"rows": 50_000_000}}))
        .await;
    let cancelled_id = cancelled["id"].as_str().unwrap();
    app.wait_for(cancelled_id, "writing", |op| {
        op["progress"]["completed_units"].as_f64().unwrap_or(0.0) > 0.0
    })
    .await;
    app.request(
        Method::PUT,
        &format!("/v1/operations/{cancelled_id}/cancellation"),
        &app.client_key,
    )
    .send()
    .await
    .unwrap();
    app.wait_for_state(cancelled_id, "cancelled").await;
    // What it stored (pieces it finished before the cancel reached it) is
    // garbage from the cancel on; the next garbage pass deletes it. Only
    // the finished export's object is left.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let objects = store.list().await.unwrap();
        if objects == vec![record.storage_key.clone()] {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "objects left after the cancel: {objects:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Past the result's lifetime the object is deleted; the operation stays.
    clock.advance(Duration::from_secs(24 * 3600 + 1));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !store.list().await.unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "objects left: {:?}",
            store.list().await.unwrap()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(app.get_operation(&id).await["state"], "succeeded");
    app.shutdown().await;
}
