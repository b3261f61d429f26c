//! Change notifications: what a commit announces (NOTIFY on one channel,
//! several changes to a payload) and the listener that turns other nodes'
//! announcements into this node's change feed and read-cache evictions.

use super::*;

pub(super) async fn listen(pool: &PgPool) -> std::result::Result<sqlx::postgres::PgListener, sqlx::Error> {
    let mut listener = sqlx::postgres::PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}

/// Publishes every notification on `feed`, each after the read cache forgot
/// what it changed. Notifications sent while the listening connection was
/// down are gone: meanwhile the read cache serves nothing, and once the
/// listener is back a resync tells subscribers to re-read what they watch
/// (a missed notification delays a waiter by one reconnect, not until its
/// wait ends).
pub(super) async fn follow_notifications(
    pool: PgPool,
    mut listener: sqlx::postgres::PgListener,
    feed: broadcast::Sender<Change>,
    reads: Arc<ReadCache>,
) {
    loop {
        let lost = match listener.try_recv().await {
            Ok(Some(notification)) => {
                let Ok(mut items) = serde_json::from_str::<Vec<WireItem>>(notification.payload()) else {
                    continue;
                };
                // Forgotten, all of them, before anyone hears of one.
                let touched: Vec<String> = items
                    .iter_mut()
                    .filter_map(|item| item.touched.take().map(std::borrow::Cow::into_owned))
                    .collect();
                let changes: Vec<Change> = items.into_iter().filter_map(WireItem::into_change).collect();
                reads.evict(
                    touched
                        .iter()
                        .map(String::as_str)
                        .chain(changes.iter().map(|c| c.operation_id.as_str())),
                );
                for change in changes {
                    let _ = feed.send(change);
                }
                continue;
            }
            Ok(None) => "the change listener lost its connection; reconnecting".to_owned(),
            Err(_) if pool.is_closed() => return,
            Err(e) => format!("the change listener failed ({e}); reconnecting"),
        };
        reads.suspend();
        tracing::warn!("{lost}");
        // A new listener, rather than sqlx's reconnect inside `try_recv`:
        // the cache may serve again only once it is known to listen.
        drop(listener);
        loop {
            if pool.is_closed() {
                return;
            }
            match listen(&pool).await {
                Ok(fresh) => {
                    listener = fresh;
                    break;
                }
                Err(e) => tracing::warn!(error = %e, "the change listener cannot reconnect yet"),
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        reads.resume();
        let _ = feed.send(Change::resync());
    }
}

/// Queues `changes` for every listener; they are delivered if and when the
/// transaction commits. Sent [`CHANGES_PER_PAYLOAD`] to a payload, all in one
/// statement (a claim of 64 tasks had paid a round trip per payload), in
/// order: `unnest` yields the array's items in order and each row's
/// `pg_notify` runs as it is read.
pub(super) async fn announce(c: &mut PgConnection, changes: &mut Changes) -> Result<()> {
    let payloads = changes.unannounced_payloads();
    if payloads.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT pg_notify($1, payload) FROM unnest($2::TEXT[]) AS p(payload)")
        .bind(CHANNEL)
        .bind(payloads)
        .execute(&mut *c)
        .await
        .map_err(db)?;
    Ok(())
}

/// One item of a NOTIFY payload (a JSON array of them): a change, or an
/// operation to forget (`touched`). Written and read through this struct,
/// never a `serde_json::Value` (building and walking those was 5 % of the
/// server's time in an in-process drain). Absent and `null` fields read the
/// same, so nodes of neighbouring versions understand each other.
#[derive(serde::Serialize, serde::Deserialize, Default)]
pub(super) struct WireItem<'a> {
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub(super) touched: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub(super) id: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub(super) t: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) v: Option<i64>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub(super) e: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub(super) k: Option<std::borrow::Cow<'a, str>>,
    #[serde(borrow, default, skip_serializing_if = "Option::is_none")]
    pub(super) s: Option<std::borrow::Cow<'a, str>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) a: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) c: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) st: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) co: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) cr: Option<i64>,
    /// Sent only when true (an operation with a callback): a node of the
    /// version before reads none, and its deliverer finds the webhook at
    /// its next interval instead of at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) w: Option<bool>,
}

impl<'a> WireItem<'a> {
    pub(super) fn touched(id: &'a str) -> Self {
        Self {
            touched: Some(id.into()),
            ..Self::default()
        }
    }

    pub(super) fn change(c: &'a Change) -> Self {
        Self {
            touched: None,
            id: Some(c.operation_id.as_str().into()),
            t: Some(c.tenant.as_str().into()),
            v: Some(c.version),
            e: Some(c.event_type.as_str().into()),
            k: Some(c.kind.as_str().into()),
            s: Some(c.state.as_str().into()),
            a: Some(c.attempt),
            c: Some(c.created_at.0),
            st: c.started_at.map(|t| t.0),
            co: c.completed_at.map(|t| t.0),
            cr: c.cancel_requested_at.map(|t| t.0),
            w: c.callback.then_some(true),
        }
    }

    /// The change this item announces, if it is one.
    pub(super) fn into_change(self) -> Option<Change> {
        Some(Change {
            operation_id: Id::from_trusted(self.id?.into_owned()),
            tenant: self.t?.into_owned(),
            version: self.v?,
            event_type: self.e?.into_owned(),
            kind: self.k?.into_owned(),
            state: self.s?.parse().ok()?,
            attempt: self.a?,
            created_at: Timestamp(self.c?),
            started_at: self.st.map(Timestamp),
            completed_at: self.co.map(Timestamp),
            cancel_requested_at: self.cr.map(Timestamp),
            callback: self.w.unwrap_or(false),
        })
    }
}

/// `items` as one JSON text.
pub(super) fn wire_text<'a>(items: impl IntoIterator<Item = &'a WireItem<'a>>) -> String {
    let mut text = String::from("[");
    for (i, item) in items.into_iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&serde_json::to_string(item).expect("notification items serialize"));
    }
    text.push(']');
    text
}

pub(super) fn change_of(op: &Operation, event_type: EventType) -> Change {
    Change::of(op, event_type.as_str())
}
