//! The /ui page's safety over plain HTTP (no browser; `ui_browser.rs` drives the page itself):
//! cross-site POSTs refused (Origin), foreign `Host`s refused (DNS rebinding cannot reach the
//! loopback rule), the admin key's sign-in and its session cookie (the only way a browser's
//! `EventSource` can carry it) for remote callers, and no prompt text in the activity feed or a
//! request's details unless the model's `capture` is on.

use std::net::SocketAddr;

use crate::common::*;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const ADMIN_KEY: &str = "sk-admin-4c1e9b07d2a85f36";
const SIM: &str = env!("CARGO_BIN_EXE_mlxgate-sim");

fn sha256_hex(key: &str) -> String {
    Sha256::digest(key.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// A managed `mlxgate-sim` backend `a` (it has a log and can be restarted) serving model `a`,
/// and a remote backend `local` (the in-process simulator at `sim_url`) serving `qwen`.
fn yaml(sim_url: &str, top: &str) -> String {
    format!(
        "{top}backends:\n  a:\n    kind: custom\n    command: ['{SIM}', '--port', '{{port}}', '--style', 'mlx-lm']\n    \
         port: {}\n    max_concurrency: 2\n    stop_timeout: 5s\n  local: {{url: '{sim_url}', max_concurrency: 4}}\n\
         models:\n  a: {{backend: a, max_wait: 120s}}\n  qwen: {{backend: local, upstream_model: tiny-qwen3}}\n",
        free_port()
    )
}

fn with_admin_key() -> String {
    format!("admin_key_sha256: {}\n", sha256_hex(ADMIN_KEY))
}

/// The `host:port` of a gateway's address, as a browser's `Host` and `Origin` carry it.
fn authority(gw: &Gateway) -> String {
    gw.addr.to_string()
}

async fn status_and_text(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    (status, response.text().await.unwrap_or_default())
}

/// Reads Server-Sent Events from a response, one at a time (bounded by `PATIENCE`).
struct Events {
    response: reqwest::Response,
    buffer: String,
    /// Every byte read, for checks over the whole feed.
    seen: String,
}

impl Events {
    fn new(response: reqwest::Response) -> Self {
        Events { response, buffer: String::new(), seen: String::new() }
    }

    /// The next event's name and data (comments skipped).
    async fn next(&mut self) -> (String, String) {
        let read = tokio::time::timeout(PATIENCE, async {
            loop {
                let normalised = self.buffer.replace("\r\n", "\n");
                if let Some(end) = normalised.find("\n\n") {
                    let frame = normalised[..end].to_string();
                    self.buffer = normalised[end + 2..].to_string();
                    let mut name = String::from("message");
                    let mut data: Vec<&str> = vec![];
                    for line in frame.lines() {
                        if let Some(v) = line.strip_prefix("event:") {
                            name = v.trim().to_string();
                        } else if let Some(v) = line.strip_prefix("data:") {
                            data.push(v.strip_prefix(' ').unwrap_or(v));
                        }
                    }
                    if !data.is_empty() {
                        return Some((name, data.join("\n")));
                    }
                    continue;
                }
                match self.response.chunk().await {
                    Ok(Some(chunk)) => {
                        let text = String::from_utf8_lossy(&chunk);
                        self.buffer.push_str(&text);
                        self.seen.push_str(&text);
                    }
                    _ => return None,
                }
            }
        })
        .await;
        match read {
            Ok(Some(event)) => event,
            Ok(None) => panic!("the feed ended; it had sent: {}", self.seen),
            Err(_) => panic!("no event within {PATIENCE:?}; the feed had sent: {}", self.seen),
        }
    }

    /// Reads events until one named `name` whose data passes `wanted`; every event of that
    /// name read on the way, the last one included.
    async fn all_until(&mut self, name: &str, wanted: impl Fn(&Value) -> bool) -> Vec<Value> {
        let mut all = vec![];
        loop {
            let (event, data) = self.next().await;
            if event == name {
                let value: Value =
                    serde_json::from_str(&data).unwrap_or_else(|e| panic!("{event} data is not JSON ({e}): {data}"));
                let done = wanted(&value);
                all.push(value);
                if done {
                    return all;
                }
            }
        }
    }

    /// Reads events until one named `name` whose data passes `wanted`; returns its data.
    async fn until(&mut self, name: &str, wanted: impl Fn(&Value) -> bool) -> Value {
        loop {
            let (event, data) = self.next().await;
            if event == name {
                let value: Value =
                    serde_json::from_str(&data).unwrap_or_else(|e| panic!("{event} data is not JSON ({e}): {data}"));
                if wanted(&value) {
                    return value;
                }
            }
        }
    }
}

/// GET `path` with the given extra headers.
async fn get(gw: &Gateway, path: &str, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = client().get(gw.url(path));
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("send")
}

/// POST `path` (JSON `body`) with the given extra headers.
async fn post_with(gw: &Gateway, path: &str, body: &Value, headers: &[(&str, &str)]) -> reqwest::Response {
    let mut request = client().post(gw.url(path)).json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    request.send().await.expect("send")
}

// ---- Cross-site POSTs (Origin) ----

#[tokio::test]
async fn a_cross_site_post_is_refused_and_a_same_origin_or_origin_less_one_is_not() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "")).await;
    let same = format!("http://{}", authority(&gw));
    // A page elsewhere (or a sandboxed one: `Origin: null`) posting to the gateway from this
    // machine's browser: the peer is loopback, which alone would pass the admin rule.
    // `http://localhost:3000` is another port of this machine: same site, another origin.
    let other_port = "http://localhost:3000";
    for origin in
        ["http://evil.example", "http://evil.example:8000", "null", "http://localhost.evil.example", other_port]
    {
        for path in ["/admin/backends/a/restart", "/admin/backends/a/stop", "/admin/backends/local/drain"] {
            let (status, text) = status_and_text(post_with(&gw, path, &json!({}), &[("origin", origin)]).await).await;
            assert_eq!(status, 403, "POST {path} from Origin {origin}: {text}");
        }
        let login = post_with(&gw, "/ui/login", &json!({"key": ADMIN_KEY}), &[("origin", origin)]).await;
        assert_eq!(login.status(), 403, "POST /ui/login from Origin {origin}");
    }
    // A browser that sends no Origin on a cross-site POST still sends Sec-Fetch-Site.
    let fetched = post_with(&gw, "/admin/backends/a/restart", &json!({}), &[("sec-fetch-site", "cross-site")]).await;
    assert_eq!(fetched.status(), 403, "Sec-Fetch-Site: cross-site");
    // A page elsewhere opening the feed (`new EventSource(...)` sends its Origin): refused too,
    // and nothing invites a cross-origin read.
    for (path, origin) in
        [("/ui/events", "http://evil.example"), ("/admin/backends", "http://evil.example"), ("/ui/events", other_port)]
    {
        let r = get(&gw, path, &[("origin", origin)]).await;
        assert_eq!(r.status(), 403, "GET {path} from {origin}");
        let own = get(&gw, path, &[]).await;
        assert!(own.headers().get("access-control-allow-origin").is_none(), "{path}: no CORS: {:?}", own.headers());
    }
    // Nor can a page elsewhere frame the page to steer clicks on its buttons.
    let page = get(&gw, "/ui", &[]).await;
    let csp = page.headers().get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or_default();
    let frame = page.headers().get("x-frame-options").and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(csp.contains("frame-ancestors 'none'") || frame.eq_ignore_ascii_case("deny"), "framing: {csp:?} {frame:?}");
    assert_eq!(backend_state(&gw, "a").await["state"], "stopped", "no refused POST reached the backend");
    assert_eq!(backend_state(&gw, "local").await["drained"], false, "no refused POST drained it");

    // The page's own POSTs (same origin) and the CLI's (no Origin: `mlxgate drain`) go through.
    let drain = post_with(&gw, "/admin/backends/local/drain", &json!({}), &[("origin", &same)]).await;
    assert_eq!(drain.status(), 200, "same-origin drain");
    let undrain = post_with(&gw, "/admin/backends/local/undrain", &json!({}), &[]).await;
    assert_eq!(undrain.status(), 200, "origin-less undrain");
    let (status, text) =
        status_and_text(post_with(&gw, "/admin/backends/a/restart", &json!({}), &[("origin", &same)]).await).await;
    assert_eq!(status, 202, "same-origin restart: {text}");
    let answer: Value = serde_json::from_str(&text).expect("json");
    assert_eq!(answer["backend"], "a", "{answer}");
}

#[tokio::test]
async fn a_cross_site_login_is_refused_even_with_the_right_key() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &with_admin_key())).await;
    let evil = post_with(&gw, "/ui/login", &json!({"key": ADMIN_KEY}), &[("origin", "http://evil.example")]).await;
    assert_eq!(evil.status(), 403);
    assert!(evil.headers().get("set-cookie").is_none(), "no session for a cross-site login");
    // The same key from the page's own origin signs in.
    let same = format!("http://{}", authority(&gw));
    let login = post_with(&gw, "/ui/login", &json!({"key": ADMIN_KEY}), &[("origin", &same)]).await;
    assert_eq!(login.status(), 204);
}

// ---- Foreign Host (DNS rebinding) ----

#[tokio::test]
async fn a_foreign_host_is_refused_on_the_page_and_its_feeds_and_the_machines_own_names_are_not() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "")).await;
    let port = gw.addr.port();
    // A page of evil.example whose name now resolves to 127.0.0.1: same-origin for the browser,
    // so no Origin check helps; only the Host it sends tells.
    for host in ["evil.example:8000", &format!("evil.example:{port}"), "evil.example"] {
        for path in ["/ui", "/ui/events", "/ui/events/logs/a"] {
            let (status, text) = status_and_text(get(&gw, path, &[("host", host)]).await).await;
            assert_eq!(status, 403, "GET {path} with Host {host}: {text}");
        }
    }
    for host in [format!("127.0.0.1:{port}"), format!("localhost:{port}")] {
        let (status, text) = status_and_text(get(&gw, "/ui", &[("host", &host)]).await).await;
        assert_eq!(status, 200, "Host {host}");
        assert!(text.contains("data-auth=\"ok\""), "loopback without an admin key: the page itself: {text}");
        let events = get(&gw, "/ui/events", &[("host", &host)]).await;
        assert_eq!(events.status(), 200, "Host {host}");
    }
}

#[tokio::test]
async fn a_foreign_host_cannot_reach_the_admin_api_through_the_loopback_rule() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "")).await;
    // The admin API serves the same rule as the page; a rebinding page reading the backends'
    // logs (a server may log prompts) or restarting them is the same attack.
    let (status, text) = status_and_text(get(&gw, "/admin/backends", &[("host", "evil.example:8000")]).await).await;
    assert_eq!(status, 403, "GET /admin/backends with a foreign Host: {text}");
    let (status, text) =
        status_and_text(get(&gw, "/admin/backends/a/logs", &[("host", "evil.example:8000")]).await).await;
    assert_eq!(status, 403, "GET /admin/backends/a/logs with a foreign Host: {text}");
    let restart = post_with(&gw, "/admin/backends/a/restart", &json!({}), &[("host", "evil.example:8000")]).await;
    assert_eq!(restart.status(), 403, "POST restart with a foreign Host");
    // What a rebound page really sends: its own name in both, so the Origin matches the Host.
    let rebound = format!("evil.example:{}", gw.addr.port());
    let origin = format!("http://{rebound}");
    let headers = [("host", rebound.as_str()), ("origin", origin.as_str())];
    let restart = post_with(&gw, "/admin/backends/a/restart", &json!({}), &headers).await;
    assert_eq!(restart.status(), 403, "a rebound page's POST");
    assert_eq!(backend_state(&gw, "a").await["state"], "stopped", "nothing restarted");
    assert_eq!(get(&gw, "/admin/backends", &[]).await.status(), 200, "its own Host is served");
}

// ---- The admin key: 401, sign-in, the session cookie, sign-out ----

/// The `name=value` of a `Set-Cookie` header, and its attributes (lower-cased names).
fn parse_set_cookie(header: &str) -> (String, Vec<String>) {
    let mut parts = header.split(';').map(str::trim);
    let pair = parts.next().unwrap_or_default().to_string();
    (pair, parts.map(|a| a.to_ascii_lowercase()).collect())
}

/// The checks of a caller at `gw`, which has an admin key: refused without it, signs in with
/// it, rides the session on the page and both feeds, and is refused again after signing out.
async fn sign_in_and_out(gw: &Gateway, peer: &str) {
    for path in ["/ui", "/ui/events", "/ui/events/logs/a"] {
        let (status, text) = status_and_text(get(gw, path, &[]).await).await;
        assert_eq!(status, 401, "{peer}: GET {path} without the key: {text}");
        if path == "/ui" {
            assert!(text.contains("data-auth=\"login\""), "{peer}: the login page: {text}");
        }
    }
    // The page's assets are public (the login form needs them).
    for asset in ["/ui/app.js", "/ui/style.css"] {
        let r = get(gw, asset, &[]).await;
        assert_eq!(r.status(), 200, "{peer}: {asset}");
        assert_eq!(r.headers().get("cache-control").map(|v| v.as_bytes()), Some(&b"no-cache"[..]), "{asset}");
    }

    let wrong = post_with(gw, "/ui/login", &json!({"key": "sk-admin-0000000000000000"}), &[]).await;
    assert!(wrong.headers().get("set-cookie").is_none(), "{peer}: no session for a wrong key");
    let (status, text) = status_and_text(wrong).await;
    assert_eq!(status, 401, "{peer}: wrong key: {text}");
    let body: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    assert!(body["error"]["message"].is_string(), "{peer}: an error message: {text}");

    let login = post_with(gw, "/ui/login", &json!({"key": ADMIN_KEY}), &[]).await;
    assert_eq!(login.status(), 204, "{peer}: the right key");
    let set_cookie = login.headers().get("set-cookie").expect("a session cookie").to_str().expect("ascii").to_string();
    let (pair, attributes) = parse_set_cookie(&set_cookie);
    assert!(pair.starts_with("mlxgate_session="), "{set_cookie}");
    assert!(pair.len() > "mlxgate_session=".len() + 16, "a session id worth guessing nothing from: {set_cookie}");
    assert!(attributes.iter().any(|a| a == "httponly"), "HttpOnly: {set_cookie}");
    assert!(attributes.iter().any(|a| a == "samesite=strict"), "SameSite=Strict: {set_cookie}");
    assert!(attributes.iter().any(|a| a == "path=/"), "Path=/: {set_cookie}");
    assert!(
        !set_cookie.contains(ADMIN_KEY) && !set_cookie.contains(&sha256_hex(ADMIN_KEY)),
        "the key is not the cookie"
    );
    let cookie = pair.as_str();

    let (status, text) = status_and_text(get(gw, "/ui", &[("cookie", cookie)]).await).await;
    assert_eq!(status, 200, "{peer}: the page with the session");
    assert!(text.contains("data-auth=\"ok\""), "{text}");
    assert!(!text.contains(ADMIN_KEY), "the page never shows the key");
    let events = get(gw, "/ui/events", &[("cookie", cookie)]).await;
    assert_eq!(events.status(), 200, "{peer}: the feed with the session");
    let content_type = events.headers().get("content-type").map(|v| v.to_str().unwrap_or("").to_string());
    assert!(content_type.as_deref().is_some_and(|t| t.starts_with("text/event-stream")), "{content_type:?}");
    let mut feed = Events::new(events);
    let state = feed.until("state", |_| true).await;
    assert_eq!(state["admin_key"], true, "{state}");
    let names: Vec<&str> =
        state["backends"].as_array().expect("backends").iter().filter_map(|b| b["name"].as_str()).collect();
    assert!(names.contains(&"a") && names.contains(&"local"), "{state}");
    assert!(!feed.seen.contains(ADMIN_KEY) && !feed.seen.contains(&sha256_hex(ADMIN_KEY)), "no key in the feed");
    drop(feed);
    let logs = get(gw, "/ui/events/logs/a", &[("cookie", cookie)]).await;
    assert_eq!(logs.status(), 200, "{peer}: a backend's log feed with the session");
    drop(logs);
    // The admin API takes the session too (the page's buttons), and the key as a header still.
    assert_eq!(get(gw, "/admin/backends", &[("cookie", cookie)]).await.status(), 200, "{peer}");
    let bearer = format!("Bearer {ADMIN_KEY}");
    assert_eq!(get(gw, "/ui/events", &[("authorization", &bearer)]).await.status(), 200, "{peer}: the key itself");
    // A made-up session is none.
    let forged = get(gw, "/ui", &[("cookie", "mlxgate_session=0123456789abcdef0123456789abcdef")]).await;
    assert_eq!(forged.status(), 401, "{peer}: a forged session");

    let logout = post_with(gw, "/ui/logout", &json!({}), &[("cookie", cookie)]).await;
    assert_eq!(logout.status(), 204, "{peer}: sign out");
    for path in ["/ui", "/ui/events", "/ui/events/logs/a"] {
        let (status, text) = status_and_text(get(gw, path, &[("cookie", cookie)]).await).await;
        assert_eq!(status, 401, "{peer}: GET {path} with the session after logout: {text}");
    }
    assert_eq!(get(gw, "/admin/backends", &[("cookie", cookie)]).await.status(), 401, "{peer}: the session is gone");
}

#[tokio::test]
async fn with_an_admin_key_a_local_caller_signs_in_too() {
    // With a key set, loopback no longer suffices (the admin rule): the same sign-in.
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &with_admin_key())).await;
    sign_in_and_out(&gw, "loopback").await;
}

#[tokio::test]
async fn a_remote_caller_gets_401_until_it_signs_in_with_the_admin_key() {
    let Some(ip) = non_loopback_address() else {
        eprintln!("SKIPPED: this machine has no non-loopback address (the loopback half runs in the test above)");
        return;
    };
    let sim = sim().await;
    let gw = gateway_on(&yaml(&sim.url(), &with_admin_key()), SocketAddr::new(ip, 0)).await;
    sign_in_and_out(&gw, &format!("remote {ip}")).await;
}

#[tokio::test]
async fn a_remote_caller_without_an_admin_key_configured_is_forbidden_and_told_why() {
    let Some(ip) = non_loopback_address() else {
        eprintln!("SKIPPED: this machine has no non-loopback address");
        return;
    };
    let sim = sim().await;
    let gw = gateway_on(&yaml(&sim.url(), ""), SocketAddr::new(ip, 0)).await;
    let (status, text) = status_and_text(get(&gw, "/ui", &[]).await).await;
    assert_eq!(status, 403, "{text}");
    assert!(text.contains("data-auth=\"forbidden\""), "{text}");
    assert!(text.contains("admin_key_sha256"), "the page says how to open it from elsewhere: {text}");
    for path in ["/ui/events", "/ui/events/logs/a", "/admin/backends"] {
        let (status, text) = status_and_text(get(&gw, path, &[]).await).await;
        assert_eq!(status, 403, "GET {path}: {text}");
    }
    let login = post_with(&gw, "/ui/login", &json!({"key": ADMIN_KEY}), &[]).await;
    assert_eq!(login.status(), 403, "no key to sign in with");
}

#[tokio::test]
async fn failed_sign_ins_are_limited() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &with_admin_key())).await;
    // Guessing the key: refused, then refused faster (429) within a bounded number of tries.
    let mut statuses = vec![];
    for attempt in 0..100 {
        let guess = format!("sk-admin-guess-{attempt:04}");
        let status = post_with(&gw, "/ui/login", &json!({"key": guess}), &[]).await.status().as_u16();
        statuses.push(status);
        if status == 429 {
            break;
        }
        assert_eq!(status, 401, "attempt {attempt}");
    }
    assert_eq!(statuses.last(), Some(&429), "100 wrong keys in a row and never a 429: {statuses:?}");
    // Counted per address: a stranger's guesses do not lock the admin out from elsewhere.
    let elsewhere =
        reqwest::Client::builder().local_address(std::net::IpAddr::from([127, 0, 0, 2])).build().expect("client");
    let login = elsewhere.post(gw.url("/ui/login")).json(&json!({"key": ADMIN_KEY})).send().await.expect("send");
    assert_eq!(login.status(), 204, "the right key from another address");
}

// ---- No prompt text in the feed unless capture is on ----

/// A gateway on the simulator with `open` (capture off) and `captured` (`capture: true`).
async fn capture_gateway(sim: &mlxgate::sim::SimHandle) -> Gateway {
    gateway(&format!(
        "backends:\n  local: {{url: '{}', max_concurrency: 4}}\n\
         models:\n  open: {{backend: local, upstream_model: tiny-qwen3}}\n  \
         captured: {{backend: local, upstream_model: tiny-qwen3, capture: true}}\n",
        sim.url()
    ))
    .await
}

/// Sends a streamed chat whose prompt is `prompt` to `model`; its request id.
async fn chat_with(gw: &Gateway, model: &str, prompt: &str) -> String {
    let body = json!({"model": model, "stream": true, "messages": [{"role": "user", "content": prompt}],
        "sim": {"tokens": 3}});
    let r = post(gw, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), 200);
    let id = r.headers().get("x-request-id").expect("x-request-id").to_str().expect("ascii").to_string();
    let text = text_of(r).await;
    assert!(text.contains("[DONE]"), "{text}");
    id
}

async fn details(gw: &Gateway, id: &str) -> Value {
    let r = get(gw, &format!("/admin/requests/{id}"), &[]).await;
    assert_eq!(r.status(), 200, "/admin/requests/{id}");
    r.json().await.expect("json")
}

#[tokio::test]
async fn the_activity_feed_never_carries_a_prompt_and_details_only_when_capture_is_on() {
    let sim = sim().await;
    let gw = capture_gateway(&sim).await;
    let mut feed = Events::new(get(&gw, "/ui/events", &[]).await);
    feed.until("requests", |v| v.is_array()).await;

    let marker = format!("PROMPT-MARKER-{:x}", std::process::id() as u64 * 7_919 + 13);
    let open = chat_with(&gw, "open", &format!("please remember {marker} for me")).await;
    let summary = feed.until("request", |v| v["id"] == open.as_str()).await;
    assert_eq!(summary["model"], "open", "{summary}");
    assert_eq!(summary["backend"], "local", "{summary}");
    assert_eq!(summary["status"], 200, "{summary}");
    assert_eq!(summary["face"], "chat", "{summary}");
    assert_eq!(summary["streaming"], true, "{summary}");
    assert_eq!(summary["captured"], false, "{summary}");
    let detail = details(&gw, &open).await;
    assert_eq!(detail["id"], open.as_str(), "{detail}");
    assert_eq!(detail["capture"], Value::Null, "capture is off for `open`: {detail}");
    assert!(!detail.to_string().contains(&marker), "no prompt text in the details: {detail}");

    let captured = chat_with(&gw, "captured", &format!("and this one {marker} too")).await;
    let summary = feed.until("request", |v| v["id"] == captured.as_str()).await;
    assert_eq!(summary["captured"], true, "{summary}");
    let detail = details(&gw, &captured).await;
    let body = detail["capture"]["body"].as_str().unwrap_or_else(|| panic!("a captured body: {detail}"));
    assert!(body.contains(&marker), "the captured body is the request's: {body}");
    assert_eq!(detail["capture"]["truncated"], false, "{detail}");

    // The other faces: the body as the client sent it (Anthropic's or the Responses shape).
    let messages = json!({"model": "captured", "max_tokens": 8,
        "messages": [{"role": "user", "content": format!("messages face {marker}")}]});
    let responses = json!({"model": "captured", "input": format!("responses face {marker}")});
    for (path, body, face, field) in [
        ("/v1/messages", messages, "messages", "\"max_tokens\""),
        ("/v1/responses", responses, "responses", "\"input\""),
    ] {
        let r = post(&gw, path, &body).await;
        assert_eq!(r.status(), 200, "{path}");
        let id = r.headers().get("x-request-id").expect("id").to_str().expect("ascii").to_string();
        let summary = feed.until("request", |v| v["id"] == id.as_str()).await;
        assert_eq!((summary["face"].as_str(), summary["captured"].as_bool()), (Some(face), Some(true)), "{summary}");
        let detail = details(&gw, &id).await;
        let kept = detail["capture"]["body"].as_str().unwrap_or_else(|| panic!("{path}: {detail}"));
        assert!(kept.contains(&marker) && kept.contains(field), "{path}: the client's own body: {kept}");
    }

    // Neither the live feed nor a new page's backlog carries a prompt, captured or not.
    assert!(!feed.seen.contains(&marker), "the live feed carried a prompt: {}", feed.seen);
    drop(feed);
    let mut fresh = Events::new(get(&gw, "/ui/events", &[]).await);
    let backlog = fresh.until("requests", |v| v.is_array()).await;
    let ids: Vec<&str> = backlog.as_array().expect("array").iter().filter_map(|r| r["id"].as_str()).collect();
    assert_eq!(&ids[2..], [captured.as_str(), open.as_str()], "the backlog, newest first");
    assert!(!fresh.seen.contains(&marker), "the backlog carried a prompt: {}", fresh.seen);
}

#[tokio::test]
async fn a_captured_body_is_bounded() {
    let sim = sim().await;
    let gw = capture_gateway(&sim).await;
    // A prompt far over any sensible capture (its text is never needed whole to debug a request).
    let marker = "CAPTURE-HEAD";
    let prompt = format!("{marker} {}", "lorem ipsum dolor sit amet ".repeat(40_000));
    let id = chat_with(&gw, "captured", &prompt).await;
    let detail = details(&gw, &id).await;
    let body = detail["capture"]["body"].as_str().unwrap_or_else(|| panic!("a captured body: {detail}"));
    assert_eq!(detail["capture"]["truncated"], true, "a {} byte body", prompt.len());
    assert!(body.len() < prompt.len(), "bounded: {} bytes kept of {}", body.len(), prompt.len());
    assert!(body.contains(marker), "its beginning is kept");
}

// ---- What the feeds hold, and how much ----

#[tokio::test]
async fn no_key_reaches_the_feed_not_even_in_a_query_string() {
    const CLIENT_KEY: &str = "sk-cline-0f3b8e27c5d94a16";
    let sim = sim().await;
    let gw = gateway(&format!(
        "backends:\n  local: {{url: '{}'}}\nmodels:\n  qwen: {{backend: local}}\n\
         clients:\n  cline: {{key_sha256: {}}}\n",
        sim.url(),
        sha256_hex(CLIENT_KEY)
    ))
    .await;
    let mut feed = Events::new(get(&gw, "/ui/events", &[]).await);
    let state = feed.until("state", |_| true).await;
    assert_eq!(state["auth"], "required", "{state}");
    assert_eq!(state["clients"][0]["name"], "cline", "{state}");
    // Some clients put their key in the URL; the summary's path must not carry it.
    let body = json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]});
    let r = client()
        .post(gw.url(&format!("/v1/chat/completions?api_key={CLIENT_KEY}")))
        .bearer_auth(CLIENT_KEY)
        .json(&body)
        .send()
        .await
        .expect("send");
    assert_eq!(r.status(), 200);
    let id = r.headers().get("x-request-id").expect("id").to_str().expect("ascii").to_string();
    let summary = feed.until("request", |v| v["id"] == id.as_str()).await;
    assert_eq!(summary["client"], "cline", "{summary}");
    assert_eq!(summary["path"], "/v1/chat/completions", "the path without its query: {summary}");
    let detail = details(&gw, &id).await;
    for text in
        [feed.seen.as_str(), &detail.to_string(), &get(&gw, "/admin/state", &[]).await.text().await.expect("text")]
    {
        assert!(!text.contains(CLIENT_KEY), "a client's key: {text}");
        assert!(!text.contains(&sha256_hex(CLIENT_KEY)), "a client's key digest: {text}");
    }
}

#[tokio::test]
async fn the_backlog_and_the_rings_are_bounded_and_newest_first() {
    // Answers at once: REQUESTS + 1 requests.
    let fast = mlxgate::sim::Behaviour { ttft_ms: Some(0), tokens: Some(1), ..Default::default() };
    let sim = sim_with(fast).await;
    let gw = capture_gateway(&sim).await;
    let mut ids = vec![];
    for n in 0..mlxgate::activity::REQUESTS + 1 {
        let model = if n < mlxgate::activity::CAPTURES + 2 { "captured" } else { "open" };
        let body = json!({"model": model, "messages": [{"role": "user", "content": format!("request {n}")}]});
        let r = post(&gw, "/v1/chat/completions", &body).await;
        assert_eq!(r.status(), 200);
        ids.push(r.headers().get("x-request-id").expect("id").to_str().expect("ascii").to_string());
    }
    let mut feed = Events::new(get(&gw, "/ui/events", &[]).await);
    let backlog = feed.until("requests", |v| v.is_array()).await;
    let shown: Vec<&str> = backlog.as_array().expect("array").iter().filter_map(|r| r["id"].as_str()).collect();
    let newest: Vec<&str> = ids.iter().rev().take(200).map(String::as_str).collect();
    assert_eq!(shown, newest, "the last 200, newest first");
    // The ring keeps REQUESTS summaries: the oldest one is gone, the next still there.
    let gone = get(&gw, &format!("/admin/requests/{}", ids[0]), &[]).await;
    assert_eq!(gone.status(), 404, "the oldest request left the ring");
    let kept = details(&gw, &ids[1]).await;
    assert_eq!(kept["id"], ids[1].as_str());
    // Captures are fewer (CAPTURES bodies): the oldest captured request still has its summary,
    // its body is gone; the newest captured one has its body.
    assert_eq!(kept["captured"], true, "{kept}");
    assert_eq!(kept["capture"], Value::Null, "only the last CAPTURES bodies are kept: {kept}");
    let last_captured = details(&gw, &ids[mlxgate::activity::CAPTURES + 1]).await;
    let body = last_captured["capture"]["body"].as_str().unwrap_or_else(|| panic!("{last_captured}"));
    assert!(body.contains(&format!("request {}", mlxgate::activity::CAPTURES + 1)), "{body}");
    assert_eq!(get(&gw, "/admin/requests/req_0000nothing", &[]).await.status(), 404);
}

#[tokio::test]
async fn a_log_feed_is_for_managed_backends_and_marks_a_crash_and_its_restart() {
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), "")).await;
    for path in ["/ui/events/logs/local", "/ui/events/logs/nothing"] {
        let (status, text) = status_and_text(get(&gw, path, &[]).await).await;
        assert_eq!(status, 404, "{path}: {text}");
    }
    let r = post(&gw, "/v1/chat/completions", &json!({"model": "a", "messages": [{"role": "user", "content": "hi"}]}))
        .await;
    assert_eq!(r.status(), 200);
    let mut feed = Events::new(get(&gw, "/ui/events/logs/a", &[]).await);
    let lines = feed.all_until("line", |l| l["mark"] == "ready").await;
    let marks: Vec<&Value> = lines.iter().map(|l| &l["mark"]).collect();
    assert_eq!(marks.first().copied(), Some(&json!("start")), "the backlog from the start: {lines:?}");
    assert!(lines[0]["at"].as_u64().is_some_and(|at| at > 1_600_000_000_000), "epoch ms: {lines:?}");
    let plain: Vec<&str> = lines.iter().filter(|l| l["mark"].is_null()).filter_map(|l| l["text"].as_str()).collect();
    assert!(plain.iter().any(|t| t.contains("mlxgate-sim listening on")), "the server's own output: {lines:?}");
    let pid = backend_state(&gw, "a").await["pid"].as_u64().expect("pid");
    assert!(std::process::Command::new("kill").args(["-9", &pid.to_string()]).status().expect("kill").success());
    let exit = feed.until("line", |l| l["mark"] == "exit").await;
    assert!(exit["text"].as_str().is_some_and(|t| t.contains('9')), "the signal is said: {exit}");
    feed.until("line", |l| l["mark"] == "start").await;
    feed.until("line", |l| l["mark"] == "ready").await;
}

#[tokio::test]
async fn an_open_page_does_not_hold_the_gateway_at_shutdown() {
    // A page left open (its feeds never end by themselves) must not keep a SIGTERM'd gateway
    // waiting for the whole shutdown grace, which is here longer than the test's patience.
    let sim = sim().await;
    let config = format!(
        "shutdown_grace: 300s\nbackends:\n  local: {{url: '{}'}}\nmodels:\n  qwen: {{backend: local}}\n",
        sim.url()
    );
    let gateway = gateway_binary(&config, None);
    let activity = client().get(format!("{}/ui/events", gateway.url)).send().await.expect("feed");
    assert_eq!(activity.status(), 200);
    let mut feed = Events::new(activity);
    feed.until("state", |_| true).await;
    let pid = gateway.child.id().to_string();
    assert!(std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill").success());
    let ended = tokio::time::timeout(PATIENCE, async { while let Ok(Some(_)) = feed.response.chunk().await {} }).await;
    assert!(ended.is_ok(), "the feed went on after SIGTERM");
    let status = tokio::time::timeout(PATIENCE, gateway.exit_status()).await.expect("the gateway exits");
    assert!(status.success(), "{status:?}");
}

// ---- Reload from the page: checked first, then applied ----

/// A gateway run from a file the test rewrites (`mlxgate serve --config FILE`).
struct FileGateway {
    dir: tempfile::TempDir,
    gateway: GatewayBinary,
    _log: LogLines,
}

impl FileGateway {
    fn start(text: &str) -> FileGateway {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = FileGateway::write_in(dir.path(), text);
        let (gateway, log) = gateway_binary_at(&file, &[("XDG_RUNTIME_DIR", &dir.path().display().to_string())]);
        FileGateway { dir, gateway, _log: log }
    }

    fn write_in(dir: &std::path::Path, text: &str) -> std::path::PathBuf {
        let file = dir.join("gateway.yaml");
        let partial = dir.join("gateway.yaml.partial");
        std::fs::write(&partial, format!("listen: 127.0.0.1:0\n{text}")).expect("write");
        std::fs::rename(&partial, &file).expect("rename");
        file
    }

    fn write(&self, text: &str) {
        FileGateway::write_in(self.dir.path(), text);
    }

    fn file(&self) -> String {
        self.dir.path().join("gateway.yaml").display().to_string()
    }

    async fn reload(&self, dry_run: bool, headers: &[(&str, &str)]) -> (u16, Value) {
        let path = if dry_run { "/admin/reload?dry_run=true" } else { "/admin/reload" };
        let mut request = client().post(format!("{}{path}", self.gateway.url));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let r = request.send().await.expect("send");
        let status = r.status().as_u16();
        let text = r.text().await.expect("text");
        (status, serde_json::from_str(&text).unwrap_or_else(|_| panic!("{path}: not JSON: {text}")))
    }

    async fn chat_status(&self, key: &str) -> u16 {
        let body = json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]});
        let r = client().post(format!("{}/v1/chat/completions", self.gateway.url)).bearer_auth(key).json(&body);
        r.send().await.expect("send").status().as_u16()
    }
}

fn reload_yaml(sim_url: &str, client_key: &str, extra_model: bool, top: &str) -> String {
    let other = if extra_model { "  other: {backend: local}\n" } else { "" };
    format!(
        "{top}backends:\n  local: {{url: '{sim_url}'}}\nmodels:\n  qwen: {{backend: local}}\n{other}\
         clients:\n  aider: {{key_sha256: {}}}\n",
        sha256_hex(client_key)
    )
}

fn names(list: &Value) -> Vec<&str> {
    list.as_array().map(|l| l.iter().filter_map(Value::as_str).collect()).unwrap_or_default()
}

#[tokio::test]
async fn a_reload_is_checked_first_and_says_what_applies_now_and_what_needs_a_restart() {
    let (old_key, new_key) = ("sk-aider-old-6d2e0c9b71a4f358", "sk-aider-new-90a7c3e1f5b26d48");
    let sim = sim().await;
    let gw = FileGateway::start(&reload_yaml(&sim.url(), old_key, false, ""));

    let (status, check) = gw.reload(true, &[]).await;
    assert_eq!(status, 200, "{check}");
    assert_eq!(check["ok"], true, "{check}");
    assert_eq!(check["applied"], false, "{check}");
    assert_eq!(check["problems"], json!([]), "{check}");
    assert_eq!(check["config"], gw.file().as_str(), "the file it read: {check}");
    assert!(names(&check["applies_now"]).is_empty() && names(&check["needs_restart"]).is_empty(), "unchanged: {check}");

    // A new key for the client (applies now) and a new model (needs a restart).
    gw.write(&reload_yaml(&sim.url(), new_key, true, ""));
    let (status, check) = gw.reload(true, &[]).await;
    assert_eq!(status, 200, "{check}");
    assert_eq!(check["applied"], false, "{check}");
    assert!(names(&check["applies_now"]).contains(&"clients"), "{check}");
    assert!(names(&check["needs_restart"]).contains(&"models"), "{check}");
    assert_eq!((gw.chat_status(old_key).await, gw.chat_status(new_key).await), (200, 401), "a check changes nothing");

    let (status, applied) = gw.reload(false, &[]).await;
    assert_eq!(status, 200, "{applied}");
    assert_eq!(applied["applied"], true, "{applied}");
    assert_eq!((gw.chat_status(old_key).await, gw.chat_status(new_key).await), (401, 200), "applied");

    // A file with a problem: named with its path, nothing applied, even when asked to apply.
    gw.write(&format!(
        "backends:\n  local: {{url: '{}'}}\nmodels:\n  qwen: {{backend: nowhere}}\nclients:\n  aider: {{key_sha256: {}}}\n",
        sim.url(),
        sha256_hex(old_key)
    ));
    for dry_run in [true, false] {
        let (status, check) = gw.reload(dry_run, &[]).await;
        assert_eq!(status, 422, "{check}");
        assert_eq!(check["ok"], false, "{check}");
        assert_eq!(check["applied"], false, "{check}");
        let problems = names(&check["problems"]);
        assert!(problems.iter().any(|p| p.starts_with("models.qwen.backend")), "{check}");
    }
    assert_eq!((gw.chat_status(old_key).await, gw.chat_status(new_key).await), (401, 200), "nothing applied");
}

#[tokio::test]
async fn a_new_admin_key_ends_every_session() {
    let (first, second) = ("sk-admin-first-3e8d1a07c6b95f24", "sk-admin-second-b2f64c0e9d17a358");
    let client_key = "sk-aider-1c5f9e2a8b3d7064";
    let sim = sim().await;
    let top = |admin: &str| format!("admin_key_sha256: {}\n", sha256_hex(admin));
    let gw = FileGateway::start(&reload_yaml(&sim.url(), client_key, false, &top(first)));
    let url = |path: &str| format!("{}{path}", gw.gateway.url);
    let login = client().post(url("/ui/login")).json(&json!({"key": first})).send().await.expect("send");
    assert_eq!(login.status(), 204);
    let cookie = parse_set_cookie(login.headers().get("set-cookie").expect("cookie").to_str().expect("ascii")).0;
    let page = |cookie: String| async move {
        client().get(url("/ui")).header("cookie", cookie).send().await.expect("send").status().as_u16()
    };
    assert_eq!(page(cookie.clone()).await, 200);

    gw.write(&reload_yaml(&sim.url(), client_key, false, &top(second)));
    let (status, applied) = gw.reload(false, &[("cookie", &cookie)]).await;
    assert_eq!(status, 200, "the page's Apply, on its session: {applied}");
    assert!(names(&applied["applies_now"]).contains(&"admin_key_sha256"), "{applied}");
    assert_eq!(page(cookie.clone()).await, 401, "the session of the old key is over");
    let login = client().post(url("/ui/login")).json(&json!({"key": second})).send().await.expect("send");
    assert_eq!(login.status(), 204, "the new key signs in");
}

// ---- The feed over random schedules ----

/// One step of a schedule: requests started (not awaited), a page opening the feed, or a pause.
#[derive(Debug, Clone)]
enum Step {
    Requests(usize),
    Open,
    Pause(u64),
}

fn step() -> impl proptest::strategy::Strategy<Value = Step> {
    use proptest::prelude::*;
    prop_oneof![
        3 => (1usize..4).prop_map(Step::Requests),
        2 => Just(Step::Open),
        1 => (0u64..4).prop_map(Step::Pause),
    ]
}

/// Runs `steps` against a fresh gateway: requests finish while pages open the feed. Every page
/// must see every request exactly once — in its backlog or as a live `request` event — whatever
/// the order of finishing and opening (the backlog's 200 is never reached here).
async fn every_page_sees_every_request_once(steps: Vec<Step>) -> Result<(), String> {
    let fast = mlxgate::sim::Behaviour { ttft_ms: Some(0), tokens: Some(1), ..Default::default() };
    let sim = sim_with(fast).await;
    let gw =
        gateway(&format!("backends:\n  local: {{url: '{}'}}\nmodels:\n  qwen: {{backend: local}}\n", sim.url())).await;
    let url = gw.url("/v1/chat/completions");
    let mut running = tokio::task::JoinSet::new();
    let mut pages = vec![];
    for step in steps {
        match step {
            Step::Requests(n) => {
                for _ in 0..n {
                    let url = url.clone();
                    running.spawn(async move {
                        let body = json!({"model": "qwen", "messages": [{"role": "user", "content": "hi"}]});
                        let r = client().post(url).json(&body).send().await.expect("send");
                        assert_eq!(r.status(), 200);
                        r.headers().get("x-request-id").expect("id").to_str().expect("ascii").to_string()
                    });
                }
            }
            Step::Open => {
                let mut page = Events::new(get(&gw, "/ui/events", &[]).await);
                let backlog = page.until("requests", |v| v.is_array()).await;
                let seen: Vec<String> = backlog
                    .as_array()
                    .expect("array")
                    .iter()
                    .filter_map(|r| r["id"].as_str().map(String::from))
                    .collect();
                pages.push((page, seen));
            }
            Step::Pause(ms) => tokio::time::sleep(std::time::Duration::from_millis(ms)).await,
        }
    }
    let mut sent = std::collections::HashSet::new();
    while let Some(id) = running.join_next().await {
        sent.insert(id.expect("request task"));
    }
    for (n, (page, seen)) in pages.iter_mut().enumerate() {
        while seen.iter().collect::<std::collections::HashSet<_>>().len() < sent.len() {
            let (event, data) = page.next().await;
            if event == "request" {
                let summary: Value = serde_json::from_str(&data).expect("json");
                seen.push(summary["id"].as_str().expect("id").to_string());
            }
        }
        let unique: std::collections::HashSet<&String> = seen.iter().collect();
        if unique.len() != seen.len() {
            return Err(format!("page {n} saw a request twice: {seen:?}"));
        }
        if unique.len() != sent.len() || seen.iter().any(|id| !sent.contains(id)) {
            return Err(format!("page {n} saw {seen:?}, sent {sent:?}"));
        }
    }
    Ok(())
}

#[test]
fn over_random_schedules_every_page_sees_every_request_exactly_once() {
    use proptest::prelude::*;
    let config = ProptestConfig { cases: 24, failure_persistence: None, ..ProptestConfig::default() };
    proptest!(config, |(steps in proptest::collection::vec(step(), 1..24))| {
        let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let outcome = runtime.block_on(every_page_sees_every_request_once(steps));
        prop_assert!(outcome.is_ok(), "{}", outcome.unwrap_err());
    });
}

#[tokio::test]
async fn a_session_is_held_to_the_gateways_names_and_admin_hosts_adds_one() {
    let sim = sim().await;
    for (listed, expected) in [(false, 403), (true, 200)] {
        let top = format!("{}{}", with_admin_key(), if listed { "admin_hosts: [gpu-box.lan]\n" } else { "" });
        let gw = gateway(&yaml(&sim.url(), &top)).await;
        let login = post_with(&gw, "/ui/login", &json!({"key": ADMIN_KEY}), &[]).await;
        assert_eq!(login.status(), 204);
        let cookie = parse_set_cookie(login.headers().get("set-cookie").expect("cookie").to_str().expect("ascii")).0;
        let host = format!("gpu-box.lan:{}", gw.addr.port());
        for path in ["/ui", "/ui/events"] {
            let r = get(&gw, path, &[("cookie", &cookie), ("host", &host)]).await;
            assert_eq!(r.status(), expected, "{path} by the name {host}, listed in admin_hosts: {listed}");
        }
        // The key itself is no browser's doing: any name.
        let bearer = format!("Bearer {ADMIN_KEY}");
        let r = get(&gw, "/admin/backends", &[("authorization", &bearer), ("host", &host)]).await;
        assert_eq!(r.status(), 200, "the admin key by any name");
    }
}

#[tokio::test]
async fn sign_in_and_sign_out_are_204s_without_a_body() {
    // RFC 9110 §8.6: no Content-Length (other than 0) and no body on a 204.
    let sim = sim().await;
    let gw = gateway(&yaml(&sim.url(), &with_admin_key())).await;
    let login = post_with(&gw, "/ui/login", &json!({"key": ADMIN_KEY}), &[]).await;
    let cookie = parse_set_cookie(login.headers().get("set-cookie").expect("cookie").to_str().expect("ascii")).0;
    let logout = post_with(&gw, "/ui/logout", &json!({}), &[("cookie", &cookie)]).await;
    for (what, r) in [("sign-in", login), ("sign-out", logout)] {
        assert_eq!(r.status(), 204, "{what}");
        let length = r.headers().get("content-length").map(|v| v.to_str().unwrap_or("?").to_string());
        assert!(length.as_deref().is_none_or(|l| l == "0"), "{what}: a 204 with Content-Length {length:?}");
        assert!(r.text().await.expect("body").is_empty(), "{what}: a 204 with a body");
    }
}

#[test]
fn over_random_names_and_ports_only_the_gateways_own_origin_and_names_pass() {
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let machine = nix::unistd::gethostname().ok().and_then(|n| n.into_string().ok()).unwrap_or_default().to_lowercase();
    let (_sim, gw) = runtime.block_on(async {
        let sim = sim().await;
        let gw = gateway(&yaml(&sim.url(), "")).await;
        (sim, gw)
    });
    let port = gw.addr.port();
    // A DNS name (labels of letters, digits and hyphens), a port, and whether the Origin's
    // scheme is http.
    let name = "[a-z][a-z0-9-]{0,10}(\\.[a-z][a-z0-9]{0,6}){0,3}";
    let origin_port = prop_oneof![Just(Some(port)), proptest::option::of(1u16..65535)];
    let strategy = (name, origin_port, any::<bool>());
    let mut runner = TestRunner::new(Config { cases: 128, failure_persistence: None, ..Config::default() });
    let outcome = runner.run(&strategy, |(name, origin_port, http)| {
        let foreign = name != "localhost"
            && !name.ends_with(".localhost")
            && name != machine
            && name.strip_suffix(".local") != Some(machine.as_str());
        let (host_status, origin_status) = runtime.block_on(async {
            let host = format!("{name}:{port}");
            let page = get(&gw, "/ui", &[("host", &host)]).await.status().as_u16();
            let scheme = if http { "http" } else { "https" };
            let origin = match origin_port {
                Some(p) => format!("{scheme}://127.0.0.1:{p}"),
                None => format!("{scheme}://{name}"),
            };
            let drain = post_with(&gw, "/admin/backends/local/undrain", &json!({}), &[("origin", &origin)]).await;
            (page, drain.status().as_u16())
        });
        prop_assert_eq!(host_status, if foreign { 403 } else { 200 }, "Host {}:{}", name, port);
        // (`https://` on the gateway's own port is left open: only a TLS proxy in front has it.)
        if http || origin_port != Some(port) {
            let same = origin_port == Some(port);
            prop_assert_eq!(origin_status, if same { 200 } else { 403 }, "Origin port {:?} http {}", origin_port, http);
        }
        Ok(())
    });
    if let Err(e) = outcome {
        panic!("{e}");
    }
}

/// Reads `feed` to its end; whether it ended within `PATIENCE` (a bound, not a timing).
async fn ends(feed: &mut Events) -> bool {
    tokio::time::timeout(PATIENCE, async { while let Ok(Some(_)) = feed.response.chunk().await {} }).await.is_ok()
}

#[tokio::test]
async fn a_feed_ends_with_the_session_it_was_opened_on() {
    // A session is checked when a feed opens; a feed then streams for as long as the page stays.
    // Signing out, or a new admin key (changed because the old one leaked), must end the feeds
    // of that session too, the backends' logs (which may hold prompts) first of all.
    let (first, second) = ("sk-admin-first-7a0c5e2d9b14f386", "sk-admin-second-4f8b2d6e0a93c175");
    let sim = sim().await;
    let top = |admin: &str| format!("admin_key_sha256: {}\n", sha256_hex(admin));
    let gw = FileGateway::start(&yaml(&sim.url(), &top(first)));
    let url = |path: &str| format!("{}{path}", gw.gateway.url);
    let sign_in = || async {
        let login = client().post(url("/ui/login")).json(&json!({"key": first})).send().await.expect("send");
        assert_eq!(login.status(), 204);
        parse_set_cookie(login.headers().get("set-cookie").expect("cookie").to_str().expect("ascii")).0
    };
    let open = |cookie: String, path: &'static str| async move {
        let r = client().get(url(path)).header("cookie", cookie).send().await.expect("send");
        assert_eq!(r.status(), 200, "{path}");
        Events::new(r)
    };

    let cookie = sign_in().await;
    let mut activity = open(cookie.clone(), "/ui/events").await;
    activity.until("state", |_| true).await;
    let mut logs = open(cookie.clone(), "/ui/events/logs/a").await;
    let logout = client().post(url("/ui/logout")).header("cookie", &cookie).send().await.expect("send");
    assert_eq!(logout.status(), 204);
    assert!(ends(&mut activity).await, "the activity feed went on after signing out");
    assert!(ends(&mut logs).await, "the log feed went on after signing out");

    let cookie = sign_in().await;
    let mut activity = open(cookie.clone(), "/ui/events").await;
    activity.until("state", |_| true).await;
    gw.write(&yaml(&sim.url(), &top(second)));
    let (status, applied) = gw.reload(false, &[("authorization", &format!("Bearer {first}"))]).await;
    assert_eq!(status, 200, "{applied}");
    assert!(ends(&mut activity).await, "the feed of the old key's session went on after the key changed");
}

#[tokio::test]
async fn a_managed_backends_environment_reaches_neither_the_feeds_nor_the_admin_api() {
    // `env:` is where a server's tokens go (HF_TOKEN); the page shows a backend, never its env.
    const SECRET: &str = "hf_secretTOKEN4b1d9e7c20a58f36";
    let port = free_port();
    let gw = gateway(&format!(
        "backends:\n  a:\n    kind: custom\n    command: ['{SIM}', '--port', '{{port}}', '--style', 'mlx-lm']\n    \
         port: {port}\n    env: {{HF_TOKEN: {SECRET}}}\nmodels:\n  a: {{backend: a, max_wait: 120s}}\n"
    ))
    .await;
    let body = json!({"model": "a", "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post(&gw, "/v1/chat/completions", &body).await.status(), 200);
    let mut state = Events::new(get(&gw, "/ui/events", &[]).await);
    state.until("state", |s| s["backends"][0]["state"] == "ready").await;
    let mut logs = Events::new(get(&gw, "/ui/events/logs/a", &[]).await);
    logs.until("line", |l| l["mark"] == "ready").await;
    let admin = [
        get(&gw, "/admin/backends", &[]).await.text().await.expect("text"),
        get(&gw, "/admin/state", &[]).await.text().await.expect("text"),
        get(&gw, "/admin/backends/a/logs", &[]).await.text().await.expect("text"),
    ];
    for text in [&state.seen, &logs.seen].into_iter().chain(admin.iter()) {
        assert!(!text.contains(SECRET), "a backend's env is shown: {text}");
    }
}
