//! Keys, kinds, tenants, server secrets, console sessions and acceptance
//! pauses: small tables an operator changes.

use super::*;

pub(super) fn api_key_create(c: &Connection, p: &ApiKeyCreateParams) -> Result<()> {
    c.prepare_cached("INSERT INTO tenants (name, created_at) VALUES (?1, ?2) ON CONFLICT DO NOTHING")?
        .execute(params![p.tenant, p.now.0])?;
    c.prepare_cached("INSERT INTO api_keys (id, tenant, role, secret_hash, created_at) VALUES (?1, ?2, ?3, ?4, ?5)")?
        .execute(params![
            p.id.as_str(),
            p.tenant,
            p.role.as_str(),
            &p.secret_hash[..],
            p.now.0
        ])?;
    Ok(())
}

pub(super) fn api_key_get(c: &Connection, id: &Id) -> Result<Option<ApiKeyRecord>> {
    Ok(
        c.prepare_cached("SELECT id, tenant, role, secret_hash, created_at, revoked_at FROM api_keys WHERE id = ?1")?
            .query_row(params![id.as_str()], api_key_from_row)
            .optional()?,
    )
}

pub(super) fn api_key_list(c: &Connection) -> Result<Vec<ApiKeyRecord>> {
    Ok(c.prepare_cached(
        "SELECT id, tenant, role, secret_hash, created_at, revoked_at FROM api_keys ORDER BY created_at, id",
    )?
    .query_map([], api_key_from_row)?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn api_key_revoke(c: &Connection, id: &Id, now: Timestamp) -> Result<bool> {
    let n = c
        .prepare_cached("UPDATE api_keys SET revoked_at = ?2 WHERE id = ?1 AND revoked_at IS NULL")?
        .execute(params![id.as_str(), now.0])?;
    Ok(n == 1)
}

pub(super) fn api_key_count(c: &Connection) -> Result<u64> {
    let n: i64 = c.query_row("SELECT COUNT(*) FROM api_keys", [], |r| r.get(0))?;
    Ok(u64::try_from(n).unwrap_or(0))
}

pub(super) fn kind_upsert(c: &Connection, k: &KindSpec) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO kinds (name, builtin, rerun_safe, max_attempts, default_deadline_seconds, max_deadline_seconds,
                            pausable)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)
         ON CONFLICT (name) DO UPDATE SET builtin = excluded.builtin, rerun_safe = excluded.rerun_safe,
             max_attempts = excluded.max_attempts, default_deadline_seconds = excluded.default_deadline_seconds,
             max_deadline_seconds = excluded.max_deadline_seconds, pausable = excluded.pausable",
    )?
    .execute(params![
        k.name,
        k.builtin,
        k.rerun_safe,
        k.max_attempts,
        k.default_deadline_seconds,
        k.max_deadline_seconds,
        k.pausable
    ])?;
    Ok(())
}

pub(super) fn kind_get(c: &Connection, name: &str) -> Result<Option<KindSpec>> {
    let sql = format!("SELECT {KIND_COLUMNS} FROM kinds WHERE name = ?1");
    Ok(c.prepare_cached(&sql)?
        .query_row(params![name], kind_from_row)
        .optional()?)
}

pub(super) fn kind_list(c: &Connection) -> Result<Vec<KindSpec>> {
    let sql = format!("SELECT {KIND_COLUMNS} FROM kinds ORDER BY name");
    Ok(c.prepare_cached(&sql)?
        .query_map([], kind_from_row)?
        .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn server_secret(c: &Connection, name: &str, candidate: &[u8], now: Timestamp) -> Result<Vec<u8>> {
    c.prepare_cached(
        "INSERT INTO server_secrets (name, value, created_at) VALUES (?1, ?2, ?3) ON CONFLICT DO NOTHING",
    )?
    .execute(params![name, candidate, now.0])?;
    Ok(c.prepare_cached("SELECT value FROM server_secrets WHERE name = ?1")?
        .query_row(params![name], |r| r.get(0))?)
}

pub(super) fn tenant_set(c: &Connection, t: &TenantLimits) -> Result<()> {
    c.prepare_cached(
        "INSERT INTO tenants (name, created_at, max_active, max_running, rate)
         VALUES (?1, CAST(unixepoch('subsec') * 1000 AS INTEGER), ?2, ?3, ?4)
         ON CONFLICT (name) DO UPDATE SET max_active = excluded.max_active, max_running = excluded.max_running,
             rate = excluded.rate",
    )?
    .execute(params![t.name, t.max_active, t.max_running, t.rate])?;
    Ok(())
}

pub(super) fn tenant_get(c: &Connection, name: &str) -> Result<Option<TenantLimits>> {
    Ok(
        c.prepare_cached("SELECT name, max_active, max_running, rate FROM tenants WHERE name = ?1")?
            .query_row(params![name], |r| {
                Ok(TenantLimits {
                    name: r.get(0)?,
                    max_active: r.get(1)?,
                    max_running: r.get(2)?,
                    rate: r.get(3)?,
                })
            })
            .optional()?,
    )
}

pub(super) fn server_secret_list(c: &Connection, prefix: &str) -> Result<Vec<(String, Vec<u8>)>> {
    Ok(c.prepare_cached(
        "SELECT name, value FROM server_secrets WHERE substr(name, 1, length(?1)) = ?1 ORDER BY created_at, name",
    )?
    .query_map(params![prefix], |r| Ok((r.get(0)?, r.get(1)?)))?
    .collect::<rusqlite::Result<_>>()?)
}

pub(super) fn console_session_start(c: &Connection, s: &ConsoleSession) -> Result<()> {
    c.prepare_cached("DELETE FROM console_sessions WHERE expires_at <= ?1")?
        .execute(params![s.created_at.0])?;
    c.prepare_cached(
        "INSERT INTO console_sessions (token_hash, key_id, created_at, expires_at) VALUES (?1, ?2, ?3, ?4)",
    )?
    .execute(params![s.token_hash, s.key_id.as_str(), s.created_at.0, s.expires_at.0])?;
    Ok(())
}

pub(super) fn console_session_key(c: &Connection, token_hash: &[u8], now: Timestamp) -> Result<Option<Id>> {
    Ok(
        c.prepare_cached("SELECT key_id FROM console_sessions WHERE token_hash = ?1 AND expires_at > ?2")?
            .query_row(params![token_hash, now.0], |r| r.get::<_, String>(0))
            .optional()?
            .map(Id::from_trusted),
    )
}

pub(super) fn console_session_end(c: &Connection, token_hash: &[u8]) -> Result<()> {
    c.prepare_cached("DELETE FROM console_sessions WHERE token_hash = ?1")?
        .execute(params![token_hash])?;
    Ok(())
}

pub(super) fn accepting_pause(c: &Connection, kind: Option<&str>, paused: bool) -> Result<()> {
    let scope = kind.unwrap_or(ALL_KINDS);
    if paused {
        c.prepare_cached("INSERT OR IGNORE INTO accept_pauses (scope) VALUES (?1)")?
            .execute(params![scope])?;
    } else {
        c.prepare_cached("DELETE FROM accept_pauses WHERE scope = ?1")?
            .execute(params![scope])?;
    }
    Ok(())
}

pub(super) fn accepting_pauses(c: &Connection) -> Result<Vec<Option<String>>> {
    Ok(c.prepare_cached("SELECT scope FROM accept_pauses ORDER BY scope")?
        .query_map([], |r| {
            let scope: String = r.get(0)?;
            Ok((scope != ALL_KINDS).then_some(scope))
        })?
        .collect::<rusqlite::Result<_>>()?)
}
