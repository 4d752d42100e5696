//! `mlxgate-sim`: an OpenAI-compatible server for tests and benchmarks whose timing and quirks
//! are set by flags (server defaults) and per request (a `"sim": {…}` object in the body, which
//! the gateway forwards untouched). It reproduces the servers of docs/wire-facts.md (summed up in
//! docs/servers.md, "What each server does on the wire"): keepalive styles, usage placement,
//! error events, crashes, hangs, prompt caps, a prompt cache reported as `cached_tokens` in the
//! styles that report it (by default the previous prompt; with `prompt_cache_size`, mlx_lm.server's
//! LRU of whole sequences, `prompt_cache.rs`), a prefill time per uncached prompt token, and a
//! batching capacity with a speedup curve. Never used by `mlxgate serve`.
//!
//! With a server-level script (`script.rs`), chat answers follow it: tool calls streamed as real
//! servers stream them, then text after the tool results; side requests get plain text or JSON.
//!
//! Inspection endpoints for tests: `GET /sim/requests` (the last bodies and headers received,
//! POSTs to unknown paths included),
//! `GET /sim/stats` (active, peak, held and total requests; the prompt cache's sequences, lookups
//! and hits), `POST /sim/release/{key}`, `POST /sim/prompt-cache/reset` (empties the prompt cache,
//! as a restart does).

pub mod behaviour;
mod http10;
mod idle;
pub mod prompt_cache;
pub mod script;
mod stream;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{Notify, Semaphore, mpsc};
use tokio::task::JoinSet;

use behaviour::CapStyle;
pub use behaviour::{Behaviour, Plan, Style};
use prompt_cache::{Kind, SimCache};
pub use script::Script;
use stream::Job;

/// How long vllm-mlx's serialized route stays busy after a client abort: a request 4 ms later
/// got the busy error event, one 0.5 s later was served (measured in the probe's review).
const ABORT_SETTLE: Duration = Duration::from_millis(200);

/// How many received requests `/sim/requests` keeps.
const RECORDED: usize = 256;

/// Server-wide settings.
#[derive(Debug, Clone, Default)]
pub struct SimConfig {
    /// Default behaviour for every request.
    pub defaults: Behaviour,
    /// Requests generating at once; more wait inside the server (0 = unlimited).
    pub capacity: usize,
    /// Aggregate throughput with k requests generating, relative to one: `speedup[k-1]`
    /// (the last value holds beyond the list). Empty = no gain from batching (1.0 for all k).
    pub speedup: Vec<f64>,
    /// Model ids listed by `/v1/models`.
    pub models: Vec<String>,
    /// How responses are framed; `None`: the style's own (HTTP/1.0 close-delimited for
    /// `mlx-lm`, as mlx_lm.server does; HTTP/1.1 chunked otherwise).
    pub framing: Option<Framing>,
    /// A keep-alive connection idle this long is closed when its next request arrives, without
    /// an answer (uvicorn closes idle connections after 5 s; this is the race at its worst).
    pub idle_close: Option<Duration>,
    /// Refuse any request that carries `stream_options` with 422, as a server whose request
    /// model forbids unknown fields does.
    pub refuse_stream_options: bool,
    /// Scripted turns for chat requests (the simulator playing an agent's backend): tool calls,
    /// then text once the results are back (see `script`). `None`: the generated `t0 t1 …`.
    pub script: Option<Script>,
    /// mlx_lm.server's prompt cache of this many whole sequences (`--prompt-cache-size`; 0 keeps
    /// nothing). `None`: the simpler cache of the previous prompt alone.
    pub prompt_cache_size: Option<usize>,
}

/// How the simulator frames its responses on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Framing {
    /// HTTP/1.1 keep-alive, chunked streams (uvicorn-based servers).
    Chunked,
    /// HTTP/1.0, one request per connection, bodies ended by closing it (mlx_lm.server).
    Close,
}

impl SimConfig {
    /// The framing in force: the one asked for, else the style's.
    pub fn framing(&self) -> Framing {
        match (self.framing, self.defaults.style) {
            (Some(f), _) => f,
            (None, Some(Style::MlxLm)) => Framing::Close,
            (None, _) => Framing::Chunked,
        }
    }
}

/// Shared state of one running simulator.
pub struct SimState {
    config: SimConfig,
    capacity: Option<Semaphore>,
    active: AtomicUsize,
    peak: AtomicUsize,
    held: AtomicUsize,
    total: AtomicUsize,
    recorded: Mutex<VecDeque<Value>>,
    holds: Mutex<HashMap<String, Arc<Semaphore>>>,
    crashed: Notify,
    /// The server's prompt cache.
    prompt_cache: Mutex<SimCache>,
    /// A request is generating on the one serialized route (`busy_event`).
    route_busy: AtomicBool,
}

/// A simulator running in this process (tests); dropping it stops it.
pub struct SimHandle {
    pub addr: SocketAddr,
    pub state: Arc<SimState>,
    task: tokio::task::JoinHandle<()>,
}

impl SimHandle {
    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Kills the server as a crash would: connections cut, port closed.
    pub fn kill(&self) {
        self.task.abort();
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a simulator on `127.0.0.1:0` inside this process.
pub async fn spawn(config: SimConfig) -> std::io::Result<SimHandle> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let state = SimState::new(config);
    let task = tokio::spawn(run(listener, Arc::clone(&state)));
    Ok(SimHandle { addr, state, task })
}

/// Serves until a request's `exit_after` crashes the server; then every connection is cut.
pub async fn run(listener: TcpListener, state: Arc<SimState>) {
    let router = router(Arc::clone(&state));
    let framing = state.config.framing();
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((tcp, _)) = accepted else { continue };
                let _ = tcp.set_nodelay(true);
                let router = router.clone();
                match framing {
                    Framing::Close => connections.spawn(async move {
                        let _ = http10::serve(tcp, router).await;
                    }),
                    Framing::Chunked => {
                        let idle = state.config.idle_close;
                        connections.spawn(async move {
                            let service = TowerToHyperService::new(router);
                            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                            let _ = match idle {
                                Some(idle) => {
                                    builder.serve_connection(TokioIo::new(idle::IdleClose::new(tcp, idle)), service).await
                                }
                                None => builder.serve_connection(TokioIo::new(tcp), service).await,
                            };
                        })
                    }
                };
            }
            () = state.crashed.notified() => {
                connections.abort_all();
                return;
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

impl SimState {
    /// Fresh state for one server.
    pub fn new(config: SimConfig) -> Arc<Self> {
        let capacity = (config.capacity > 0).then(|| Semaphore::new(config.capacity));
        let prompt_cache = Mutex::new(SimCache::new(config.prompt_cache_size));
        Arc::new(SimState {
            config,
            capacity,
            active: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
            total: AtomicUsize::new(0),
            recorded: Mutex::new(VecDeque::new()),
            holds: Mutex::new(HashMap::new()),
            crashed: Notify::new(),
            prompt_cache,
            route_busy: AtomicBool::new(false),
        })
    }

    /// How this server frames its responses.
    pub fn framing(&self) -> Framing {
        self.config.framing()
    }

    /// Requests generating right now.
    pub fn active(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// The most requests that were ever generating at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::SeqCst)
    }

    /// The last request bodies received (newest last), with `path` and `authorization` added.
    pub fn requests(&self) -> Vec<Value> {
        lock(&self.recorded).iter().cloned().collect()
    }

    /// Waits for room to generate when the server has a capacity (held while generating).
    async fn generation_slot(&self) -> Option<tokio::sync::SemaphorePermit<'_>> {
        match &self.capacity {
            Some(s) => s.acquire().await.ok(),
            None => None,
        }
    }

    /// True when the prompt cache is mlx_lm.server's LRU (sequences stored when answers end).
    fn lru_cache(&self) -> bool {
        self.config.prompt_cache_size.is_some()
    }

    /// Stores a sequence in the LRU prompt cache (a no-op for the previous-prompt cache).
    pub(crate) fn remember(&self, tokens: Vec<String>, kind: Kind) {
        lock(&self.prompt_cache).remember(tokens, kind);
    }

    /// Keeps `body` (with `_path` and `_authorization` added) for `/sim/requests`.
    fn record(&self, body: Value, path: &str, headers: &HeaderMap) {
        let mut seen = if body.is_object() { body } else { json!({"_body": body}) };
        seen["_path"] = json!(path);
        seen["_authorization"] = json!(headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()));
        let mut recorded = lock(&self.recorded);
        if recorded.len() == RECORDED {
            recorded.pop_front();
        }
        recorded.push_back(seen);
    }

    fn crash(&self) {
        self.crashed.notify_one();
    }

    /// Time between two tokens for one request, with `k` requests decoding together.
    fn token_interval(&self, plan: &Plan) -> Duration {
        let k = self.active().max(1);
        let gain = if self.config.speedup.is_empty() {
            1.0
        } else {
            self.config.speedup[(k - 1).min(self.config.speedup.len() - 1)].max(0.01)
        };
        let per_request_tps = plan.tokens_per_second * gain / k as f64;
        Duration::from_secs_f64(1.0 / per_request_tps)
    }

    /// Waits until `POST /sim/release/{key}` (or the client leaves); false when it left.
    async fn hold(&self, key: &str, tx: &mpsc::Sender<stream::Write>) -> bool {
        let gate = Arc::clone(lock(&self.holds).entry(key.to_string()).or_insert_with(|| Arc::new(Semaphore::new(0))));
        self.held.fetch_add(1, Ordering::SeqCst);
        let released = tokio::select! {
            // A released gate is a closed semaphore: acquire fails at once.
            _ = gate.acquire() => true,
            () = tx.closed() => false,
        };
        self.held.fetch_sub(1, Ordering::SeqCst);
        released
    }

    fn release(&self, key: &str) {
        lock(&self.holds).entry(key.to_string()).or_insert_with(|| Arc::new(Semaphore::new(0))).close();
    }
}

/// Holds the serialized route (vllm-mlx's simple mode) while alive.
struct Route(Arc<SimState>);

impl Route {
    /// The route, unless another request holds it.
    fn claim(state: &Arc<SimState>) -> Option<Route> {
        let free = state.route_busy.compare_exchange(false, true, Ordering::SeqCst, Ordering::SeqCst).is_ok();
        free.then(|| Route(Arc::clone(state)))
    }
}

impl Drop for Route {
    fn drop(&mut self) {
        self.0.route_busy.store(false, Ordering::SeqCst);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Counts a request as generating while alive.
struct Active<'a>(&'a SimState);

impl<'a> Active<'a> {
    fn new(state: &'a SimState) -> Self {
        let now = state.active.fetch_add(1, Ordering::SeqCst) + 1;
        state.peak.fetch_max(now, Ordering::SeqCst);
        Active(state)
    }
}

impl Drop for Active<'_> {
    fn drop(&mut self) {
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Rapid-MLX's checks (`loopback_only`): a Host other than localhost / 127.0.0.1 / [::1] gets
/// 400, any Origin 403, both as text/plain.
async fn trusted_hosts(
    State(state): State<Arc<SimState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if state.config.defaults.plan().loopback_only {
        let host = request.headers().get(header::HOST).and_then(|v| v.to_str().ok()).unwrap_or("127.0.0.1");
        let name = match host.rsplit_once(':') {
            Some((h, port)) if !port.contains(']') => h,
            _ => host,
        };
        if !crate::probe::wire::is_loopback(name) {
            return (StatusCode::BAD_REQUEST, [(header::CONTENT_TYPE, "text/plain")], "Invalid host header")
                .into_response();
        }
        if request.headers().contains_key(header::ORIGIN) {
            return (StatusCode::FORBIDDEN, [(header::CONTENT_TYPE, "text/plain")], "Cross-origin requests disabled")
                .into_response();
        }
    }
    next.run(request).await
}

fn router(state: Arc<SimState>) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(generate))
        .route("/v1/completions", post(generate))
        .route("/v1/embeddings", post(embeddings))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { Json(json!({"status": "ok"})) }))
        .route("/sim/requests", get(|State(s): State<Arc<SimState>>| async move { Json(s.requests()) }))
        .route("/sim/stats", get(stats))
        .route("/sim/release/{key}", post(release))
        .route(
            "/sim/prompt-cache/reset",
            post(|State(s): State<Arc<SimState>>| async move {
                lock(&s.prompt_cache).reset();
                StatusCode::NO_CONTENT
            }),
        )
        .fallback(unknown)
        .layer(axum::middleware::from_fn_with_state(Arc::clone(&state), trusted_hosts))
        .with_state(state)
}

/// Any other path: 404, as a server without that route answers; a POST's JSON body is still
/// recorded, so that `/sim/requests` shows what a client sent to a path the server lacks (an
/// agent pointed straight at the simulator, e.g. Codex's `POST /v1/responses`).
async fn unknown(
    State(state): State<Arc<SimState>>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    if method == axum::http::Method::POST {
        let parsed = serde_json::from_slice(&body).unwrap_or_else(|_| json!(String::from_utf8_lossy(&body)));
        state.record(parsed, uri.path(), &headers);
    }
    StatusCode::NOT_FOUND
}

async fn models(State(state): State<Arc<SimState>>) -> Json<Value> {
    let ids = if state.config.models.is_empty() { vec!["sim".to_string()] } else { state.config.models.clone() };
    let data: Vec<Value> =
        ids.iter().map(|id| json!({"id": id, "object": "model", "created": 0, "owned_by": "mlxgate-sim"})).collect();
    Json(json!({"object": "list", "data": data}))
}

async fn stats(State(state): State<Arc<SimState>>) -> Json<Value> {
    Json(json!({
        "active": state.active(),
        "peak": state.peak(),
        "held": state.held.load(Ordering::SeqCst),
        "total": state.total.load(Ordering::SeqCst),
        "prompt_cache": lock(&state.prompt_cache).stats(),
    }))
}

async fn release(State(state): State<Arc<SimState>>, Path(key): Path<String>) -> StatusCode {
    state.release(&key);
    StatusCode::NO_CONTENT
}

/// A refused request: status and error body.
type Refusal = (StatusCode, Json<Value>);

/// Parses and records a request; returns its body and resolved plan.
fn admit(state: &SimState, path: &str, headers: &HeaderMap, body: &Bytes) -> Result<(Value, Plan), Refusal> {
    state.total.fetch_add(1, Ordering::SeqCst);
    let mut parsed: Value = serde_json::from_slice(body).map_err(|e| {
        (
            StatusCode::BAD_REQUEST,
            Json(json!({"error": {"message": format!("invalid JSON: {e}"), "type": "invalid_request_error"}})),
        )
    })?;
    state.record(parsed.clone(), path, headers);
    if state.config.refuse_stream_options && parsed.get("stream_options").is_some() {
        let detail = json!([{"type": "extra_forbidden", "loc": ["body", "stream_options"],
            "msg": "Extra inputs are not permitted"}]);
        return Err((StatusCode::UNPROCESSABLE_ENTITY, Json(json!({"detail": detail}))));
    }
    let per_request: Behaviour = match parsed.get_mut("sim").map(Value::take) {
        Some(v) => serde_json::from_value(v).map_err(|e| {
            (StatusCode::BAD_REQUEST, Json(json!({"error": {"message": format!("bad sim object: {e}")}})))
        })?,
        None => Behaviour::default(),
    };
    let plan = per_request.over(&state.config.defaults).plan();
    if let Some(status) = plan.fail_status {
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        let body = json!({"error": {"message": "simulated failure", "type": "server_error", "code": status.as_u16()}});
        return Err((status, Json(body)));
    }
    Ok((parsed, plan))
}

/// POST `/v1/chat/completions` and `/v1/completions`.
async fn generate(
    State(state): State<Arc<SimState>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (request, mut plan) = match admit(&state, uri.path(), &headers, &body) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    if plan.hang {
        std::future::pending::<()>().await;
    }
    let chat = uri.path().ends_with("/chat/completions");
    let prompt = prompt_words(&request);
    let prompt_tokens = u32::try_from(prompt.len()).unwrap_or(u32::MAX);
    let max_tokens = request.get("max_tokens").or_else(|| request.get("max_completion_tokens")).and_then(Value::as_u64);
    if let Some(cap) = plan.prompt_cap {
        let counted = match plan.cap_style {
            CapStyle::Openai => prompt_tokens as u64 + max_tokens.unwrap_or(0),
            _ => prompt_tokens as u64,
        };
        if counted > cap as u64 {
            return over_cap(plan.cap_style, cap, prompt_tokens, max_tokens.unwrap_or(0));
        }
    }
    let (cached_tokens, reused) = lock(&state.prompt_cache).lookup(&prompt, plan.prompt_cache);
    // Prefill takes its time on the tokens the cache did not spare.
    let per_token = plan.prefill_ms_per_token;
    let prefill_ms = |tokens: usize| (tokens as f64 * per_token).round() as u64;
    plan.ttft_ms += prefill_ms(prompt.len().saturating_sub(reused as usize));
    if state.lru_cache() && chat {
        checkpoint_system_prompt(&state, &request, &prompt, reused as usize, prefill_ms);
    }
    let scripted = state.config.script.as_ref().filter(|_| chat).map(|s| stream::Scripted::of(s.reply(&request)));
    let completion_tokens = match (&scripted, max_tokens) {
        (Some(s), _) => s.completion_tokens(),
        (None, Some(m)) => plan.tokens.min(u32::try_from(m).unwrap_or(u32::MAX)),
        (None, None) => plan.tokens,
    };
    // A scripted answer is sent whole whatever max_tokens says.
    let cut = scripted.is_none() && max_tokens.is_some_and(|m| m < plan.tokens as u64);
    let mut job = Job {
        id: format!("{}sim{}", plan.id_prefix, state.total.load(Ordering::SeqCst)),
        model: request.get("model").and_then(Value::as_str).unwrap_or("sim").to_string(),
        chat,
        prompt_tokens,
        cached_tokens,
        completion_tokens,
        finish_reason: if cut && !plan.stop_at_max_tokens { "length" } else { "stop" },
        include_usage: request.pointer("/stream_options/include_usage").and_then(Value::as_bool).unwrap_or(false),
        scripted,
        remember: None,
    };
    if state.lru_cache() {
        let text: String = (0..job.text_tokens()).map(|i| job.token(i)).collect();
        job.remember = Some(prompt_cache::stored_sequence(prompt, &text));
    }
    let streaming = request.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let route = if plan.busy_event { Route::claim(&state).map(Some) } else { Some(None) };
    let Some(route) = route else {
        return busy(streaming, &job);
    };
    if !streaming {
        let _route = route;
        return complete(&state, &plan, &job).await;
    }
    let (tx, rx) = mpsc::channel::<stream::Write>(16);
    tokio::spawn(async move {
        let _route = route;
        let _slot = state.generation_slot().await;
        let _active = Active::new(&state);
        let watch = tx.clone();
        stream::write_stream(&state, &plan, &job, tx).await;
        let left = watch.is_closed();
        drop(watch);
        if left && plan.busy_event {
            tokio::time::sleep(ABORT_SETTLE).await;
        }
    });
    let body = futures_util::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|write| (write, rx)) });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(body))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// mlx_lm.server's system-prompt checkpoint (its batched path): a chat prompt ending with a user
/// message whose leading system messages are not all served from the cache has them saved as a
/// sequence of their own once they are prefilled (after `prefill_ms` of the tokens still to do).
fn checkpoint_system_prompt(
    state: &Arc<SimState>,
    request: &Value,
    prompt: &[String],
    reused: usize,
    prefill_ms: impl Fn(usize) -> u64,
) {
    let messages = request.get("messages").and_then(Value::as_array).map_or(&[][..], Vec::as_slice);
    if messages.last().and_then(|m| m.get("role")) != Some(&json!("user")) {
        return;
    }
    let system: usize = messages
        .iter()
        .take_while(|m| m.get("role") == Some(&json!("system")))
        .map(|m| prompt_words(&json!({"messages": [m]})).len())
        .sum();
    let Some(tokens) = prompt_cache::system_checkpoint(prompt, system, reused) else { return };
    let wait = Duration::from_millis(prefill_ms(tokens.len() - reused));
    let state = Arc::clone(state);
    tokio::spawn(async move {
        tokio::time::sleep(wait).await;
        state.remember(tokens, Kind::System);
    });
}

/// vllm-mlx's simple mode, busy: a stream gets 200 and an in-band error event, a whole answer
/// 503 (measured).
fn busy(streaming: bool, job: &Job) -> Response {
    if !streaming {
        let detail = json!({"detail": {"error": "text_generation_busy",
            "message": "SimpleEngine serialized route is busy; retry later"}});
        return (StatusCode::SERVICE_UNAVAILABLE, Json(detail)).into_response();
    }
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .body(Body::from(stream::busy_body(job)))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A non-streaming answer: sent whole once every token is "generated".
async fn complete(state: &SimState, plan: &Plan, job: &Job) -> Response {
    let _slot = state.generation_slot().await;
    let _active = Active::new(state);
    // tokio's timer has a 1 ms tick: even a zero sleep waits for the next one, so `ttft_ms: 0`
    // skips it and answers at once.
    if plan.ttft_ms > 0 {
        tokio::time::sleep(Duration::from_millis(plan.ttft_ms)).await;
    }
    if plan.drop_after.is_some() {
        let dropped = std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "mlxgate-sim: drop_after");
        let body = futures_util::stream::once(async move { Err::<Bytes, _>(dropped) });
        return Response::builder()
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from_stream(body))
            .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    for i in 1..job.text_tokens() {
        if plan.exit_after == Some(i) {
            state.crash();
            return std::future::pending().await;
        }
        tokio::time::sleep(state.token_interval(plan)).await;
    }
    if let Some(sequence) = &job.remember {
        state.remember(sequence.clone(), Kind::Assistant);
    }
    let text: String = (0..job.text_tokens()).map(|i| job.token(i)).collect();
    let usage = stream::usage_of(job);
    let body = if job.chat {
        let mut message = json!({"role": "assistant", "content": text});
        let calls = job.tool_calls();
        if !calls.is_empty() {
            if text.is_empty() {
                message["content"] = Value::Null;
            }
            message["tool_calls"] = calls
                .iter()
                .enumerate()
                .map(|(k, c)| {
                    json!({"id": job.call_id(k), "type": "function",
                    "function": {"name": c.name, "arguments": c.arguments}})
                })
                .collect();
        }
        json!({"id": job.id, "object": "chat.completion", "created": now_secs(), "model": job.model,
            "choices": [{"index": 0, "message": message, "finish_reason": job.finish_reason()}],
            "usage": usage})
    } else {
        json!({"id": job.id, "object": "text_completion", "created": now_secs(), "model": job.model,
            "choices": [{"index": 0, "text": text, "finish_reason": job.finish_reason()}], "usage": usage})
    };
    Json(body).into_response()
}

/// POST `/v1/embeddings`: a deterministic 8-dimensional vector per input.
async fn embeddings(
    State(state): State<Arc<SimState>>,
    uri: axum::http::Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let (request, _plan) = match admit(&state, uri.path(), &headers, &body) {
        Ok(v) => v,
        Err(r) => return r.into_response(),
    };
    let inputs: Vec<String> = match request.get("input") {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => {
            items.iter().map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_string)).collect()
        }
        _ => vec![],
    };
    let tokens: usize = inputs.iter().map(|s| s.split_whitespace().count()).sum();
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, text)| {
            let seed = text.bytes().fold(7u32, |h, b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
            let vector: Vec<f64> = (0..8u32).map(|d| f64::from(seed.rotate_left(d * 4) % 1000) / 1000.0).collect();
            json!({"object": "embedding", "index": i, "embedding": vector})
        })
        .collect();
    Json(json!({"object": "list", "data": data, "model": request.get("model"),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}))
    .into_response()
}

/// The prompt's tokens in the simulator's units: the whitespace-separated words of every text
/// part, in order (messages, then a completion's prompt).
fn prompt_words(request: &Value) -> Vec<String> {
    fn words(v: &Value, out: &mut Vec<String>) {
        match v {
            Value::String(s) => out.extend(s.split_whitespace().map(str::to_string)),
            Value::Array(parts) => {
                for p in parts {
                    words(p.get("text").unwrap_or(p), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for message in request.get("messages").and_then(Value::as_array).into_iter().flatten() {
        if let Some(content) = message.get("content") {
            words(content, &mut out);
        }
    }
    if let Some(prompt) = request.get("prompt") {
        words(prompt, &mut out);
    }
    out
}

/// The refusal a real server gives for a prompt over its cap, in its own shape.
fn over_cap(style: CapStyle, cap: u32, prompt: u32, max_tokens: u64) -> Response {
    let body = match style {
        CapStyle::Omlx => {
            json!({"error": {"message": format!("Prompt too long: {prompt} tokens exceeds max context window of {cap} tokens"),
            "type": "invalid_request_error", "param": null, "code": null}})
        }
        CapStyle::Openai => json!({"error": {"message": format!(
            "This model's maximum context length is {cap} tokens. However, you requested {} tokens ({prompt} in the messages, {max_tokens} in the completion). Please reduce the length of the messages or completion.",
            prompt as u64 + max_tokens),
            "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}}),
        CapStyle::Vllm => {
            json!({"detail": format!("Prompt length {prompt} exceeds the maximum context length {cap}")})
        }
        CapStyle::LlamaServer => json!({"error": {"code": 400, "message": format!(
            "the request exceeds the available context size ({prompt} > {cap}), try increasing it"), "type": "exceed_context_size_error"}}),
    };
    (StatusCode::BAD_REQUEST, Json(body)).into_response()
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
