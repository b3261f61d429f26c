//! The console (docs/api.md §9): a web dashboard served at `/ui/` by the same
//! process, rendered on the server (every reading page works without
//! JavaScript; the live rows and nothing else need it), with its assets
//! compiled into the binary.
//!
//! - **Sessions.** Signing in with an API key (client or admin; worker keys
//!   are refused) stores the SHA-256 of a fresh random token with the key's
//!   id; the token goes back as an `HttpOnly`, `SameSite=Strict` cookie
//!   (`Secure` behind TLS) scoped to `/ui`. The key itself is never stored,
//!   shown, logged or put in a URL. Revoking the key ends its sessions at
//!   the next request; signing out deletes the session.
//! - **Cross-site requests.** Every state-changing form carries a token
//!   derived from the session's (an attacker's page cannot read it) and is
//!   refused, `403`, when it lacks it or when the browser says it comes from
//!   another origin (`Origin`, `Sec-Fetch-Site`).
//! - **One set of rules.** Pages read through the store calls the API uses;
//!   every action calls the function its API endpoint calls
//!   (`commands::cancel`, `commands::update`, `submissions::prepare_rerun`,
//!   `results::result_links`), or for tenants and keys the store call the
//!   CLI makes. A client key sees its tenant only (another tenant's id is
//!   404, as in the API); an admin key sees every tenant and may filter.

// Handlers answer `Result<Response, Response>`, axum's idiom for a page or
// a refusal rendered as one; the size of `Response` is no concern here.
#![allow(clippy::result_large_err)]

mod pages;
mod schedules;

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::time::Duration;

use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State};
use axum::http::request::Parts;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::{Form, Router};
use futures_util::Stream;
use longrun_core::apikey::{NewApiKey, PresentedKey, Role};
use longrun_core::webhook::WebhookSecret;
use longrun_core::{Id, IdKind, Timestamp};
use longrun_store::{ApiKeyCreateParams, ConsoleSession};
use maud::{Markup, html};
use serde::Deserialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::app::ApiError;
use crate::app::AppState;
use crate::app::commands;
use crate::app::submissions::{self, prepare_rerun};
use longrun_api::{DesiredStateBody, RerunRequest, UpdateRequest};

/// The session cookie.
const COOKIE: &str = "longrun_session";
/// How long a session lasts after signing in.
pub const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Live rows one page may follow.
const MAX_LIVE_IDS: usize = 100;
/// How long the webhook secret a rotation replaces keeps signing.
const SECRET_OVERLAP: Duration = Duration::from_secs(24 * 3600);

pub fn router() -> Router<AppState> {
    Router::new()
        .route("/ui", get(|| async { Redirect::permanent("/ui/") }))
        .route("/ui/", get(pages::overview))
        .route("/ui/sign-in", get(sign_in_page).post(sign_in))
        .route("/ui/sign-out", post(sign_out))
        .route("/ui/operations", get(pages::operations))
        .route("/ui/operations/{id}", get(pages::operation))
        .route("/ui/operations/{id}/cancel", post(cancel))
        .route("/ui/operations/{id}/edit", post(edit))
        .route("/ui/operations/{id}/intent", post(intent))
        .route("/ui/operations/{id}/rerun", post(rerun))
        .route("/ui/operations/{id}/artifacts/{name}", get(download))
        .route("/ui/workers", get(pages::workers))
        .route("/ui/schedules", get(schedules::list))
        .route("/ui/schedules/{id}", get(schedules::show))
        .route("/ui/schedules/{id}/paused", post(schedules::set_paused))
        .route("/ui/tenants", get(pages::tenants))
        .route("/ui/tenants/{name}/keys", post(create_key))
        .route("/ui/tenants/{name}/webhook-secret", post(rotate_secret))
        .route("/ui/tenants/{name}/delete", post(delete_tenant))
        .route("/ui/keys/{id}/revoke", post(revoke_key))
        .route("/ui/accepting/resume", post(resume_accepting))
        .route("/ui/live", get(live))
        .route("/ui/assets/console.css", get(css))
        .route("/ui/assets/console.js", get(js))
}

/// Who is looking: the key a live session was opened with.
#[derive(Debug, Clone)]
pub struct Viewer {
    pub key_id: Id,
    pub tenant: String,
    pub role: Role,
    /// The token this session's forms carry.
    pub csrf: String,
}

impl Viewer {
    pub fn is_admin(&self) -> bool {
        self.role == Role::Admin
    }

    /// The tenant whose data a page shows: a client's own, or the one an
    /// admin filters by (`None`: every tenant).
    pub fn scope(&self, requested: Option<&str>) -> Option<String> {
        if self.is_admin() {
            requested.filter(|t| !t.is_empty()).map(str::to_owned)
        } else {
            Some(self.tenant.clone())
        }
    }

    /// The tenant of operation `id` as this viewer may see it: a client's
    /// own; for an admin, whichever tenant it belongs to.
    pub async fn tenant_of(&self, app: &AppState, id: &Id) -> Result<String, ApiError> {
        if !self.is_admin() {
            return Ok(self.tenant.clone());
        }
        app.store.operation_tenant(id).await?.ok_or(ApiError::NotFound)
    }

    fn require_admin(&self) -> Result<(), ApiError> {
        if self.is_admin() {
            Ok(())
        } else {
            Err(ApiError::Forbidden)
        }
    }
}

impl FromRequestParts<AppState> for Viewer {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, app: &AppState) -> Result<Self, Self::Rejection> {
        let here = parts.uri.path_and_query().map_or("/ui/", |p| p.as_str());
        let to_sign_in = || sign_in_redirect(here);
        let Some(token) = session_token(&parts.headers) else {
            return Err(to_sign_in());
        };
        let now = app.clock.now();
        let key_id = app
            .store
            .console_session_key(&sha256(token.as_bytes()), now)
            .await
            .map_err(|e| error_page(None, ApiError::from(e)))?
            .ok_or_else(to_sign_in)?;
        let record = app
            .api_key(&key_id)
            .await
            .map_err(|e| error_page(None, ApiError::from(e)))?;
        // A revoked key's sessions end with it.
        let record = record
            .filter(|r| r.revoked_at.is_none() && r.role != Role::Worker)
            .ok_or_else(to_sign_in)?;
        tracing::Span::current().record("tenant", record.tenant.as_str());
        Ok(Viewer {
            key_id: record.id,
            tenant: record.tenant,
            role: record.role,
            csrf: csrf_token(&token),
        })
    }
}

fn sign_in_redirect(next: &str) -> Response {
    let next: String = url::form_urlencoded::byte_serialize(next.as_bytes()).collect();
    Redirect::to(&format!("/ui/sign-in?next={next}")).into_response()
}

fn sha256(bytes: &[u8]) -> Vec<u8> {
    Sha256::digest(bytes).to_vec()
}

/// The form token of a session: derived from its secret token, so only a
/// page the session itself loaded can know it.
fn csrf_token(session_token: &str) -> String {
    let digest = Sha256::digest(format!("longrun-console-csrf:{session_token}").as_bytes());
    data_encoding::BASE32_NOPAD.encode(&digest).to_ascii_lowercase()
}

fn session_token(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_owned())
        .filter(|v| !v.is_empty() && v.len() <= 128)
}

/// Whether the browser says the request comes from a page of this origin.
/// Browsers send `Sec-Fetch-Site` and `Origin` with form posts; a request
/// with neither is not from a browser page, and still needs the form token.
fn same_origin(headers: &HeaderMap) -> bool {
    if let Some(site) = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok())
        && !matches!(site, "same-origin" | "none")
    {
        return false;
    }
    match headers.get(header::ORIGIN).and_then(|v| v.to_str().ok()) {
        None => true,
        Some(origin) => {
            let host = headers.get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("");
            let origin_host = origin
                .strip_prefix("http://")
                .or_else(|| origin.strip_prefix("https://"))
                .unwrap_or("");
            !host.is_empty() && origin_host.eq_ignore_ascii_case(host)
        }
    }
}

/// Refuses a state-changing form that another site could have sent.
fn check_form(viewer: &Viewer, headers: &HeaderMap, presented: &str) -> Result<(), Response> {
    let token_ok: bool = viewer.csrf.as_bytes().ct_eq(presented.as_bytes()).into();
    if token_ok && same_origin(headers) {
        Ok(())
    } else {
        metrics::counter!("longrun_console_forms_refused_total").increment(1);
        Err(error_page(
            Some(viewer),
            ApiError::LinkRefused("the form did not come from this console; reload the page and try again".into()),
        ))
    }
}

/// Behind TLS (directly or at a proxy that says so), cookies are `Secure`.
fn behind_tls(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
}

fn session_cookie(value: &str, max_age: Duration, secure: bool) -> HeaderValue {
    let secure = if secure { "; Secure" } else { "" };
    HeaderValue::from_str(&format!(
        "{COOKIE}={value}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}{secure}",
        max_age.as_secs()
    ))
    .expect("a cookie of base32 is a valid header")
}

/// Every console response: HTML never cached, never framed, scripts and
/// styles from this origin only.
pub(crate) fn page(status: StatusCode, markup: Markup) -> Response {
    let mut response = (status, Html(markup.into_string())).into_response();
    harden(response.headers_mut());
    response
}

fn harden(headers: &mut HeaderMap) {
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
             frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        ),
    );
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("same-origin"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
}

/// A refusal or failure as a page: the problem's status, code and detail.
pub(crate) fn error_page(viewer: Option<&Viewer>, error: ApiError) -> Response {
    if let ApiError::Internal(message) = &error {
        tracing::error!(error = %message, "internal error");
    }
    let problem = error.problem();
    let status = StatusCode::from_u16(problem.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = html! {
        section.problem {
            h1 { (problem.title) }
            p { (problem.detail) }
            p.muted { "Problem code " code { (problem.code) } " · HTTP " (problem.status) }
            p { a href="/ui/" { "Back to the overview" } }
        }
    };
    page(status, pages::layout(&problem.title, viewer, body))
}

/// A posted form, or its refusal as a page with the problem's code (axum's
/// own `Form` rejection is plain text).
pub(crate) struct Posted<T>(pub T);

impl<T: DeserializeOwned, S: Send + Sync> FromRequest<S> for Posted<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        Form::<T>::from_request(req, state)
            .await
            .map(|Form(form)| Posted(form))
            .map_err(|rejection| {
                let error = match rejection.status() {
                    StatusCode::PAYLOAD_TOO_LARGE => {
                        ApiError::PayloadTooLarge("the form is larger than the server's limit".into())
                    }
                    StatusCode::UNSUPPORTED_MEDIA_TYPE => ApiError::UnsupportedMediaType(
                        "a form must be sent as application/x-www-form-urlencoded".into(),
                    ),
                    _ => ApiError::InvalidRequest(format!("the form could not be read: {}", rejection.body_text())),
                };
                error_page(None, error)
            })
    }
}

/// Handlers answer a page or a refusal rendered as one.
pub(crate) type PageResult = Result<Response, Response>;

pub(crate) trait OrPage<T> {
    fn or_page(self, viewer: &Viewer) -> Result<T, Response>;
}

impl<T, E: Into<ApiError>> OrPage<T> for Result<T, E> {
    fn or_page(self, viewer: &Viewer) -> Result<T, Response> {
        self.map_err(|e| error_page(Some(viewer), e.into()))
    }
}

// ---- signing in and out ----------------------------------------------------

#[derive(Debug, Deserialize)]
struct NextQuery {
    next: Option<String>,
}

/// Where to go after signing in: a console path, never another site.
fn safe_next(next: Option<&str>) -> String {
    match next {
        Some(n) if n.starts_with("/ui/") && !n.starts_with("//") && !n.contains('\\') => n.to_owned(),
        _ => "/ui/".to_owned(),
    }
}

async fn sign_in_page(Query(query): Query<NextQuery>) -> Response {
    page(StatusCode::OK, pages::sign_in(&safe_next(query.next.as_deref()), None))
}

/// The address a request came from, when it came through the listener.
struct Peer(Option<std::net::SocketAddr>);

impl<S: Send + Sync> FromRequestParts<S> for Peer {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        Ok(Peer(crate::source::peer(&parts.extensions)))
    }
}

#[derive(Debug, Deserialize)]
struct SignInForm {
    key: String,
    next: Option<String>,
}

async fn sign_in(
    State(app): State<AppState>,
    Peer(peer): Peer,
    headers: HeaderMap,
    Posted(form): Posted<SignInForm>,
) -> Response {
    let next = safe_next(form.next.as_deref());
    let refuse = |status: StatusCode, why: &str| page(status, pages::sign_in(&next, Some(why)));
    // Signing in from another site's page would sign the victim in as the
    // attacker: refused like any cross-site form.
    if !same_origin(&headers) {
        return refuse(StatusCode::FORBIDDEN, "This form did not come from this console.");
    }
    // As the API authenticates (`http::auth::authenticate`): a correct key
    // signs in whatever its address did; wrong secrets of existing keys
    // spend the source's budget (`--auth-failures-per-source`).
    let source = || peer.map(|p| crate::source::client_address(p.ip(), &headers, &app.config.limits.trusted_proxies));
    let record = match crate::app::auth::authenticate(&app, PresentedKey::parse(form.key.trim()), source).await {
        Ok(record) => record,
        Err(ApiError::RateLimited { retry_after, .. }) => {
            let mut response = refuse(
                StatusCode::TOO_MANY_REQUESTS,
                "Too many failed sign-ins from this address; wait and try again.",
            );
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(retry_after.as_secs().max(1)));
            return response;
        }
        Err(ApiError::Unauthenticated) => return refuse(StatusCode::UNAUTHORIZED, "That key is not valid."),
        Err(e) => return error_page(None, e),
    };
    if record.role == Role::Worker {
        return refuse(
            StatusCode::FORBIDDEN,
            "Worker keys cannot sign in; use a client or admin key.",
        );
    }
    let token = longrun_core::id::random_base32::<32>();
    let now = app.clock.now();
    let session = ConsoleSession {
        token_hash: sha256(token.as_bytes()),
        key_id: record.id.clone(),
        created_at: now,
        expires_at: now.plus(SESSION_TTL),
    };
    if let Err(e) = app.store.console_session_start(session).await {
        return error_page(None, e.into());
    }
    tracing::info!(key_id = %record.id, tenant = %record.tenant, "console sign-in");
    let mut response = Redirect::to(&next).into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        session_cookie(&token, SESSION_TTL, behind_tls(&headers)),
    );
    harden(response.headers_mut());
    response
}

#[derive(Debug, Deserialize)]
struct TokenOnly {
    /// Missing is refused as a wrong token is: `403`.
    #[serde(default)]
    csrf: String,
}

async fn sign_out(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Posted(form): Posted<TokenOnly>,
) -> PageResult {
    check_form(&viewer, &headers, &form.csrf)?;
    if let Some(token) = session_token(&headers) {
        app.store
            .console_session_end(&sha256(token.as_bytes()))
            .await
            .or_page(&viewer)?;
    }
    let mut response = Redirect::to("/ui/sign-in").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        session_cookie("", Duration::ZERO, behind_tls(&headers)),
    );
    Ok(response)
}

// ---- operation actions -----------------------------------------------------

fn operation_id(raw: &str) -> Result<Id, ApiError> {
    Id::parse(IdKind::Operation, raw).ok_or(ApiError::NotFound)
}

fn to_operation(id: &Id) -> Response {
    Redirect::to(&format!("/ui/operations/{id}")).into_response()
}

#[derive(Debug, Deserialize)]
struct CancelForm {
    /// Missing is refused as a wrong token is: `403`.
    #[serde(default)]
    csrf: String,
    reason: Option<String>,
}

async fn cancel(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(id): Path<String>,
    Posted(form): Posted<CancelForm>,
) -> PageResult {
    check_form(&viewer, &headers, &form.csrf)?;
    let id = operation_id(&id).or_page(&viewer)?;
    let tenant = viewer.tenant_of(&app, &id).await.or_page(&viewer)?;
    let reason = form.reason.filter(|r| !r.trim().is_empty());
    commands::cancel(&app, &tenant, viewer.key_id.as_str(), &id, reason, None)
        .await
        .or_page(&viewer)?;
    Ok(to_operation(&id))
}

#[derive(Debug, Deserialize)]
struct EditForm {
    /// Missing is refused as a wrong token is: `403`.
    #[serde(default)]
    csrf: String,
    /// The version the page showed: the edit's `If-Match`.
    version: i64,
    /// Seconds from creation; empty removes the deadline.
    deadline_seconds: String,
    /// `key=value`, one per line.
    labels: String,
}

/// Labels as the edit form writes them: `key=value` per line.
fn parse_labels(text: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let mut labels = BTreeMap::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let (key, value) = line
            .split_once('=')
            .ok_or_else(|| ApiError::InvalidRequest(format!("label {line:?} is not key=value")))?;
        labels.insert(key.trim().to_owned(), value.trim().to_owned());
    }
    Ok(labels)
}

async fn edit(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(id): Path<String>,
    Posted(form): Posted<EditForm>,
) -> PageResult {
    check_form(&viewer, &headers, &form.csrf)?;
    let id = operation_id(&id).or_page(&viewer)?;
    let tenant = viewer.tenant_of(&app, &id).await.or_page(&viewer)?;
    let deadline_seconds = match form.deadline_seconds.trim() {
        "" => None,
        n => Some(
            n.parse::<u64>()
                .map_err(|_| ApiError::InvalidRequest("deadline_seconds must be a whole number of seconds".into()))
                .or_page(&viewer)?,
        ),
    };
    let request = UpdateRequest {
        deadline_seconds: Some(deadline_seconds),
        labels: Some(parse_labels(&form.labels).or_page(&viewer)?),
        desired_state: None,
        not_before: None,
    };
    match commands::update(&app, &tenant, id.clone(), form.version, request).await {
        Ok(_) => Ok(to_operation(&id)),
        // A stale edit is shown against what the operation is now.
        Err(e @ (ApiError::PreconditionFailed { .. } | ApiError::TerminalIntentWins { .. })) => {
            Err(pages::operation_page(&app, &viewer, &tenant, &id, Some(e)).await)
        }
        Err(e) => Err(error_page(Some(&viewer), e)),
    }
}

#[derive(Debug, Deserialize)]
struct IntentForm {
    /// Missing is refused as a wrong token is: `403`.
    #[serde(default)]
    csrf: String,
    version: i64,
    /// `paused` or `running`.
    desired_state: String,
}

async fn intent(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(id): Path<String>,
    Posted(form): Posted<IntentForm>,
) -> PageResult {
    check_form(&viewer, &headers, &form.csrf)?;
    let id = operation_id(&id).or_page(&viewer)?;
    let tenant = viewer.tenant_of(&app, &id).await.or_page(&viewer)?;
    let desired = match form.desired_state.as_str() {
        "paused" => DesiredStateBody::Paused,
        "running" => DesiredStateBody::Running,
        _ => {
            return Err(error_page(
                Some(&viewer),
                ApiError::InvalidRequest("desired_state is paused or running".into()),
            ));
        }
    };
    let request = UpdateRequest {
        deadline_seconds: None,
        labels: None,
        desired_state: Some(desired),
        not_before: None,
    };
    match commands::update(&app, &tenant, id.clone(), form.version, request).await {
        Ok(_) => Ok(to_operation(&id)),
        Err(e @ ApiError::PreconditionFailed { .. }) => {
            Err(pages::operation_page(&app, &viewer, &tenant, &id, Some(e)).await)
        }
        Err(e) => Err(error_page(Some(&viewer), e)),
    }
}

#[derive(Debug, Deserialize)]
struct RerunForm {
    /// Missing is refused as a wrong token is: `403`.
    #[serde(default)]
    csrf: String,
    /// Minted with the page: a double submission replays, not re-runs twice.
    idempotency_key: String,
    #[serde(default)]
    from_checkpoint: Option<String>,
}

async fn rerun(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(id): Path<String>,
    Posted(form): Posted<RerunForm>,
) -> PageResult {
    check_form(&viewer, &headers, &form.csrf)?;
    let id = operation_id(&id).or_page(&viewer)?;
    let tenant = viewer.tenant_of(&app, &id).await.or_page(&viewer)?;
    let key = longrun_core::IdempotencyKey::parse(form.idempotency_key.as_bytes())
        .map_err(|e| ApiError::InvalidRequest(e.to_string()))
        .or_page(&viewer)?;
    let request = RerunRequest {
        from_checkpoint: form.from_checkpoint.is_some(),
        ..Default::default()
    };
    let now = app.clock.now();
    let params = prepare_rerun(&app, &tenant, &id, Some(key), request, now)
        .await
        .or_page(&viewer)?;
    let (op, _replayed) = submissions::accept(&app, params).await.or_page(&viewer)?;
    Ok(to_operation(&op.id))
}

/// Mints a download link for one artifact and sends the browser to it.
async fn download(State(app): State<AppState>, viewer: Viewer, Path((id, name)): Path<(String, String)>) -> PageResult {
    let id = operation_id(&id).or_page(&viewer)?;
    let tenant = viewer.tenant_of(&app, &id).await.or_page(&viewer)?;
    let mut links = crate::app::reads::result_links(&app, &tenant, id)
        .await
        .or_page(&viewer)?;
    let artifact = if name == longrun_store::DEFAULT_ARTIFACT {
        links.artifact.take()
    } else {
        links.artifacts.remove(&name)
    };
    let artifact = artifact.ok_or(ApiError::NotFound).or_page(&viewer)?;
    Ok(Redirect::to(&artifact.download.url).into_response())
}

// ---- tenants and keys (admins) ---------------------------------------------

#[derive(Debug, Deserialize)]
struct KeyForm {
    /// Missing is refused as a wrong token is: `403`.
    #[serde(default)]
    csrf: String,
    role: String,
}

async fn create_key(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Posted(form): Posted<KeyForm>,
) -> PageResult {
    check_form(&viewer, &headers, &form.csrf)?;
    viewer.require_admin().or_page(&viewer)?;
    let role = Role::parse(&form.role)
        .ok_or_else(|| ApiError::InvalidRequest("role is client, worker or admin".into()))
        .or_page(&viewer)?;
    let key = NewApiKey::generate();
    app.store
        .api_key_create(ApiKeyCreateParams {
            id: key.id.clone(),
            tenant: tenant.clone(),
            role,
            secret_hash: key.secret_hash,
            now: app.clock.now(),
        })
        .await
        .or_page(&viewer)?;
    app.known_keys.insert(&key.id);
    tracing::info!(key_id = %key.id, tenant = %tenant, role = role.as_str(), "console created an API key");
    // Shown once, on this response only (never cached, never redirected to).
    let shown = pages::Secret {
        what: format!("New {} key for {tenant}", role.as_str()),
        value: key.token,
    };
    Ok(pages::tenants_page(&app, &viewer, Some(shown), None).await)
}

async fn revoke_key(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(id): Path<String>,
    Posted(form): Posted<TokenOnly>,
) -> PageResult {
    check_form(&viewer, &headers, &form.csrf)?;
    viewer.require_admin().or_page(&viewer)?;
    let id = Id::parse(IdKind::ApiKey, &id)
        .ok_or(ApiError::NotFound)
        .or_page(&viewer)?;
    app.store.api_key_revoke(&id, app.clock.now()).await.or_page(&viewer)?;
    Ok(Redirect::to("/ui/tenants").into_response())
}

async fn rotate_secret(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Posted(form): Posted<TokenOnly>,
) -> PageResult {
    check_form(&viewer, &headers, &form.csrf)?;
    viewer.require_admin().or_page(&viewer)?;
    let fresh = WebhookSecret::generate().expose();
    app.store
        .webhook_secret_rotate(&tenant, fresh.clone(), app.clock.now(), SECRET_OVERLAP)
        .await
        .or_page(&viewer)?;
    let shown = pages::Secret {
        what: format!(
            "New webhook secret for {tenant} (the previous one keeps signing for {} hours)",
            SECRET_OVERLAP.as_secs() / 3600
        ),
        value: fresh,
    };
    Ok(pages::tenants_page(&app, &viewer, Some(shown), None).await)
}

#[derive(Debug, Deserialize)]
struct DeleteForm {
    /// Missing is refused as a wrong token is: `403`.
    #[serde(default)]
    csrf: String,
    /// The tenant's name, typed again.
    confirm: String,
}

async fn delete_tenant(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Path(tenant): Path<String>,
    Posted(form): Posted<DeleteForm>,
) -> PageResult {
    check_form(&viewer, &headers, &form.csrf)?;
    viewer.require_admin().or_page(&viewer)?;
    if form.confirm != tenant {
        let refusal = format!("Type {tenant:?} exactly to delete it; nothing was deleted.");
        return Err(pages::tenants_page(&app, &viewer, None, Some(refusal)).await);
    }
    if tenant == viewer.tenant {
        let refusal = "You cannot delete the tenant of the key you are signed in with.".to_owned();
        return Err(pages::tenants_page(&app, &viewer, None, Some(refusal)).await);
    }
    // The objects of its artifacts become garbage; the retention sweep
    // deletes them, as after any removal.
    let counts = app
        .store
        .tenant_delete(&tenant, app.clock.now())
        .await
        .or_page(&viewer)?;
    tracing::info!(tenant = %tenant, operations = counts.operations, keys = counts.keys, "console deleted a tenant");
    Ok(Redirect::to("/ui/tenants").into_response())
}

#[derive(Debug, Deserialize)]
struct ResumeForm {
    csrf: String,
    /// A kind, or empty for the pause of every kind.
    kind: String,
}

async fn resume_accepting(
    State(app): State<AppState>,
    viewer: Viewer,
    headers: HeaderMap,
    Posted(form): Posted<ResumeForm>,
) -> PageResult {
    check_form(&viewer, &headers, &form.csrf)?;
    viewer.require_admin().or_page(&viewer)?;
    let kind = Some(form.kind).filter(|k| !k.is_empty());
    app.store.accepting_pause(kind, false).await.or_page(&viewer)?;
    app.forget_pauses();
    Ok(Redirect::to("/ui/").into_response())
}

// ---- live rows -------------------------------------------------------------

#[derive(Debug, Deserialize)]
struct LiveQuery {
    ids: String,
}

/// `text/event-stream` of the changes of the operations a page shows: one
/// `change` event `{"id","state","version"}` per committed change (only
/// the viewer's own, or any for an admin), and the current state of each
/// first and after a gap in the feed. First: a change made between the
/// page's rendering and its stream's opening, or while an `EventSource`
/// reconnects, is not missed (the page keeps the highest version it saw,
/// so hearing a state twice changes nothing).
async fn live(
    State(app): State<AppState>,
    viewer: Viewer,
    Query(query): Query<LiveQuery>,
) -> Result<Sse<impl Stream<Item = Result<SseEvent, Infallible>>>, Response> {
    let ids: std::collections::HashSet<Id> = query
        .ids
        .split(',')
        .filter_map(|raw| Id::parse(IdKind::Operation, raw.trim()))
        .take(MAX_LIVE_IDS)
        .collect();
    let slot = app.console_streams.try_enter().ok_or_else(|| {
        error_page(
            Some(&viewer),
            ApiError::TemporarilyUnavailable {
                detail: "too many console pages are following changes".into(),
                retry_after: Duration::from_secs(5),
            },
        )
    })?;
    let mut feed = app.store.subscribe_changes();
    let stream = async_stream(move |tx| async move {
        let _slot = slot;
        // Subscribed above, before reading: nothing falls between the two.
        let mut changes = current(&app, &viewer, &ids).await;
        loop {
            for (id, state, version) in changes {
                let data = serde_json::json!({"id": id.as_str(), "state": state, "version": version});
                if tx
                    .send(SseEvent::default().event("change").data(data.to_string()))
                    .await
                    .is_err()
                {
                    return;
                }
            }
            // A page that went away frees its place at once, not at the
            // next change of one of its operations.
            let received = tokio::select! {
                () = tx.closed() => return,
                received = feed.recv() => received,
            };
            changes = match received {
                Ok(change) if change.is_resync() => current(&app, &viewer, &ids).await,
                Ok(change) => {
                    let visible = viewer.is_admin() || change.tenant == viewer.tenant;
                    if visible && ids.contains(&change.operation_id) {
                        vec![(change.operation_id, change.state.as_str().to_owned(), change.version)]
                    } else {
                        Vec::new()
                    }
                }
                Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => current(&app, &viewer, &ids).await,
                Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
            };
        }
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::new().interval(Duration::from_secs(15))))
}

/// The current state of each followed operation the viewer may see.
async fn current(app: &AppState, viewer: &Viewer, ids: &std::collections::HashSet<Id>) -> Vec<(Id, String, i64)> {
    let mut out = Vec::new();
    for id in ids {
        let Ok(tenant) = viewer.tenant_of(app, id).await else {
            continue;
        };
        if let Ok(Some(op)) = app.store.operation_get(&tenant, id).await {
            out.push((op.id.clone(), op.state.as_str().to_owned(), op.version));
        }
    }
    out
}

/// A stream fed by a task through a small channel (ends when the task
/// returns or the client goes).
fn async_stream<F, Fut>(f: F) -> impl Stream<Item = Result<SseEvent, Infallible>>
where
    F: FnOnce(tokio::sync::mpsc::Sender<SseEvent>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (tx, rx) = tokio::sync::mpsc::channel(16);
    tokio::spawn(f(tx));
    futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|event| (Ok(event), rx)) })
}

// ---- assets ----------------------------------------------------------------

async fn css() -> Response {
    asset("text/css; charset=utf-8", include_str!("console/console.css"))
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", include_str!("console/console.js"))
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, max-age=300"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// When an instant is, for people: RFC 3339 to the second.
pub(crate) fn when(t: Timestamp) -> String {
    let mut s = t.to_rfc3339();
    if let Some(dot) = s.find('.') {
        s.replace_range(dot..s.len() - 1, "");
    }
    s
}

/// A duration for people: `3h 12m`, `4m 05s`, `850 ms`.
pub(crate) fn span(d: Duration) -> String {
    let ms = d.as_millis();
    let s = d.as_secs();
    match s {
        0 => format!("{ms} ms"),
        1..=59 => format!("{s} s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        3600..=86_399 => format!("{}h {:02}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {:02}h", s / 86_400, (s % 86_400) / 3600),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn only_pages_of_this_origin_may_post() {
        assert!(same_origin(&headers(&[("host", "127.0.0.1:8080")])));
        assert!(same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:8080")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "http://127.0.0.1:9090")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "127.0.0.1:8080"),
            ("origin", "null")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "a"),
            ("sec-fetch-site", "cross-site")
        ])));
        assert!(!same_origin(&headers(&[
            ("host", "a"),
            ("sec-fetch-site", "same-site")
        ])));
    }

    #[test]
    fn next_stays_in_the_console() {
        assert_eq!(
            safe_next(Some("/ui/operations?state=queued")),
            "/ui/operations?state=queued"
        );
        for bad in [
            "https://evil.example/",
            "//evil.example/ui/",
            "/v1/operations",
            "/ui\\..",
            "",
        ] {
            assert_eq!(safe_next(Some(bad)), "/ui/", "{bad}");
        }
        assert_eq!(safe_next(None), "/ui/");
    }

    #[test]
    fn the_session_cookie_is_read_among_others_and_bounded() {
        let h = headers(&[("cookie", "a=1; longrun_session=abc; b=2")]);
        assert_eq!(session_token(&h).as_deref(), Some("abc"));
        assert_eq!(session_token(&headers(&[("cookie", "longrun_session=")])), None);
        assert_ne!(csrf_token("abc"), csrf_token("abd"));
    }

    #[test]
    fn labels_are_key_equals_value_lines() {
        let labels = parse_labels("team=data\n\n  env = prod \n").unwrap();
        assert_eq!(labels.get("team").map(String::as_str), Some("data"));
        assert_eq!(labels.get("env").map(String::as_str), Some("prod"));
        assert!(parse_labels("oops").is_err());
    }

    #[test]
    fn spans_read_well() {
        assert_eq!(span(Duration::from_millis(850)), "850 ms");
        assert_eq!(span(Duration::from_secs(245)), "4m 05s");
        assert_eq!(span(Duration::from_secs(3 * 3600 + 12 * 60)), "3h 12m");
        assert_eq!(when(Timestamp(1_800_000_000_123)), "2027-01-15T08:00:00Z");
    }
}
