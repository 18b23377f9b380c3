//! A batch opened or cancelled in this process: its runner reads the open
//! batches again now, not at its next poll (`batches.poll_ms`): it claims a new
//! batch's lines at once, and drops a cancelled batch's queued lines before they
//! start. Other instances find either at their next look. Between `batch` (which
//! opens and cancels batches) and `runner` (which claims their lines), importing
//! neither.

use tokio::sync::Notify;

static CHANGED: Notify = Notify::const_new();

/// Tells this process's runner that a batch opened or was cancelled.
pub(super) fn batches_changed() {
    CHANGED.notify_one();
}

/// Until a batch opens or is cancelled here (at once if one did since the last
/// wait).
pub(super) async fn changed() {
    CHANGED.notified().await
}
