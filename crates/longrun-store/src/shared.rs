//! Pure code both backends share: `codec`, how records are kept in columns
//! (the JSON forms of progress, artifacts, pieces and snapshots, the
//! webhook body, pages); `rules`, the decisions of the store (how work
//! ends, retries or pauses, what a heartbeat changes, which changes of
//! intent are allowed), with a claim's in `claims` and where pieces go in
//! `pieces`; `names`, the event and webhook types a use case records;
//! `script`, statements both stores run as written,
//! and the use cases written so (`admin`, `schedules`). None reads a
//! database or a clock; each driver runs a script with one runner.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::Duration;

use longrun_core::{Id, State, Timestamp};
use serde_json::{Value, json};

use crate::*;

mod admin;
mod claims;
mod codec;
mod columns;
mod lookups;
mod names;
mod pieces;
mod rules;
mod schedules;
mod script;
mod uploads;
mod webhooks;

pub(crate) use admin::*;
pub(crate) use claims::*;
pub(crate) use codec::*;
pub(crate) use columns::*;
pub(crate) use lookups::*;
pub(crate) use names::{EventType, WebhookType};
pub(crate) use pieces::*;
pub(crate) use rules::*;
pub(crate) use schedules::*;
pub(crate) use script::*;
pub(crate) use uploads::*;
pub(crate) use webhooks::*;
