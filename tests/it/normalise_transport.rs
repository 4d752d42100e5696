//! The transport, concurrency, request-shaping and model-name normalisations (issue 12), each
//! against the server that needs it: a pooled connection idle past the server's keep-alive is
//! never reused (mlxgate-sim closing idle connections at their worst, and real uvicorn under
//! mlx-openai-server), Rapid-MLX gets a loopback `Host` and no `Origin`, vllm-mlx without
//! `--continuous-batching` is served one request at a time and its "busy" answers are sent again,
//! `stream_options` is not sent to a server that refuses it, and mlx_lm.server only ever sees the
//! configured model name. The real servers come from the venvs `scripts/setup-backends` builds
//! (see `prerequisites`).

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use mlxgate::sim::{self, SimConfig};
use serde_json::{Value, json};

fn ask(model: &str, stream: bool, max_tokens: u32) -> Value {
    json!({"model": model, "stream": stream, "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": "hello there"}]})
}

/// Status and body of a chat request through the gateway.
async fn chat_through(gw: &Gateway, body: &Value, headers: &[(&str, &str)]) -> (u16, String) {
    let mut request = client().post(gw.url("/v1/chat/completions")).json(body);
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let r = request.send().await.expect("send");
    let status = r.status().as_u16();
    (status, text_of(r).await)
}

/// A managed backend stanza with one slot and the server's own environment.
fn managed(name: &str, kind: &str, model: &Path, port: u16, extra: &str) -> String {
    format!(
        "  {name}:\n    kind: {kind}\n    model: '{}'\n    venv: '{ROOT}/.venv-{kind}'\n    port: {port}\n    \
         stop_timeout: 10s\n    ready: {{timeout: 180s}}\n{extra}",
        model.display()
    )
}

/// The text a stream generated (every `delta.content`), and whether it carried an error event.
fn streamed(text: &str) -> (String, bool) {
    let mut content = String::new();
    let mut error = false;
    for data in data_lines(text) {
        let Ok(v) = serde_json::from_str::<Value>(&data) else { continue };
        error |= v.get("error").is_some();
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            content.push_str(c);
        }
    }
    (content, error)
}

// ---- pool_idle_timeout ----

/// The simulator closes a keep-alive connection idle 1 s when the next request arrives on it,
/// unanswered: the race of a server closing an idle connection as a request comes, made
/// deterministic. With `pool_idle_timeout` below that, requests spaced past it all succeed; with
/// it above (60 s), the second one goes out on the stale connection and fails — the contrast
/// shows this test catches a reused stale connection. The pause between the two requests is the
/// idle time under test, not a synchronisation.
#[tokio::test]
async fn a_connection_idle_past_the_servers_keep_alive_is_never_reused() {
    let idle_close = Duration::from_secs(1);
    let s = sim::spawn(SimConfig { idle_close: Some(idle_close), ..Default::default() }).await.expect("sim");
    let gw = gateway(&format!(
        "backends:\n  fresh: {{url: '{0}', normalise: {{pool_idle_timeout: 500ms}}}}\n  \
         stale: {{url: '{0}', normalise: {{pool_idle_timeout: 60s}}}}\n\
         models:\n  f: {{backend: fresh, upstream_model: tiny}}\n  s: {{backend: stale, upstream_model: tiny}}\n",
        s.url()
    ))
    .await;
    let mut seen = Vec::new();
    for model in ["f", "s"] {
        for _ in 0..2 {
            let (status, text) = chat_through(&gw, &ask(model, false, 4), &[]).await;
            seen.push((model, status, text));
            tokio::time::sleep(idle_close + Duration::from_millis(300)).await;
        }
    }
    let statuses: Vec<(&str, u16)> = seen.iter().map(|(m, s, _)| (*m, *s)).collect();
    assert_eq!(statuses, [("f", 200), ("f", 200), ("s", 200), ("s", 502)], "{seen:#?}");
    assert!(seen[3].2.contains("failed before a response"), "{}", seen[3].2);
}

/// Requests through the gateway to a real uvicorn server (mlx-openai-server, which closes a
/// keep-alive connection idle 5 s) spaced at about that idle close all succeed: the kind's
/// pool idle timeout (4 s) never reuses a connection the server is closing.
///
/// By hand: `MLXGATE_TEST_POOL_IDLE_TIMEOUT=60s MLXGATE_TEST_SPACINGS_MS=4990,5000,5010,...`
/// sends them with the pool idle timeout above the server's (a stale connection can be reused;
/// the race is a matter of milliseconds, so it fails only now and then).
#[tokio::test]
async fn requests_spaced_at_uvicorns_idle_close_all_succeed_real() {
    const KIND: &str = "mlx-openai-server";
    let Some(model) = prerequisites(&[KIND, "mlx-lm"]) else { return };
    let normalise = std::env::var("MLXGATE_TEST_POOL_IDLE_TIMEOUT")
        .map_or(String::new(), |t| format!("    normalise: {{pool_idle_timeout: {t}}}\n"));
    let spacings: Vec<f64> = std::env::var("MLXGATE_TEST_SPACINGS_MS")
        .ok()
        .map(|s| s.split(',').filter_map(|n| n.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![4950.0, 5000.0, 5050.0]);
    let gw = gateway(&config(&[managed("o", KIND, &model, free_port(), &normalise)], &[("m", "o")], "")).await;
    let (status, text) = chat_through(&gw, &ask("m", true, 2), &[]).await;
    assert_eq!(status, 200, "{text}");
    let mut failed = Vec::new();
    for spacing in &spacings {
        tokio::time::sleep(Duration::from_secs_f64(spacing / 1000.0)).await;
        let (status, text) = chat_through(&gw, &ask("m", true, 2), &[]).await;
        if status != 200 || !text.contains("data: [DONE]") {
            failed.push(format!("after {spacing} ms idle: {status} {text}"));
        }
    }
    assert!(failed.is_empty(), "{} of {} failed:\n{}", failed.len(), spacings.len(), failed.join("\n"));
}

// ---- stream_options ----

/// A server that refuses `stream_options` (422) is never sent it, not even the client's, with
/// `normalise.stream_options: false`: the stream completes, without usage, and is counted as a
/// stream whose tokens are unknown. The same server as a backend with the switch left on refuses
/// the request (the switch is what makes it work).
#[tokio::test]
async fn stream_options_are_not_sent_to_a_server_that_refuses_them() {
    let s = sim::spawn(SimConfig { refuse_stream_options: true, ..Default::default() }).await.expect("sim");
    let gw = gateway(&format!(
        "backends:\n  strict: {{url: '{0}', normalise: {{stream_options: false}}}}\n  lax: {{url: '{0}'}}\n\
         models:\n  s: {{backend: strict, upstream_model: tiny}}\n  l: {{backend: lax, upstream_model: tiny}}\n",
        s.url()
    ))
    .await;
    let mut body = ask("s", true, 4);
    body["stream_options"] = json!({"include_usage": true});
    let (status, text) = chat_through(&gw, &body, &[]).await;
    assert_eq!(status, 200, "{text}");
    assert!(text.contains("data: [DONE]"), "{text}");
    assert!(!text.contains("\"usage\""), "the server sent no usage: {text}");
    let sent = sim_requests(&s).await;
    assert!(sent.last().is_some_and(|r| r.get("stream_options").is_none()), "{sent:?}");
    let unknown = "mlxgate_generation_tokens_unknown_total{backend=\"strict\",client=\"anonymous\",model=\"s\"}";
    assert_eq!(metric(&gw, unknown).await, Some(1.0), "metered without usage");
    // A whole answer whose client sends stream_options anyway (some SDKs always do).
    let mut whole = ask("s", false, 4);
    whole["stream_options"] = json!({"include_usage": true});
    let (status, text) = chat_through(&gw, &whole, &[]).await;
    assert_eq!(status, 200, "stream_options removed from a whole answer's request too: {text}");
    let (status, text) = chat_through(&gw, &ask("l", true, 4), &[]).await;
    assert_eq!(status, 422, "the gateway asks for usage when the switch is on: {text}");
}

// ---- loopback_host ----

/// A name for this machine that is not one Rapid-MLX trusts (localhost, 127.0.0.1, [::1]) but
/// reaches a server listening on 127.0.0.1: the host name when it resolves to loopback, else the
/// IPv4-mapped IPv6 address of 127.0.0.1.
fn untrusted_loopback_name() -> String {
    use std::net::ToSocketAddrs;
    let hostname = std::fs::read_to_string("/etc/hostname").unwrap_or_default().trim().to_string();
    let loopback = !hostname.is_empty()
        && !hostname.contains("localhost")
        && (hostname.as_str(), 80).to_socket_addrs().is_ok_and(|mut a| a.all(|a| a.ip().is_loopback()));
    if loopback { hostname } else { "[::ffff:127.0.0.1]".into() }
}

/// Rapid-MLX answers 400 to a Host it does not trust and 403 to any Origin. Through the gateway
/// a client's request with `Origin: http://localhost:3000` (a browser UI) gets 200 from the
/// managed server and from the same server named by a non-loopback name in a `url:` backend of
/// kind rapid-mlx; with `loopback_host: false` the same requests get 403 (Origin forwarded) and
/// 400 (the URL's Host forwarded).
#[tokio::test]
async fn rapid_mlx_gets_a_loopback_host_and_no_origin_real() {
    const KIND: &str = "rapid-mlx";
    let Some(model) = prerequisites(&[KIND, "mlx-lm"]) else { return };
    let port = free_port();
    let name = untrusted_loopback_name();
    let upstream = model.display().to_string();
    let url = |host: &str, extra: &str| {
        format!("  {{url: 'http://{host}:{port}', kind: {KIND}, max_concurrency: 1{extra}}}\n")
    };
    let off = ", normalise: {loopback_host: false}";
    let backends = [
        managed("managed", KIND, &model, port, ""),
        format!("  by_name:{}", url(&name, "")),
        format!("  by_name_off:{}", url(&name, off)),
        format!("  loopback_off:{}", url("127.0.0.1", off)),
    ];
    let models: String = ["managed", "by_name", "by_name_off", "loopback_off"]
        .iter()
        .map(|b| format!("  {b}: {{backend: {b}, upstream_model: '{upstream}', max_wait: 300s}}\n"))
        .collect();
    let gw = gateway(&format!("backends:\n{}models:\n{models}", backends.concat())).await;
    let origin = [("origin", "http://localhost:3000"), ("referer", "http://localhost:3000/chat")];
    let mut got = Vec::new();
    for model in ["managed", "by_name", "by_name_off", "loopback_off"] {
        let (status, text) = chat_through(&gw, &ask(model, true, 3), &origin).await;
        got.push((model, status, text));
    }
    let statuses: Vec<(&str, u16)> = got.iter().map(|(m, s, _)| (*m, *s)).collect();
    assert_eq!(
        statuses,
        [("managed", 200), ("by_name", 200), ("by_name_off", 400), ("loopback_off", 403)],
        "{name}: {got:#?}"
    );
    assert!(got[0].2.contains("data: [DONE]") && got[1].2.contains("data: [DONE]"), "{got:#?}");
    assert!(got[2].2.contains("Invalid host header"), "{}", got[2].2);
    assert!(got[3].2.contains("Cross-origin requests disabled"), "{}", got[3].2);
}

// ---- serialize ----

/// vllm-mlx in simple mode (no `--continuous-batching`) answers a second concurrent stream 200
/// and then an error event, and stays busy a moment after a client aborts a stream (a next
/// request, even a sequential one, gets the same). Through the gateway (serialize: one at a
/// time, a busy answer sent again): two concurrent streams both generate with no error event,
/// and a request sent right after an aborted stream, several times over, succeeds.
#[tokio::test]
async fn vllm_mlx_serves_concurrent_streams_and_the_request_after_an_abort_real() {
    const KIND: &str = "vllm-mlx";
    let Some(model) = prerequisites(&[KIND, "mlx-lm"]) else { return };
    let gw = gateway(&config(&[managed("v", KIND, &model, free_port(), "")], &[("m", "v")], "")).await;
    let (status, text) = chat_through(&gw, &ask("m", true, 2), &[]).await;
    assert_eq!(status, 200, "warm: {text}");
    let body = ask("m", true, 8);
    let (a, b) = tokio::join!(chat_through(&gw, &body, &[]), chat_through(&gw, &body, &[]));
    for (status, text) in [&a, &b] {
        let (content, error) = streamed(text);
        assert_eq!(*status, 200, "{text}");
        assert!(!error && !content.is_empty() && text.contains("data: [DONE]"), "{text}");
    }
    for round in 0..5 {
        let mut r = post(&gw, "/v1/chat/completions", &ask("m", true, 2000)).await;
        assert_eq!(r.status(), 200);
        // A few tokens in, the client leaves.
        let mut seen = String::new();
        while seen.matches("\"content\"").count() < 3 {
            let chunk = r.chunk().await.expect("read").expect("more of the stream");
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
        drop(r);
        let (status, text) = chat_through(&gw, &ask("m", true, 4), &[]).await;
        let (content, error) = streamed(&text);
        assert!(status == 200 && !error && !content.is_empty(), "round {round}, right after an abort: {status} {text}");
    }
}

// ---- model names ----

/// mlx_lm.server drops its model and looks a name it does not know up on the Hub. The gateway
/// sends it only the configured upstream name (the model's path), never the public one (the
/// answer's `model`, which mlx_lm echoes, is put back to the public name for the client), and a
/// request for a name the gateway does not serve is the gateway's 404, never the server's.
#[tokio::test]
async fn mlx_lm_only_ever_sees_the_configured_model_name_real() {
    const KIND: &str = "mlx-lm";
    let Some(model) = prerequisites(&[KIND]) else { return };
    let hub = tempfile::tempdir().expect("hub cache");
    let env = format!("    env: {{HF_HUB_CACHE: '{}'}}\n", hub.path().display());
    let gw = gateway(&config(&[managed("n", KIND, &model, free_port(), &env)], &[("qwen", "n")], "")).await;
    for stream in [false, true, false] {
        let (status, text) = chat_through(&gw, &ask("qwen", stream, 3), &[]).await;
        assert_eq!(status, 200, "{text}");
        let answered = if stream {
            data_lines(&text).first().and_then(|d| serde_json::from_str::<Value>(d).ok()).unwrap_or_default()
        } else {
            serde_json::from_str(&text).expect("json")
        };
        // Served at all: the server was asked for the path (a name it does not know is looked up
        // on the Hub, in an empty cache here, and fails); the client sees its own name.
        assert_eq!(answered["model"], "qwen", "the answer names the public model: {text}");
        assert!(!text.contains(&model.display().to_string()), "the path never reaches the client: {text}");
        if stream {
            continue;
        }
        let (status, text) = chat_through(&gw, &ask("no-such-model-xyz", false, 3), &[]).await;
        let error: Value = serde_json::from_str(&text).expect("json");
        assert_eq!((status, &error["error"]["code"]), (404, &json!("model_not_found")), "{text}");
        assert!(!text.contains("Hub"), "the gateway answered, not the server: {text}");
    }
    let series = "mlxgate_requests_total{backend=\"n\",client=\"anonymous\",model=\"qwen\",outcome=\"ok\"}";
    assert_eq!(metric(&gw, series).await, Some(3.0));
}

/// serialize's busy retry sends a request again only when the backend's previous request ended
/// just before (vllm-mlx's route stays busy ~0.1 s then): on a backend idle since long, the same
/// error event is a real failure and reaches the client after one attempt.
#[tokio::test]
async fn an_error_event_on_an_idle_serialized_backend_is_not_sent_again() {
    let sim = sim().await;
    let yaml = format!(
        "backends:\n  v: {{url: '{}', normalise: {{serialize: true}}}}\nmodels:\n  m: {{backend: v}}\n",
        sim.url()
    );
    let gw = gateway(&yaml).await;
    let failing = json!({"model": "m", "stream": true, "max_tokens": 4,
        "messages": [{"role": "user", "content": "hi"}], "sim": {"error_after": 0, "style": "vllm-mlx"}});
    let total = |stats: serde_json::Value| stats["total"].as_u64().expect("total");
    // Idle: no request has ended on this backend yet.
    let text = text_of(post(&gw, "/v1/chat/completions", &failing).await).await;
    assert!(text.contains("simulated failure"), "{text}");
    assert_eq!(total(sim_stats(&sim).await), 1, "a real failure is sent once");
    // Idle for longer than the busy window after a request ended: sent once again.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    text_of(post(&gw, "/v1/chat/completions", &failing).await).await;
    assert_eq!(total(sim_stats(&sim).await), 2, "a real failure is sent once");
    // Right after a request that ended normally: sent once more (busy then is rare).
    let ok = json!({"model": "m", "stream": false, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(post(&gw, "/v1/chat/completions", &ok).await.status(), 200);
    let text = text_of(post(&gw, "/v1/chat/completions", &failing).await).await;
    assert!(text.contains("simulated failure"), "the last answer reaches the client: {text}");
    assert_eq!(total(sim_stats(&sim).await), 3 + 2, "one attempt and one more");
    // Right after a client aborted a stream (vllm-mlx stays busy ~0.1 s then): the whole schedule.
    let long = json!({"model": "m", "stream": true, "max_tokens": 1000, "messages": [{"role": "user", "content": "hi"}],
        "sim": {"tokens": 1000, "tokens_per_second": 50.0}});
    let mut aborted = post(&gw, "/v1/chat/completions", &long).await;
    read_until(&mut aborted, "\"content\"").await;
    drop(aborted);
    let text = text_of(post(&gw, "/v1/chat/completions", &failing).await).await;
    assert!(text.contains("simulated failure"), "the last answer reaches the client: {text}");
    assert_eq!(total(sim_stats(&sim).await), 6 + 5, "one attempt and four more after pauses");
}
