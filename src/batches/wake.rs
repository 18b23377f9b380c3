//! A batch opened in this process: its runner claims now, not at its next poll
//! (`batches.poll_ms`). Other instances find it at theirs. Between `batch` (which
//! opens batches) and `runner` (which claims their lines), importing neither.

use tokio::sync::Notify;

static OPENED: Notify = Notify::const_new();

/// Tells this process's runner that a batch opened.
pub(super) fn batch_opened() {
    OPENED.notify_one();
}

/// Until a batch opens here (at once if one opened since the last wait).
pub(super) async fn opened() {
    OPENED.notified().await
}
