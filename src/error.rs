//! Server-side failures, kept apart from the client's `ApiError` until the edge:
//! the cause goes to the log, the client gets a stable code and nothing of the
//! cause. A provider's failure has its own type (`upstream::Failure`), turned into
//! the waterfall's answer (`all_routes_failed` and its kin) by the flow.

use sluice_filters::{ApiError, ErrorCode};

/// A failure of the service's own state stores.
#[derive(Debug, thiserror::Error)]
pub(crate) enum Error {
    /// A database query failed.
    #[error("database ({what}): {source}")]
    Db {
        what: &'static str,
        source: sqlx::Error,
    },
    /// The counters store (Redis, or the in-process counters) failed.
    #[error("counters ({what}): {source}")]
    Counters {
        what: &'static str,
        source: anyhow::Error,
    },
}

impl Error {
    /// A database failure while doing `what`.
    pub(crate) fn db(what: &'static str) -> impl Fn(sqlx::Error) -> Error {
        move |source| Error::Db { what, source }
    }

    /// A counters failure while doing `what`.
    pub(crate) fn counters(what: &'static str) -> impl Fn(anyhow::Error) -> Error {
        move |source| Error::Counters { what, source }
    }
}

impl From<Error> for ApiError {
    fn from(e: Error) -> ApiError {
        tracing::error!(error = %e, "server-side failure");
        match e {
            Error::Db { .. } => ApiError::internal(),
            // Limits and credits are the customer's money: without the store that
            // enforces them, the request is not sent, and a retry may find it back.
            Error::Counters { .. } => ApiError::new(
                ErrorCode::UnavailableRoute,
                "The limits store is unavailable; retry with backoff.",
            )
            .with_status(503),
        }
    }
}
