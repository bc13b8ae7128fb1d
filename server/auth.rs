//! API keys: with any set, every endpoint but `/health` and `/` (the chat
//! page, which asks for the key itself) answers 401 unless the request
//! carries `Authorization: Bearer KEY` with one of them.

use super::api::ApiError;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, WWW_AUTHENTICATE};
use axum::http::{HeaderValue, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;

/// The keys a client may present (none: the server is open to all).
#[derive(Clone, Default)]
pub struct ApiKeys {
    keys: Vec<Box<[u8]>>,
}

impl ApiKeys {
    pub fn new(keys: impl IntoIterator<Item = String>) -> Self {
        ApiKeys {
            keys: keys
                .into_iter()
                .map(|k| k.into_bytes().into_boxed_slice())
                .collect(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether `presented` is one of the keys. Every key is compared, each
    /// in time independent of where the bytes differ, so the answer's
    /// timing tells nothing of a key's bytes (only, as usual, its length).
    fn accepts(&self, presented: &[u8]) -> bool {
        self.keys
            .iter()
            .fold(false, |ok, k| ok | same_bytes(k, presented))
    }
}

/// `a == b` without an early exit at the first differing byte.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y));
    // black_box keeps the optimizer from turning the fold into a search.
    std::hint::black_box(diff) == 0
}

/// The token of `Authorization: Bearer TOKEN` (the scheme in any case, as
/// RFC 7235 has it).
fn bearer(req: &Request) -> Option<&[u8]> {
    let value = req.headers().get(AUTHORIZATION)?.as_bytes();
    let (scheme, token) = value.split_at_checked(7)?;
    scheme
        .eq_ignore_ascii_case(b"bearer ")
        .then(|| token.trim_ascii())
}

/// Middleware: passes the request on with a valid key, else 401 with the
/// challenge RFC 6750 asks for.
pub async fn require_key(State(keys): State<Arc<ApiKeys>>, req: Request, next: Next) -> Response {
    let (message, challenge) = match bearer(&req) {
        Some(token) if keys.accepts(token) => return next.run(req).await,
        Some(_) => (
            "the API key is not valid",
            r#"Bearer error="invalid_token""#,
        ),
        None => (
            "an API key is required: send the header Authorization: Bearer KEY",
            "Bearer",
        ),
    };
    let mut resp = ApiError {
        status: StatusCode::UNAUTHORIZED,
        code: Some("invalid_api_key"),
        ..ApiError::invalid(message, None)
    }
    .into_response();
    resp.headers_mut()
        .insert(WWW_AUTHENTICATE, HeaderValue::from_static(challenge));
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_listed_key_of_the_same_bytes_is_accepted() {
        let keys = ApiKeys::new(["alpha".to_string(), "beta-key".to_string()]);
        assert!(keys.accepts(b"alpha"));
        assert!(keys.accepts(b"beta-key"));
        for bad in [
            &b""[..],
            b"alph",
            b"alphb",
            b"alpha ",
            b"beta-kez",
            b"ALPHA",
        ] {
            assert!(!keys.accepts(bad), "{bad:?}");
        }
        assert!(!ApiKeys::default().accepts(b""));
    }
}
