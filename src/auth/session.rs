//! `/ui` sessions: a browser on another machine signs in once with the admin key and holds a
//! cookie (`mlxgate_session`, `HttpOnly`, `SameSite=Strict`), which the page's live feeds ride
//! on (`EventSource` cannot send an `Authorization` header).
//!
//! A token is 32 bytes from the OS's generator; only its SHA-256 is kept, compared in constant
//! time, with the digest of the admin key it was opened with — a reload that changes the key
//! ends every session. At most [`MAX_SESSIONS`] live (the oldest closed first), each for
//! [`LIFETIME`]; at most [`MAX_FAILURES`] wrong keys a minute are tried from one address (an
//! IPv6 address's /64 counts as one), so the key is guessed no faster than that from there,
//! and a peer guessing does not lock the admin out from elsewhere (at most [`MAX_PEERS`]
//! addresses are remembered, the quietest forgotten first).

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, HeaderValue, header};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::config::KeyHash;

/// The cookie's name.
pub const COOKIE: &str = "mlxgate_session";
/// How many sessions may be open at once.
pub const MAX_SESSIONS: usize = 64;
/// How long a session lasts.
pub const LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Wrong keys tried per minute from one address before its sign-ins are refused for the rest
/// of it.
pub const MAX_FAILURES: usize = 10;
/// How many addresses' recent failures are remembered.
pub const MAX_PEERS: usize = 1024;

struct Session {
    token: [u8; 32],
    key: KeyHash,
    until: Instant,
}

#[derive(Default)]
struct State {
    open: VecDeque<Session>,
    /// Each address's wrong keys of the last minute.
    failures: HashMap<IpAddr, VecDeque<Instant>>,
    /// Bumped when a session closes: a feed opened on one asks again (see `epoch`).
    closed: u64,
}

/// The open sessions.
#[derive(Default)]
pub struct Sessions(Mutex<State>);

impl Sessions {
    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Opens a session for the admin key `key`; its token, to go in the cookie (64 hex digits).
    pub fn open(&self, key: KeyHash) -> Result<String, getrandom::Error> {
        let mut random = [0u8; 32];
        getrandom::fill(&mut random)?;
        let token: String = random.iter().map(|b| format!("{b:02x}")).collect();
        let now = Instant::now();
        let mut state = self.state();
        state.open.retain(|s| s.until > now);
        if state.open.len() >= MAX_SESSIONS {
            state.open.pop_front();
        }
        // The cookie's text is the token: its digest is what is kept.
        state.open.push_back(Session { token: digest(token.as_bytes()), key, until: now + LIFETIME });
        Ok(token)
    }

    /// Whether `token` is an open session's, opened with the admin key in force (`key`).
    pub fn valid(&self, token: &[u8], key: Option<&KeyHash>) -> bool {
        let Some(key) = key else { return false };
        let presented = digest(token);
        let now = Instant::now();
        let state = self.state();
        let mut found = subtle::Choice::from(0);
        for session in &state.open {
            let live = subtle::Choice::from(u8::from(session.until > now));
            found |= session.token.ct_eq(&presented) & session.key.ct_eq(key) & live;
        }
        found.into()
    }

    /// Closes every session (the admin key changed).
    pub fn close_all(&self) {
        let mut state = self.state();
        state.open.clear();
        state.closed += 1;
    }

    /// Closes the session of `token`, if open.
    pub fn close(&self, token: &[u8]) {
        let presented = digest(token);
        let mut state = self.state();
        state.open.retain(|s| !bool::from(s.token.ct_eq(&presented)));
        state.closed += 1;
    }

    /// Whether a sign-in may be tried now from `peer` (fewer than [`MAX_FAILURES`] wrong keys
    /// from there in the last minute).
    pub fn may_try(&self, peer: Option<IpAddr>) -> bool {
        let mut state = self.state();
        let now = Instant::now();
        let Some(recent) = state.failures.get_mut(&address(peer)) else { return true };
        while recent.front().is_some_and(|t| now.duration_since(*t) > Duration::from_secs(60)) {
            recent.pop_front();
        }
        recent.len() < MAX_FAILURES
    }

    /// Counts a wrong key from `peer`.
    pub fn failed(&self, peer: Option<IpAddr>) {
        let mut state = self.state();
        let now = Instant::now();
        let key = address(peer);
        if state.failures.len() >= MAX_PEERS && !state.failures.contains_key(&key) {
            // Forget the address whose last failure is the oldest.
            let quietest = state.failures.iter().min_by_key(|(_, times)| times.back().copied()).map(|(ip, _)| *ip);
            if let Some(ip) = quietest {
                state.failures.remove(&ip);
            }
        }
        let recent = state.failures.entry(key).or_default();
        recent.push_back(now);
        if recent.len() > MAX_FAILURES {
            recent.pop_front();
        }
    }

    /// A number that changes whenever a session is closed: a live feed opened on a session
    /// compares it at every event and asks the admin rule again when it changed.
    pub fn epoch(&self) -> u64 {
        self.state().closed
    }
}

/// The address failures are counted under: an IPv6 address's /64 (one host may hold a whole
/// /64), any other as it is; an unknown peer as one.
fn address(peer: Option<IpAddr>) -> IpAddr {
    match peer.map(|ip| ip.to_canonical()) {
        Some(IpAddr::V6(v6)) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        Some(v4) => v4,
        None => IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED),
    }
}

fn digest(token: &[u8]) -> [u8; 32] {
    Sha256::digest(token).into()
}

/// The session token a request's `Cookie` headers carry.
pub fn token(headers: &HeaderMap) -> Option<&[u8]> {
    headers.get_all(header::COOKIE).iter().flat_map(|value| value.as_bytes().split(|&b| b == b';')).find_map(|pair| {
        let pair = pair.trim_ascii();
        let value = pair.strip_prefix(COOKIE.as_bytes())?.strip_prefix(b"=")?;
        (!value.is_empty()).then_some(value)
    })
}

/// The `Set-Cookie` value of a new session (`Secure` is left out: the gateway speaks plain
/// HTTP on a home network; behind a TLS proxy the browser keeps it all the same).
pub fn set_cookie(token: &str) -> HeaderValue {
    let value = format!("{COOKIE}={token}; Path=/; HttpOnly; SameSite=Strict; Max-Age={}", LIFETIME.as_secs());
    HeaderValue::from_str(&value).unwrap_or_else(|_| HeaderValue::from_static("mlxgate_session=; Max-Age=0"))
}

/// The `Set-Cookie` value that ends the session in the browser.
pub fn clear_cookie() -> HeaderValue {
    HeaderValue::from_static("mlxgate_session=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_opens_is_checked_against_the_key_and_closes() {
        let sessions = Sessions::default();
        let key = KeyHash::of_key(b"admin");
        let token = sessions.open(key).expect("token");
        assert_eq!(token.len(), 64);
        assert!(sessions.valid(token.as_bytes(), Some(&key)));
        assert!(!sessions.valid(b"0000", Some(&key)));
        assert!(!sessions.valid(token.as_bytes(), Some(&KeyHash::of_key(b"new key"))), "a new key ends it");
        assert!(!sessions.valid(token.as_bytes(), None), "no key, no sessions");
        sessions.close(token.as_bytes());
        assert!(!sessions.valid(token.as_bytes(), Some(&key)));
    }

    #[test]
    fn sessions_and_failures_are_bounded() {
        let sessions = Sessions::default();
        let key = KeyHash::of_key(b"admin");
        let first = sessions.open(key).expect("token");
        for _ in 0..MAX_SESSIONS {
            sessions.open(key).expect("token");
        }
        assert!(!sessions.valid(first.as_bytes(), Some(&key)), "the oldest closed");
        assert_eq!(sessions.state().open.len(), MAX_SESSIONS);
        let (guesser, admin): (IpAddr, IpAddr) = ("192.0.2.7".parse().expect("ip"), "127.0.0.1".parse().expect("ip"));
        for _ in 0..MAX_FAILURES {
            assert!(sessions.may_try(Some(guesser)));
            sessions.failed(Some(guesser));
        }
        assert!(!sessions.may_try(Some(guesser)));
        assert!(sessions.may_try(Some(admin)), "one address's guesses lock out no other");
        let (a, b): (IpAddr, IpAddr) = ("2001:db8::1".parse().expect("ip"), "2001:db8::ffff:2".parse().expect("ip"));
        for _ in 0..MAX_FAILURES {
            sessions.failed(Some(a));
        }
        assert!(!sessions.may_try(Some(b)), "a /64 is one address");
        for i in 0..MAX_PEERS as u32 + 5 {
            sessions.failed(Some(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i))));
        }
        assert!(sessions.state().failures.len() <= MAX_PEERS);
        let before = sessions.epoch();
        sessions.close(b"whatever");
        assert_ne!(sessions.epoch(), before);
    }

    #[test]
    fn the_cookie_is_found_among_others() {
        let mut headers = HeaderMap::new();
        headers.append(header::COOKIE, HeaderValue::from_static("a=1; mlxgate_sessionx=no"));
        headers.append(header::COOKIE, HeaderValue::from_static("b=2;  mlxgate_session=abc ; c=3"));
        assert_eq!(token(&headers), Some(&b"abc"[..]));
        assert_eq!(token(&HeaderMap::new()), None);
        let set = set_cookie("abc");
        let set = set.to_str().expect("text");
        assert!(set.contains("HttpOnly") && set.contains("SameSite=Strict") && set.starts_with("mlxgate_session=abc;"));
    }
}
