//! The `/ui` page, served by the binary itself: its three files (`ui/index.html`, `ui/app.js`,
//! `ui/style.css` in the repository, embedded at build time: no Node, no build step), the
//! sign-in and sign-out of a browser on another machine, and (`feed.rs`) its live feeds.
//!
//! The page follows the admin rule ([`admin::admit`]): let in, it is served (200); otherwise it
//! is served as a sign-in form (401: an admin key is set and none came) or as the reason it is
//! not shown (403: another machine, and no admin key to sign in with). The script and style are
//! public: they hold no data. Every data call the page makes is an admin call.
//!
//! The page is locked into its own origin: a `Content-Security-Policy` that loads nothing from
//! elsewhere and may not be framed (`frame-ancestors 'none'`: no click-jacking of its buttons).

pub mod feed;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use subtle::ConstantTimeEq;

use super::AppState;
use super::admin;
use crate::auth::browser::{self, AdminBy};
use crate::auth::session;
use crate::config::KeyHash;
use crate::error::{GatewayError, KeyProblem};

const INDEX: &str = include_str!("../../ui/index.html");
const SCRIPT: &str = include_str!("../../ui/app.js");
const STYLE: &str = include_str!("../../ui/style.css");

/// The page's security headers: nothing loaded from elsewhere, never framed, no referrer.
const POLICY: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
                      connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

/// GET `/ui`: the page, the sign-in form, or why neither (see the module's header).
pub async fn page(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    let (status, auth) = match admin::admit(&state, request.headers(), peer) {
        Ok(_) => (StatusCode::OK, "ok"),
        Err(GatewayError::InvalidApiKey(_)) => (StatusCode::UNAUTHORIZED, "login"),
        Err(GatewayError::AdminForbidden) => (StatusCode::FORBIDDEN, "forbidden"),
        // Cross-site or a foreign Host: no page at all.
        Err(e) => return e.into_response(),
    };
    let mut response = (status, INDEX.replace("{{AUTH}}", auth)).into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/html; charset=utf-8"));
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    locked(headers);
    response
}

/// GET `/ui/app.js`.
pub async fn script() -> Response {
    asset(SCRIPT, "text/javascript; charset=utf-8")
}

/// GET `/ui/style.css`.
pub async fn style() -> Response {
    asset(STYLE, "text/css; charset=utf-8")
}

fn asset(body: &'static str, content_type: &'static str) -> Response {
    let mut response = body.into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Revalidated each time: a new binary serves a new page.
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    locked(headers);
    response
}

fn locked(headers: &mut HeaderMap) {
    headers.insert(header::CONTENT_SECURITY_POLICY, HeaderValue::from_static(POLICY));
    headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    headers.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
}

/// The body of `/ui/login`.
#[derive(serde::Deserialize)]
struct SignIn {
    key: String,
}

/// POST `/ui/login` `{"key": "…"}`: the admin key → a session cookie (204). A wrong key is
/// 401 (and counted: at most ten a minute are tried from one address, then 429); with no admin
/// key set there is nothing to sign in with (403). A cross-site sign-in, or one through a name
/// that is not the gateway's, is refused before anything is counted.
pub async fn sign_in(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let peer = request.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0.ip());
    let (parts, body) = request.into_parts();
    // A key is a few dozen bytes: a body beyond 4 KiB is not a sign-in.
    let body = match axum::body::to_bytes(body, 4096).await {
        Ok(body) => body,
        Err(_) => {
            return GatewayError::invalid("the body must be JSON: {\"key\": \"<the admin key>\"}", Some("key"))
                .into_response();
        }
    };
    match open_session(&state, &parts.headers, peer, &body) {
        Ok(token) => {
            let mut response = StatusCode::NO_CONTENT.into_response();
            response.headers_mut().insert(header::SET_COOKIE, session::set_cookie(&token));
            response.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
            response
        }
        Err(e) => e.into_response(),
    }
}

fn open_session(
    state: &AppState,
    headers: &HeaderMap,
    peer: Option<IpAddr>,
    body: &[u8],
) -> Result<String, GatewayError> {
    // What it opens is a browser's session: the browser rules as for one (no cross-site
    // request, no foreign Host: a rebound page may not even guess), before anything is counted.
    browser::check(headers, AdminBy::Session, &state.hosts)?;
    let admin_key = state.access().admin_key.ok_or(GatewayError::AdminForbidden)?;
    if !state.sessions.may_try(peer) {
        return Err(GatewayError::TooManySignIns);
    }
    let SignIn { key } = serde_json::from_slice(body)
        .map_err(|_| GatewayError::invalid("the body must be JSON: {\"key\": \"<the admin key>\"}", Some("key")))?;
    if !bool::from(admin_key.ct_eq(&KeyHash::of_key(key.trim().as_bytes()))) {
        state.sessions.failed(peer);
        if let Some(suppressed) = state.log_throttle.allow("ui sign-in refused") {
            tracing::warn!(suppressed, "a /ui sign-in with a wrong admin key was refused");
        }
        return Err(GatewayError::InvalidApiKey(KeyProblem::Incorrect));
    }
    tracing::info!("a /ui session was opened");
    state.sessions.open(admin_key).map_err(|e| GatewayError::Internal(format!("no random token: {e}")))
}

/// POST `/ui/logout`: ends the browser's session (204; the cookie cleared).
pub async fn sign_out(State(state): State<Arc<AppState>>, headers: HeaderMap) -> Response {
    if let Err(e) = browser::check(&headers, AdminBy::Session, &state.hosts) {
        return e.into_response();
    }
    if let Some(token) = session::token(&headers) {
        state.sessions.close(token);
    }
    let mut response = StatusCode::NO_CONTENT.into_response();
    response.headers_mut().insert(header::SET_COOKIE, session::clear_cookie());
    response
}
