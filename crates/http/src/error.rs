//! One error type for the HTTP front, mapped to OpenAI-shaped error bodies
//! (`{"error": {"message", "type", "param", "code"}}`) and HTTP statuses in
//! one place.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use zinfer_protocol::ErrorCode;

/// Everything a request to the HTTP front can fail with.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// The body is not valid JSON or a field has the wrong type or value.
    #[error("{message}")]
    InvalidRequest {
        /// For a person; names the field.
        message: String,
        /// The offending field, when known.
        param: Option<String>,
    },
    /// A field OpenAI defines that zinfer does not implement (or a value of
    /// it other than the default).
    #[error("{message}")]
    Unsupported {
        /// For a person.
        message: String,
        /// The field.
        param: String,
    },
    /// A field neither OpenAI nor zinfer defines.
    #[error("unknown field {0:?}; see the zinfer README for the supported fields")]
    UnknownField(String),
    /// No worker serves the named model.
    #[error("the model {0:?} does not exist; GET /v1/models lists the models served")]
    ModelNotFound(String),
    /// No stored response has this id (never stored, expired, evicted or
    /// deleted).
    #[error(
        "no response {0:?} is stored: responses are kept in memory for an hour at most \
         (fewer when many are stored), and not across restarts"
    )]
    ResponseNotFound(String),
    /// No such path.
    #[error("no route for {0}; zinfer serves {routes}", routes = crate::server::ROUTES.join(", "))]
    NoRoute(String),
    /// `--api-key` is set and the request did not carry it.
    #[error("missing or incorrect API key; send it as \"Authorization: Bearer KEY\"")]
    Unauthorized,
    /// The router answered the request with an error.
    #[error("{message}")]
    Router {
        /// The protocol's error code.
        code: ErrorCode,
        /// The router's message.
        message: String,
    },
    /// Too many requests are waiting to be handed to the router.
    #[error("the HTTP front has too many requests in flight; retry with backoff")]
    Busy,
    /// The router did not answer in time (it may be down).
    #[error("no answer from the router within {0} s; is it running?")]
    RouterTimeout(u64),
    /// The connection to the router's I/O thread is gone (shutting down).
    #[error("the HTTP front is shutting down")]
    ShuttingDown,
    /// The body is longer than the front accepts.
    #[error("the request body exceeds the limit of {0} bytes")]
    BodyTooLarge(usize),
    /// The body could not be read (the client stopped sending it).
    #[error("the request body could not be read: {0}")]
    BodyUnreadable(String),
}

impl ApiError {
    /// A 400 for `param` with `message`.
    pub fn invalid(param: impl Into<String>, message: impl Into<String>) -> Self {
        ApiError::InvalidRequest {
            message: message.into(),
            param: Some(param.into()),
        }
    }

    /// A 400 for a field zinfer does not implement.
    pub fn unsupported(param: &str, message: impl Into<String>) -> Self {
        ApiError::Unsupported {
            message: message.into(),
            param: param.to_string(),
        }
    }

    /// The HTTP status of this error.
    pub fn status(&self) -> StatusCode {
        match self {
            ApiError::InvalidRequest { .. }
            | ApiError::Unsupported { .. }
            | ApiError::UnknownField(_)
            | ApiError::BodyUnreadable(_) => StatusCode::BAD_REQUEST,
            ApiError::BodyTooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ApiError::ModelNotFound(_) | ApiError::NoRoute(_) | ApiError::ResponseNotFound(_) => {
                StatusCode::NOT_FOUND
            }
            ApiError::Unauthorized => StatusCode::UNAUTHORIZED,
            ApiError::Router { code, .. } => match code {
                ErrorCode::BadRequest | ErrorCode::PromptTooLong => StatusCode::BAD_REQUEST,
                ErrorCode::UnknownModel => StatusCode::NOT_FOUND,
                ErrorCode::Overloaded => StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::WorkerLost => StatusCode::BAD_GATEWAY,
                ErrorCode::Deadline => StatusCode::GATEWAY_TIMEOUT,
                ErrorCode::Internal => StatusCode::INTERNAL_SERVER_ERROR,
            },
            ApiError::Busy => StatusCode::TOO_MANY_REQUESTS,
            ApiError::RouterTimeout(_) => StatusCode::GATEWAY_TIMEOUT,
            ApiError::ShuttingDown => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// OpenAI's `type`, `param` and `code` for this error.
    fn parts(&self) -> (&'static str, Option<&str>, Option<&'static str>) {
        match self {
            ApiError::InvalidRequest { param, .. } => {
                ("invalid_request_error", param.as_deref(), None)
            }
            ApiError::Unsupported { param, .. } => (
                "invalid_request_error",
                Some(param.as_str()),
                Some("unsupported_parameter"),
            ),
            ApiError::UnknownField(field) => (
                "invalid_request_error",
                Some(field.as_str()),
                Some("unknown_parameter"),
            ),
            ApiError::ModelNotFound(_) => (
                "invalid_request_error",
                Some("model"),
                Some("model_not_found"),
            ),
            ApiError::NoRoute(_) => ("invalid_request_error", None, Some("not_found")),
            ApiError::ResponseNotFound(_) => ("invalid_request_error", None, Some("not_found")),
            ApiError::BodyTooLarge(_) => ("invalid_request_error", None, Some("request_too_large")),
            ApiError::BodyUnreadable(_) => ("invalid_request_error", None, None),
            ApiError::Unauthorized => ("invalid_request_error", None, Some("invalid_api_key")),
            ApiError::Router { code, .. } => match code {
                ErrorCode::BadRequest => ("invalid_request_error", None, Some(code.as_str())),
                ErrorCode::UnknownModel => (
                    "invalid_request_error",
                    Some("model"),
                    Some("model_not_found"),
                ),
                ErrorCode::PromptTooLong => (
                    "invalid_request_error",
                    Some("messages"),
                    Some("context_length_exceeded"),
                ),
                ErrorCode::Overloaded => ("rate_limit_error", None, Some(code.as_str())),
                _ => ("server_error", None, Some(code.as_str())),
            },
            ApiError::Busy => ("rate_limit_error", None, Some("overloaded")),
            ApiError::RouterTimeout(_) => ("server_error", None, Some("router_timeout")),
            ApiError::ShuttingDown => ("server_error", None, Some("unavailable")),
        }
    }

    /// The OpenAI error body, `{"error": {...}}`; also sent as the last event
    /// of a stream that fails after it started.
    pub fn body(&self) -> Value {
        let (kind, param, code) = self.parts();
        json!({
            "error": {
                "message": self.to_string(),
                "type": kind,
                "param": param,
                "code": code,
            }
        })
    }

    /// The error the router's `error` reply stands for.
    pub fn from_router(code: ErrorCode, message: String, model: Option<&str>) -> Self {
        match (code, model) {
            (ErrorCode::UnknownModel, Some(model)) => ApiError::ModelNotFound(model.to_string()),
            _ => ApiError::Router { code, message },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status(), axum::Json(self.body())).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_have_the_openai_shape() {
        let body = ApiError::invalid("n", "n must be 1").body();
        assert_eq!(body["error"]["message"], "n must be 1");
        assert_eq!(body["error"]["type"], "invalid_request_error");
        assert_eq!(body["error"]["param"], "n");
        assert!(body["error"]["code"].is_null());
        let body = ApiError::ModelNotFound("gpt-9".into()).body();
        assert_eq!(body["error"]["code"], "model_not_found");
        assert_eq!(body["error"]["param"], "model");
    }

    #[test]
    fn router_codes_map_to_statuses() {
        let status = |code| ApiError::from_router(code, String::new(), None).status();
        assert_eq!(status(ErrorCode::BadRequest), StatusCode::BAD_REQUEST);
        assert_eq!(status(ErrorCode::UnknownModel), StatusCode::NOT_FOUND);
        assert_eq!(status(ErrorCode::Overloaded), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(
            status(ErrorCode::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(status(ErrorCode::PromptTooLong), StatusCode::BAD_REQUEST);
        assert_eq!(status(ErrorCode::WorkerLost), StatusCode::BAD_GATEWAY);
        assert_eq!(status(ErrorCode::Deadline), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(
            status(ErrorCode::Internal),
            StatusCode::INTERNAL_SERVER_ERROR
        );
        let named = ApiError::from_router(ErrorCode::UnknownModel, "x".into(), Some("m"));
        assert_eq!(named, ApiError::ModelNotFound("m".into()));
    }
}
