//! Path to route kind. `/v1` is canonical; the spec's unprefixed twins map to their
//! `/v1` route; `/api/v1/embeddings` is the embeddings route, not management; every
//! other `/v1` path, and every other unprefixed path, is not found.

/// What a request path asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// `GET /v1/models`.
    Models,
    /// `GET /v1/models/{id}`: the path's remainder is the id.
    Model,
    Chat,
    Responses,
    /// `/v1/responses/{id}`: one stored response (DELETE).
    StoredResponse,
    Messages,
    /// `POST /v1/messages/count_tokens`: answered 404 `not_found_error` by contract.
    MessagesCountTokens,
    Embeddings,
    Batches,
    Files,
    /// `/api/*` other than `/api/v1/embeddings`.
    Management,
    NotFound,
}

impl Route {
    /// A bounded label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Route::Models => "models",
            Route::Model => "model",
            Route::Chat => "chat",
            Route::Responses => "responses",
            Route::StoredResponse => "stored_response",
            Route::Messages => "messages",
            Route::MessagesCountTokens => "messages_count_tokens",
            Route::Embeddings => "embeddings",
            Route::Batches => "batches",
            Route::Files => "files",
            Route::Management => "management",
            Route::NotFound => "not_found",
        }
    }

    pub const ALL: [Route; 12] = [
        Route::Models,
        Route::Model,
        Route::Chat,
        Route::Responses,
        Route::StoredResponse,
        Route::Messages,
        Route::MessagesCountTokens,
        Route::Embeddings,
        Route::Batches,
        Route::Files,
        Route::Management,
        Route::NotFound,
    ];

    /// Whether the route's errors use the messages envelope.
    pub fn is_messages(self) -> bool {
        matches!(self, Route::Messages | Route::MessagesCountTokens)
    }

    /// Inference routes read a JSON body naming a model.
    pub fn is_inference(self) -> bool {
        matches!(
            self,
            Route::Chat | Route::Responses | Route::Messages | Route::Embeddings
        )
    }
}

/// Classifies a path (without its query string).
pub fn route(path: &str) -> Route {
    // A trailing slash is tolerated the way most clients and proxies expect.
    let path = match path.strip_suffix('/') {
        Some(p) if !p.is_empty() => p,
        _ => path,
    };
    if path == "/api/v1/embeddings" {
        return Route::Embeddings;
    }
    if path == "/api" || path.starts_with("/api/") {
        return Route::Management;
    }
    let (rest, prefixed) = match path.strip_prefix("/v1") {
        Some(rest) if rest.is_empty() || rest.starts_with('/') => (rest, true),
        _ => (path, false),
    };
    match rest {
        "/models" => Route::Models,
        "/chat/completions" => Route::Chat,
        "/responses" => Route::Responses,
        "/messages" => Route::Messages,
        "/embeddings" => Route::Embeddings,
        "/batches" => Route::Batches,
        "/files" => Route::Files,
        "/messages/count_tokens" if prefixed => Route::MessagesCountTokens,
        r if prefixed && r.starts_with("/models/") && r.len() > "/models/".len() => Route::Model,
        r if prefixed
            && r.strip_prefix("/responses/")
                .is_some_and(|id| !id.is_empty() && !id.contains('/')) =>
        {
            Route::StoredResponse
        }
        r if r.starts_with("/batches/") => Route::Batches,
        r if r.starts_with("/files/") => Route::Files,
        _ => Route::NotFound,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_and_twins() {
        for (p, r) in [
            ("/v1/models", Route::Models),
            ("/models", Route::Models),
            ("/v1/chat/completions", Route::Chat),
            ("/chat/completions", Route::Chat),
            ("/v1/responses", Route::Responses),
            ("/responses", Route::Responses),
            ("/v1/messages", Route::Messages),
            ("/messages", Route::Messages),
            ("/v1/embeddings", Route::Embeddings),
            ("/embeddings", Route::Embeddings),
            ("/api/v1/embeddings", Route::Embeddings),
            ("/v1/batches", Route::Batches),
            ("/batches", Route::Batches),
            ("/v1/files", Route::Files),
            ("/files", Route::Files),
            ("/v1/models/gpt-4.1-mini", Route::Model),
            ("/v1/responses/resp_1", Route::StoredResponse),
            ("/responses/resp_1", Route::NotFound),
            ("/v1/responses/resp_1/input_items", Route::NotFound),
            ("/v1/messages/count_tokens", Route::MessagesCountTokens),
            ("/api/models", Route::Management),
            ("/api/models/gpt-4.1/waterfall", Route::Management),
            ("/v1/chat/completions/", Route::Chat),
        ] {
            assert_eq!(route(p), r, "{p}");
        }
    }

    #[test]
    fn unknown_paths_are_not_found() {
        for p in [
            "/",
            "/v1",
            "/v1/",
            "/v1/completions",
            "/v1/nope",
            "/completions",
            "/health",
            "/v2/chat/completions",
            "/v1chat/completions",
            "/models/gpt-4.1",
            "/messages/count_tokens",
            "/apis",
        ] {
            assert_eq!(route(p), Route::NotFound, "{p}");
        }
    }
}
