//! A model of two backends balanced by its policy, against two simulators that keep
//! mlx_lm.server's prompt cache (an LRU of whole sequences, `cached_tokens` reported as the real
//! server does): `cache_aware` keeps each conversation on the backend that holds its prefix, so
//! every later turn finds its earlier prompt cached, while `round_robin` sends every other turn
//! to the backend that does not; the balancer's metrics show its decisions and how right its
//! index was.

use crate::common::*;
use mlxgate::sim::{self, Behaviour, SimConfig, SimHandle, Style};
use serde_json::{Value, json};

/// A simulator in mlx_lm.server's style keeping its prompt cache of 10 sequences, prefilling
/// an uncached token in half a millisecond (so that what a cache saves shows in the time to
/// first token, which the balancer learns its rates from).
async fn caching_sim() -> SimHandle {
    let defaults = Behaviour { style: Some(Style::MlxLm), prefill_ms_per_token: Some(0.5), ..Default::default() };
    sim::spawn(SimConfig { defaults, prompt_cache_size: Some(10), ..Default::default() }).await.expect("sim starts")
}

fn yaml(a: &str, b: &str, policy: &str) -> String {
    format!(
        "backends:\n  a: {{url: '{a}', max_concurrency: 2}}\n  b: {{url: '{b}', max_concurrency: 2}}\n\
         models:\n  qwen: {{backends: [a, b], upstream_model: tiny-qwen3, balance: {{policy: {policy}}}}}\n"
    )
}

/// Words the simulator counts one token each.
fn words(n: usize, seed: usize) -> String {
    (0..n).map(|i| format!("w{}", (i * 7 + seed) % 97)).collect::<Vec<_>>().join(" ")
}

/// Per turn of each conversation (three, four turns each, taken in turn): the prompt tokens
/// and cached tokens the backend reported.
async fn conversations(gw: &Gateway) -> Vec<Vec<(u64, u64)>> {
    let system = format!("You are a coding agent. {}", words(60, 1));
    let mut histories: Vec<Vec<Value>> = (0..3)
        .map(|c| {
            vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": words(40, 10 + c)})]
        })
        .collect();
    let mut usages = vec![Vec::new(); 3];
    for turn in 0..4 {
        for (c, history) in histories.iter_mut().enumerate() {
            let body = json!({"model": "qwen", "stream": false, "max_tokens": 4, "messages": history,
                              "sim": {"tokens": 4}});
            let r = post(gw, "/v1/chat/completions", &body).await;
            assert_eq!(r.status(), 200);
            let answer: Value = r.json().await.expect("json");
            let usage = &answer["usage"];
            let prompt = usage["prompt_tokens"].as_u64().expect("prompt_tokens");
            let cached = usage["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
            usages[c].push((prompt, cached));
            let text = answer["choices"][0]["message"]["content"].as_str().expect("content").to_string();
            history.push(json!({"role": "assistant", "content": text}));
            history.push(json!({"role": "user", "content": words(30, 100 * turn + c)}));
        }
    }
    usages
}

/// Prompt tokens prefilled (prompt − cached), summed over every answer.
fn prefilled(usages: &[Vec<(u64, u64)>]) -> u64 {
    usages.iter().flatten().map(|(prompt, cached)| prompt - cached).sum()
}

#[tokio::test]
async fn cache_aware_keeps_each_conversation_where_its_prefix_is_cached() {
    let (a, b) = (caching_sim().await, caching_sim().await);
    let gw = gateway(&yaml(&a.url(), &b.url(), "cache_aware")).await;
    let usages = conversations(&gw).await;
    for (c, turns) in usages.iter().enumerate() {
        for window in turns.windows(2) {
            let ((before, _), (_, cached)) = (window[0], window[1]);
            assert!(
                cached >= before,
                "conversation {c}: a later turn finds the whole earlier prompt cached: {turns:?}"
            );
        }
    }
    // Every request was decided once, and counted under the backend and reason of the
    // decision (a next turn sent before the previous answer's record is finished is placed
    // by the rendezvous of its opening, which is the same backend: `cold`, still cached).
    let text = client().get(gw.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let decisions: Vec<&str> = text.lines().filter(|l| l.starts_with("mlxgate_route_decisions_total{")).collect();
    let counted: f64 = decisions.iter().filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum();
    assert_eq!(counted, 12.0, "{decisions:#?}");
    assert!(decisions.iter().any(|l| l.contains("reason=\"cache_hit\"")), "{decisions:#?}");
    // Both backends serve (three conversations are not all put on one).
    let served = |sim: &SimHandle| {
        let url = format!("{}/sim/stats", sim.url());
        async move { client().get(url).send().await.expect("stats").json::<Value>().await.expect("json")["total"].as_u64() }
    };
    let (on_a, on_b) = (served(&a).await.expect("total"), served(&b).await.expect("total"));
    assert!(on_a > 0 && on_b > 0, "a {on_a}, b {on_b}");
    // The index predicted what the servers reported, within a few tokens per answer.
    for backend in ["a", "b"] {
        let labels = format!("{{backend=\"{backend}\",model=\"qwen\"}}");
        let predicted =
            metric(&gw, &format!("mlxgate_route_predicted_cached_tokens_total{labels}")).await.unwrap_or(0.0);
        let reported = metric(&gw, &format!("mlxgate_route_reported_cached_tokens_total{labels}")).await.unwrap_or(0.0);
        assert!(reported > 0.0, "{backend} reported cached tokens");
        assert!(
            (predicted - reported).abs() <= reported * 0.25,
            "{backend}: predicted {predicted}, reported {reported}"
        );
    }
}

#[tokio::test]
async fn cache_aware_prefills_less_than_round_robin_on_the_same_conversations() {
    let mut figures = Vec::new();
    for policy in ["cache_aware", "round_robin"] {
        let (a, b) = (caching_sim().await, caching_sim().await);
        let gw = gateway(&yaml(&a.url(), &b.url(), policy)).await;
        figures.push(prefilled(&conversations(&gw).await));
    }
    let (cache_aware, round_robin) = (figures[0], figures[1]);
    assert!(
        cache_aware * 3 < round_robin * 2,
        "cache_aware prefilled {cache_aware} tokens, round_robin {round_robin}: less than two thirds expected"
    );
}

#[tokio::test]
async fn two_gateways_that_have_not_seen_a_conversation_send_it_to_the_same_backend() {
    let (a, b) = (caching_sim().await, caching_sim().await);
    let yaml = yaml(&a.url(), &b.url(), "cache_aware");
    // Per conversation, two gateways that share no state and know of no other conversation
    // (even load): each turn goes through the other gateway than the one before, so each
    // gateway meets the conversation cold and places it by the rendezvous of its opening —
    // the same backend for both, where its prefix then stays cached.
    let system = format!("You are a coding agent. {}", words(60, 1));
    let mut placed = Vec::new();
    for c in 0..5 {
        let gateways = [gateway(&yaml).await, gateway(&yaml).await];
        let mut history =
            vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": words(40, 20 + c)})];
        let mut served = Vec::new();
        for turn in 0..4 {
            let gw = &gateways[turn % 2];
            let body =
                json!({"model": "qwen", "stream": false, "max_tokens": 4, "messages": history, "sim": {"tokens": 4}});
            let before = sim_stats(&a).await["total"].as_u64();
            let r = post(gw, "/v1/chat/completions", &body).await;
            assert_eq!(r.status(), 200);
            let answer: Value = r.json().await.expect("json");
            served.push(if sim_stats(&a).await["total"].as_u64() != before { "a" } else { "b" });
            if turn > 0 {
                let prompt = answer["usage"]["prompt_tokens"].as_u64().expect("prompt");
                let cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64().unwrap_or(0);
                assert!(
                    prompt - cached <= 40,
                    "conversation {c} turn {turn}: only the new turn prefilled ({cached} of {prompt} cached): {served:?}"
                );
            }
            let text = answer["choices"][0]["message"]["content"].as_str().expect("content").to_string();
            history.push(json!({"role": "assistant", "content": text}));
            history.push(json!({"role": "user", "content": words(30, 100 * turn + c)}));
        }
        assert!(served.windows(2).all(|w| w[0] == w[1]), "conversation {c} stayed on one backend: {served:?}");
        placed.push(served[0]);
    }
    // The rendezvous spreads conversations: not all five on one backend.
    assert!(placed.contains(&"a") && placed.contains(&"b"), "{placed:?}");
}

/// Each request's access-log line says how it was routed (`route`, a reason of
/// `mlxgate_route_decisions_total`) and what the gateway believed that backend held
/// (`predicted_cached_tokens`), beside what the server reported (`cached_tokens`): the line a
/// user reads to see why a turn went where it did. Through the real binary, in JSON lines.
#[tokio::test]
async fn the_access_line_says_why_a_request_went_where_it_did() {
    let (a, b) = (caching_sim().await, caching_sim().await);
    let (gw, lines) =
        gateway_binary_logged(&yaml(&a.url(), &b.url(), "cache_aware"), &[("MLXGATE_LOG_FORMAT", "json")], "info");
    let system = format!("You are a coding agent. {}", words(60, 1));
    let mut history =
        vec![json!({"role": "system", "content": system}), json!({"role": "user", "content": words(40, 3)})];
    for turn in 0..3 {
        let body = json!({"model": "qwen", "max_tokens": 4, "messages": history, "sim": {"tokens": 4}});
        let r = client().post(format!("{}/v1/chat/completions", gw.url)).json(&body).send().await.expect("send");
        assert_eq!(r.status(), 200);
        let answer: Value = r.json().await.expect("json");
        let text = answer["choices"][0]["message"]["content"].as_str().expect("content").to_string();
        history.push(json!({"role": "assistant", "content": text}));
        history.push(json!({"role": "user", "content": words(30, 100 * turn)}));
    }
    let chat = || -> Vec<Value> {
        lines
            .lock()
            .expect("log")
            .iter()
            .filter(|l| l.contains("mlxgate::access"))
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .map(|v| v["fields"].clone())
            .filter(|f| f["face"] == "chat")
            .collect()
    };
    eventually("three chat access lines", || async { chat().len() >= 3 }).await;
    let lines = chat();
    for line in &lines {
        let route = line["route"].as_str().unwrap_or_else(|| panic!("no route: {line}"));
        assert!(["cold", "cache_hit", "least_loaded"].contains(&route), "{line}");
        assert!(line["predicted_cached_tokens"].is_u64(), "{line}");
    }
    assert_eq!(lines[0]["route"], "cold", "a new conversation: {}", lines[0]);
    assert_eq!(lines[0]["predicted_cached_tokens"], 0);
    // The later turns stay where the first was served, and say so with what was predicted.
    for line in &lines[1..] {
        assert_eq!(line["backend"], lines[0]["backend"], "{line}");
        assert_eq!(line["route"], "cache_hit", "{line}");
        let (predicted, reported) = (line["predicted_cached_tokens"].as_f64(), line["cached_tokens"].as_f64());
        let (predicted, reported) = (predicted.expect("predicted"), reported.expect("reported"));
        assert!(reported > 0.0 && (predicted - reported).abs() <= reported * 0.25, "{line}");
    }
}

/// Review: a map piece of a chunked request (`on_overflow: chunk`) on a model of several
/// backends is bound by the pool to any backend (`whole_answer` passes no router), but its
/// record keeps the client request's backend — the model's first — and `whole_answer` never
/// says which one served it: the piece's access line and `mlxgate_requests_total` name `a`
/// for pieces `b` served (here `a` is drained: it served nothing). Its error messages and the
/// idle timeout of its read are the first backend's too (`route.backend`).
#[tokio::test]
async fn review_a_chunked_requests_pieces_are_counted_under_the_backend_that_served_them() {
    let Some(model) = prerequisites(&[]) else { return };
    let (a, b) = (caching_sim().await, caching_sim().await);
    let config = format!(
        "backends:\n  a: {{url: '{}', max_concurrency: 2, context_cap: 1024}}\n  b: {{url: '{}', max_concurrency: 2, context_cap: 1024}}\n\
         models:\n  qwen: {{backends: [a, b], upstream_model: tiny-qwen3, on_overflow: chunk, tokenizer: '{}', default_max_tokens: 64}}\n",
        a.url(),
        b.url(),
        model.display()
    );
    let gw = gateway(&config).await;
    let drained = client().post(gw.url("/admin/backends/a/drain")).send().await.expect("drain");
    assert_eq!(drained.status(), 200);
    const W: [&str; 12] = [
        "model", "token", "stream", "server", "gateway", "queue", "request", "answer", "cache", "prompt", "swap",
        "metal",
    ];
    let document = (0..3000).map(|i| W[(i * 7 + 5) % W.len()]).collect::<Vec<_>>().join(" ");
    let messages = json!([{"role": "system", "content": "summarise"},
                          {"role": "user", "content": format!("summarise this document: {document}")}]);
    let body = json!({"model": "qwen", "messages": messages, "max_tokens": 40, "stream": true});
    let r = post(&gw, "/v1/chat/completions", &body).await;
    assert_eq!(r.status(), 200);
    let transform = r.headers()["x-mlxgate-transform"].to_str().expect("ascii").to_string();
    let text = text_of(r).await;
    assert!(text.contains("[DONE]"), "{text}");
    let pieces: usize = transform.strip_prefix("chunk; pieces=").expect("chunk header").parse().expect("number");
    assert_eq!(sim_requests(&a).await.len(), 0, "a is drained");
    assert_eq!(sim_requests(&b).await.len(), pieces + 1, "b served every piece and the reduce");
    let metrics = client().get(gw.url("/metrics")).send().await.expect("metrics").text().await.expect("text");
    let under = |backend: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with("mlxgate_requests_total{") && l.contains(&format!("backend=\"{backend}\"")))
            .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()))
            .sum()
    };
    assert_eq!(
        (under("a"), under("b")),
        (0.0, (pieces + 1) as f64),
        "requests counted by backend, {pieces} pieces and the reduce all served by b"
    );
}

/// Review (issue 21: rates, now replaced by the first answer's figure). The prefill rate is
/// learnt from `(prompt − cached) ÷ (TTFT − queue wait)`, TTFT counted from the request's
/// arrival (`outcome.rs`: `first_token − arrived`) and the queue wait only the time spent
/// waiting for slots (`call.rs`): a failover's failed attempt — here `a` hanging until its
/// `first_byte_timeout` (default: `response_timeout`, 30 minutes) — is taught to `b` as
/// prefill time. It is `b`'s first sample, so it replaces the prior outright, and it is also
/// what every backend without a rate of its own is estimated at (`model_prefill_per_s`).
#[tokio::test]
async fn review_a_failovers_wasted_attempt_is_not_learnt_as_the_serving_backends_prefill() {
    let hung = sim_with(Behaviour { hang: Some(true), ..Default::default() }).await;
    let good = caching_sim().await;
    let yaml = format!(
        "backends:\n  a: {{url: '{}', max_concurrency: 1, first_byte_timeout: 2s}}\n  b: {{url: '{}', max_concurrency: 1}}\n\
         models:\n  qwen: {{backends: [a, b], upstream_model: tiny-qwen3, balance: {{policy: round_robin}}}}\n",
        hung.url(),
        good.url()
    );
    let config = mlxgate::Config::parse(&yaml, &|_| None).expect("valid");
    let tokens = mlxgate::tokens::registry::Registry::load(&config).expect("registry");
    let limiter = mlxgate::limits::Limiter::for_config(&config).expect("limiter");
    let keeper = std::path::PathBuf::from(env!("CARGO_BIN_EXE_mlxgate"));
    let state = mlxgate::AppState::new(config, keeper, tokens, limiter);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    let limits = mlxgate::accept::ConnectionLimits {
        header_read_timeout: std::time::Duration::from_secs(30),
        max_per_client: 64,
    };
    let server = tokio::spawn(mlxgate::accept::serve(
        mlxgate::app(state.clone()),
        listener,
        limits,
        std::future::pending::<()>(),
        std::time::Duration::from_secs(1),
        || {},
    ));
    // 800 words (one token each for the simulator): b prefills them in ~0.4 s (0.5 ms each).
    let body = json!({"model": "qwen", "stream": true, "max_tokens": 4, "sim": {"tokens": 4},
                      "messages": [{"role": "user", "content": words(800, 7)}]});
    let r = client().post(format!("http://{addr}/v1/chat/completions")).json(&body).send().await.expect("send");
    assert_eq!(r.status(), 200);
    let text = r.text().await.expect("body");
    assert!(text.contains("[DONE]"), "{text}");
    assert_eq!(sim_stats(&good).await["total"], 1, "b served it after a's first_byte_timeout");
    let (balancer, _) = state.dispatch.route("qwen").expect("route").balancer.clone().expect("balanced");
    let learnt = eventually_some(|| rates_of(&balancer, 1)).await;
    assert!(
        learnt >= 1000.0,
        "b prefills ~2000 tokens/s; it learnt {learnt:.0}/s from a TTFT that counts a's 2 s hang ({:?})",
        balancer.rates()
    );
    server.abort();
}

fn rates_of(balancer: &mlxgate::balance::Balancer, backend: usize) -> Option<f64> {
    balancer.rates()[backend].learnt_prefill_per_s()
}

async fn eventually_some(mut f: impl FnMut() -> Option<f64>) -> f64 {
    let mut found = None;
    eventually("a learnt rate", || {
        found = f();
        let done = found.is_some();
        async move { done }
    })
    .await;
    found.expect("found")
}
