//! Built-in kinds and the registry that knows them.

pub mod export;
pub mod import;
pub mod sleep;

use std::sync::Arc;

use longrun_store::KindSpec;

use longrun_worker::Registry;

/// Every built-in kind.
pub fn builtin() -> Registry {
    let mut registry = Registry::default();
    registry.register(Arc::new(sleep::Sleep));
    registry.register(Arc::new(export::Export));
    registry.register(Arc::new(import::Import));
    registry
}

/// The declarations the server writes to the kinds table at start.
pub fn specs(registry: &Registry) -> Vec<KindSpec> {
    registry
        .handlers()
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
