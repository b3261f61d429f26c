//! Where pieces go, decided once for every backend: an upload's next
//! piece and who may append it, an upload completed into one object, and a
//! resumable artifact's piece.

use super::*;

/// An upload with a piece appended (see [`UploadAppendParams`]), or the
/// refusal: another offset than the current one, or a complete upload.
pub(crate) fn upload_appended(current: &UploadRecord, p: &UploadAppendParams) -> Result<UploadRecord> {
    if current.complete || p.offset != current.offset {
        return Err(StoreError::UploadOffsetMismatch {
            offset: current.offset,
            complete: current.complete,
        });
    }
    let mut next = current.clone();
    if p.chunk.size_bytes > 0 || p.sha256.is_some() {
        next.chunks.push(p.chunk.clone());
    }
    next.offset += p.chunk.size_bytes;
    next.expected_sha256 = current.expected_sha256.clone().or_else(|| p.expected_sha256.clone());
    if let Some(sha256) = &p.sha256 {
        if current.offset != 0 {
            return Err(StoreError::Corrupt(
                "only a whole upload completes with its append".into(),
            ));
        }
        next.complete = true;
        next.sha256 = Some(sha256.clone());
    }
    Ok(next)
}

/// An upload completed into one object, with the storage keys of the pieces
/// that became garbage; refused if it moved on or is complete already.
pub(crate) fn upload_completed(
    current: &UploadRecord,
    p: &UploadCompleteParams,
) -> Result<(UploadRecord, Vec<String>)> {
    if current.complete || p.size_bytes != current.offset || p.object.size_bytes != current.offset {
        return Err(StoreError::UploadOffsetMismatch {
            offset: current.offset,
            complete: current.complete,
        });
    }
    let garbage = current
        .chunks
        .iter()
        .map(|c| c.storage_key.clone())
        .filter(|key| *key != p.object.storage_key)
        .collect();
    let completed = UploadRecord {
        complete: true,
        sha256: Some(p.sha256.clone()),
        chunks: vec![p.object.clone()],
        ..current.clone()
    };
    Ok((completed, garbage))
}

/// Who holds the right to append to an upload, as its row says.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(crate) struct UploadLease {
    pub token: Option<String>,
    pub until: Option<Timestamp>,
}

impl UploadLease {
    /// When the right ends, if someone holds it at `now`.
    pub(crate) fn live_until(&self, now: Timestamp) -> Option<Timestamp> {
        self.token.as_ref().and(self.until).filter(|until| *until > now)
    }
}

/// Whether `token` may take (or renew) the right to append at `now`: yes
/// when nobody holds it, the holder's right has lapsed, or `token` is the
/// holder's; else `Err` with when the holder's right ends.
pub(crate) fn append_lease_free(current: &UploadLease, token: &str, now: Timestamp) -> Result<(), Timestamp> {
    match current.live_until(now) {
        Some(until) if current.token.as_deref() != Some(token) => Err(until),
        _ => Ok(()),
    }
}

/// Where a new piece of a resumable artifact may go: `pieces` (in offset
/// order) before `offset` must end exactly there. Returns how many of them
/// stay (those at or past `offset` are replaced).
pub(crate) fn piece_placement(pieces: &[(i64, UploadChunk)], offset: i64) -> Result<usize> {
    let kept = pieces.iter().take_while(|(at, _)| *at < offset).count();
    let end = pieces[..kept].last().map_or(0, |(at, p)| at + p.size_bytes);
    if end != offset {
        // Refused with where the pieces (contiguous from 0) end.
        let mut contiguous = 0;
        for (at, p) in pieces {
            if *at != contiguous {
                break;
            }
            contiguous += p.size_bytes;
        }
        return Err(StoreError::UploadOffsetMismatch {
            offset: contiguous,
            complete: false,
        });
    }
    Ok(kept)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_land_on_a_boundary_and_replace_what_follows() {
        let piece = |size| chunk_of(size);
        let pieces = vec![(0, piece(10)), (10, piece(5)), (15, piece(7))];
        assert_eq!(piece_placement(&pieces, 22).unwrap(), 3, "appends");
        assert_eq!(piece_placement(&pieces, 15).unwrap(), 2, "resumes, replacing the last");
        assert_eq!(piece_placement(&pieces, 0).unwrap(), 0, "starts over");
        assert!(matches!(
            piece_placement(&pieces, 12),
            Err(StoreError::UploadOffsetMismatch { offset: 22, .. })
        ));
        assert!(matches!(
            piece_placement(&pieces, 30),
            Err(StoreError::UploadOffsetMismatch { offset: 22, .. })
        ));
        assert!(matches!(
            piece_placement(&[], 5),
            Err(StoreError::UploadOffsetMismatch { offset: 0, .. })
        ));
    }

    fn chunk_of(size: i64) -> UploadChunk {
        UploadChunk {
            storage_key: format!("k{size}"),
            size_bytes: size,
        }
    }
}
