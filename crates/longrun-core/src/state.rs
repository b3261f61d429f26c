//! The public operation state machine and its legal-transition table.
//!
//! `queued → running → succeeded | failed | cancelled`, plus `queued →
//! cancelled` (cancelled before it started) and `queued → failed` (its deadline
//! passed before it started), and pausing: `queued | running → paused`,
//! `paused → queued` (resumed) and `paused → cancelled`. Terminal states are
//! final. Stores enforce this
//! table twice: in the `WHERE` clause of every update, and in the schema itself
//! (a trigger / check), so a bug in one query cannot apply an illegal change.

use std::fmt;
use std::str::FromStr;

/// An operation's state (docs/api.md §5); the transition table is [`State::can_become`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Waiting for a worker.
    Queued,
    /// Leased to a worker.
    Running,
    /// Ended with a result (terminal).
    Succeeded,
    /// Ended with an error (terminal).
    Failed,
    /// Ended by a cancel request (terminal).
    Cancelled,
    /// Held back from claims until resumed (non-terminal).
    Paused,
}

impl State {
    /// Every state.
    pub const ALL: [State; 6] = [
        State::Queued,
        State::Running,
        State::Succeeded,
        State::Failed,
        State::Cancelled,
        State::Paused,
    ];

    /// The state as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Queued => "queued",
            State::Running => "running",
            State::Succeeded => "succeeded",
            State::Failed => "failed",
            State::Cancelled => "cancelled",
            State::Paused => "paused",
        }
    }

    /// Whether no transition leaves it.
    pub fn is_terminal(self) -> bool {
        matches!(self, State::Succeeded | State::Failed | State::Cancelled)
    }

    /// The legal-transition table. A state never "transitions" to itself.
    pub fn can_become(self, to: State) -> bool {
        matches!(
            (self, to),
            (
                State::Queued,
                State::Running | State::Cancelled | State::Failed | State::Paused
            ) | (
                State::Running,
                State::Succeeded | State::Failed | State::Cancelled | State::Paused
            ) | (State::Paused, State::Queued | State::Cancelled)
        )
    }
}

impl fmt::Display for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A stored state this version does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown operation state {0:?}")]
pub struct UnknownState(pub String);

impl FromStr for State {
    type Err = UnknownState;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        State::ALL
            .into_iter()
            .find(|state| state.as_str() == s)
            .ok_or_else(|| UnknownState(s.to_owned()))
    }
}

/// A checked transition: constructing one proves it is in the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Transition {
    /// The state before.
    pub from: State,
    /// The state after.
    pub to: State,
}

/// A transition outside the table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("illegal transition {from} → {to}")]
pub struct IllegalTransition {
    /// The state before.
    pub from: State,
    /// The state asked for.
    pub to: State,
}

impl Transition {
    /// The transition `from` → `to`, if the table has it.
    pub fn new(from: State, to: State) -> Result<Self, IllegalTransition> {
        if from.can_become(to) {
            Ok(Self { from, to })
        } else {
            Err(IllegalTransition { from, to })
        }
    }
}

/// Every legal `(from, to)` pair, for stores that render the table into SQL
/// and for tests that compare the schema against it.
pub fn legal_transitions() -> impl Iterator<Item = Transition> {
    State::ALL.into_iter().flat_map(|from| {
        State::ALL
            .into_iter()
            .filter(move |&to| from.can_become(to))
            .map(move |to| Transition { from, to })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminal_states_are_final() {
        for from in State::ALL.into_iter().filter(|s| s.is_terminal()) {
            for to in State::ALL {
                assert!(!from.can_become(to), "{from} must not become {to}");
            }
        }
    }

    #[test]
    fn table_has_exactly_the_documented_edges() {
        let edges: Vec<(State, State)> = legal_transitions().map(|t| (t.from, t.to)).collect();
        assert_eq!(
            edges,
            vec![
                (State::Queued, State::Running),
                (State::Queued, State::Failed),
                (State::Queued, State::Cancelled),
                (State::Queued, State::Paused),
                (State::Running, State::Succeeded),
                (State::Running, State::Failed),
                (State::Running, State::Cancelled),
                (State::Running, State::Paused),
                (State::Paused, State::Queued),
                (State::Paused, State::Cancelled),
            ]
        );
    }

    #[test]
    fn names_round_trip() {
        for s in State::ALL {
            assert_eq!(s.as_str().parse::<State>().unwrap(), s);
        }
        assert!("done".parse::<State>().is_err());
    }
}
