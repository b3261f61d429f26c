//! Pure code both backends share, in two rooms: `codec`, how records are
//! kept in columns (the JSON forms of progress, artifacts, pieces and
//! snapshots, the webhook body, pages), and `rules`, the decisions of the
//! store (how work ends, retries or pauses, what a heartbeat changes, which
//! changes of intent are allowed). Neither reads a database or a clock.

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::time::Duration;

use longrun_core::{Id, State, Timestamp};
use serde_json::{Value, json};

use crate::*;

mod codec;
mod rules;
mod schedules;

pub(crate) use codec::*;
pub(crate) use rules::*;
pub(crate) use schedules::*;
