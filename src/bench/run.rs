//! The scenarios of `mlxgate bench`, run against one or two endpoints: for each prompt size and
//! repeat, a request alone (`single`, also the baseline of the speedup), then `N` identical
//! requests built first and released together through a barrier (`double`, `parallel:N`); with
//! `--compare` each step runs on A, then on B (interleaved, so that a drift of the machine
//! falls on both). Each stream is read as it arrives with the gateway's own SSE parser and
//! figures (`stream::sse`, `stream::meter`), timestamped per read.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{Request, header};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use indicatif::ProgressBar;
use serde_json::json;
use tokio::sync::Barrier;

use super::prompts::PromptMaker;
use super::stats::{Group, Sample};
use crate::stream::meter::StreamFigures;
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

/// The HTTP client the requests go through: plain HTTP/1.1, no proxy, `TCP_NODELAY`.
struct Sender {
    client: Client<HttpConnector, Full<Bytes>>,
    api_key: Option<String>,
    timeout: Duration,
}

impl Sender {
    fn new(plan: &Plan) -> Sender {
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Sender { client, api_key: plan.api_key.clone(), timeout: plan.timeout }
    }

    /// The streamed chat request for `text`, asking for usage.
    fn request(&self, endpoint: &Endpoint, text: &str, max_tokens: u32) -> Result<Request<Full<Bytes>>, String> {
        let body = json!({
            "model": endpoint.model,
            "messages": [{"role": "user", "content": text}],
            "stream": true,
            "stream_options": {"include_usage": true},
            "max_tokens": max_tokens,
            "temperature": 0,
        });
        let mut request = Request::post(format!("{}/chat/completions", endpoint.url))
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "text/event-stream");
        if let Some(key) = &self.api_key {
            request = request.header(header::AUTHORIZATION, format!("Bearer {key}"));
        }
        request.body(Full::new(Bytes::from(body.to_string()))).map_err(|e| format!("cannot build the request: {e}"))
    }

    /// Sends `request` now and reads its stream to the end; the sample and the instants it
    /// was sent and ended.
    async fn send(&self, request: Request<Full<Bytes>>) -> Timed {
        let sent = Instant::now();
        let sample = match tokio::time::timeout(self.timeout, self.read(request, sent)).await {
            Ok(sample) => sample,
            Err(_) => Sample::failed(
                sent.elapsed().as_secs_f64(),
                format!("no end within {}", humantime::format_duration(self.timeout)),
            ),
        };
        Timed { sent, ended: Instant::now(), sample }
    }

    async fn read(&self, request: Request<Full<Bytes>>, sent: Instant) -> Sample {
        let failed = |why: String| Sample::failed(sent.elapsed().as_secs_f64(), why);
        let response = match self.client.request(request).await {
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
                Err(e) => return failed(format!("the stream broke: {e}")),
            };
            let now = Instant::now();
            let mut generated = 0;
            parser.feed(&data, |item, _| generated += u64::from(figures.watch(&item, now, true).1));
            figures.max_frames_in_one_read = figures.max_frames_in_one_read.max(together.add(now, generated));
        }
        let ended = Instant::now();
        // A last event without its blank line still counts (its end is implied).
        parser.feed(b"\n\n", |item, _| {
            figures.watch(&item, ended, true);
        });
        Sample::measured(sent, ended, &figures)
    }
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

/// Builds `n` identical requests, then releases them at one instant; the group's wall time
/// runs from the first send to the last end.
async fn release(sender: &Arc<Sender>, endpoint: &Endpoint, text: &str, n: usize, max_tokens: u32) -> Group {
    let barrier = Arc::new(Barrier::new(n));
    let mut tasks = Vec::with_capacity(n);
    for _ in 0..n {
        let request = sender.request(endpoint, text, max_tokens);
        let (sender, barrier) = (Arc::clone(sender), Arc::clone(&barrier));
        tasks.push(tokio::spawn(async move {
            barrier.wait().await;
            match request {
                Ok(request) => sender.send(request).await,
                Err(why) => {
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
    let first = timed.iter().map(|t| t.sent).min();
    let last = timed.iter().map(|t| t.ended).max();
    let wall_seconds = match (first, last) {
        (Some(first), Some(last)) => last.saturating_duration_since(first).as_secs_f64(),
        _ => 0.0,
    };
    Group { wall_seconds, samples: timed.into_iter().map(|t| t.sample).collect() }
}

/// Groups the plan releases, for the progress bar.
pub fn steps(plan: &Plan) -> u64 {
    let phases = if plan.concurrency > 1 { 2 } else { 1 };
    (plan.endpoints.len() * plan.prompt_sizes.len() * plan.repeats * phases) as u64
}

/// Runs the plan: warm-ups first (an endpoint whose warm-up fails stops the run), then every
/// size, repeat and phase, each on every endpoint in turn.
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
    let mut runs = vec![vec![SizeRuns::default(); plan.prompt_sizes.len()]; plan.endpoints.len()];
    let mut phases = vec![("single", 1)];
    if plan.concurrency > 1 {
        phases.push(("together", plan.concurrency));
    }
    for (s, &size) in plan.prompt_sizes.iter().enumerate() {
        for repeat in 0..plan.repeats {
            for &(phase, n) in &phases {
                for (e, endpoint) in plan.endpoints.iter().enumerate() {
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
}
