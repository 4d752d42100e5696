//! Who sent a request: the API key it carries (`Authorization: Bearer …`, or `x-api-key: …` as
//! Anthropic clients send it) checked against the configured clients, and who may use the
//! admin API (its own key, or a loopback peer when none is set).
//!
//! The presented key is hashed with SHA-256 and the digest compared with every client's in
//! constant time, all of them each time, so neither which client matched nor how much of a
//! digest did shows in the time taken. Nothing here formats a key: no log line or error message
//! can carry one.
//!
//! The keys, clients and limits in force are an [`Access`] snapshot, which a reload (SIGHUP)
//! replaces as a whole: a request identifies its client against one snapshot.
//!
//! The admin side's browser rules (no cross-site request, no foreign `Host`) are in
//! `browser.rs`; the `/ui` page's sign-in sessions in `session.rs`.

pub mod browser;
pub mod session;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use axum::http::{HeaderMap, header};
use subtle::{ConditionallySelectable, ConstantTimeEq};

use crate::config::{ANONYMOUS, AuthMode, ClientConfig, Config, KeyHash, Limits};
use crate::error::{GatewayError, KeyProblem};

/// The header Anthropic's clients send their key in.
const X_API_KEY: &str = "x-api-key";

/// The part of the configuration a reload replaces: who may call and with which limits. A
/// request reads one snapshot (see `AppState::access`); the rest of [`Config`] is fixed at
/// start-up.
#[derive(Debug, Clone)]
pub struct Access {
    /// Whether requests must carry a configured client's key.
    pub auth: AuthMode,
    /// The configured clients, by name.
    pub clients: BTreeMap<String, ClientConfig>,
    /// The limits of a client that does not set them, and of every request when auth is off.
    pub default_limits: Limits,
    /// The digest of the key `/admin/*` requires (loopback peers only without one).
    pub admin_key: Option<KeyHash>,
}

impl Access {
    /// The access part of a validated configuration.
    pub fn of(config: &Config) -> Access {
        Access {
            auth: config.auth,
            clients: config.clients.clone(),
            default_limits: config.default_limits,
            admin_key: config.admin_key,
        }
    }
}

/// Who sent a request, once its key is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Client {
    /// A configured client, by its name in `clients:`.
    Named(Arc<str>),
    /// Auth is off: requests are not told apart by key.
    Anonymous,
}

impl Client {
    /// The client's configured name, or `anonymous` (a bounded set: fit for metric labels).
    pub fn name(&self) -> &str {
        match self {
            Client::Named(name) => name,
            Client::Anonymous => ANONYMOUS,
        }
    }

    /// Its limits: the client's own (filled from `default_limits`), or `default_limits`.
    pub fn limits(&self, access: &Access) -> Limits {
        match self {
            Client::Named(name) => access.clients.get(&**name).map_or(access.default_limits, |c| c.limits),
            Client::Anonymous => access.default_limits,
        }
    }

    /// Whether it may send requests for `model`. A model it may not use must be answered as
    /// one that does not exist (404 `model_not_found`), so that its name is not confirmed.
    pub fn may_use(&self, access: &Access, model: &str) -> bool {
        match self {
            Client::Named(name) => access.clients.get(&**name).is_some_and(|c| c.may_use(model)),
            Client::Anonymous => true,
        }
    }
}

/// Identifies the client of a request from its headers alone (before its body is read: a
/// refused client costs nothing). With auth off every request is [`Client::Anonymous`];
/// with auth required, a missing or unknown key is 401 `invalid_api_key`.
pub fn identify(access: &Access, headers: &HeaderMap) -> Result<Client, GatewayError> {
    if access.auth == AuthMode::Off {
        return Ok(Client::Anonymous);
    }
    let key = presented_key(headers).ok_or(GatewayError::InvalidApiKey(KeyProblem::Missing))?;
    find_client(&access.clients, &KeyHash::of_key(key))
        .map(|c| Client::Named(Arc::clone(&c.name)))
        .ok_or(GatewayError::InvalidApiKey(KeyProblem::Incorrect))
}

/// The client whose key has `digest`: every client's digest is compared (in constant time),
/// whatever the earlier comparisons found.
fn find_client<'a>(clients: &'a BTreeMap<String, ClientConfig>, digest: &KeyHash) -> Option<&'a ClientConfig> {
    let mut found = u32::MAX;
    for (i, client) in clients.values().enumerate() {
        let index = u32::try_from(i).unwrap_or(u32::MAX);
        found.conditional_assign(&index, client.key.ct_eq(digest));
    }
    clients.values().nth(usize::try_from(found).ok()?)
}

/// The key a request carries: the token of `Authorization: Bearer <key>` (the scheme in any
/// case), else the value of `x-api-key`. Surrounding whitespace is not part of a key; an empty
/// key is none.
pub fn presented_key(headers: &HeaderMap) -> Option<&[u8]> {
    let bearer = headers.get(header::AUTHORIZATION).and_then(|value| {
        let value = value.as_bytes();
        let (scheme, token) = value.split_at_checked(6)?;
        let separated = token.first().is_some_and(u8::is_ascii_whitespace);
        (scheme.eq_ignore_ascii_case(b"bearer") && separated).then_some(token)
    });
    let key = bearer.or_else(|| headers.get(X_API_KEY).map(|v| v.as_bytes()))?.trim_ascii();
    (!key.is_empty()).then_some(key)
}

/// Whether a request may use `/admin/*` (and `/ui`), and how it was let in: with
/// `admin_key_sha256` set, it must carry that key or an open `/ui` session's cookie (`session`:
/// the caller checked it; 401 otherwise, wherever it comes from); without one, it must come from this machine
/// (`peer` on loopback and not forwarded by a proxy; 403 otherwise, and when the peer is
/// unknown). A reverse proxy on the same machine (Caddy or nginx for TLS) connects from
/// loopback for every remote caller; the `Forwarded`/`X-Forwarded-For`/`X-Real-IP` header it
/// adds is what tells such a call apart.
pub fn admit_admin(
    access: &Access,
    headers: &HeaderMap,
    peer: Option<SocketAddr>,
    session: bool,
) -> Result<browser::AdminBy, GatewayError> {
    match &access.admin_key {
        Some(admin) => {
            let Some(key) = presented_key(headers) else {
                return if session {
                    Ok(browser::AdminBy::Session)
                } else {
                    Err(GatewayError::InvalidApiKey(KeyProblem::Missing))
                };
            };
            if bool::from(admin.ct_eq(&KeyHash::of_key(key))) {
                Ok(browser::AdminBy::Key)
            } else {
                Err(GatewayError::InvalidApiKey(KeyProblem::Incorrect))
            }
        }
        None if peer.is_some_and(|p| is_loopback(p.ip())) && !forwarded(headers) => Ok(browser::AdminBy::Loopback),
        None => Err(GatewayError::AdminForbidden),
    }
}

/// Whether a proxy says it forwarded the request for someone else.
fn forwarded(headers: &HeaderMap) -> bool {
    ["forwarded", "x-forwarded-for", "x-real-ip"].iter().any(|name| headers.contains_key(*name))
}

/// Whether `ip` is this machine's loopback: 127.0.0.0/8 and ::1, and 127/8 as an IPv6 socket
/// on a dual-stack listener sees it (`::ffff:127.0.0.1`, which `Ipv6Addr::is_loopback` denies).
pub fn is_loopback(ip: IpAddr) -> bool {
    ip.to_canonical().is_loopback()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static [u8])]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.append(*name, HeaderValue::from_bytes(value).expect("header value"));
        }
        map
    }

    fn config(extra: &str) -> Access {
        let text = format!(
            "backends: {{local: {{url: 'http://127.0.0.1:9'}}}}\n\
             models: {{qwen: {{backend: local}}, other: {{backend: local}}}}\n{extra}"
        );
        Access::of(&Config::parse(&text, &|name| Some(format!("key-of-{name}"))).expect("valid"))
    }

    const TWO_CLIENTS: &str = "clients:\n  aider: {key: '${AIDER}', models: [qwen], limits: {rpm: 5}}\n  \
                               cursor: {key: '${CURSOR}'}\ndefault_limits: {rpm: 100, tpm: 1000}\n";

    #[test]
    fn keys_come_as_bearer_or_x_api_key() {
        let key = |pairs: &[(&'static str, &'static [u8])]| presented_key(&headers(pairs)).map(<[u8]>::to_vec);
        assert_eq!(key(&[("authorization", b"Bearer sk-1")]), Some(b"sk-1".to_vec()));
        assert_eq!(key(&[("authorization", b"bearer   sk-1 ")]), Some(b"sk-1".to_vec()));
        assert_eq!(key(&[("authorization", b"BEARER\tsk-1")]), Some(b"sk-1".to_vec()));
        assert_eq!(key(&[("x-api-key", b" sk-2 ")]), Some(b"sk-2".to_vec()));
        assert_eq!(key(&[("authorization", b"Bearer sk-1"), ("x-api-key", b"sk-2")]), Some(b"sk-1".to_vec()));
        assert_eq!(key(&[("authorization", b"Basic dTpw"), ("x-api-key", b"sk-2")]), Some(b"sk-2".to_vec()));
        assert_eq!(key(&[("authorization", b"Bearersk-1")]), None);
        assert_eq!(key(&[("authorization", b"Bearer ")]), None);
        assert_eq!(key(&[("x-api-key", b"")]), None);
        assert_eq!(key(&[]), None);
        // A key is bytes: one with non-ASCII bytes is compared as sent.
        assert_eq!(key(&[("x-api-key", b"cl\xc3\xa9")]), Some("clé".as_bytes().to_vec()));
    }

    #[test]
    fn identifies_each_client_by_its_key() {
        let config = config(TWO_CLIENTS);
        let who = |pairs: &[(&'static str, &'static [u8])]| identify(&config, &headers(pairs));
        assert_eq!(who(&[("authorization", b"Bearer key-of-AIDER")]).ok(), Some(Client::Named("aider".into())));
        assert_eq!(who(&[("x-api-key", b"key-of-CURSOR")]).ok(), Some(Client::Named("cursor".into())));
        assert!(matches!(who(&[]), Err(GatewayError::InvalidApiKey(KeyProblem::Missing))));
        assert!(matches!(
            who(&[("authorization", b"Bearer key-of-AIDE")]),
            Err(GatewayError::InvalidApiKey(KeyProblem::Incorrect))
        ));
        let aider = Client::Named("aider".into());
        assert!(aider.may_use(&config, "qwen") && !aider.may_use(&config, "other"));
        assert_eq!(aider.limits(&config).rpm.map(|n| n.get()), Some(5));
        assert_eq!(aider.limits(&config).tpm.map(|n| n.get()), Some(1000), "filled from default_limits");
        let cursor = Client::Named("cursor".into());
        assert!(cursor.may_use(&config, "qwen") && cursor.may_use(&config, "other"));
        assert_eq!(cursor.name(), "cursor");
    }

    #[test]
    fn with_auth_off_everyone_is_anonymous() {
        let config = config(&format!("auth: off\n{TWO_CLIENTS}"));
        let anyone = identify(&config, &headers(&[("authorization", b"Bearer whatever")])).expect("served");
        assert_eq!(anyone, Client::Anonymous);
        assert_eq!(anyone.name(), "anonymous");
        assert!(anyone.may_use(&config, "other"));
        assert_eq!(anyone.limits(&config).rpm.map(|n| n.get()), Some(100));
        assert_eq!(identify(&config, &HeaderMap::new()).ok(), Some(Client::Anonymous));
    }

    #[test]
    fn loopback_is_127_8_and_ipv6_loopback_in_every_spelling() {
        for ip in ["127.0.0.1", "127.0.0.2", "127.255.255.254", "::1", "::ffff:127.0.0.1", "::ffff:127.1.2.3"] {
            assert!(is_loopback(ip.parse().expect("ip")), "{ip}");
        }
        for ip in ["192.0.2.2", "10.0.0.1", "0.0.0.0", "::", "::ffff:192.0.2.2", "fe80::1", "::127.0.0.1"] {
            assert!(!is_loopback(ip.parse().expect("ip")), "{ip}");
        }
    }

    #[test]
    fn admin_needs_its_key_when_set_else_a_loopback_peer() {
        let local: Option<SocketAddr> = Some("127.0.0.1:5000".parse().expect("addr"));
        let remote: Option<SocketAddr> = Some("192.0.2.2:5000".parse().expect("addr"));
        let open = config(TWO_CLIENTS);
        assert!(admit_admin(&open, &HeaderMap::new(), local, false).is_ok());
        assert!(matches!(admit_admin(&open, &HeaderMap::new(), remote, false), Err(GatewayError::AdminForbidden)));
        assert!(matches!(admit_admin(&open, &HeaderMap::new(), None, false), Err(GatewayError::AdminForbidden)));
        // A reverse proxy on this machine: loopback peer, but it says it forwards someone.
        for name in ["forwarded", "x-forwarded-for", "x-real-ip"] {
            let proxied = headers(&[(name, b"203.0.113.7")]);
            assert!(matches!(admit_admin(&open, &proxied, local, false), Err(GatewayError::AdminForbidden)), "{name}");
        }

        let keyed = Access { admin_key: Some(KeyHash::of_key(b"admin-key")), ..open };
        let with = headers(&[("authorization", b"Bearer admin-key")]);
        assert!(admit_admin(&keyed, &with, remote, false).is_ok(), "the key opens it from anywhere");
        let client_key = headers(&[("authorization", b"Bearer key-of-AIDER")]);
        for peer in [local, remote] {
            assert!(matches!(
                admit_admin(&keyed, &HeaderMap::new(), peer, false),
                Err(GatewayError::InvalidApiKey(KeyProblem::Missing))
            ));
            assert!(matches!(
                admit_admin(&keyed, &client_key, peer, false),
                Err(GatewayError::InvalidApiKey(KeyProblem::Incorrect))
            ));
        }
    }
}
