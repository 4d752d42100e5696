//! Who may call the gateway: `auth`, `clients:` (each with its key, models and limits),
//! `default_limits`, `admin_key_sha256` and `rate_limit_store`, checked into plain data.
//!
//! A key given in clear (`key: ${AIDER_KEY}`) is hashed here, at load: the [`Config`] holds
//! SHA-256 digests only, and neither they nor a Redis password show in its `Debug`. No problem
//! message quotes a key or a digest (a key pasted into `key_sha256` by mistake stays unprinted).
//!
//! [`Config`]: super::Config

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::num::NonZeroU32;
use std::sync::Arc;

use serde::Deserialize;
use serde_yaml::Value;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use super::{ModelConfig, Problem, typed};

/// The name requests are known by when nobody is identified (auth off); no client may take it,
/// so that a metric label `client="anonymous"` is never a configured client's.
pub const ANONYMOUS: &str = "anonymous";

/// Whether requests must carry a configured client's key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AuthMode {
    /// Every request is served as `anonymous`; keys are not checked.
    Off,
    /// A request without a configured client's key gets 401.
    Required,
}

/// The SHA-256 digest of an API key. Its `Debug` prints no digit of it: a digest of a short key
/// is as good as the key to whoever can try keys offline.
#[derive(Clone, Copy)]
pub struct KeyHash([u8; 32]);

impl KeyHash {
    /// The digest of a key as a client sends it (the bytes after `Bearer `).
    pub fn of_key(key: &[u8]) -> KeyHash {
        KeyHash(Sha256::digest(key).into())
    }

    /// Reads 64 hexadecimal characters (either case); `None` for anything else.
    pub fn from_hex(text: &str) -> Option<KeyHash> {
        let text = text.as_bytes();
        if text.len() != 64 {
            return None;
        }
        let mut digest = [0u8; 32];
        for (byte, pair) in digest.iter_mut().zip(text.chunks_exact(2)) {
            *byte = (hex_digit(pair[0])? << 4) | hex_digit(pair[1])?;
        }
        Some(KeyHash(digest))
    }
}

fn hex_digit(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

/// Compared in constant time: how long a comparison takes says nothing of where two digests
/// differ.
impl ConstantTimeEq for KeyHash {
    fn ct_eq(&self, other: &Self) -> subtle::Choice {
        self.0.ct_eq(&other.0)
    }
}

impl fmt::Debug for KeyHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("KeyHash(<redacted>)")
    }
}

/// Per-client limits; `None` is no limit of that kind. Each is at least 1 when set.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Requests per minute.
    pub rpm: Option<NonZeroU32>,
    /// Tokens (prompt + generated) per minute.
    pub tpm: Option<NonZeroU32>,
    /// Requests in flight at once.
    pub concurrency: Option<NonZeroU32>,
}

impl Limits {
    /// Each limit from `self`, or from `fallback` where `self` sets none.
    pub fn or(self, fallback: Limits) -> Limits {
        Limits {
            rpm: self.rpm.or(fallback.rpm),
            tpm: self.tpm.or(fallback.tpm),
            concurrency: self.concurrency.or(fallback.concurrency),
        }
    }
}

/// One entry of `clients:`.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Its name in `clients:` (shared with every request it sends: cheap to clone).
    pub name: Arc<str>,
    /// The digest of its key (`key_sha256`, or the hash of `key` taken at load).
    pub key: KeyHash,
    /// The public model names it may use; `None`: every model.
    pub models: Option<BTreeSet<String>>,
    /// Its own limits, each one it does not set taken from `default_limits`.
    pub limits: Limits,
}

impl ClientConfig {
    /// Whether the client may send requests for `model` (a model it may not use is, to it, a
    /// model that does not exist).
    pub fn may_use(&self, model: &str) -> bool {
        self.models.as_ref().is_none_or(|models| models.contains(model))
    }
}

/// Where rate-limit state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RateLimitStore {
    /// In this process (the default).
    Memory,
    /// In a Redis server shared by several gateways.
    Redis(RedisUrl),
}

/// A `redis://[:password@]host[:port][/db]` URL, checked. Its `Debug` hides the password.
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL as written, password included (for the Redis client only; never log it).
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The URL with any `user:password@` replaced by `<redacted>@`: fit for logs.
    pub fn redacted(&self) -> String {
        let Some(rest) = self.0.strip_prefix("redis://") else { return self.0.clone() };
        let authority_end = rest.find('/').unwrap_or(rest.len());
        match rest[..authority_end].rfind('@') {
            Some(at) => format!("redis://<redacted>@{}", &rest[at + 1..]),
            None => self.0.clone(),
        }
    }
}

impl fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RedisUrl({})", self.redacted())
    }
}

/// The validated access keys of [`super::Config`].
pub(super) struct Access {
    pub auth: AuthMode,
    pub clients: BTreeMap<String, ClientConfig>,
    pub default_limits: Limits,
    pub admin_key: Option<KeyHash>,
    pub rate_limit_store: RateLimitStore,
}

/// The access keys as they come out of the file (each still YAML, so that a mistake in one
/// does not hide the problems of the others).
pub(super) struct RawAccess {
    pub auth: Option<Value>,
    pub clients: BTreeMap<String, Value>,
    pub default_limits: Option<Value>,
    pub admin_key_sha256: Option<Value>,
    pub rate_limit_store: Option<Value>,
}

/// A client: exactly one of `key` and `key_sha256`, the models it may use, its limits.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClient {
    /// SHA-256 of the client's key, 64 hexadecimal characters (printf %s "$KEY" | shasum -a 256).
    key_sha256: Option<RawSecret>,
    /// The client's key itself (hashed at load), e.g. from an environment variable: ${AIDER_KEY}.
    key: Option<RawSecret>,
    /// The models it may use (default: all).
    models: Option<Vec<String>>,
    /// Its limits; each one left out is default_limits'.
    limits: Option<RawLimits>,
}

/// Per-client limits; each one left out is no limit of that kind.
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLimits {
    /// Requests per minute.
    rpm: Option<u64>,
    /// Tokens (prompt + generated) per minute.
    tpm: Option<u64>,
    /// Requests in flight at once.
    concurrency: Option<u64>,
}

/// A key or a digest: text only, and a value of another type is refused without being quoted
/// in the message (serde's own "invalid type: integer `123…`" would print it).
pub(super) struct RawSecret(String);

impl schemars::JsonSchema for RawSecret {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Secret".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({"type": "string", "description": "Text (quote a key made of digits)."})
    }
}

impl<'de> Deserialize<'de> for RawSecret {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match Value::deserialize(d) {
            Ok(Value::String(text)) => Ok(RawSecret(text)),
            _ => Err(serde::de::Error::custom("must be text: quote it")),
        }
    }
}

/// How to write a digest, said in every message about one.
const DIGEST_HINT: &str = "the SHA-256 digest of the key as 64 hexadecimal characters \
                           (printf %s \"$KEY\" | shasum -a 256)";

/// Whether `path` (from the root, as `substitute_env` walks it) is a client's clear key: its
/// `${VAR}` is taken as text, never re-read as YAML (`${KEY}` = `0123` stays `0123`).
pub(super) fn is_clear_key(path: &[String]) -> bool {
    matches!(path, [clients, _, key] if clients == "clients" && key == "key")
}

/// Checks the access keys against the validated `models`.
pub(super) fn validate(raw: RawAccess, models: &BTreeMap<String, ModelConfig>, problems: &mut Vec<Problem>) -> Access {
    let auth: Option<AuthMode> = raw.auth.and_then(|v| typed(v, "auth", problems));
    let default_limits = raw.default_limits.map_or_else(Limits::default, |v| {
        typed::<RawLimits>(v, "default_limits", problems)
            .map(|l| limits(l, "default_limits", problems))
            .unwrap_or_default()
    });
    let configured = !raw.clients.is_empty();
    let mut clients = BTreeMap::new();
    let mut key_fields = BTreeMap::new();
    for (name, value) in raw.clients {
        let path = format!("clients.{name}");
        let Some(client) = typed::<RawClient>(value, &path, problems) else { continue };
        if let Some((config, key_field)) = validate_client(&name, &path, client, default_limits, models, problems) {
            key_fields.insert(name.clone(), key_field);
            clients.insert(name, config);
        }
    }
    refuse_shared_keys(&clients, &key_fields, problems);
    let auth = match auth {
        Some(AuthMode::Required) if !configured => {
            problems.push(Problem {
                path: "auth".into(),
                reason: "required, but no clients are configured: add clients (each with a key), or set auth: off"
                    .into(),
            });
            AuthMode::Required
        }
        Some(mode) => mode,
        None if configured => AuthMode::Required,
        None => AuthMode::Off,
    };
    let admin_key = raw.admin_key_sha256.and_then(|v| admin_key(v, &clients, problems));
    let rate_limit_store = raw.rate_limit_store.map_or(RateLimitStore::Memory, |v| store(v, problems));
    Access { auth, clients, default_limits, admin_key, rate_limit_store }
}

/// One client: its key (exactly one of `key`, `key_sha256`), models and limits. Returns it
/// with the name of the key field it used, for messages.
fn validate_client(
    name: &str,
    path: &str,
    raw: RawClient,
    default_limits: Limits,
    models: &BTreeMap<String, ModelConfig>,
    problems: &mut Vec<Problem>,
) -> Option<(ClientConfig, &'static str)> {
    let mut problem = |field: &str, reason: String| {
        let at = if field.is_empty() { path.to_string() } else { format!("{path}.{field}") };
        problems.push(Problem { path: at, reason });
    };
    if name == ANONYMOUS {
        problem("", format!("{ANONYMOUS:?} is the name of requests that carry no key: choose another name"));
    }
    let key = match (raw.key_sha256, raw.key) {
        (Some(_), Some(_)) => {
            problem("", "give either key_sha256 or key, not both".into());
            None
        }
        (None, None) => {
            problem("", format!("needs key_sha256 ({DIGEST_HINT}) or key (written as key: ${{ENV_VAR}})"));
            None
        }
        (Some(RawSecret(hex)), None) => match KeyHash::from_hex(hex.trim()) {
            Some(hash) => Some((hash, "key_sha256")),
            None => {
                problem("key_sha256", format!("must be {DIGEST_HINT}"));
                None
            }
        },
        (None, Some(RawSecret(key))) => {
            if key.is_empty() {
                problem("key", "is empty (is its environment variable set to nothing?)".into());
                None
            } else if key.trim() != key {
                problem("key", "starts or ends with whitespace, which no client can send in a header".into());
                None
            } else {
                Some((KeyHash::of_key(key.as_bytes()), "key"))
            }
        }
    };
    let allowed = raw.models.map(|list| allowed_models(list, path, models, problems));
    let own = raw.limits.map(|l| limits(l, &format!("{path}.limits"), problems)).unwrap_or_default();
    let (key, key_field) = key?;
    Some((ClientConfig { name: Arc::from(name), key, models: allowed, limits: own.or(default_limits) }, key_field))
}

/// A client's `models` list: each a configured public name, at least one.
fn allowed_models(
    list: Vec<String>,
    path: &str,
    models: &BTreeMap<String, ModelConfig>,
    problems: &mut Vec<Problem>,
) -> BTreeSet<String> {
    if list.is_empty() {
        problems.push(Problem {
            path: format!("{path}.models"),
            reason: "lists no model: leave it out to allow every model".into(),
        });
    }
    for (i, model) in list.iter().enumerate() {
        if !models.contains_key(model) {
            let known: Vec<&str> = models.keys().map(String::as_str).collect();
            problems.push(Problem {
                path: format!("{path}.models[{i}]"),
                reason: format!(
                    "no model named {model:?} (models: {})",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ),
            });
        }
    }
    list.into_iter().collect()
}

/// A `limits` block: each limit given is at least 1 and fits 32 bits.
fn limits(raw: RawLimits, path: &str, problems: &mut Vec<Problem>) -> Limits {
    let mut check = |value: Option<u64>, field: &str| -> Option<NonZeroU32> {
        let value = value?;
        let checked = u32::try_from(value).ok().and_then(NonZeroU32::new);
        if checked.is_none() {
            problems.push(Problem {
                path: format!("{path}.{field}"),
                reason: format!("must be at least 1 and at most {} (leave it out for no limit)", u32::MAX),
            });
        }
        checked
    };
    Limits {
        rpm: check(raw.rpm, "rpm"),
        tpm: check(raw.tpm, "tpm"),
        concurrency: check(raw.concurrency, "concurrency"),
    }
}

/// Two clients with one key could not be told apart: the second (in name order) is refused.
fn refuse_shared_keys(
    clients: &BTreeMap<String, ClientConfig>,
    key_fields: &BTreeMap<String, &'static str>,
    problems: &mut Vec<Problem>,
) {
    let list: Vec<&ClientConfig> = clients.values().collect();
    for (i, later) in list.iter().enumerate() {
        if let Some(earlier) = list[..i].iter().find(|c| bool::from(c.key.ct_eq(&later.key))) {
            let field = key_fields.get(&*later.name).copied().unwrap_or("key");
            problems.push(Problem {
                path: format!("clients.{}.{field}", later.name),
                reason: format!("the same key as client {:?}: each client needs its own key", earlier.name),
            });
        }
    }
}

/// `admin_key_sha256`: a digest, and no client's (a client's key would open `/admin/*`).
fn admin_key(value: Value, clients: &BTreeMap<String, ClientConfig>, problems: &mut Vec<Problem>) -> Option<KeyHash> {
    let RawSecret(hex) = typed(value, "admin_key_sha256", problems)?;
    let Some(hash) = KeyHash::from_hex(hex.trim()) else {
        problems.push(Problem { path: "admin_key_sha256".into(), reason: format!("must be {DIGEST_HINT}") });
        return None;
    };
    if let Some(client) = clients.values().find(|c| bool::from(c.key.ct_eq(&hash))) {
        problems.push(Problem {
            path: "admin_key_sha256".into(),
            reason: format!("is client {:?}'s key: the admin key must be a key of its own", client.name),
        });
    }
    Some(hash)
}

/// `rate_limit_store`: `memory` or `redis://[:password@]host[:port][/db]`.
fn store(value: Value, problems: &mut Vec<Problem>) -> RateLimitStore {
    let Some(text) = typed::<String>(value, "rate_limit_store", problems) else { return RateLimitStore::Memory };
    let text = text.trim();
    if text == "memory" {
        return RateLimitStore::Memory;
    }
    match redis_url(text) {
        Ok(url) => RateLimitStore::Redis(url),
        Err(reason) => {
            problems.push(Problem { path: "rate_limit_store".into(), reason });
            RateLimitStore::Memory
        }
    }
}

fn redis_url(text: &str) -> Result<RedisUrl, String> {
    let usage = "is memory or a URL like redis://127.0.0.1:6379";
    if !text.starts_with("redis://") {
        let shown = if text.contains('@') { "this value" } else { text };
        return Err(format!(
            "{usage} (got {shown:?}{})",
            if text.starts_with("rediss://") { "; TLS is not supported" } else { "" }
        ));
    }
    let uri: http::Uri = text.parse().map_err(|_| format!("{usage}: this one is not a URL"))?;
    if uri.host().is_none_or(str::is_empty) {
        return Err(format!("{usage}: it names no host"));
    }
    let authority = uri.authority().map_or("", |a| a.as_str());
    let host_and_port = authority.rsplit('@').next().unwrap_or(authority);
    if let Some((_, port)) = host_and_port.rsplit_once(':').filter(|_| !host_and_port.ends_with(']'))
        && port.parse::<u16>().map_or(true, |p| p == 0)
    {
        return Err(format!("{usage}: its port is not a number from 1 to 65535"));
    }
    let path = uri.path().trim_start_matches('/');
    if !path.is_empty() && path.parse::<u32>().is_err() {
        return Err(format!("{usage}: the path may only be a database number (redis://host:port/0)"));
    }
    if uri.query().is_some() {
        return Err(format!("{usage}: no query is read"));
    }
    Ok(RedisUrl(text.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{Config, ConfigError};

    /// A digest written in a file (of no key in particular).
    const AIDER_SHA: &str = "5f1a5eb4e7ffa5dc1b8e7e4dbdd2d41f7ad5e1a39e2f8cb0a9e3a8eb6f9e2c61";

    const BASE: &str = "backends: {local: {url: 'http://127.0.0.1:9'}}\n\
                        models: {qwen: {backend: local}, other: {backend: local}}\n";

    fn parse(extra: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, Vec<String>> {
        match Config::parse(&format!("{BASE}{extra}"), env) {
            Ok(c) => Ok(c),
            Err(ConfigError::Invalid(p)) => Err(p.iter().map(ToString::to_string).collect()),
            Err(e) => Err(vec![e.to_string()]),
        }
    }

    fn no_env(_: &str) -> Option<String> {
        None
    }

    fn problems(extra: &str) -> Vec<String> {
        parse(extra, &no_env).err().unwrap_or_default()
    }

    fn hex(hash: &KeyHash) -> String {
        hash.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn digests_match_the_shell_tools() {
        // printf %s abc | sha256sum
        let abc = "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad";
        assert_eq!(hex(&KeyHash::of_key(b"abc")), abc);
        let read = KeyHash::from_hex(&abc.to_uppercase()).expect("hex");
        assert!(bool::from(read.ct_eq(&KeyHash::of_key(b"abc"))));
        assert!(!bool::from(read.ct_eq(&KeyHash::of_key(b"abd"))));
        for bad in ["", "abc", &abc[..63], &format!("{abc}0"), &abc.replace('a', "g")] {
            assert!(KeyHash::from_hex(bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn without_clients_auth_is_off_and_limits_are_none() {
        let c = parse("", &no_env).expect("valid");
        assert_eq!(c.auth, AuthMode::Off);
        assert!(c.clients.is_empty());
        assert_eq!(c.default_limits, Limits::default());
        assert!(c.admin_key.is_none());
        assert_eq!(c.rate_limit_store, RateLimitStore::Memory);
    }

    #[test]
    fn clients_with_digests_or_keys_from_the_environment() {
        let env = |name: &str| match name {
            "CURSOR_KEY" => Some("0123".to_string()),
            _ => None,
        };
        let text = format!(
            "clients:\n  \
               aider: {{key_sha256: {AIDER_SHA}, models: [qwen], limits: {{rpm: 60, tpm: 200000, concurrency: 2}}}}\n  \
               cursor: {{key: '${{CURSOR_KEY}}', limits: {{tpm: 1000}}}}\n\
             default_limits: {{rpm: 600, concurrency: 4}}\n\
             admin_key_sha256: '{}'\n\
             rate_limit_store: redis://127.0.0.1:6379\n",
            hex(&KeyHash::of_key(b"admin"))
        );
        let c = parse(&text, &env).expect("valid");
        assert_eq!(c.auth, AuthMode::Required, "clients configured: auth is required by default");
        let aider = &c.clients["aider"];
        assert_eq!(&*aider.name, "aider");
        assert_eq!(hex(&aider.key), AIDER_SHA);
        assert!(aider.may_use("qwen") && !aider.may_use("other"));
        let n = |v| NonZeroU32::new(v);
        assert_eq!(aider.limits, Limits { rpm: n(60), tpm: n(200_000), concurrency: n(2) });
        let cursor = &c.clients["cursor"];
        // The variable's text is the key: `0123`, not the number 123 that YAML would read.
        assert_eq!(hex(&cursor.key), hex(&KeyHash::of_key(b"0123")));
        assert!(cursor.may_use("qwen") && cursor.may_use("other"), "no models: every model");
        assert_eq!(cursor.limits, Limits { rpm: n(600), tpm: n(1000), concurrency: n(4) }, "defaults fill the gaps");
        assert_eq!(c.default_limits, Limits { rpm: n(600), tpm: None, concurrency: n(4) });
        assert!(c.admin_key.is_some());
        assert!(matches!(&c.rate_limit_store, RateLimitStore::Redis(url) if url.as_str() == "redis://127.0.0.1:6379"));
        let off = parse(&format!("auth: off\nclients: {{aider: {{key_sha256: {AIDER_SHA}}}}}\n"), &no_env);
        assert_eq!(off.expect("valid").auth, AuthMode::Off, "auth: off is kept with clients configured");
    }

    #[test]
    fn debug_prints_no_key_digest_or_password() {
        let env = |_: &str| Some("sk-very-secret-key".to_string());
        let text = format!(
            "clients:\n  aider: {{key_sha256: {AIDER_SHA}}}\n  cursor: {{key: '${{K}}'}}\n\
             admin_key_sha256: {}\nrate_limit_store: 'redis://:hunter2@redis.local:6380/2'\n",
            "ab".repeat(32)
        );
        let c = parse(&text, &env).expect("valid");
        let shown = format!("{c:?}");
        for secret in ["sk-very-secret", AIDER_SHA, &hex(&c.clients["cursor"].key), &"ab".repeat(32), "hunter2"] {
            assert!(!shown.contains(secret), "{secret:?} in {shown}");
        }
        assert!(shown.contains("redis://<redacted>@redis.local:6380/2"), "{shown}");
    }

    #[test]
    fn every_client_problem_is_reported_at_its_path() {
        let env = |name: &str| match name {
            "EMPTY" => Some(String::new()),
            "SPACED" => Some(" spaced-key ".to_string()),
            _ => None,
        };
        let text = format!(
            "clients:\n  \
               both: {{key_sha256: {AIDER_SHA}, key: abc}}\n  \
               neither: {{models: [qwen]}}\n  \
               short: {{key_sha256: 'sk-pasted-the-key-itself'}}\n  \
               number: {{key: 12345}}\n  \
               empty: {{key: '${{EMPTY}}'}}\n  \
               spaced: {{key: '${{SPACED}}'}}\n  \
               typo: {{key: abc, modles: [qwen]}}\n  \
               models: {{key: def, models: [qwen, qwne]}}\n  \
               nomodels: {{key: ghi, models: []}}\n  \
               zero: {{key: jkl, limits: {{rpm: 0, tpm: 5000000000, concurrency: 0}}}}\n  \
               anonymous: {{key: mno}}\n\
             default_limits: {{rpm: 0}}\n"
        );
        let p = parse(&text, &env).err().unwrap_or_default();
        for expected in [
            "clients.both: give either key_sha256 or key, not both",
            "clients.neither: needs key_sha256 (the SHA-256 digest of the key as 64 hexadecimal characters",
            "clients.short.key_sha256: must be the SHA-256 digest of the key as 64 hexadecimal characters",
            "clients.number.key: must be text: quote it",
            "clients.empty.key: is empty (is its environment variable set to nothing?)",
            "clients.spaced.key: starts or ends with whitespace",
            "clients.typo.modles: unknown field `modles`",
            "clients.models.models[1]: no model named \"qwne\" (models: other, qwen)",
            "clients.nomodels.models: lists no model: leave it out to allow every model",
            "clients.zero.limits.rpm: must be at least 1 and at most 4294967295 (leave it out for no limit)",
            "clients.zero.limits.tpm: must be at least 1",
            "clients.zero.limits.concurrency: must be at least 1",
            "clients.anonymous: \"anonymous\" is the name of requests that carry no key",
            "default_limits.rpm: must be at least 1",
        ] {
            assert!(p.iter().any(|l| l.starts_with(expected)), "{expected:?} not in {p:#?}");
        }
        assert_eq!(p.len(), 14, "{p:#?}");
        for secret in ["sk-pasted", "12345", "spaced-key"] {
            assert!(!p.iter().any(|l| l.contains(secret)), "{secret:?} quoted in {p:#?}");
        }
    }

    #[test]
    fn shared_keys_and_an_admin_key_that_is_a_clients_are_refused() {
        let text = format!(
            "clients:\n  a: {{key_sha256: {AIDER_SHA}}}\n  b: {{key: same}}\n  c: {{key: same}}\n  \
             d: {{key_sha256: '{}'}}\nadmin_key_sha256: '{}'\n",
            AIDER_SHA.to_uppercase(),
            hex(&KeyHash::of_key(b"same"))
        );
        let p = problems(&text);
        assert_eq!(
            p,
            [
                "clients.c.key: the same key as client \"b\": each client needs its own key",
                "clients.d.key_sha256: the same key as client \"a\": each client needs its own key",
                "admin_key_sha256: is client \"b\"'s key: the admin key must be a key of its own",
            ]
        );
        assert_eq!(
            problems("admin_key_sha256: 1234\n"),
            ["admin_key_sha256: must be text: quote it"],
            "a number is not quoted back"
        );
        assert_eq!(
            problems("admin_key_sha256: not-hex\n"),
            ["admin_key_sha256: must be the SHA-256 digest of the key as 64 hexadecimal characters \
              (printf %s \"$KEY\" | shasum -a 256)"]
        );
    }

    #[test]
    fn auth_required_needs_clients_and_auth_is_off_or_required() {
        assert_eq!(
            problems("auth: required\n"),
            ["auth: required, but no clients are configured: add clients (each with a key), or set auth: off"]
        );
        let p = problems("auth: maybe\n");
        assert!(
            p.len() == 1 && p[0].starts_with("auth: unknown variant `maybe`, expected `off` or `required`"),
            "{p:?}"
        );
        // A client that is refused still counts as configured: its own problem is the one to fix.
        let p = problems("auth: required\nclients: {a: {models: [qwen]}}\n");
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with("clients.a: needs key_sha256"), "{p:?}");
    }

    #[test]
    fn rate_limit_store_is_memory_or_a_redis_url() {
        let store = |value: &str| match parse(&format!("rate_limit_store: '{value}'\n"), &no_env) {
            Ok(c) => Ok(c.rate_limit_store),
            Err(p) => Err(p.join("\n")),
        };
        assert_eq!(store("memory"), Ok(RateLimitStore::Memory));
        for good in ["redis://127.0.0.1:6379", "redis://redis.local", "redis://:pw@host:6380/3"] {
            assert!(matches!(store(good), Ok(RateLimitStore::Redis(ref u)) if u.as_str() == good), "{good}");
        }
        for (bad, why) in [
            ("memroy", "rate_limit_store: is memory or a URL like redis://127.0.0.1:6379 (got \"memroy\")"),
            ("rediss://h:1", "TLS is not supported"),
            ("redis://", "not a URL"),
            ("redis://h:1/x", "the path may only be a database number"),
            ("redis://h:port", "its port is not a number"),
            ("redis://h:0", "its port is not a number"),
            ("redis://h:1?db=2", "no query is read"),
        ] {
            let got = store(bad).err().unwrap_or_default();
            assert!(got.starts_with("rate_limit_store: ") && got.contains(why), "{bad}: {got}");
        }
        let hidden = store("http://:hunter2@h").err().unwrap_or_default();
        assert!(!hidden.contains("hunter2"), "{hidden}");
    }
}
