//! What a web page in someone's browser must not be able to do to the gateway's admin side
//! (`/ui` and `/admin/*`), as pure rules over a request's headers:
//!
//! - **No cross-site request.** A request that says it comes from a page of another origin
//!   (`Origin` not this gateway's scheme, host and port, or `Sec-Fetch-Site: cross-site`) is
//!   refused, whatever else it carries: a page elsewhere cannot restart a backend through the
//!   user's session or the loopback rule. Tools (curl, `mlxgate drain`) send neither header.
//! - **No foreign `Host` where the browser is the credential.** The loopback rule and the
//!   session cookie are what a browser brings by itself; a DNS rebinding (a name the attacker
//!   controls, pointed at 127.0.0.1) reaches the gateway as same-origin with that name in
//!   `Host`. So a request admitted that way must name the gateway by an IP address,
//!   `localhost` (or a `.localhost` name, which resolves to loopback only), this machine's own
//!   name (`mac`, `mac.local`), or a name in `admin_hosts:`. A request carrying the admin key
//!   itself is not a browser's doing and is not held to it.

use axum::http::{HeaderMap, header};

use crate::error::GatewayError;

/// How a request was let into the admin side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AdminBy {
    /// It carried the admin key.
    Key,
    /// It carried a `/ui` session cookie.
    Session,
    /// It came from this machine, and no admin key is set.
    Loopback,
}

/// The host names a browser may use for the admin side (besides IP addresses and localhost).
#[derive(Debug, Clone, Default)]
pub struct Hosts {
    /// This machine's name (lowercase, without `.local`), when known.
    pub machine: Option<String>,
    /// `admin_hosts:` (lowercase; `*`: any).
    pub extra: Vec<String>,
}

impl Hosts {
    /// Whether `origin`'s host is one named in `admin_hosts:` (by name, not `*`): the public
    /// name a reverse proxy serves the gateway by, which rewrites `Host` but not `Origin`.
    fn names_origin(&self, origin: &str) -> bool {
        let Some((_, authority)) = origin.split_once("://") else { return false };
        let name = host_name(authority).trim_end_matches('.').to_ascii_lowercase();
        self.extra.contains(&name)
    }
}

impl Hosts {
    /// This machine's name and `admin_hosts`.
    pub fn of_machine(extra: &[String]) -> Hosts {
        let machine = nix::unistd::gethostname().ok().and_then(|n| n.into_string().ok()).map(|n| {
            let n = n.to_ascii_lowercase();
            n.strip_suffix(".local").map(str::to_owned).unwrap_or(n)
        });
        Hosts { machine, extra: extra.to_vec() }
    }

    /// Whether `host` (a `Host` header's name, without its port; any case) is one of them.
    pub fn allows(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let ipv6 = host.strip_prefix('[').and_then(|h| h.strip_suffix(']'));
        if host.parse::<std::net::IpAddr>().is_ok() || ipv6.is_some_and(|h| h.parse::<std::net::Ipv6Addr>().is_ok()) {
            return true;
        }
        if host == "localhost" || host.ends_with(".localhost") {
            return true;
        }
        let machine = self.machine.as_deref().is_some_and(|m| host == m || host.strip_suffix(".local") == Some(m));
        machine || self.extra.iter().any(|h| h == "*" || *h == host)
    }
}

/// The name part of a `Host` header value (`mac.local:8000` → `mac.local`, `[::1]:8000` →
/// `[::1]`).
fn host_name(authority: &str) -> &str {
    if authority.starts_with('[') {
        return authority.find(']').map_or(authority, |end| &authority[..=end]);
    }
    authority.rsplit_once(':').map_or(authority, |(name, _)| name)
}

/// Refuses what a web page could do (see the module's header): a cross-site request always;
/// a foreign `Host` when `by` is what a browser brings by itself.
///
/// An `Origin` is this gateway's when it names the request's `Host`, or a name listed in
/// `admin_hosts` (behind a reverse proxy that rewrites `Host`). A request with no `Host` at all
/// (HTTP/1.0 from a tool) is no browser's.
pub fn check(headers: &HeaderMap, by: AdminBy, hosts: &Hosts) -> Result<(), GatewayError> {
    let host = headers.get(header::HOST).map(|h| h.to_str().unwrap_or("\u{fffd}"));
    for origin in headers.get_all(header::ORIGIN) {
        let origin_text = String::from_utf8_lossy(origin.as_bytes()).into_owned();
        if !(same_origin(&origin_text, host.unwrap_or("")) || hosts.names_origin(&origin_text)) {
            return Err(GatewayError::CrossSite { origin: origin_text.chars().take(100).collect() });
        }
    }
    if headers.get_all("sec-fetch-site").iter().any(|v| v.as_bytes().eq_ignore_ascii_case(b"cross-site")) {
        return Err(GatewayError::CrossSite { origin: "(Sec-Fetch-Site: cross-site)".into() });
    }
    if let Some(host) = host
        && by != AdminBy::Key
        && !hosts.allows(host_name(host))
    {
        return Err(GatewayError::ForeignHost(host.chars().take(100).collect()));
    }
    Ok(())
}

/// Whether `origin` (`http://mac.local:8000`) names the host and port of `host`
/// (`mac.local:8000`). A default port may be left out of either (`http://mac.local` and
/// `mac.local:80`). `null` (a sandboxed or file page) is never this gateway.
fn same_origin(origin: &str, host: &str) -> bool {
    let Some((scheme, authority)) = origin.split_once("://") else { return false };
    let default_port = match scheme.to_ascii_lowercase().as_str() {
        "http" => "80",
        "https" => "443",
        _ => return false,
    };
    let with_port = |a: &str| -> String {
        let a = a.to_ascii_lowercase();
        let bare = host_name(&a).len() == a.len();
        if bare { format!("{a}:{default_port}") } else { a }
    };
    !authority.is_empty() && !authority.contains('/') && with_port(authority) == with_port(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).expect("header value"));
        }
        map
    }

    fn hosts() -> Hosts {
        Hosts { machine: Some("mac".into()), extra: vec!["gateway.lan".into()] }
    }

    #[test]
    fn the_names_a_browser_may_use() {
        let hosts = hosts();
        for ok in [
            "127.0.0.1",
            "10.0.0.5",
            "[::1]",
            "localhost",
            "LOCALHOST",
            "app.localhost",
            "mac",
            "Mac.Local",
            "gateway.lan",
            "localhost.",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "mac.evil.example",
            "localhost.evil.example",
            "macx.local",
            "",
            "gateway.lan.evil",
            "[evil.example]",
        ] {
            assert!(!hosts.allows(bad), "{bad}");
        }
        assert!(Hosts { machine: None, extra: vec!["*".into()] }.allows("anything.example"));
        assert_eq!(host_name("mac.local:8000"), "mac.local");
        assert_eq!(host_name("[::1]:8000"), "[::1]");
        assert_eq!(host_name("mac"), "mac");
    }

    #[test]
    fn origins_must_be_this_gateways() {
        assert!(same_origin("http://127.0.0.1:8000", "127.0.0.1:8000"));
        assert!(same_origin("http://Mac.Local:8000", "mac.local:8000"));
        assert!(same_origin("http://mac.local", "mac.local:80"));
        assert!(same_origin("https://gw.lan", "gw.lan:443"));
        assert!(same_origin("http://[::1]:8000", "[::1]:8000"));
        for (origin, host) in [
            ("http://evil.example", "127.0.0.1:8000"),
            ("http://127.0.0.1:3000", "127.0.0.1:8000"),
            ("http://localhost:8000", "127.0.0.1:8000"),
            ("null", "127.0.0.1:8000"),
            ("file://", "127.0.0.1:8000"),
            ("https://127.0.0.1:8000", "127.0.0.1:8000:1"),
            ("http://127.0.0.1:8000/x", "127.0.0.1:8000"),
        ] {
            assert!(!same_origin(origin, host), "{origin} vs {host}");
        }
    }

    #[test]
    fn a_page_elsewhere_is_refused_and_a_rebound_name_too_unless_the_key_came() {
        let hosts = hosts();
        let local = headers(&[("host", "127.0.0.1:8000")]);
        for by in [AdminBy::Key, AdminBy::Session, AdminBy::Loopback] {
            assert!(check(&local, by, &hosts).is_ok());
            let same = headers(&[("host", "127.0.0.1:8000"), ("origin", "http://127.0.0.1:8000")]);
            assert!(check(&same, by, &hosts).is_ok());
            let cross = headers(&[("host", "127.0.0.1:8000"), ("origin", "http://evil.example")]);
            assert!(matches!(check(&cross, by, &hosts), Err(GatewayError::CrossSite { .. })), "{by:?}");
            let fetch = headers(&[("host", "127.0.0.1:8000"), ("sec-fetch-site", "cross-site")]);
            assert!(matches!(check(&fetch, by, &hosts), Err(GatewayError::CrossSite { .. })), "{by:?}");
        }
        // DNS rebinding: the page's own origin, a name that is not the gateway's.
        let rebound = headers(&[("host", "evil.example:8000"), ("origin", "http://evil.example:8000")]);
        assert!(matches!(check(&rebound, AdminBy::Loopback, &hosts), Err(GatewayError::ForeignHost(_))));
        assert!(matches!(check(&rebound, AdminBy::Session, &hosts), Err(GatewayError::ForeignHost(_))));
        let tool = headers(&[("host", "gateway.example.com:8000")]);
        assert!(check(&tool, AdminBy::Key, &hosts).is_ok(), "a caller with the key may use any name");
        assert!(check(&HeaderMap::new(), AdminBy::Loopback, &hosts).is_ok(), "no Host: no browser (HTTP/1.0 tools)");
        let shouting = headers(&[("host", "127.0.0.1:8000"), ("sec-fetch-site", "Cross-Site")]);
        assert!(matches!(check(&shouting, AdminBy::Key, &hosts), Err(GatewayError::CrossSite { .. })));
        let mut two = headers(&[("host", "127.0.0.1:8000"), ("origin", "http://127.0.0.1:8000")]);
        two.append("origin", HeaderValue::from_static("http://evil.example"));
        assert!(matches!(check(&two, AdminBy::Key, &hosts), Err(GatewayError::CrossSite { .. })), "every Origin");
        // Behind a reverse proxy that rewrote Host: the public name is listed.
        let proxied = headers(&[("host", "127.0.0.1:8000"), ("origin", "https://gateway.lan")]);
        assert!(check(&proxied, AdminBy::Session, &hosts).is_ok());
        let unlisted = headers(&[("host", "127.0.0.1:8000"), ("origin", "https://other.lan")]);
        assert!(matches!(check(&unlisted, AdminBy::Session, &hosts), Err(GatewayError::CrossSite { .. })));
    }
}
