//! A keep-alive connection the simulator closes once it has been idle too long, the way uvicorn
//! closes one idle 5 s — at its worst: the request that arrives after the idle time is read and
//! the connection is then closed unanswered, as when the server's close and the client's request
//! cross on the wire (the client reused a connection it believed open). Deterministic, where the
//! real race is a matter of milliseconds.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A connection that reads as closed (EOF) when bytes arrive after `idle` without traffic, once
/// it has answered something.
pub struct IdleClose<T> {
    io: T,
    idle: Duration,
    last: Instant,
    answered: bool,
}

impl<T> IdleClose<T> {
    /// `io`, closed when a request comes after `idle` of silence.
    pub fn new(io: T, idle: Duration) -> Self {
        IdleClose { io, idle, last: Instant::now(), answered: false }
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for IdleClose<T> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let read = Pin::new(&mut self.io).poll_read(cx, buf);
        if matches!(read, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            if self.answered && self.last.elapsed() >= self.idle {
                // The server had closed: the request is dropped unread, the connection ends.
                buf.set_filled(before);
                return Poll::Ready(Ok(()));
            }
            self.last = Instant::now();
        }
        read
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for IdleClose<T> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let written = Pin::new(&mut self.io).poll_write(cx, data);
        if matches!(written, Poll::Ready(Ok(n)) if n > 0) {
            self.last = Instant::now();
            self.answered = true;
        }
        written
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}
