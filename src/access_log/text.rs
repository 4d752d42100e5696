//! The access line written straight to the log (stderr, or `--log-file`: [`crate::log_file`]), in the text format tracing's formatter gives it
//! (`2026-12-02T08:27:37.270136Z  INFO mlxgate::access: request_id=… method=POST …`), without
//! going through the formatter: its generic field visitor and styling cost more per request
//! than the rest of the line's work (measured: a tenth of the gateway's instructions per
//! request). Used only where the log is plain text to a file or a pipe (`mlxgate serve` sets it
//! up, [`enable`]); JSON lines, a terminal's colours and in-process tests keep tracing's
//! formatter. `RUST_LOG` still decides whether the line is written (`mlxgate::access=off`).
//!
//! The same line, field for field: `%` fields as their text, numbers as numbers, optional
//! strings quoted and escaped as `{:?}` does, absent ones left out (the property test below
//! holds it to tracing's own output).

use std::cell::RefCell;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{AccessLine, Ending};

static DIRECT: AtomicBool = AtomicBool::new(false);

/// From now on, access lines go straight to the log (plain text logging).
pub fn enable() {
    DIRECT.store(true, Ordering::Relaxed);
}

/// Writes `line` straight to the log when that is set up (see [`enable`]) and `RUST_LOG` lets
/// the line through; false when the line is left to tracing.
pub(super) fn write(line: &AccessLine, end: &Ending<'_>) -> bool {
    if !DIRECT.load(Ordering::Relaxed) {
        return false;
    }
    if tracing::enabled!(target: "mlxgate::access", tracing::Level::INFO) {
        thread_local! {
            static BUFFER: RefCell<(Vec<u8>, Stamp)> = RefCell::new((Vec::with_capacity(512), Stamp::default()));
        }
        BUFFER.with_borrow_mut(|(buffer, stamp)| {
            buffer.clear();
            stamp.write(buffer, SystemTime::now());
            buffer.extend_from_slice(b"  INFO mlxgate::access: ");
            fields(buffer, line, end);
            buffer.push(b'\n');
            crate::log_file::write_line(buffer);
        });
    }
    true
}

/// The line's fields, as tracing's default formatter writes them.
pub(super) fn fields(out: &mut Vec<u8>, line: &AccessLine, end: &Ending<'_>) {
    let model = if end.model.is_empty() { line.asked_model.as_deref().unwrap_or("") } else { end.model };
    text(out, "request_id", line.id.as_str());
    text(out, " method", line.method.as_str());
    text(out, " path", &line.path);
    text(out, " face", line.face.as_str());
    number(out, " status", u64::from(line.status.unwrap_or(499)));
    text(out, " outcome", end.outcome);
    quoted(out, " model", (!model.is_empty()).then_some(model));
    quoted(out, " alias", line.alias.as_deref());
    quoted(out, " fallback_from", line.fallback_from.as_deref());
    if !end.backend.is_empty() {
        text(out, " backend", end.backend);
    }
    text(out, " client", end.client);
    tenths(out, " duration_ms", Some(end.duration));
    tenths(out, " queue_ms", line.queue_wait);
    tenths(out, " ttft_ms", line.ttft);
    for (name, value) in [
        (" prompt_tokens", line.prompt_tokens),
        (" cached_tokens", line.cached_tokens),
        (" completion_tokens", line.completion_tokens),
    ] {
        if let Some(n) = value {
            number(out, name, n);
        }
    }
    quoted(out, " route", line.route.map(|(reason, _)| reason));
    if let Some((_, tokens)) = line.route {
        number(out, " predicted_cached_tokens", tokens);
    }
    quoted(out, " transform", line.transform.as_deref());
    if line.piece {
        out.extend_from_slice(b" piece=true");
    }
}

fn text(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(name.as_bytes());
    out.push(b'=');
    out.extend_from_slice(value.as_bytes());
}

fn number(out: &mut Vec<u8>, name: &str, value: u64) {
    out.extend_from_slice(name.as_bytes());
    out.push(b'=');
    out.extend_from_slice(itoa::Buffer::new().format(value).as_bytes());
}

fn quoted(out: &mut Vec<u8>, name: &str, value: Option<&str>) {
    let Some(value) = value else { return };
    out.extend_from_slice(name.as_bytes());
    out.push(b'=');
    if value.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'\\' || b == b' ') {
        out.push(b'"');
        out.extend_from_slice(value.as_bytes());
        out.push(b'"');
    } else {
        let _ = write!(out, "{value:?}");
    }
}

/// A duration in milliseconds rounded to a tenth, as `{:?}` writes that `f64` (`12.0`, `0.3`).
fn tenths(out: &mut Vec<u8>, name: &str, value: Option<Duration>) {
    let Some(d) = value else { return };
    // The same arithmetic as the traced line's (milliseconds, then tenths), rounded alike.
    let tenths = (d.as_secs_f64() * 1000.0 * 10.0).round() as u64;
    out.extend_from_slice(name.as_bytes());
    out.push(b'=');
    let mut digits = itoa::Buffer::new();
    out.extend_from_slice(digits.format(tenths / 10).as_bytes());
    out.push(b'.');
    out.push(b'0' + (tenths % 10) as u8);
}

/// The timestamp as tracing's formatter writes it (RFC 3339, UTC, microseconds), its date and
/// time of day made once a second.
#[derive(Default)]
struct Stamp {
    second: u64,
    text: Vec<u8>,
}

impl Stamp {
    fn write(&mut self, out: &mut Vec<u8>, now: SystemTime) {
        let since = now.duration_since(UNIX_EPOCH).unwrap_or_default();
        let second = since.as_secs();
        if second != self.second || self.text.is_empty() {
            self.second = second;
            self.text = date_time(second).into_bytes();
        }
        out.extend_from_slice(&self.text);
        let _ = write!(out, ".{:06}Z", since.subsec_micros());
    }
}

/// `YYYY-MM-DDTHH:MM:SS` of a Unix time, UTC (the proleptic Gregorian calendar; the date by the
/// chat templates' `civil_from_days`).
fn date_time(unix: u64) -> String {
    let of_day = unix % 86_400;
    let (year, month, day) = crate::tokens::template::civil_from_days((unix / 86_400) as i64);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}", of_day / 3600, of_day / 60 % 60, of_day % 60)
}

#[cfg(test)]
mod tests;
