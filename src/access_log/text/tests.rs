use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::access_log::{Face, RequestId};

/// What tracing's formatter writes for the line (everything after the target), the format the
/// direct writer must match.
fn traced(line: &AccessLine, end: &Ending<'_>) -> String {
    #[derive(Clone, Default)]
    struct Sink(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("sink").extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let sink = Sink::default();
    let writer = sink.clone();
    let subscriber =
        tracing_subscriber::fmt().with_ansi(false).without_time().with_writer(move || writer.clone()).finish();
    tracing::subscriber::with_default(subscriber, || crate::access_log::traced(line, end));
    let text = String::from_utf8(sink.0.lock().expect("sink").clone()).expect("utf-8");
    text.split_once("mlxgate::access: ").map(|(_, rest)| rest.trim_end().to_string()).unwrap_or(text)
}

fn direct(line: &AccessLine, end: &Ending<'_>) -> String {
    let mut out = Vec::new();
    fields(&mut out, line, end);
    String::from_utf8(out).expect("utf-8")
}

fn any_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9._/-]{1,12}",
        "\\PC{0,10}",
        Just("with \"quotes\" and \\ back".to_string()),
        Just("tab\tnew\nline\u{7f}\u{200b}é".to_string()),
    ]
}

proptest! {
    #[test]
    fn the_direct_line_is_tracings_line(
        model in any_text(), asked in proptest::option::of(any_text()), alias in proptest::option::of(any_text()),
        backend in prop_oneof![Just(String::new()), "[a-z-]{1,8}"], status in proptest::option::of(100u16..600),
        millis in proptest::collection::vec(proptest::option::of(0u64..10_000_000), 3),
        tokens in proptest::collection::vec(proptest::option::of(any::<u64>()), 3),
        route in proptest::option::of(("[a-z_]{1,10}", any::<u64>())), piece in any::<bool>(),
        transform in proptest::option::of(any_text()), path in "/[a-z/]{0,20}", get in any::<bool>(),
    ) {
        let method = if get { http::Method::GET } else { http::Method::POST };
        let mut line = AccessLine::new(true, RequestId::new(), method, &path);
        line.status = status;
        line.asked_model = asked.map(Into::into);
        line.alias = alias.map(Into::into);
        line.fallback_from = Some("other".into()).filter(|_| piece);
        let micros = |i: usize| millis[i].map(Duration::from_micros);
        (line.queue_wait, line.ttft) = (micros(0), micros(1));
        (line.prompt_tokens, line.cached_tokens, line.completion_tokens) = (tokens[0], tokens[1], tokens[2]);
        let reason: &'static str = route.as_ref().map_or("least_loaded", |(r, _)| Box::leak(r.clone().into_boxed_str()));
        line.route = route.map(|(_, n)| (reason, n));
        line.transform = transform.map(Into::into);
        line.piece = piece;
        line.face = if get { Face::Health } else { Face::Chat };
        let end = Ending {
            model: &model, backend: &backend, client: "anonymous", outcome: "ok",
            duration: micros(2).unwrap_or_default(),
        };
        prop_assert_eq!(direct(&line, &end), traced(&line, &end));
    }
}

#[test]
fn timestamps_are_rfc_3339_utc_with_microseconds() {
    let mut stamp = Stamp::default();
    let mut out = Vec::new();
    let at = UNIX_EPOCH + Duration::from_micros(1_764_662_857_270_136);
    stamp.write(&mut out, at);
    assert_eq!(String::from_utf8(out).expect("utf-8"), "2025-12-02T08:07:37.270136Z");
    for (unix, text) in [
        (0, "1970-01-01T00:00:00"),
        (951_782_400, "2000-02-29T00:00:00"),
        (4_107_542_399, "2100-02-28T23:59:59"),
        (1_798_761_600, "2027-01-01T00:00:00"),
    ] {
        assert_eq!(date_time(unix), text);
    }
}
