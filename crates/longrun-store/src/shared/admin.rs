//! Keys, kinds, tenants, server secrets, console sessions and acceptance
//! pauses — the small tables an operator changes — as [`Script`]s both
//! stores run: each use case's statements and its decoding, once.

use longrun_core::apikey::Role;

use super::*;

/// The acceptance pause of every kind (`accept_pauses.scope`).
const ALL_KINDS: &str = "*";

fn api_key(r: &Row) -> Result<ApiKeyRecord> {
    let role = r.text(2)?;
    Ok(ApiKeyRecord {
        id: Id::from_trusted(r.text(0)?),
        tenant: r.text(1)?,
        role: Role::parse(&role).ok_or_else(|| StoreError::Corrupt(format!("unknown role {role}")))?,
        secret_hash: r.bytes(3)?,
        created_at: r.ts(4)?,
        revoked_at: r.opt_ts(5)?,
    })
}

fn kind(r: &Row) -> Result<KindSpec> {
    Ok(KindSpec {
        name: r.text(0)?,
        builtin: r.bool(1)?,
        rerun_safe: r.bool(2)?,
        max_attempts: r.int(3)?,
        default_deadline_seconds: r.opt_int(4)?,
        max_deadline_seconds: r.opt_int(5)?,
        pausable: r.bool(6)?,
    })
}

/// A key, and its tenant if the tenant is new.
pub(crate) fn api_key_create(p: &ApiKeyCreateParams) -> Script<()> {
    Script {
        stmts: vec![
            Stmt {
                sql: "INSERT INTO tenants (name, created_at) VALUES (?1, ?2) ON CONFLICT DO NOTHING",
                args: vec![p.tenant.as_str().into(), p.now.into()],
            },
            Stmt {
                sql: "INSERT INTO api_keys (id, tenant, role, secret_hash, created_at) VALUES (?1, ?2, ?3, ?4, ?5)",
                args: vec![
                    p.id.as_str().into(),
                    p.tenant.as_str().into(),
                    p.role.as_str().into(),
                    p.secret_hash[..].into(),
                    p.now.into(),
                ],
            },
        ],
        decode: nothing,
    }
}

pub(crate) fn api_key_get(id: &Id) -> Script<Option<ApiKeyRecord>> {
    const SQL: &str = "SELECT id, tenant, role, secret_hash, created_at, revoked_at FROM api_keys WHERE id = ?1";
    Script::one(SQL, vec![id.as_str().into()], |d| optional(d, api_key))
}

pub(crate) fn api_key_list() -> Script<Vec<ApiKeyRecord>> {
    const SQL: &str =
        "SELECT id, tenant, role, secret_hash, created_at, revoked_at FROM api_keys ORDER BY created_at, id";
    Script::one(SQL, vec![], |d| all(d, api_key))
}

/// Whether a key that was not revoked is now.
pub(crate) fn api_key_revoke(id: &Id, now: Timestamp) -> Script<bool> {
    Script::one(
        "UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL",
        vec![id.as_str().into(), now.into()],
        changed_one,
    )
}

pub(crate) fn api_key_count() -> Script<u64> {
    Script::one("SELECT COUNT(*) FROM api_keys", vec![], |d| one(d, |r| r.count(0)))
}

pub(crate) fn kind_upsert(k: &KindSpec) -> Script<()> {
    Script::one(
        "INSERT INTO kinds (name, builtin, rerun_safe, max_attempts, default_deadline_seconds, max_deadline_seconds,
                            pausable)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (name) DO UPDATE SET builtin = excluded.builtin, rerun_safe = excluded.rerun_safe,
             max_attempts = excluded.max_attempts, default_deadline_seconds = excluded.default_deadline_seconds,
             max_deadline_seconds = excluded.max_deadline_seconds, pausable = excluded.pausable",
        vec![
            k.name.as_str().into(),
            k.builtin.into(),
            k.rerun_safe.into(),
            k.max_attempts.into(),
            k.default_deadline_seconds.into(),
            k.max_deadline_seconds.into(),
            k.pausable.into(),
        ],
        nothing,
    )
}

pub(crate) fn kind_get(name: &str) -> Script<Option<KindSpec>> {
    const SQL: &str = "SELECT name, builtin, rerun_safe, max_attempts, default_deadline_seconds, max_deadline_seconds, pausable FROM kinds WHERE name = ?1";
    Script::one(SQL, vec![name.into()], |d| optional(d, kind))
}

pub(crate) fn kind_list() -> Script<Vec<KindSpec>> {
    const SQL: &str = "SELECT name, builtin, rerun_safe, max_attempts, default_deadline_seconds, max_deadline_seconds, pausable FROM kinds ORDER BY name";
    Script::one(SQL, vec![], |d| all(d, kind))
}

/// The secret `name`: `candidate` if none was stored yet, else the stored one.
pub(crate) fn server_secret(name: &str, candidate: &[u8], now: Timestamp) -> Script<Vec<u8>> {
    Script {
        stmts: vec![
            Stmt {
                sql: "INSERT INTO server_secrets (name, value, created_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
                args: vec![name.into(), candidate.into(), now.into()],
            },
            Stmt {
                sql: "SELECT value FROM server_secrets WHERE name = ?1",
                args: vec![name.into()],
            },
        ],
        decode: |d| one(d, |r| r.bytes(0)),
    }
}

/// The secrets whose name starts with `prefix`, oldest first.
pub(crate) fn server_secret_list(prefix: &str) -> Script<Vec<(String, Vec<u8>)>> {
    Script::one(
        "SELECT name, value FROM server_secrets WHERE substr(name, 1, length(?1)) = ?1 ORDER BY created_at, name",
        vec![prefix.into()],
        |d| all(d, |r| Ok((r.text(0)?, r.bytes(1)?))),
    )
}

/// A tenant's limits (created now if new: its `created_at` is the store's clock).
pub(crate) fn tenant_set(t: &TenantLimits) -> Script<()> {
    Script::one(
        "INSERT INTO tenants (name, created_at, max_active, max_running, rate)
         VALUES (?1, {now_ms}, ?2, ?3, ?4)
         ON CONFLICT (name) DO UPDATE SET max_active = excluded.max_active, max_running = excluded.max_running,
             rate = excluded.rate",
        vec![
            t.name.as_str().into(),
            t.max_active.into(),
            t.max_running.into(),
            t.rate.into(),
        ],
        nothing,
    )
}

pub(crate) fn tenant_get(name: &str) -> Script<Option<TenantLimits>> {
    Script::one(
        "SELECT name, max_active, max_running, rate FROM tenants WHERE name = ?1",
        vec![name.into()],
        |d| {
            optional(d, |r| {
                Ok(TenantLimits {
                    name: r.text(0)?,
                    max_active: r.opt_int(1)?,
                    max_running: r.opt_int(2)?,
                    rate: r.opt_real(3)?,
                })
            })
        },
    )
}

/// A console session; sessions already expired go.
pub(crate) fn console_session_start(s: &ConsoleSession) -> Script<()> {
    Script {
        stmts: vec![
            Stmt {
                sql: "DELETE FROM console_sessions WHERE expires_at <= ?1",
                args: vec![s.created_at.into()],
            },
            Stmt {
                sql: "INSERT INTO console_sessions (token_hash, key_id, created_at, expires_at) VALUES (?1, ?2, ?3, ?4)",
                args: vec![
                    s.token_hash[..].into(),
                    s.key_id.as_str().into(),
                    s.created_at.into(),
                    s.expires_at.into(),
                ],
            },
        ],
        decode: nothing,
    }
}

/// The key of a session still valid at `now`.
pub(crate) fn console_session_key(token_hash: &[u8], now: Timestamp) -> Script<Option<Id>> {
    Script::one(
        "SELECT key_id FROM console_sessions WHERE token_hash = ?1 AND expires_at > ?2",
        vec![token_hash.into(), now.into()],
        |d| optional(d, |r| Ok(Id::from_trusted(r.text(0)?))),
    )
}

pub(crate) fn console_session_end(token_hash: &[u8]) -> Script<()> {
    Script::one(
        "DELETE FROM console_sessions WHERE token_hash = ?1",
        vec![token_hash.into()],
        nothing,
    )
}

/// Pauses (or resumes) acceptance of `kind`, or of every kind.
pub(crate) fn accepting_pause(kind: Option<&str>, paused: bool) -> Script<()> {
    let scope = kind.unwrap_or(ALL_KINDS).into();
    let sql = if paused {
        "INSERT INTO accept_pauses (scope) VALUES (?1) ON CONFLICT DO NOTHING"
    } else {
        "DELETE FROM accept_pauses WHERE scope = ?1"
    };
    Script::one(sql, vec![scope], nothing)
}

/// The pauses in force: `None` pauses every kind.
pub(crate) fn accepting_pauses() -> Script<Vec<Option<String>>> {
    Script::one("SELECT scope FROM accept_pauses ORDER BY scope", vec![], |d| {
        all(d, |r| {
            let scope = r.text(0)?;
            Ok((scope != ALL_KINDS).then_some(scope))
        })
    })
}
