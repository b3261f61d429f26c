//! The result resource, with its download links, and uploaded inputs.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The result resource: the default artifact's fields at the top (when the
/// result has one, as before named artifacts existed), and every named one
/// under `artifacts`, each with a download link.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ResultBody {
    /// The operation.
    pub operation_id: String,
    /// The default artifact (`result.artifact`).
    #[serde(flatten)]
    pub artifact: Option<ArtifactBody>,
    /// The named artifacts (`result.artifacts.{name}`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub artifacts: BTreeMap<String, ArtifactBody>,
}

/// One published artifact.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ArtifactBody {
    /// `res_…`
    pub id: String,
    /// As the worker uploaded it.
    pub content_type: String,
    /// Its size.
    pub size_bytes: i64,
    /// Lowercase hex SHA-256 of its bytes: check a download against it.
    pub sha256: String,
    /// When it was stored.
    pub created_at: String,
    /// When it is removed (`410 result_expired` after).
    pub expires_at: Option<String>,
    /// A link to its bytes.
    pub download: Download,
}

/// A short-lived, signed download link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Download {
    /// Relative to the server; needs no key.
    pub url: String,
    /// When the link stops working (ask for a new one).
    pub expires_at: String,
}

/// An upload, as clients see it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct UploadBody {
    /// `upl_…`
    pub id: String,
    /// Bytes received so far; the size once complete.
    pub size_bytes: i64,
    /// Whether every byte was received (`Upload-Complete: ?1`).
    pub complete: bool,
    /// Lowercase hex SHA-256 of the whole upload, once complete.
    pub sha256: Option<String>,
    /// As the creation's `Content-Type` said.
    pub content_type: String,
    /// When it was created.
    pub created_at: String,
    /// When the upload goes if no operation names it (one an operation names
    /// lives as long as the operation).
    pub expires_at: String,
}
