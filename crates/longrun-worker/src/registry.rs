//! The handlers a worker runs, by kind name.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::task::Handler;

/// The handlers this process can run, by kind name.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: BTreeMap<String, Arc<dyn Handler>>,
}

impl Registry {
    /// Adds `handler` under the kind its info names (replacing one of that name).
    pub fn register(&mut self, handler: Arc<dyn Handler>) {
        self.handlers.insert(handler.info().name, handler);
    }

    /// The handler of `kind`.
    pub fn get(&self, kind: &str) -> Option<&Arc<dyn Handler>> {
        self.handlers.get(kind)
    }

    /// The kinds registered.
    pub fn kinds(&self) -> Vec<String> {
        self.handlers.keys().cloned().collect()
    }

    /// Every handler, by kind name.
    pub fn handlers(&self) -> impl Iterator<Item = &Arc<dyn Handler>> {
        self.handlers.values()
    }
}
