//! What the gateway did lately, kept for the `/ui` page and `/admin/requests`: the last
//! [`REQUESTS`] finished API requests (each one's summary, written when its record is finished,
//! beside its access-log line), the last [`SWAPS`] times a managed backend was stopped and why,
//! and — for models with `capture: true` only — the bodies of the last [`CAPTURES`] requests.
//!
//! Everything is bounded, and with no page open a finished request costs one short lock and a
//! ring push: followers (`follow`) get each summary through a bounded broadcast, and one that
//! falls behind is told how many it missed instead of holding memory. A summary carries
//! configured names, the request id, the status and the figures; never a key, a prompt or an
//! answer (the capture is kept apart, by request id, and only when the user asked for it).
//!
//! A leaf: it imports nothing of the crate (the record fills a summary; the scheduler and the
//! admin calls note swaps; the API reads them).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::broadcast;

/// How many finished requests are kept.
pub const REQUESTS: usize = 500;
/// How many swaps are kept.
pub const SWAPS: usize = 20;
/// How many captured request bodies are kept.
pub const CAPTURES: usize = 32;
/// The most of a request body a capture keeps.
pub const CAPTURE_BYTES: usize = 64 * 1024;
/// How many summaries a follower may fall behind before it is told it missed some.
const FOLLOWER_LAG: usize = 1024;

/// One finished API request, as the `/ui` page's activity view shows it. Every name in it is
/// a configured one (or the request id); every figure may be unknown.
#[derive(Debug, Clone, Default, Serialize)]
pub struct RequestSummary {
    /// The gateway's own number for it, in finishing order (a client may send the same
    /// `x-request-id` twice: this one is unique in the process).
    pub seq: u64,
    pub id: Id,
    /// When it finished and when it arrived, in milliseconds since the Unix epoch.
    pub at: u64,
    pub started: u64,
    pub client: String,
    pub model: String,
    /// The alias the client asked for the model by.
    pub alias: Option<Box<str>>,
    /// The model whose request `model` (its fallback) served.
    pub fallback_from: Option<Box<str>>,
    pub backend: String,
    /// The API face (`chat`, `responses`, `messages`, …).
    pub face: &'static str,
    #[serde(serialize_with = "method_text")]
    pub method: http::Method,
    pub path: Box<str>,
    /// The status of the response's headers (499: the client left before them).
    pub status: u16,
    /// `ok`, or the error type of `mlxgate_requests_total`'s outcome label.
    pub outcome: &'static str,
    pub streaming: bool,
    pub queue_ms: Option<f64>,
    pub ttft_ms: Option<f64>,
    /// Decode speed of a spread-out stream with known tokens.
    pub decode_tps: Option<f64>,
    /// Most of the stream's tokens came in one read (no decode speed to tell).
    pub burst: bool,
    pub prompt_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    /// What the gateway did to fit the prompt (the answer's `x-mlxgate-transform`).
    pub transform: Option<Box<str>>,
    /// Why the balancer chose the backend, and the cached tokens it predicted there.
    pub route: Option<&'static str>,
    pub predicted_cached_tokens: Option<u64>,
    pub duration_ms: f64,
    /// A body was captured for it (`GET /admin/requests/{id}` has it).
    pub captured: bool,
}

/// A request's id: the bytes of its `x-request-id` header, shared (no copy per request);
/// visible ASCII, as the access log keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Id(pub http::HeaderValue);

impl Id {
    /// The id's text.
    pub fn as_str(&self) -> &str {
        self.0.to_str().unwrap_or("-")
    }
}

impl Default for Id {
    fn default() -> Self {
        Id(http::HeaderValue::from_static("-"))
    }
}

impl From<&str> for Id {
    fn from(text: &str) -> Self {
        http::HeaderValue::from_str(text).map_or_else(|_| Id::default(), Id)
    }
}

impl Serialize for Id {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

fn method_text<S: serde::Serializer>(method: &http::Method, serializer: S) -> Result<S::Ok, S::Error> {
    serializer.serialize_str(method.as_str())
}

/// A captured request body (its first [`CAPTURE_BYTES`], as text).
#[derive(Debug, Clone, Serialize)]
pub struct Capture {
    pub body: String,
    pub truncated: bool,
}

impl Capture {
    /// The first [`CAPTURE_BYTES`] of `body` (cut on a character boundary; invalid UTF-8
    /// replaced).
    pub fn of(body: &[u8]) -> Capture {
        let mut end = body.len().min(CAPTURE_BYTES);
        if let Err(e) = std::str::from_utf8(&body[..end])
            && e.error_len().is_none()
        {
            // Cut inside a character: end before it.
            end = e.valid_up_to();
        }
        Capture { body: String::from_utf8_lossy(&body[..end]).into_owned(), truncated: end < body.len() }
    }
}

/// A managed backend stopped by the gateway: a swap (and its reason), idle, or an operator.
#[derive(Debug, Clone, Serialize)]
pub struct Swap {
    /// Milliseconds since the Unix epoch.
    pub at: u64,
    /// The backend stopped.
    pub backend: String,
    /// The backend it made room for (a swap).
    pub next: Option<String>,
    /// A swap's reason (`mlxgate_backend_swaps_total`'s), `idle` or `admin`.
    pub reason: &'static str,
}

/// The rings and the feed (one per gateway, shared).
pub struct Activity {
    requests: Mutex<VecDeque<Arc<RequestSummary>>>,
    feed: broadcast::Sender<Arc<RequestSummary>>,
    swaps: Mutex<VecDeque<Swap>>,
    /// By the summary's `seq`.
    captures: Mutex<VecDeque<(u64, Arc<Capture>)>>,
    next_seq: std::sync::atomic::AtomicU64,
}

impl Default for Activity {
    fn default() -> Self {
        Activity {
            requests: Mutex::new(VecDeque::with_capacity(REQUESTS)),
            feed: broadcast::channel(FOLLOWER_LAG).0,
            swaps: Mutex::default(),
            captures: Mutex::default(),
            next_seq: std::sync::atomic::AtomicU64::new(1),
        }
    }
}

/// Locks a ring whatever a panicking holder left (every ring is valid after any push).
fn lock<T>(ring: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    ring.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Pushes `item` onto `ring`, dropping the oldest beyond `most`.
fn push_bounded<T>(ring: &mut VecDeque<T>, item: T, most: usize) {
    if ring.len() >= most {
        ring.pop_front();
    }
    ring.push_back(item);
}

impl Activity {
    /// Keeps a finished request (and its capture, if any) and hands it to the followers.
    pub fn finished(&self, mut summary: RequestSummary, capture: Option<Capture>) {
        let mut requests = lock(&self.requests);
        summary.seq = self.next_seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(capture) = capture {
            push_bounded(&mut lock(&self.captures), (summary.seq, Arc::new(capture)), CAPTURES);
        }
        let summary = Arc::new(summary);
        push_bounded(&mut requests, Arc::clone(&summary), REQUESTS);
        // Under the ring's lock, so that a follower's backlog and its feed neither miss nor
        // repeat a request (see `follow`).
        if self.feed.receiver_count() > 0 {
            let _ = self.feed.send(summary);
        }
    }

    /// The last `n` finished requests, newest first.
    pub fn recent(&self, n: usize) -> Vec<Arc<RequestSummary>> {
        lock(&self.requests).iter().rev().take(n).cloned().collect()
    }

    /// The last `n` finished requests (newest first) and every one finished after them, as it
    /// finishes. A follower [`FOLLOWER_LAG`] behind is told how many it missed.
    pub fn follow(&self, n: usize) -> (Vec<Arc<RequestSummary>>, broadcast::Receiver<Arc<RequestSummary>>) {
        let requests = lock(&self.requests);
        let backlog = requests.iter().rev().take(n).cloned().collect();
        (backlog, self.feed.subscribe())
    }

    /// A request still in the ring, by id (the newest of that id, or the one numbered `seq`),
    /// with its capture if one was kept.
    pub fn request(&self, id: &str, seq: Option<u64>) -> Option<(Arc<RequestSummary>, Option<Arc<Capture>>)> {
        let summary = lock(&self.requests)
            .iter()
            .rev()
            .find(|r| r.id.as_str() == id && seq.is_none_or(|seq| r.seq == seq))
            .cloned()?;
        let capture = lock(&self.captures).iter().rev().find(|(c, _)| *c == summary.seq).map(|(_, c)| Arc::clone(c));
        Some((summary, capture))
    }

    /// Notes that the gateway stopped `backend` (for `next`, a swap) and why.
    pub fn swapped(&self, backend: &str, next: Option<&str>, reason: &'static str) {
        let swap = Swap { at: now_ms(), backend: backend.to_owned(), next: next.map(str::to_owned), reason };
        push_bounded(&mut lock(&self.swaps), swap, SWAPS);
    }

    /// The last swaps, newest first.
    pub fn swaps(&self) -> Vec<Swap> {
        lock(&self.swaps).iter().rev().cloned().collect()
    }
}

/// Now, in milliseconds since the Unix epoch.
pub fn now_ms() -> u64 {
    epoch_ms(SystemTime::now())
}

/// `at` in milliseconds since the Unix epoch (0 before it).
pub fn epoch_ms(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn summary(id: &str) -> RequestSummary {
        RequestSummary { id: id.into(), model: "m".into(), ..RequestSummary::default() }
    }

    #[test]
    fn rings_keep_the_newest_within_their_bounds() {
        let activity = Activity::default();
        for i in 0..REQUESTS + 10 {
            let capture = (i % 2 == 0).then(|| Capture::of(b"{}"));
            activity.finished(summary(&format!("r{i}")), capture);
        }
        let recent = activity.recent(usize::MAX);
        assert_eq!(recent.len(), REQUESTS);
        assert_eq!(recent[0].id.as_str(), format!("r{}", REQUESTS + 9));
        assert!(activity.request("r0", None).is_none(), "pushed out of the ring");
        let (_, capture) = activity.request(&format!("r{}", REQUESTS + 8), None).expect("kept");
        assert!(capture.is_some());
        assert!(activity.request(&format!("r{}", REQUESTS + 9), None).expect("kept").1.is_none());
        assert!(lock(&activity.captures).len() <= CAPTURES);
        for i in 0..SWAPS + 3 {
            activity.swapped("a", Some("b"), if i % 2 == 0 { "due" } else { "idle" });
        }
        assert_eq!(activity.swaps().len(), SWAPS);
    }

    #[test]
    fn a_capture_is_bounded_and_cut_on_a_character() {
        let small = Capture::of("héllo".as_bytes());
        assert_eq!((small.body.as_str(), small.truncated), ("héllo", false));
        let mut big = vec![b'a'; CAPTURE_BYTES - 1];
        big.extend("é and more".as_bytes());
        let cut = Capture::of(&big);
        assert!(cut.truncated);
        assert_eq!(cut.body.len(), CAPTURE_BYTES - 1, "the 2-byte é across the bound is left out whole");
        let invalid = Capture::of(b"\xff\xfeok");
        assert_eq!((invalid.body.as_str(), invalid.truncated), ("\u{fffd}\u{fffd}ok", false));
    }

    #[test]
    fn the_same_client_id_twice_is_two_requests_told_apart_by_seq() {
        let activity = Activity::default();
        activity.finished(summary("dup"), Some(Capture::of(b"first")));
        activity.finished(summary("dup"), None);
        let recent = activity.recent(10);
        assert_eq!(recent.len(), 2);
        assert!(recent[0].seq > recent[1].seq);
        let (newest, capture) = activity.request("dup", None).expect("kept");
        assert_eq!((newest.seq, capture.is_none()), (recent[0].seq, true));
        let (first, capture) = activity.request("dup", Some(recent[1].seq)).expect("kept");
        assert_eq!(first.seq, recent[1].seq);
        assert_eq!(capture.map(|c| c.body.clone()).as_deref(), Some("first"), "the capture is the first one's");
        assert!(activity.request("dup", Some(u64::MAX)).is_none());
    }

    #[tokio::test]
    async fn a_follower_gets_its_backlog_then_each_later_request_once() {
        let activity = Activity::default();
        activity.finished(summary("before"), None);
        let (backlog, mut feed) = activity.follow(200);
        assert_eq!(backlog.iter().map(|r| r.id.as_str()).collect::<Vec<_>>(), ["before"]);
        activity.finished(summary("after"), None);
        assert_eq!(feed.recv().await.expect("summary").id.as_str(), "after");
        for i in 0..FOLLOWER_LAG + 2 {
            activity.finished(summary(&format!("f{i}")), None);
        }
        assert!(matches!(feed.recv().await, Err(broadcast::error::RecvError::Lagged(2))));
    }
}
