//! A managed server's output as the gateway keeps it: the last [`LOG_LINES`] lines in a ring
//! (`/admin/backends/{name}/logs`), the gateway's own lines about the process among them —
//! marks: started, ready, ended, stopped —, and the live feed of new lines to whoever follows
//! them (the `/ui` page's log view). A line is pushed once and shared (`Arc`) by the ring and
//! every follower; with no follower a push costs the ring's lock.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use serde::Serialize;
use tokio::sync::broadcast;

use crate::activity::now_ms;

/// How many of a backend's last output lines are kept.
const LOG_LINES: usize = 1000;

/// How many lines a follower may fall behind before it is told it missed some.
const FOLLOWER_LAG: usize = 512;

/// The gateway's own line about the server's process.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Mark {
    /// A process was spawned.
    Start,
    /// It answered its ready path.
    Ready,
    /// It ended by itself (crashed, hung, could not start).
    Exit,
    /// The gateway stopped it (a swap, idle, an operator, shutdown, a restart).
    Stop,
}

/// One line of a server's output, or a [`Mark`].
#[derive(Debug, Clone, Serialize)]
pub struct LogLine {
    /// When it was read, in milliseconds since the Unix epoch.
    pub at: u64,
    pub text: String,
    /// Set on the gateway's own lines.
    pub mark: Option<Mark>,
}

/// The last lines a backend's server printed, newest last, and their followers.
pub struct LogBuffer {
    lines: Mutex<VecDeque<Arc<LogLine>>>,
    followers: broadcast::Sender<Arc<LogLine>>,
    /// The server's access-log record of a successful health probe (`"GET /health HTTP/1.1" 200`,
    /// as BaseHTTPServer and uvicorn write it): the gateway's own probes, every few seconds, would
    /// crowd the server's real output out of the ring and the log.
    probe_line: Option<String>,
}

impl Default for LogBuffer {
    fn default() -> Self {
        LogBuffer { lines: Mutex::default(), followers: broadcast::channel(FOLLOWER_LAG).0, probe_line: None }
    }
}

impl LogBuffer {
    /// A buffer that leaves out the server's record of the gateway's probes of `ready_path`.
    pub fn new(ready_path: &str) -> Self {
        LogBuffer { probe_line: Some(format!("\"GET {ready_path} HTTP/1.1\" 200")), ..LogBuffer::default() }
    }

    /// Whether `line` is the server's record of a successful probe by the gateway.
    pub fn is_probe(&self, line: &str) -> bool {
        self.probe_line.as_deref().is_some_and(|p| line.contains(p))
    }

    /// Keeps a line the server printed.
    pub fn push(&self, text: String) {
        self.keep(LogLine { at: now_ms(), text, mark: None });
    }

    /// Keeps the gateway's own line about the process (`mlxgate: …`).
    pub fn mark(&self, mark: Mark, text: impl std::fmt::Display) {
        self.keep(LogLine { at: now_ms(), text: format!("mlxgate: {text}"), mark: Some(mark) });
    }

    fn keep(&self, line: LogLine) {
        let line = Arc::new(line);
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == LOG_LINES {
            lines.pop_front();
        }
        lines.push_back(Arc::clone(&line));
        // Sent under the lock, so that a follower's backlog and its feed neither miss nor
        // repeat a line (see `follow`). No follower: nothing to send.
        if self.followers.receiver_count() > 0 {
            let _ = self.followers.send(line);
        }
    }

    /// The last `n` lines the server printed (marks left out: this is what explains a crash).
    pub fn tail(&self, n: usize) -> Vec<String> {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let printed: Vec<&Arc<LogLine>> = lines.iter().filter(|l| l.mark.is_none()).collect();
        printed.iter().skip(printed.len().saturating_sub(n)).map(|l| l.text.clone()).collect()
    }

    /// The last `n` lines, marks included.
    pub fn recent(&self, n: usize) -> Vec<Arc<LogLine>> {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().skip(lines.len().saturating_sub(n)).cloned().collect()
    }

    /// The last `n` lines and every line after them, as they come: no line missed or repeated
    /// between the two. A follower that falls [`FOLLOWER_LAG`] lines behind is told how many it
    /// missed (`RecvError::Lagged`).
    pub fn follow(&self, n: usize) -> (Vec<Arc<LogLine>>, broadcast::Receiver<Arc<LogLine>>) {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        let backlog = lines.iter().skip(lines.len().saturating_sub(n)).cloned().collect();
        (backlog, self.followers.subscribe())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_record_of_the_gateways_probes_is_left_out() {
        let logs = LogBuffer::new("/health");
        // mlx_lm.server (BaseHTTPServer) and uvicorn write their access lines like this.
        assert!(logs.is_probe(r#"127.0.0.1 - - [30/Nov/2026 06:24:54] "GET /health HTTP/1.1" 200 -"#));
        assert!(logs.is_probe(r#"INFO:     127.0.0.1:51234 - "GET /health HTTP/1.1" 200 OK"#));
        assert!(!logs.is_probe(r#"127.0.0.1 - - [30/Nov/2026 06:24:54] "GET /health HTTP/1.1" 503 -"#));
        assert!(!logs.is_probe(r#""POST /v1/chat/completions HTTP/1.1" 200 -"#));
        assert!(!LogBuffer::default().is_probe(r#""GET /health HTTP/1.1" 200"#));
    }

    #[test]
    fn the_ring_keeps_the_last_lines_and_tail_leaves_marks_out() {
        let logs = LogBuffer::default();
        for i in 0..LOG_LINES + 5 {
            logs.push(format!("line {i}"));
        }
        logs.mark(Mark::Exit, "ended: killed by signal 9");
        assert_eq!(logs.tail(2), [format!("line {}", LOG_LINES + 3), format!("line {}", LOG_LINES + 4)]);
        let recent = logs.recent(2);
        assert_eq!(recent[1].mark, Some(Mark::Exit));
        assert_eq!(recent[1].text, "mlxgate: ended: killed by signal 9");
        assert_eq!(logs.recent(usize::MAX).len(), LOG_LINES);
    }

    #[tokio::test]
    async fn a_follower_gets_its_backlog_then_every_later_line_once() {
        let logs = Arc::new(LogBuffer::default());
        logs.push("before".into());
        let (backlog, mut feed) = logs.follow(10);
        assert_eq!(backlog.iter().map(|l| l.text.as_str()).collect::<Vec<_>>(), ["before"]);
        logs.mark(Mark::Start, "starting");
        logs.push("after".into());
        assert_eq!(feed.recv().await.expect("line").mark, Some(Mark::Start));
        assert_eq!(feed.recv().await.expect("line").text, "after");
        // A follower that falls behind is told how many it missed, then goes on.
        for i in 0..FOLLOWER_LAG + 3 {
            logs.push(format!("flood {i}"));
        }
        assert!(matches!(feed.recv().await, Err(broadcast::error::RecvError::Lagged(3))));
        assert_eq!(feed.recv().await.expect("line").text, "flood 3");
    }
}
