//! What changes from run to run in a recorded exchange, masked so that the same code gives the
//! same text twice: request and answer ids (`req_…`, `resp_…`, `msg_…`, `toolu_…`, … with
//! their hex), Unix times (`created`, `created_at`) and RFC 3339 ones, and the headers that
//! carry timings, a `retry-after` over its one-second floor and the wait a rate-limit message
//! names. A pure function of the text: tested below.

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::{Captures, Regex};

/// Header lines whose value is a time measured on this run (queue wait, first token, speed) or
/// a time left before a limit resets.
static TIMING_HEADERS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?m)^(x-mlxgate-queue-ms|x-mlxgate-ttft-ms|x-mlxgate-tokens-per-second|x-ratelimit-reset-requests|x-ratelimit-reset-tokens|retry-after-ms): .*$",
    )
    .expect("regex")
});

/// A `retry-after` of more than the one-second floor: the time left until a limit lets the
/// client in, which shrinks as the run goes.
static RETRY_AFTER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?m)^retry-after: ([2-9]|\d{2,})$").expect("regex"));

/// The wait a rate-limit message names ("Please try again in 59.897s.").
static TRY_AGAIN: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"try again in \d+(\.\d+)?(ms|s)").expect("regex"));

/// Unix times in JSON (`"created": 1764597600`, `"created_at": …`, `"completed_at": …`).
static UNIX_TIMES: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#""(created|[a-z_]+_at)":(\s*)\d{9,}"#).expect("regex"));

/// RFC 3339 times in JSON strings (`"2026-12-01T16:20:00Z"`).
static RFC3339: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r#""\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z""#).expect("regex"));

/// Ids made of a known prefix and a long hex run (time and counter, or random).
static IDS: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\b(req|resp|msg|rs|fc|call|toolu)_([0-9a-f]{16,})").expect("regex"));

/// `text` with what changes run to run replaced by placeholders. Each distinct id hex becomes
/// `<idN>`, numbered in the order of first appearance, so that which ids are equal (a response
/// id and the items named after it, a request id in a header and in the error body) stays
/// visible.
pub fn mask(text: &str) -> String {
    let text = TIMING_HEADERS.replace_all(text, "$1: <masked>");
    let text = RETRY_AFTER.replace_all(&text, "retry-after: <seconds>");
    let text = TRY_AGAIN.replace_all(&text, "try again in <time>");
    let text = UNIX_TIMES.replace_all(&text, "\"$1\":$2<time>");
    let text = RFC3339.replace_all(&text, "\"<time>\"");
    let mut seen: HashMap<String, usize> = HashMap::new();
    IDS.replace_all(&text, |c: &Captures| {
        let next = seen.len() + 1;
        let n = *seen.entry(c[2].to_string()).or_insert(next);
        format!("{}_<id{n}>", &c[1])
    })
    .into_owned()
}

#[cfg(test)]
mod tests {
    use super::mask;

    #[test]
    fn timing_headers_are_masked_and_others_kept() {
        let text = "x-mlxgate-queue-ms: 3\nx-mlxgate-ttft-ms: 12\nx-mlxgate-tokens-per-second: 180.5\n\
                    x-ratelimit-reset-requests: 29.9s\nretry-after-ms: 29950\nretry-after: 1\n\
                    x-ratelimit-remaining-requests: 0\ncontent-type: text/event-stream\n";
        assert_eq!(
            mask(text),
            "x-mlxgate-queue-ms: <masked>\nx-mlxgate-ttft-ms: <masked>\nx-mlxgate-tokens-per-second: <masked>\n\
             x-ratelimit-reset-requests: <masked>\nretry-after-ms: <masked>\nretry-after: 1\n\
             x-ratelimit-remaining-requests: 0\ncontent-type: text/event-stream\n"
        );
    }

    #[test]
    fn a_retry_after_over_the_floor_and_a_named_wait_are_masked() {
        let text = "retry-after: 60\nretry-after: 1\nretry-after: 12\n\
                    {\"message\":\"Please try again in 59.897s.\",\"m\":\"try again in 6ms\",\"q\":\"retry after 1s.\"}";
        assert_eq!(
            mask(text),
            "retry-after: <seconds>\nretry-after: 1\nretry-after: <seconds>\n\
             {\"message\":\"Please try again in <time>.\",\"m\":\"try again in <time>\",\"q\":\"retry after 1s.\"}"
        );
    }

    #[test]
    fn a_header_name_inside_a_body_line_is_not_a_header() {
        let text = "data: {\"note\":\"x-mlxgate-queue-ms: 3\"}\n";
        assert_eq!(mask(text), text);
    }

    #[test]
    fn unix_and_rfc3339_times_are_masked_small_numbers_kept() {
        let text = r#"{"created":1764597600,"created_at": 1764597601,"completed_at":1764597602,"x":{"created":0},"t":"2026-12-01T16:20:00Z","n":1764597600}"#;
        assert_eq!(
            mask(text),
            r#"{"created":<time>,"created_at": <time>,"completed_at":<time>,"x":{"created":0},"t":"<time>","n":1764597600}"#
        );
    }

    #[test]
    fn ids_are_numbered_by_first_appearance_and_equal_ids_stay_equal() {
        let text = "x-request-id: req_0123456789abcdef0123456789abcdef\n\
                    {\"id\":\"resp_18d2f0a1b2c3d4e50001\",\"item\":\"msg_18d2f0a1b2c3d4e50001_0\",\
                    \"call\":\"call_18d2f0a1b2c3d4e50001_1\",\"other\":\"toolu_18d2f0a1b2c3d4e60002\",\
                    \"request_id\":\"req_0123456789abcdef0123456789abcdef\"}";
        assert_eq!(
            mask(text),
            "x-request-id: req_<id1>\n\
             {\"id\":\"resp_<id2>\",\"item\":\"msg_<id2>_0\",\"call\":\"call_<id2>_1\",\"other\":\"toolu_<id3>\",\
             \"request_id\":\"req_<id1>\"}"
        );
    }

    #[test]
    fn short_or_non_hex_ids_are_kept() {
        // The simulator's ids are the same on every run: they stay as they are.
        let text = r#"{"id":"chatcmpl-sim1","call":"call_chatcmplsim1_0","fixed":"call_1","toolu_01":"x"}"#;
        assert_eq!(mask(text), text);
    }

    #[test]
    fn masking_is_idempotent() {
        let text = "x-request-id: req_0123456789abcdef0123456789abcdef\n{\"created\":1764597600}";
        assert_eq!(mask(&mask(text)), mask(text));
    }
}
