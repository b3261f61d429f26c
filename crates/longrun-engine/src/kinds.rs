//! Built-in kinds and the registry that knows them.

pub mod export;
pub mod import;
pub mod sleep;

use std::collections::BTreeMap;
use std::sync::Arc;

use longrun_store::KindSpec;

use crate::worker::Handler;

/// The handlers this process can run, by kind name.
#[derive(Clone, Default)]
pub struct Registry {
    handlers: BTreeMap<String, Arc<dyn Handler>>,
}

impl Registry {
    /// Every built-in kind.
    pub fn builtin() -> Self {
        let mut registry = Self::default();
        registry.register(Arc::new(sleep::Sleep));
        registry.register(Arc::new(export::Export));
        registry.register(Arc::new(import::Import));
        registry
    }

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

    /// The declarations the server writes to the kinds table at start.
    pub fn specs(&self) -> Vec<KindSpec> {
        self.handlers
            .values()
            .map(|h| {
                let info = h.info();
                KindSpec {
                    name: info.name,
                    builtin: true,
                    rerun_safe: info.rerun_safe,
                    max_attempts: info.max_attempts,
                    default_deadline_seconds: None,
                    max_deadline_seconds: None,
                    pausable: info.pausable,
                }
            })
            .collect()
    }
}
