//! The console in a real browser: Debian's headless Chromium driven over
//! WebDriver (`chromedriver` from Debian's `chromium-driver`, `fantoccini`
//! as the client), against a real server on loopback. Each test saves
//! screenshots of the pages it visits under `$CARGO_TARGET_TMPDIR/console`
//! (the current ones are in `docs/console/`).
//!
//! Without Chromium these tests say so and pass; with
//! `LONGRUN_REQUIRE_PEERS` set (as `.ci/run` sets it) that is a failure.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use longrun_core::apikey::Role;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{TestApp, create_key, peers_required, spawn_app};

const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// A headless Chromium and the chromedriver that drives it (killed, with
/// the browser, when dropped).
struct Browser {
    client: Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

impl Drop for Browser {
    fn drop(&mut self) {
        // chromedriver leads its own process group; the browser is in it.
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.driver.id())])
            .status();
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Whether the browser at `here` went somewhere else than `asked` on the
/// server's say (a redirect: to sign in, or from a lookup to its operation),
/// rather than still showing the page it was on.
fn redirected(here: &str, asked: &str) -> bool {
    let path = |u: &str| {
        u.split_once("://")
            .map_or("", |(_, rest)| rest.split_once('/').map_or("", |(_, p)| p))
            .to_owned()
    };
    let (here, asked) = (path(here), path(asked));
    here.starts_with("ui/sign-in") || (asked.starts_with("ui/operations?q=") && here.starts_with("ui/operations/"))
}

/// Starts a browser, or says loudly why it cannot (a failure when peers
/// are required).
async fn browser() -> Option<Browser> {
    let missing: Vec<&str> = [CHROMIUM, CHROMEDRIVER]
        .into_iter()
        .filter(|p| !std::path::Path::new(p).exists())
        .collect();
    if !missing.is_empty() {
        assert!(
            !peers_required(),
            "LONGRUN_REQUIRE_PEERS is set but {missing:?} is missing (apt-get install chromium chromium-driver)"
        );
        eprintln!("SKIPPED: the console browser test ({missing:?} missing; apt-get install chromium chromium-driver)");
        return None;
    }
    let port = free_port();
    let mut command = Command::new(CHROMEDRIVER);
    command
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    std::os::unix::process::CommandExt::process_group(&mut command, 0);
    let driver = command.spawn().expect("chromedriver starts");
    let profile = tempfile::tempdir().unwrap();
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        json!({
            "binary": CHROMIUM,
            "args": [
                "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-quic", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-extensions",
                "--window-size=1360,1000",
                format!("--user-data-dir={}", profile.path().display()),
            ],
        }),
    );
    let connector = hyper_util::client::legacy::connect::HttpConnector::new();
    let url = format!("http://127.0.0.1:{port}");
    // chromedriver takes a moment to listen: retry the session for a while.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let client = loop {
        match ClientBuilder::new(connector.clone())
            .capabilities(capabilities.clone())
            .connect(&url)
            .await
        {
            Ok(client) => break client,
            Err(e) => {
                assert!(tokio::time::Instant::now() < deadline, "no WebDriver session: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    Some(Browser {
        client,
        driver,
        _profile: profile,
    })
}

impl Browser {
    /// Goes to `path` and waits (bounded) until its document has loaded:
    /// under load, chromedriver may answer while the previous document is
    /// still the one shown.
    async fn goto(&self, app: &TestApp, path: &str) {
        let url = app.url(path);
        let before = self
            .client
            .current_url()
            .await
            .map(|u| u.to_string())
            .unwrap_or_default();
        self.client.goto(&url).await.unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let here = self
                .client
                .execute("return [location.href, document.readyState];", vec![])
                .await
                .unwrap_or(json!([]));
            let href = here[0].as_str().unwrap_or("");
            let moved = href != before || url == before;
            let arrived = moved && (href == url || redirected(href, &url));
            if arrived && here[1] == "complete" {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "never arrived at {url}: {here}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    async fn text(&self, css: &str) -> String {
        self.client.find(Locator::Css(css)).await.unwrap().text().await.unwrap()
    }

    async fn source(&self) -> String {
        self.client.source().await.unwrap()
    }

    async fn path(&self) -> String {
        self.client.current_url().await.unwrap().path().to_owned()
    }

    async fn sign_in(&self, app: &TestApp, key: &str) {
        self.goto(app, "/ui/sign-in").await;
        self.client
            .find(Locator::Id("key"))
            .await
            .unwrap()
            .send_keys(key)
            .await
            .unwrap();
        self.click("#sign-in").await;
    }

    /// Waits (bounded) until the element `css` reads `want`, without
    /// navigating: the page's own script changes it.
    async fn wait_for_text(&self, css: &str, want: &str) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let now = match self.client.find(Locator::Css(css)).await {
                Ok(e) => e.text().await.unwrap_or_default(),
                Err(_) => String::new(),
            };
            if now == want {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{css} reads {now:?}, not {want:?}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Fills `fields` of the form at `css`, submits it, and waits until the
    /// page it leads to has loaded.
    async fn submit(&self, css: &str, fields: &[(&str, &str)]) {
        let mut form = self.client.form(Locator::Css(css)).await.unwrap();
        for (name, value) in fields {
            form = form.set_by_name(name, value).await.unwrap();
        }
        self.client
            .execute("window.__before_submit = true;", vec![])
            .await
            .unwrap();
        form.submit().await.unwrap();
        self.wait_for_new_page().await;
    }

    /// Waits (bounded) until the document marked before a navigation has
    /// been replaced by a loaded one.
    async fn wait_for_new_page(&self) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        loop {
            let loaded = self
                .client
                .execute(
                    "return window.__before_submit !== true && document.readyState === 'complete';",
                    vec![],
                )
                .await
                .unwrap_or(json!(false));
            if loaded == json!(true) {
                return;
            }
            assert!(tokio::time::Instant::now() < deadline, "the form led nowhere");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Clicks the element at `css` and waits for the page it leads to.
    async fn click(&self, css: &str) {
        self.client
            .execute("window.__before_submit = true;", vec![])
            .await
            .unwrap();
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
        self.wait_for_new_page().await;
    }

    /// Clicks what does not navigate (a `<summary>` opening its details).
    async fn click_in_place(&self, css: &str) {
        self.client
            .find(Locator::Css(css))
            .await
            .unwrap()
            .click()
            .await
            .unwrap();
    }

    async fn screenshot(&self, name: &str) {
        let png = self.client.screenshot().await.unwrap();
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("console");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(format!("{name}.png")), png).unwrap();
    }

    async fn close(mut self) {
        let client = self.client.clone();
        let _ = client.close().await;
        self.driver.kill().ok();
    }
}

/// Submits a `sleep` of ten minutes (work that stays running) and returns its id.
async fn sleeping(app: &TestApp, key: &str, idempotency_key: &str) -> String {
    let op = submit(
        app,
        key,
        idempotency_key,
        json!({"kind": "sleep", "input": {"duration_ms": 600_000}}),
    )
    .await;
    op["id"].as_str().unwrap().to_owned()
}

async fn submit(app: &TestApp, key: &str, idempotency_key: &str, body: Value) -> Value {
    let response = app
        .request(Method::POST, "/v1/operations", key)
        .header("Idempotency-Key", idempotency_key)
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::ACCEPTED);
    response.json().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_in_sets_a_strict_session_cookie_and_signing_out_ends_it() {
    let app = spawn_app().await;
    let Some(browser) = browser().await else { return };

    // Unsigned, a page sends the browser to sign in, and back afterwards.
    browser.goto(&app, "/ui/operations?state=queued").await;
    assert_eq!(browser.path().await, "/ui/sign-in");
    browser.screenshot("sign-in").await;

    // A wrong key is refused and never echoed.
    browser.sign_in(&app, "lr_nonsense_secret").await;
    assert!(browser.text(".alert").await.contains("not valid"));
    assert!(!browser.source().await.contains("nonsense"));

    // A worker key may not sign in.
    let worker_key = app.worker_key.clone();
    browser.sign_in(&app, &worker_key).await;
    assert!(browser.text(".alert").await.contains("Worker keys"));

    browser.sign_in(&app, &app.client_key).await;
    assert_eq!(browser.path().await, "/ui/");
    assert!(browser.text(".who").await.contains("acme"));
    let page = browser.source().await;
    let secret = app.client_key.rsplit('_').next().unwrap();
    assert!(!page.contains(secret), "the key is never in a page");
    assert!(!browser.client.current_url().await.unwrap().as_str().contains(secret));

    let cookie = browser.client.get_named_cookie("longrun_session").await.unwrap();
    assert_eq!(cookie.http_only(), Some(true));
    assert_eq!(format!("{:?}", cookie.same_site()), "Some(Strict)");
    assert_eq!(cookie.path(), Some("/ui"));
    let session = cookie.value().to_owned();
    assert!(!session.contains(secret));

    // The cookie works from another client too (it is the session) ...
    let with_cookie = |path: &str| {
        app.http
            .get(app.url(path))
            .header("cookie", format!("longrun_session={session}"))
            .send()
    };
    let response = with_cookie("/ui/operations").await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(response.headers()["cache-control"], "no-store");
    assert!(
        response.headers()["content-security-policy"]
            .to_str()
            .unwrap()
            .contains("frame-ancestors 'none'")
    );

    // ... until signing out deletes it on the server.
    browser.click("#sign-out").await;
    assert_eq!(browser.path().await, "/ui/sign-in");
    browser.goto(&app, "/ui/workers").await;
    assert_eq!(browser.path().await, "/ui/sign-in");
    let replayed = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
        .get(app.url("/ui/workers"))
        .header("cookie", format!("longrun_session={session}"))
        .send()
        .await
        .unwrap();
    assert_eq!(replayed.status(), StatusCode::SEE_OTHER, "the old cookie is dead");
    assert!(
        replayed.headers()["location"]
            .to_str()
            .unwrap()
            .starts_with("/ui/sign-in")
    );

    browser.close().await;
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_sees_only_its_tenant_and_the_list_filters() {
    let app = spawn_app().await;
    let Some(browser) = browser().await else { return };
    let slow = json!({"kind": "sleep", "input": {"duration_ms": 600_000}, "labels": {"team": "data"}});
    let mine = submit(&app, &app.client_key, "mine-1", slow.clone()).await;
    let done = submit(
        &app,
        &app.client_key,
        "mine-2",
        json!({"kind": "sleep", "input": {"duration_ms": 0, "steps": 1}}),
    )
    .await;
    let theirs = submit(&app, &app.other_tenant_key, "theirs-1", slow.clone()).await;
    let (mine, done, theirs) = (
        mine["id"].as_str().unwrap(),
        done["id"].as_str().unwrap(),
        theirs["id"].as_str().unwrap(),
    );
    app.wait_for_state(done, "succeeded").await;

    browser.sign_in(&app, &app.client_key).await;
    browser.screenshot("overview").await;
    browser.goto(&app, "/ui/operations").await;
    let page = browser.source().await;
    assert!(page.contains(mine) && page.contains(done));
    assert!(!page.contains(theirs), "another tenant's work is not listed");
    browser.screenshot("operations").await;

    // Another tenant's operation by URL: 404, as in the API.
    browser.goto(&app, &format!("/ui/operations/{theirs}")).await;
    assert!(
        browser.text("h1").await.contains("Not found"),
        "{}",
        browser.source().await
    );
    assert!(!browser.source().await.contains("600000"));
    let refused = browser
        .client
        .find(Locator::Css(".problem code"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(refused, "not_found");

    // Filters: by state, by label, by kind, by a created range.
    browser.goto(&app, "/ui/operations?state=succeeded").await;
    let page = browser.source().await;
    assert!(page.contains(done) && !page.contains(mine), "{page}");
    browser.goto(&app, "/ui/operations?label=team%3Adata").await;
    let page = browser.source().await;
    assert!(page.contains(mine) && !page.contains(done), "{page}");
    browser.goto(&app, "/ui/operations?kind=export").await;
    assert!(browser.client.find(Locator::Id("empty")).await.is_ok());
    browser
        .goto(
            &app,
            "/ui/operations?created_from=2000-01-01T00%3A00&created_to=2001-01-01T00%3A00",
        )
        .await;
    assert!(
        browser.client.find(Locator::Id("empty")).await.is_ok(),
        "nothing was created in 2000"
    );
    // The filter form itself, as a person uses it.
    browser.goto(&app, "/ui/operations").await;
    browser.submit("#filters", &[("label", "team:data")]).await;
    let page = browser.source().await;
    assert!(page.contains(mine) && !page.contains(done));

    // Lookup by id and by idempotency key; another tenant's key finds nothing.
    browser.goto(&app, "/ui/operations?q=mine-2").await;
    assert_eq!(browser.path().await, format!("/ui/operations/{done}"));
    browser.goto(&app, &format!("/ui/operations?q={mine}")).await;
    assert_eq!(browser.path().await, format!("/ui/operations/{mine}"));
    browser.goto(&app, "/ui/operations?q=theirs-1").await;
    assert!(browser.text("h1").await.contains("Not found"));

    // The operation page shows the idempotency record and the timeline.
    browser.goto(&app, &format!("/ui/operations/{done}")).await;
    assert!(browser.text("#idempotency").await.contains("mine-2"));
    assert!(browser.text("#history").await.contains("succeeded"));
    browser.screenshot("operation").await;

    // Workers: the running sleep holds a lease, and kinds are listed.
    app.wait_for_state(mine, "running").await;
    browser.goto(&app, "/ui/workers").await;
    assert!(browser.text("#leases").await.contains(mine));
    assert!(!browser.source().await.contains(theirs), "nor another tenant's lease");
    assert!(browser.text("#kinds").await.contains("export"));
    browser.screenshot("workers").await;

    // A client is no admin.
    browser.goto(&app, "/ui/tenants").await;
    assert_eq!(browser.text(".problem code").await, "forbidden");

    browser.close().await;
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rows_follow_their_operations_live_and_cancel_works_from_the_page() {
    let app = spawn_app().await;
    let Some(browser) = browser().await else { return };
    let first = sleeping(&app, &app.client_key, "live-1").await;
    let second = sleeping(&app, &app.client_key, "live-2").await;
    app.wait_for_state(&first, "running").await;

    browser.sign_in(&app, &app.client_key).await;
    browser.goto(&app, "/ui/operations").await;
    // A mark on the loaded page: it survives only if the page is not reloaded.
    browser
        .client
        .execute("window.__loaded_once = true;", vec![])
        .await
        .unwrap();
    let row = format!("tr[data-id='{first}'] [data-field=state]");
    // Whether the page's event stream opens before the change or after,
    // the row follows: the stream begins with the current states
    // (`the_live_stream_begins_with_the_current_state_of_what_it_follows`).

    // The operation ends elsewhere (through the API); the row follows.
    let response = app
        .request(
            Method::PUT,
            &format!("/v1/operations/{first}/cancellation"),
            &app.client_key,
        )
        .send()
        .await
        .unwrap();
    assert!(response.status().is_success());
    app.wait_for_state(&first, "cancelled").await;
    browser.wait_for_text(&row, "cancelled").await;
    let same_page = browser
        .client
        .execute("return window.__loaded_once === true;", vec![])
        .await
        .unwrap();
    assert_eq!(same_page, json!(true), "the row changed without a reload");

    // Cancel from the operation page.
    browser.goto(&app, &format!("/ui/operations/{second}")).await;
    browser.screenshot("operation-running").await;
    browser.submit("#cancel", &[("reason", "from the console")]).await;
    app.wait_for_state(&second, "cancelled").await;
    let cancellation = app.get_json(&format!("/v1/operations/{second}/cancellation")).await;
    assert_eq!(cancellation["reason"], "from the console", "{cancellation}");
    browser.goto(&app, &format!("/ui/operations/{second}")).await;
    assert_eq!(browser.text("h1 [data-field=state]").await, "cancelled");
    assert!(browser.source().await.contains("from the console"));

    browser.close().await;
    app.shutdown().await;
}

/// The events of `/ui/live` read so far and what is left of a partial one.
struct Live {
    response: reqwest::Response,
    buffer: String,
}

impl Live {
    /// The next `change` event's data (bounded: 10 s).
    async fn next(&mut self) -> Value {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(end) = self.buffer.find("\n\n") {
                let event: String = self.buffer.drain(..end + 2).collect();
                if let Some(data) = event.lines().find_map(|line| line.strip_prefix("data:")) {
                    assert!(event.contains("event: change"), "{event}");
                    return serde_json::from_str(data.trim()).unwrap();
                }
                continue;
            }
            let chunk = tokio::time::timeout_at(deadline, self.response.chunk())
                .await
                .expect("a change event within 10 s")
                .unwrap()
                .expect("the stream stays open");
            self.buffer.push_str(std::str::from_utf8(&chunk).unwrap());
        }
    }
}

/// The live stream a page opens begins with the current state of the
/// operations it follows, so that a change made between the page's
/// rendering and the stream's opening (or while a browser reconnects it)
/// is not missed; then it carries their changes. Another tenant's
/// operation is in neither, named or not.
#[tokio::test]
async fn the_live_stream_begins_with_the_current_state_of_what_it_follows() {
    let app = spawn_app().await;
    let mine = sleeping(&app, &app.client_key, "live-snapshot").await;
    let theirs = sleeping(&app, &app.other_tenant_key, "live-snapshot").await;
    app.wait_for_state(&mine, "running").await;
    let (http, session) = app.console_session(&app.client_key).await;
    let response = http
        .get(app.url(&format!("/ui/live?ids={theirs},{mine}")))
        .header("cookie", &session)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut live = Live {
        response,
        buffer: String::new(),
    };

    // Before any change: where it stands now, and nothing of theirs.
    let running = app.get_json(&format!("/v1/operations/{mine}")).await;
    assert_eq!(running["state"], "running");
    let first = live.next().await;
    assert_eq!(first["id"], mine.as_str(), "{first}");
    assert_eq!(first["state"], "running");
    let version = first["version"].as_i64().unwrap();

    // Their operation ends, then mine: only mine is heard, newer.
    for (id, key) in [(&theirs, &app.other_tenant_key), (&mine, &app.client_key)] {
        let response = app
            .request(Method::PUT, &format!("/v1/operations/{id}/cancellation"), key)
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success());
    }
    // (A running operation may first be heard asked to cancel, then
    // cancelled once its worker stops.)
    let mut last = version;
    loop {
        let next = live.next().await;
        assert_eq!(next["id"], mine.as_str(), "{next}");
        let at = next["version"].as_i64().unwrap();
        assert!(at > last, "{next}");
        last = at;
        if next["state"] == "cancelled" {
            break;
        }
        assert_eq!(next["state"], "running", "{next}");
    }
    // The stream would hold the server's graceful shutdown open.
    drop(live);
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_deadline_edit_shows_the_conflict_and_changes_nothing() {
    let app = spawn_app().await;
    let Some(browser) = browser().await else { return };
    let id = sleeping(&app, &app.client_key, "stale-1").await;
    app.wait_for_state(&id, "running").await;

    browser.sign_in(&app, &app.client_key).await;
    browser.goto(&app, &format!("/ui/operations/{id}")).await;
    // A fresh edit applies.
    browser.submit("#edit", &[("deadline_seconds", "3600")]).await;
    let now = app.get_operation(&id).await;
    let deadline = now["deadline_at"].clone();
    assert!(!deadline.is_null(), "{now}");
    assert!(browser.text("#deadline").await.contains("3600 s"));

    // Someone else changes it after the page was loaded ...
    let version = now["version"].as_i64().unwrap();
    let response = app
        .request(Method::PATCH, &format!("/v1/operations/{id}"), &app.client_key)
        .header("If-Match", format!("\"{version}\""))
        .json(&json!({"labels": {"changed": "elsewhere"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);

    // ... so the edit made on the stale page is refused and shown as such.
    browser.submit("#edit", &[("deadline_seconds", "60")]).await;
    let conflict = browser.text("#conflict").await;
    assert!(conflict.contains("Not applied"), "{conflict}");
    assert!(conflict.contains("precondition_failed"), "{conflict}");
    browser.screenshot("operation-conflict").await;
    let after = app.get_operation(&id).await;
    assert_eq!(after["deadline_at"], deadline, "the stale edit changed nothing");
    assert_eq!(after["labels"]["changed"], "elsewhere");
    // The page now shows the current version, so the edit can be made again.
    assert!(browser.source().await.contains(&format!("at version {}", version + 1)));

    browser.close().await;
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_cross_site_post_is_refused() {
    let app = spawn_app().await;
    let Some(browser) = browser().await else { return };
    let id = sleeping(&app, &app.client_key, "forged-1").await;

    // Another origin on the same host (so the same site: the browser sends
    // the SameSite=Strict cookie along) serves a page that posts the cancel
    // form by itself.
    let target = app.url(&format!("/ui/operations/{id}/cancel"));
    let attack = format!(
        "<!doctype html><form id=f method=post action=\"{target}\">\
         <input name=csrf value=guessed><input name=reason value=forged></form>\
         <script>document.getElementById('f').submit()</script>"
    );
    let evil = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let evil_url = format!("http://{}/", evil.local_addr().unwrap());
    let router = axum::Router::new().route(
        "/",
        axum::routing::get(move || {
            let attack = attack.clone();
            async move { axum::response::Html(attack) }
        }),
    );
    let evil_server = tokio::spawn(async move { axum::serve(evil, router).await });

    browser.sign_in(&app, &app.client_key).await;
    browser.client.goto(&evil_url).await.unwrap();
    browser
        .client
        .wait()
        .for_element(Locator::Css(".problem"))
        .await
        .expect("the console answered the forged post");
    assert_eq!(browser.text(".problem code").await, "forbidden");
    browser.screenshot("forged-post-refused").await;
    let now = app.get_operation(&id).await;
    assert!(
        !now["cancel_requested"].as_bool().unwrap(),
        "nothing was cancelled: {now}"
    );
    assert_ne!(now["state"], "cancelled");

    // The same form from the console's own page, with its token, works.
    browser.goto(&app, &format!("/ui/operations/{id}")).await;
    browser.submit("#cancel", &[]).await;
    app.wait_for(&id, "cancel requested", |op| op["cancel_requested"] == true)
        .await;

    evil_server.abort();
    browser.close().await;
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_creates_a_key_that_works_and_is_shown_once() {
    let app = spawn_app().await;
    let Some(browser) = browser().await else { return };
    let admin_key = create_key(app.store.as_ref(), "ops", Role::Admin).await;
    sleeping(&app, &app.client_key, "a-1").await;
    sleeping(&app, &app.other_tenant_key, "g-1").await;
    app.store.accepting_pause(Some("export".into()), true).await.unwrap();

    browser.sign_in(&app, &admin_key).await;
    // The overview shows the pause, and an admin may lift it.
    assert!(browser.text("#acceptance-paused").await.contains("export"));
    browser.screenshot("overview-admin").await;
    browser.click("#acceptance-paused button").await;
    assert!(browser.client.find(Locator::Id("acceptance-paused")).await.is_err());
    assert!(app.store.accepting_pauses().await.unwrap().is_empty());

    // An admin sees every tenant, and can filter by one.
    browser.goto(&app, "/ui/operations").await;
    let page = browser.source().await;
    assert!(page.contains(">acme<") && page.contains(">globex<"));
    browser.goto(&app, "/ui/operations?tenant=globex").await;
    assert!(!browser.source().await.contains(">acme<"));

    // Create a client key for acme: shown once, on that response.
    browser.goto(&app, "/ui/tenants").await;
    browser
        .submit("#tenant-acme form[action='/ui/tenants/acme/keys']", &[])
        .await;
    let created = browser
        .client
        .find(Locator::Id("new-secret"))
        .await
        .unwrap()
        .prop("value")
        .await
        .unwrap()
        .unwrap();
    browser.screenshot("tenants-key-created").await;
    let works = app
        .request(Method::GET, "/v1/operations", &created)
        .send()
        .await
        .unwrap();
    assert_eq!(works.status(), StatusCode::OK, "the new key works");
    let listed: Value = works.json().await.unwrap();
    assert_eq!(listed["operations"].as_array().unwrap().len(), 1, "as acme");

    // Never shown again: not on the tenants page, not anywhere after.
    let secret = created.rsplit('_').next().unwrap().to_owned();
    browser.goto(&app, "/ui/tenants").await;
    assert!(!browser.source().await.contains(&secret));
    assert!(browser.client.find(Locator::Id("new-secret")).await.is_err());
    browser.client.back().await.unwrap();
    assert!(!browser.source().await.contains(&secret), "not from the history either");
    browser.goto(&app, "/ui/tenants").await;
    browser.screenshot("tenants").await;

    // Revoked from the console, it stops working.
    let key_id = longrun_core::apikey::PresentedKey::parse(&created).unwrap().id;
    let revoke = format!("tr[data-key='{key_id}'] form");
    browser.submit(&revoke, &[]).await;
    let refused = app
        .request(Method::GET, "/v1/operations", &created)
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), StatusCode::UNAUTHORIZED);

    // Deleting a tenant takes its name typed again.
    let delete = "#tenant-globex form[action='/ui/tenants/globex/delete']";
    browser.click_in_place("#tenant-globex summary").await;
    browser.submit(delete, &[("confirm", "globe")]).await;
    assert!(browser.text("#refusal").await.contains("nothing was deleted"));
    assert_eq!(app.operation_count("globex").await, 1);
    browser.click_in_place("#tenant-globex summary").await;
    browser.submit(delete, &[("confirm", "globex")]).await;
    assert_eq!(app.operation_count("globex").await, 0);
    assert!(browser.client.find(Locator::Id("tenant-globex")).await.is_err());

    browser.close().await;
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_download_button_yields_the_artifacts_bytes() {
    let app = spawn_app().await;
    let Some(browser) = browser().await else { return };
    let op = submit(
        &app,
        &app.client_key,
        "export-1",
        json!({"kind": "export", "input": {"rows": 500, "format": "csv"}}),
    )
    .await;
    let id = op["id"].as_str().unwrap().to_owned();
    app.wait_for_state(&id, "succeeded").await;
    let result = app.get_json(&format!("/v1/operations/{id}/result")).await;
    let sha256 = result["sha256"].as_str().unwrap().to_owned();
    let via_api = app
        .http
        .get(app.url(result["download"]["url"].as_str().unwrap()))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();

    browser.sign_in(&app, &app.client_key).await;
    browser.goto(&app, &format!("/ui/operations/{id}")).await;
    browser.screenshot("operation-artifact").await;
    assert!(browser.text("#result").await.contains(&sha256));
    // What the button fetches, in the page: follow it, hash the bytes.
    let digest = browser
        .client
        .execute_async(
            r#"const done = arguments[arguments.length - 1];
               const href = document.getElementById('download-default').href;
               fetch(href).then(r => r.arrayBuffer()).then(async bytes => {
                 const hash = await crypto.subtle.digest('SHA-256', bytes);
                 done([bytes.byteLength, [...new Uint8Array(hash)].map(b => b.toString(16).padStart(2, '0')).join('')]);
               }).catch(e => done(['error', String(e)]));"#,
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(
        digest,
        json!([via_api.len(), sha256]),
        "the button's bytes are the artifact's"
    );

    browser.close().await;
    app.shutdown().await;
}

/// Signing in over plain HTTP (no browser needed): refusals are pages, not
/// problem documents; a cross-site sign-in is refused; wrong secrets are
/// limited per source as the API's are, and never a good key.
#[tokio::test]
async fn sign_in_refusals_are_pages_and_failures_are_limited_per_source() {
    let limits = longrun_server::Limits {
        auth_failures_per_source: 1.0,
        ..Default::default()
    };
    let app = crate::helpers::spawn_app_with(crate::helpers::Options {
        limits,
        ..Default::default()
    })
    .await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let sign_in = |key: String, origin: Option<&'static str>| {
        let mut request = http
            .post(app.url("/ui/sign-in"))
            .form(&[("key", key.as_str()), ("next", "/ui/")]);
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };

    // From another site: refused before the key is even read.
    let response = sign_in(app.client_key.clone(), Some("http://evil.example"))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    assert!(
        response.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    assert!(response.headers().get("set-cookie").is_none());

    // A good key: a session and a redirect, never the key in the answer.
    let response = sign_in(app.client_key.clone(), None).await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    let cookie = response.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict") && cookie.contains("Path=/ui"));
    assert!(!cookie.contains("Secure"), "plain HTTP: no Secure");
    assert!(!cookie.contains(app.client_key.rsplit('_').next().unwrap()));

    // Behind TLS (as the proxy says), the cookie is Secure.
    let response = http
        .post(app.url("/ui/sign-in"))
        .header("x-forwarded-proto", "https")
        .form(&[("key", app.client_key.as_str())])
        .send()
        .await
        .unwrap();
    assert!(response.headers()["set-cookie"].to_str().unwrap().contains("Secure"));

    // Made-up keys: 401 pages, never limited (refused from memory).
    for _ in 0..40 {
        let response = sign_in(longrun_core::apikey::NewApiKey::generate().token, None)
            .await
            .unwrap();
        assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    }
    // Wrong secrets of an existing key: 401 pages for the source's burst,
    // then 429 with Retry-After.
    let (id, _) = app.client_key.rsplit_once('_').unwrap();
    let (mut unauthorized, mut limited) = (0, 0);
    for _ in 0..40 {
        let guess = format!("{id}_{}", longrun_core::id::random_base32::<32>());
        let response = sign_in(guess, None).await.unwrap();
        assert!(
            response.headers()["content-type"]
                .to_str()
                .unwrap()
                .starts_with("text/html")
        );
        match response.status() {
            StatusCode::UNAUTHORIZED => unauthorized += 1,
            StatusCode::TOO_MANY_REQUESTS => {
                assert!(response.headers().contains_key("retry-after"));
                limited += 1;
            }
            other => panic!("unexpected {other}"),
        }
    }
    assert!((1..=11).contains(&unauthorized), "the burst: {unauthorized}");
    assert_eq!(limited, 40 - unauthorized);
    // The good key still signs in from that address.
    let response = sign_in(app.client_key.clone(), None).await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);

    // A page without a session sends to sign-in, keeping where it was going.
    let response = http.get(app.url("/ui/operations?state=failed")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        response.headers()["location"],
        "/ui/sign-in?next=%2Fui%2Foperations%3Fstate%3Dfailed"
    );
    app.shutdown().await;
}

/// Bad input to the console's forms, over plain HTTP: each refused with a
/// page naming the problem, nothing changed.
#[tokio::test]
async fn malformed_oversized_and_unknown_form_posts_are_refused_and_change_nothing() {
    let app = spawn_app().await;
    let id = sleeping(&app, &app.client_key, "bad-forms").await;
    // Once running, only the refused posts below could change its version.
    let version = app.wait_for_state(&id, "running").await["version"].as_i64().unwrap();
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let response = http
        .post(app.url("/ui/sign-in"))
        .form(&[("key", app.client_key.as_str())])
        .send()
        .await
        .unwrap();
    let cookie = response.headers()["set-cookie"]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_owned();
    let page = http
        .get(app.url(&format!("/ui/operations/{id}")))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_owned();
    let post = |path: String, form: Vec<(&'static str, String)>| {
        http.post(app.url(&path)).header("cookie", &cookie).form(&form).send()
    };
    let edit = format!("/ui/operations/{id}/edit");
    let v = version.to_string();
    // What is wrong, where it is posted, the form, and the refusal.
    type Case = (&'static str, String, Vec<(&'static str, String)>, StatusCode);
    let cases: Vec<Case> = vec![
        (
            "no token",
            edit.clone(),
            vec![
                ("version", v.clone()),
                ("deadline_seconds", "60".into()),
                ("labels", String::new()),
            ],
            StatusCode::FORBIDDEN,
        ),
        (
            "a wrong token",
            edit.clone(),
            vec![
                ("csrf", "nope".into()),
                ("version", v.clone()),
                ("deadline_seconds", "60".into()),
                ("labels", String::new()),
            ],
            StatusCode::FORBIDDEN,
        ),
        (
            "a version that is no number",
            edit.clone(),
            vec![
                ("csrf", csrf.clone()),
                ("version", "three".into()),
                ("deadline_seconds", "60".into()),
                ("labels", String::new()),
            ],
            StatusCode::BAD_REQUEST,
        ),
        (
            "a deadline that is no number",
            edit.clone(),
            vec![
                ("csrf", csrf.clone()),
                ("version", v.clone()),
                ("deadline_seconds", "soon".into()),
                ("labels", String::new()),
            ],
            StatusCode::BAD_REQUEST,
        ),
        (
            "a label line without =",
            edit.clone(),
            vec![
                ("csrf", csrf.clone()),
                ("version", v.clone()),
                ("deadline_seconds", String::new()),
                ("labels", "oops".into()),
            ],
            StatusCode::BAD_REQUEST,
        ),
        (
            "a label value too long",
            edit.clone(),
            vec![
                ("csrf", csrf.clone()),
                ("version", v.clone()),
                ("deadline_seconds", String::new()),
                ("labels", format!("k={}", "x".repeat(300))),
            ],
            StatusCode::BAD_REQUEST,
        ),
        (
            "an unknown operation",
            "/ui/operations/op_aaaaaaaaaaaaaaaaaaaaaaaaaa/cancel".into(),
            vec![("csrf", csrf.clone())],
            StatusCode::NOT_FOUND,
        ),
        (
            "a malformed id",
            "/ui/operations/nonsense/cancel".into(),
            vec![("csrf", csrf.clone())],
            StatusCode::NOT_FOUND,
        ),
        (
            "an intent that is neither",
            format!("/ui/operations/{id}/intent"),
            vec![
                ("csrf", csrf.clone()),
                ("version", v.clone()),
                ("desired_state", "sideways".into()),
            ],
            StatusCode::BAD_REQUEST,
        ),
        (
            "a client at an admin form",
            "/ui/tenants/acme/keys".into(),
            vec![("csrf", csrf.clone()), ("role", "admin".into())],
            StatusCode::FORBIDDEN,
        ),
        (
            "an oversized body",
            format!("/ui/operations/{id}/cancel"),
            vec![("csrf", csrf.clone()), ("reason", "r".repeat(2 * 1024 * 1024))],
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
    ];
    for (what, path, form, status) in cases {
        let response = post(path, form).await.unwrap();
        assert_eq!(response.status(), status, "{what}");
        let kind = response.headers()["content-type"].to_str().unwrap().to_owned();
        assert!(kind.starts_with("text/html"), "{what}: a page, not {kind}");
        let page = response.text().await.unwrap();
        assert!(
            page.contains("Problem code"),
            "{what}: the page names the problem: {page}"
        );
    }
    let json = http
        .post(app.url(&format!("/ui/operations/{id}/cancel")))
        .header("cookie", &cookie)
        .json(&json!({"csrf": csrf}))
        .send()
        .await
        .unwrap();
    assert_eq!(json.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "a form sent as JSON");
    let after = app.get_operation(&id).await;
    assert_eq!(after["version"].as_i64().unwrap(), version, "nothing changed: {after}");
    assert_eq!(after["state"], "running");
    let keys = app.store.api_key_list().await.unwrap();
    assert!(
        keys.iter().all(|k| k.role != Role::Admin || k.tenant != "acme"),
        "no key was made"
    );
    app.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schedules_are_listed_their_firings_linked_and_paused_from_the_page() {
    let app = spawn_app().await;
    let Some(browser) = browser().await else { return };
    let created = app
        .request(Method::POST, "/v1/schedules", &app.client_key)
        .json(&json!({"kind": "sleep", "input": {"duration_ms": 1}, "cron": "0 2 * * *", "time_zone": "Europe/Berlin"}))
        .send()
        .await
        .unwrap();
    assert_eq!(created.status(), StatusCode::CREATED);
    let schedule: Value = created.json().await.unwrap();
    let id = schedule["id"].as_str().unwrap().to_owned();
    let fired: Value = app
        .request(Method::POST, &format!("/v1/schedules/{id}/trigger"), &app.client_key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let op = fired["id"].as_str().unwrap().to_owned();
    // Another tenant's schedule never shows.
    let theirs: Value = app
        .request(Method::POST, "/v1/schedules", &app.other_tenant_key)
        .json(&json!({"kind": "sleep", "input": {"duration_ms": 1}, "cron": "@hourly"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();

    browser.sign_in(&app, &app.client_key).await;
    browser.goto(&app, "/ui/schedules").await;
    let table = browser.text("#schedules").await;
    assert!(table.contains(&id) && table.contains("0 2 * * *"), "{table}");
    assert!(
        !browser
            .source()
            .await
            .contains(theirs["id"].as_str().expect("their schedule")),
        "{theirs}"
    );
    browser.click(&format!("tr[data-id='{id}'] a")).await;
    assert_eq!(browser.path().await, format!("/ui/schedules/{id}"));
    assert_eq!(browser.text("[data-field=paused]").await, "active");
    assert_eq!(
        browser.text("#next li").await,
        schedule["next_fire_times"][0].as_str().unwrap()
    );
    // The trigger's firing, linked to its operation.
    assert_eq!(browser.text("#fires [data-field=decision]").await, "triggered");
    assert!(
        browser
            .source()
            .await
            .contains(&format!("href=\"/ui/operations/{op}\""))
    );
    browser.screenshot("schedule").await;

    // Pause from the page: the API says so too.
    browser.submit("#toggle", &[]).await;
    assert_eq!(browser.text("[data-field=paused]").await, "paused");
    let read = app.get_json(&format!("/v1/schedules/{id}")).await;
    assert_eq!(
        (read["paused"].clone(), read["version"].as_i64()),
        (json!(true), Some(3))
    );

    // Resumed elsewhere, the page's stale form is refused and shown as such.
    let resumed = app
        .request(Method::PATCH, &format!("/v1/schedules/{id}"), &app.client_key)
        .header("If-Match", "\"3\"")
        .json(&json!({"paused": false}))
        .send()
        .await
        .unwrap();
    assert_eq!(resumed.status(), StatusCode::OK);
    browser.submit("#toggle", &[]).await;
    let conflict = browser.text("#conflict").await;
    assert!(
        conflict.contains("Not applied") && conflict.contains("precondition_failed"),
        "{conflict}"
    );
    assert_eq!(
        app.get_json(&format!("/v1/schedules/{id}")).await["paused"],
        json!(false),
        "nothing changed"
    );

    // Another tenant's schedule is not found from this session.
    browser
        .goto(&app, &format!("/ui/schedules/{}", theirs["id"].as_str().unwrap()))
        .await;
    assert!(browser.source().await.contains("not_found") || browser.source().await.contains("Not found"));

    browser.close().await;
    app.shutdown().await;
}
