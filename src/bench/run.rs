//! The scenarios of `mlxgate bench`, run against one or two endpoints: without a tokenizer, a
//! calibration of prompt sizes against the first endpoint's own count; then for each prompt
//! size and repeat, a request alone (`single`, also the baseline of the speedup), then `N`
//! identical requests, each built and its connection opened first, released together through a
//! barrier (`double`, `parallel:N`); with `--compare` each step runs on both endpoints, A then
//! B, then B then A at the next (interleaved, so that a drift of the machine falls on both and
//! neither always follows the other). Each stream is read as it arrives with the gateway's own
//! SSE parser and figures (`stream::sse`, `stream::meter`), timestamped per read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use indicatif::ProgressBar;
use serde_json::json;
use tokio::net::TcpStream;
use tokio::sync::Barrier;

use super::prompts::{CALIBRATION_WORDS, Calibration, PromptMaker, calibration_text};
use super::stats::{Group, Sample};
use crate::stream::figures::StreamFigures;
use crate::stream::sse::SseParser;

/// Reads within this time of the first one of a run of reads count as one read for the burst
/// flag: a chunked server's frames written together reach the client as several HTTP chunks
/// of one TCP read, which hyper hands over one by one, microseconds apart.
pub const BURST_WINDOW: Duration = Duration::from_millis(1);

/// Body bytes of an error answer kept for the message.
const ERROR_BODY_BYTES: usize = 300;

/// One server measured: its OpenAI base URL (`…/v1`) and the model name it is sent.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// `A` (`--url`) or `B` (`--compare`).
    pub label: &'static str,
    pub url: String,
    pub model: String,
}

impl Endpoint {
    /// `host:port` to connect to and the base path (`/v1`), from an `http://` URL.
    fn target(&self) -> Result<(String, String), String> {
        let uri: http::Uri = self.url.parse().map_err(|e| format!("{}: not a URL: {e}", self.url))?;
        if uri.scheme_str() != Some("http") {
            return Err(format!("{}: only http:// URLs are measured", self.url));
        }
        let host = uri.host().ok_or_else(|| format!("{}: no host", self.url))?;
        let authority = format!("{host}:{}", uri.port_u16().unwrap_or(80));
        Ok((authority, uri.path().trim_end_matches('/').to_string()))
    }
}

/// What to send.
#[derive(Debug, Clone)]
pub struct Plan {
    pub endpoints: Vec<Endpoint>,
    pub prompt_sizes: Vec<usize>,
    pub repeats: usize,
    /// Requests released together after the single one; 1: only the single runs.
    pub concurrency: usize,
    pub max_tokens: u32,
    pub warmup: usize,
    pub api_key: Option<String>,
    pub timeout: Duration,
}

/// Every group measured at one prompt size on one endpoint.
#[derive(Debug, Clone, Default)]
pub struct SizeRuns {
    /// Tokens of the prompts sent, as counted here.
    pub prompt_tokens_sent: Vec<usize>,
    /// The requests sent alone, one group per repeat.
    pub single: Vec<Group>,
    /// The requests released together, one group per repeat (empty for `single`).
    pub concurrent: Vec<Group>,
}

/// Everything measured: `runs[endpoint][size]`, in the plan's order.
#[derive(Debug, Clone)]
pub struct Measured {
    pub runs: Vec<Vec<SizeRuns>>,
}

/// A warm-up request failed: the endpoint is not usable (wrong URL, model or key).
#[derive(Debug, thiserror::Error)]
#[error("{label} ({url}): the warm-up request failed: {reason}")]
pub struct Unusable {
    pub label: &'static str,
    pub url: String,
    pub reason: String,
}

/// The requests' sender: a fresh HTTP/1.1 connection per request (`TCP_NODELAY`), opened
/// before the request's release so that no connect or handshake lies between the release and
/// the request's bytes, nor in its TTFT.
struct Sender {
    api_key: Option<String>,
    timeout: Duration,
}

/// An opened connection, ready for one request.
type Connection = SendRequest<Full<Bytes>>;

impl Sender {
    fn new(plan: &Plan) -> Sender {
        Sender { api_key: plan.api_key.clone(), timeout: plan.timeout }
    }

    /// Opens a connection to `endpoint` and waits until it can take a request.
    async fn connect(&self, endpoint: &Endpoint) -> Result<Connection, String> {
        let (authority, _) = endpoint.target()?;
        let opened = async {
            let stream = TcpStream::connect(&authority).await.map_err(|e| format!("cannot connect: {e}"))?;
            stream.set_nodelay(true).map_err(|e| format!("cannot set TCP_NODELAY: {e}"))?;
            let (mut send, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| format!("cannot connect: {}", with_causes(&e)))?;
            tokio::spawn(async move {
                // Its errors reach the request's response or body, where they are reported.
                let _ = connection.await;
            });
            send.ready().await.map_err(|e| format!("the connection closed: {}", with_causes(&e)))?;
            Ok(send)
        };
        match tokio::time::timeout(self.timeout, opened).await {
            Ok(opened) => opened,
            Err(_) => Err(format!("cannot connect within {}", humantime::format_duration(self.timeout))),
        }
    }

    /// The streamed chat request for `text`, asking for usage.
    fn request(&self, endpoint: &Endpoint, text: &str, max_tokens: u32) -> Result<Request<Full<Bytes>>, String> {
        let (authority, path) = endpoint.target()?;
        let body = json!({
            "model": endpoint.model,
            "messages": [{"role": "user", "content": text}],
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": max_tokens,
            "temperature": 0,
        });
        let mut request = Request::post(format!("{path}/chat/completions"))
            .header(header::HOST, authority)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "text/event-stream");
        if let Some(key) = &self.api_key {
            request = request.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        request.body(Full::new(Bytes::from(body.to_string()))).map_err(|e| format!("cannot build the request: {e}"))
    }

    /// Sends `request` on `connection` now and reads its stream to the end; the sample and
    /// the instants it was sent and ended.
    async fn send(&self, connection: Connection, request: Request<Full<Bytes>>) -> Timed {
        let sent = Instant::now();
        match tokio::time::timeout(self.timeout, read(connection, request, sent)).await {
            Ok((sample, ended)) => Timed { sent, ended, sample },
            Err(_) => {
                let why = format!("no end within {}", humantime::format_duration(self.timeout));
                Timed { sent, ended: Instant::now(), sample: Sample::failed(sent.elapsed().as_secs_f64(), why) }
            }
        }
    }
}

/// Sends `request` and reads its answer, timestamping each read; the sample and the instant
/// its answer ended (the same instant ends the sample's wall time and its group's).
async fn read(mut connection: Connection, request: Request<Full<Bytes>>, sent: Instant) -> (Sample, Instant) {
    let failed = |why: String| {
        let ended = Instant::now();
        (Sample::failed(ended.saturating_duration_since(sent).as_secs_f64(), why), ended)
    };
    let response = match connection.send_request(request).await {
        Ok(r) => r,
        Err(e) => return failed(format!("cannot send: {}", with_causes(&e))),
    };
    let status = response.status();
    let mut body = response.into_body();
    if !status.is_success() {
        let text = match body.collect().await {
            Ok(b) => String::from_utf8_lossy(&b.to_bytes()).chars().take(ERROR_BODY_BYTES).collect(),
            Err(_) => String::new(),
        };
        return failed(format!("HTTP {status}: {text}"));
    }
    let mut parser = SseParser::new();
    let mut figures = StreamFigures { metered: true, ..Default::default() };
    let mut together = Together::default();
    while let Some(frame) = body.frame().await {
        let data = match frame {
            Ok(frame) => match frame.into_data() {
                Ok(data) => data,
                Err(_) => continue,
            },
            Err(e) => return failed(format!("the stream broke: {}", with_causes(&e))),
        };
        let now = Instant::now();
        let mut generated = 0;
        parser.feed(&data, |item, _| generated += u64::from(figures.watch(&item, now, true).generated));
        figures.max_frames_in_one_read = figures.max_frames_in_one_read.max(together.add(now, generated));
    }
    let ended = Instant::now();
    // A last event without its blank line still counts (its end is implied).
    parser.feed(b"\n\n", |item, _| {
        figures.watch(&item, ended, true);
    });
    (Sample::measured(sent, ended, &figures), ended)
}

/// An error and its causes, `a: b: c` (hyper's own says only "client error (Connect)").
fn with_causes(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut cause = error.source();
    while let Some(e) = cause {
        text.push_str(&format!(": {e}"));
        cause = e.source();
    }
    text
}

/// Output frames that arrived together: within [`BURST_WINDOW`] of the first read of a run.
#[derive(Default)]
struct Together {
    since: Option<Instant>,
    frames: u64,
}

impl Together {
    /// Adds one read's output frames; the frames of the run it belongs to so far.
    fn add(&mut self, now: Instant, frames: u64) -> u64 {
        if frames == 0 {
            return self.frames;
        }
        match self.since {
            Some(since) if now.duration_since(since) <= BURST_WINDOW => self.frames += frames,
            _ => {
                self.since = Some(now);
                self.frames = frames;
            }
        }
        self.frames
    }
}

/// One request's sample and when it was sent and ended.
struct Timed {
    sent: Instant,
    ended: Instant,
    sample: Sample,
}

/// Builds `n` identical requests and opens a connection for each, then releases them at one
/// instant (a barrier that the last connection ready opens); the group's wall time runs from
/// the first send to the last end.
async fn release(sender: &Arc<Sender>, endpoint: &Endpoint, text: &str, n: usize, max_tokens: u32) -> Group {
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let request = sender.request(endpoint, text, max_tokens);
        let (sender, barrier, endpoint) = (Arc::clone(sender), Arc::clone(&barrier), endpoint.clone());
        tasks.push(tokio::spawn(async move {
            let connection = sender.connect(&endpoint).await;
            // Every task reaches the barrier, failed or not: the others wait for it.
            barrier.wait().await;
            match (connection, request) {
                (Ok(connection), Ok(request)) => sender.send(connection, request).await,
                (Err(why), _) | (_, Err(why)) => {
                    let now = Instant::now();
                    Timed { sent: now, ended: now, sample: Sample::failed(0.0, why) }
                }
            }
        }));
    }
    let mut timed = Vec::with_capacity(n);
    for task in tasks {
        match task.await {
            Ok(t) => timed.push(t),
            Err(e) => {
                let now = Instant::now();
                timed.push(Timed { sent: now, ended: now, sample: Sample::failed(0.0, format!("task failed: {e}")) });
            }
        }
    }
    let seconds = |from: Option<Instant>, to: Option<Instant>| match (from, to) {
        (Some(from), Some(to)) => to.saturating_duration_since(from).as_secs_f64(),
        _ => 0.0,
    };
    let (first, last_sent) = (timed.iter().map(|t| t.sent).min(), timed.iter().map(|t| t.sent).max());
    let last = timed.iter().map(|t| t.ended).max();
    Group {
        wall_seconds: seconds(first, last),
        sent_spread_seconds: seconds(first, last_sent),
        samples: timed.into_iter().map(|t| t.sample).collect(),
    }
}

/// Groups the plan releases, for the progress bar.
pub fn steps(plan: &Plan) -> u64 {
    let phases = if plan.concurrency > 1 { 2 } else { 1 };
    (plan.endpoints.len() * plan.prompt_sizes.len() * plan.repeats * phases) as u64
}

/// Sizes `prompts` from `endpoint`'s own count: two prompts of [`CALIBRATION_WORDS`] body
/// words, one token generated each, and their `usage.prompt_tokens`. Without a usable count
/// (an error, no usage) the prompts keep the rule, with the reason.
async fn calibrate(sender: &Arc<Sender>, endpoint: &Endpoint, prompts: &mut PromptMaker, run_id: &str) {
    let mut points = Vec::with_capacity(CALIBRATION_WORDS.len());
    for words in CALIBRATION_WORDS {
        // Shaped as the measured prompts' tags, so that the fixed tokens are theirs.
        let tag = format!("Request {run_id}-{}-calibrate-{words}-0.", endpoint.label);
        let group = release(sender, endpoint, &calibration_text(&tag, words), 1, 1).await;
        let Some(sample) = group.samples.first() else { return };
        match (&sample.error, sample.prompt_tokens) {
            (Some(why), _) => return prompts.uncalibrated(format!("the calibration request failed: {why}")),
            (None, None) => return prompts.uncalibrated("the server reports no usage.prompt_tokens".into()),
            (None, Some(tokens)) => points.push((words, tokens)),
        }
    }
    match Calibration::through(points[0], points[1]) {
        Ok(calibration) => prompts.calibrated(calibration, endpoint.label),
        Err(why) => prompts.uncalibrated(why),
    }
}

/// Runs the plan: warm-ups first (an endpoint whose warm-up fails stops the run), then, with
/// no tokenizer, the calibration of prompt sizes against the first endpoint (the same sizes
/// go to the second), then every size, repeat and phase, each on every endpoint in turn, the
/// order of the endpoints flipped at each step (A B, B A, A B…: neither always goes first).
pub async fn measure(plan: &Plan, prompts: &mut PromptMaker, progress: &ProgressBar) -> Result<Measured, Unusable> {
    let sender = Arc::new(Sender::new(plan));
    // Distinct tags across runs too: a second bench against the same server finds no cache.
    // Six hex digits: a few tokens (digits are a token each in Qwen's vocabulary).
    let micros = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_micros());
    let run_id = format!("{:06x}", micros & 0xff_ffff);
    for endpoint in &plan.endpoints {
        for i in 0..plan.warmup {
            progress.set_message(format!("{} warm-up", endpoint.label));
            let prompt = prompts.make(50, &format!("Warm-up {run_id} {} {i}.", endpoint.label));
            let group = release(&sender, endpoint, &prompt.text, 1, 16).await;
            if let Some(why) = group.samples.iter().find_map(|s| s.error.clone()) {
                return Err(Unusable { label: endpoint.label, url: endpoint.url.clone(), reason: why });
            }
        }
    }
    if let (false, Some(first)) = (prompts.has_tokenizer(), plan.endpoints.first()) {
        progress.set_message(format!("{} calibrating prompt sizes", first.label));
        calibrate(&sender, first, prompts, &run_id).await;
    }
    let mut runs = vec![vec![SizeRuns::default(); plan.prompt_sizes.len()]; plan.endpoints.len()];
    let mut phases = vec![("single", 1)];
    if plan.concurrency > 1 {
        phases.push(("together", plan.concurrency));
    }
    for (s, &size) in plan.prompt_sizes.iter().enumerate() {
        for repeat in 0..plan.repeats {
            for (p, &(phase, n)) in phases.iter().enumerate() {
                for e in endpoint_order(plan.endpoints.len(), repeat + p) {
                    let endpoint = &plan.endpoints[e];
                    progress.set_message(format!("{} {size} tokens ×{n} repeat {}", endpoint.label, repeat + 1));
                    let tag = format!("Request {run_id}-{}-{phase}-{size}-{repeat}.", endpoint.label);
                    let prompt = prompts.make(size, &tag);
                    let group = release(&sender, endpoint, &prompt.text, n, plan.max_tokens).await;
                    let runs = &mut runs[e][s];
                    runs.prompt_tokens_sent.push(prompt.tokens);
                    if n == 1 {
                        runs.single.push(group)
                    } else {
                        runs.concurrent.push(group)
                    }
                    progress.inc(1);
                }
            }
        }
    }
    Ok(Measured { runs })
}

/// The endpoints' order at `step`: as given on even steps, reversed on odd ones.
fn endpoint_order(endpoints: usize, step: usize) -> Vec<usize> {
    let order = 0..endpoints;
    if step.is_multiple_of(2) { order.collect() } else { order.rev().collect() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_within_the_window_count_together() {
        let start = Instant::now();
        let mut together = Together::default();
        assert_eq!(together.add(start, 1), 1);
        assert_eq!(together.add(start + Duration::from_micros(50), 3), 4);
        assert_eq!(together.add(start + Duration::from_micros(60), 0), 4);
        assert_eq!(together.add(start + Duration::from_millis(20), 1), 1, "a new run");
    }

    #[test]
    fn the_endpoints_take_turns_going_first() {
        let orders: Vec<Vec<usize>> = (0..4).map(|step| endpoint_order(2, step)).collect();
        assert_eq!(orders, [vec![0, 1], vec![1, 0], vec![0, 1], vec![1, 0]]);
        assert_eq!(endpoint_order(1, 1), [0]);
    }

    #[test]
    fn endpoints_are_reached_by_host_port_and_base_path() {
        let at = |url: &str| Endpoint { label: "A", url: url.into(), model: "m".into() }.target();
        assert_eq!(at("http://127.0.0.1:8000/v1"), Ok(("127.0.0.1:8000".into(), "/v1".into())));
        assert_eq!(at("http://localhost/v1/"), Ok(("localhost:80".into(), "/v1".into())));
        assert!(at("https://example.com/v1").is_err_and(|e| e.contains("only http://")));
    }
}
