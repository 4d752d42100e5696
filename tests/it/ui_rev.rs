//! Hostile review of issue 23 (the `/ui` page): each test states what the page's admin side
//! should do and fails on `issue23` as reviewed (see the review report).

use std::net::SocketAddr;

use futures_util::StreamExt;
use serde_json::json;
use sha2::{Digest, Sha256};

use crate::common::*;

const ADMIN_KEY: &str = "the-admin-key";

fn keyed_yaml(url: &str) -> String {
    let digest: String = Sha256::digest(ADMIN_KEY.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
    format!("admin_key_sha256: '{digest}'\n{}", one_model_yaml(url, 4, 8))
}

async fn sign_in(gw_url: &str, key: &str, host: Option<&str>) -> (u16, Option<String>) {
    let mut request = client().post(format!("{gw_url}/ui/login")).json(&json!({"key": key}));
    if let Some(host) = host {
        request = request.header("host", host).header("origin", format!("http://{host}"));
    }
    let response = request.send().await.expect("send");
    let cookie = response
        .headers()
        .get("set-cookie")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::to_owned);
    (response.status().as_u16(), cookie)
}

/// A feed opened with a session must not outlive it: after sign-out (or an admin key changed by
/// a reload) the feed ends, as every other admin call with that cookie is refused.
#[tokio::test]
async fn a_feed_ends_when_its_session_ends() {
    let sim = sim().await;
    let gw = gateway(&keyed_yaml(&sim.url())).await;
    let (status, cookie) = sign_in(&gw.url(""), ADMIN_KEY, None).await;
    assert_eq!(status, 204);
    let cookie = cookie.expect("a session cookie");
    let mut feed = client().get(gw.url("/ui/events")).header("cookie", &cookie).send().await.expect("feed");
    assert_eq!(feed.status(), 200);
    read_until(&mut feed, "event: requests").await;
    let out = client().post(gw.url("/ui/logout")).header("cookie", &cookie).send().await.expect("logout");
    assert_eq!(out.status(), 204);
    let refused = client().get(gw.url("/admin/state")).header("cookie", &cookie).send().await.expect("state");
    assert_eq!(refused.status(), 401, "the session is over");
    let after = client()
        .post(gw.url("/v1/chat/completions"))
        .header("x-request-id", "after-sign-out")
        .json(&chat(false, json!({})))
        .send()
        .await
        .expect("chat");
    assert_eq!(after.status(), 200);
    // The feed must end (its body closes) rather than deliver what happened after sign-out.
    let mut body = feed.bytes_stream();
    let mut seen = String::new();
    let ended = tokio::time::timeout(PATIENCE, async {
        while let Some(chunk) = body.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk.expect("chunk")));
            if seen.contains("after-sign-out") {
                return false;
            }
        }
        true
    })
    .await;
    assert_eq!(ended, Ok(true), "the feed outlived its session and delivered: {seen}");
}

/// Ten wrong keys from one peer must not lock the admin out from another (today the throttle is
/// global: any peer that can reach the port keeps every sign-in refused with 10 requests a minute).
#[tokio::test]
async fn wrong_keys_from_one_peer_do_not_lock_out_another() {
    let Some(ip) = non_loopback_address() else {
        eprintln!("skipped: this machine has no non-loopback address to play the other peer");
        return;
    };
    let sim = sim().await;
    let gw = gateway_on(&keyed_yaml(&sim.url()), SocketAddr::from(([0, 0, 0, 0], 0))).await;
    let attacker = format!("http://{ip}:{}", gw.addr.port());
    for i in 0..11 {
        sign_in(&attacker, &format!("guess-{i}"), None).await;
    }
    let (status, cookie) = sign_in(&gw.url(""), ADMIN_KEY, None).await;
    assert_eq!((status, cookie.is_some()), (204, true), "the admin, from loopback, with the right key");
}

/// A sign-in through a name that is not the gateway's (a DNS rebinding: the page's own origin,
/// the attacker's name in Host) must be refused before it is counted as a failure.
#[tokio::test]
async fn a_sign_in_through_a_rebound_name_is_refused_and_not_counted() {
    let sim = sim().await;
    let gw = gateway(&keyed_yaml(&sim.url())).await;
    let rebound = format!("evil.example:{}", gw.addr.port());
    for i in 0..10 {
        let (status, _) = sign_in(&gw.url(""), &format!("guess-{i}"), Some(&rebound)).await;
        assert_eq!(status, 403, "a rebound name is not this gateway's");
    }
    let (status, _) = sign_in(&gw.url(""), ADMIN_KEY, None).await;
    assert_eq!(status, 204, "the admin is not locked out by a web page");
}
