//! The backend's normalisations that act on its answer to one request (`normalise:`), read
//! from the request as it goes out: where a `stop` finish counts as cut by `max_tokens`
//! (`finish_length`), and the switches the stream meter carries out.

use super::outgoing::Outgoing;
use crate::backend::profile::Kind;
use crate::config::BackendConfig;
use crate::stream::finish::StreamNormalise;

/// The backend's normalisations that act on its answer to this request.
pub(crate) fn stream_normalise(config: &BackendConfig, outgoing: &Outgoing) -> StreamNormalise {
    let on = &config.normalise;
    let length_at = if on.finish_length && outgoing.generates {
        max_tokens_of(config.kind, &outgoing.outbound.body).map(|max| length_at(config.kind, max))
    } else {
        None
    };
    StreamNormalise { length_at, single_finish: on.single_finish, hold_abandoned: on.hold_abandoned }
}

/// The token limit the backend applies to the request, read from the body as it goes to the
/// backend (the gateway always sends one to a generation endpoint). When the body carries both
/// `max_tokens` and `max_completion_tokens`, the servers differ (read in their sources):
/// mlx-openai-server 1.6.3 takes `max_tokens` unless it is null (`app/models/mlx_lm.py`),
/// mlx-omni-server 0.5.3 `max_completion_tokens or max_tokens` (a 0 or null falls through,
/// `openai_adapter.py`). Any other kind: the larger of the two. Its precedence is unknown, and
/// the larger can only miss a cut (the server's own `stop`, as without `finish_length`), where
/// the smaller could turn a finished answer into `length` (and agents continue it).
fn max_tokens_of(kind: Kind, body: &[u8]) -> Option<u64> {
    #[derive(serde::Deserialize)]
    struct Limits {
        max_tokens: Option<u64>,
        max_completion_tokens: Option<u64>,
    }
    let Limits { max_tokens, max_completion_tokens } = serde_json::from_slice(body).ok()?;
    match kind {
        Kind::MlxOpenaiServer => max_tokens.or(max_completion_tokens),
        Kind::MlxOmniServer => max_completion_tokens.filter(|&n| n > 0).or(max_tokens),
        _ => max_tokens.max(max_completion_tokens),
    }
}

/// The completion tokens a backend reports for an answer cut at `max_tokens`: mlx-omni-server
/// drops the last token (the one mlx-lm yields with the finish) and counts one less (measured:
/// 29 for `max_tokens` 30); the others count `max_tokens`.
fn length_at(kind: Kind, max_tokens: u64) -> u64 {
    match kind {
        Kind::MlxOmniServer => max_tokens.saturating_sub(1).max(1),
        _ => max_tokens,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finish_length_reads_the_limit_the_server_applies() {
        let both = br#"{"model":"m","max_tokens":8,"max_completion_tokens":200}"#;
        let reversed = br#"{"model":"m","max_tokens":200,"max_completion_tokens":8}"#;
        // mlx-openai-server: max_tokens first (measured: cut at 8 with both 8 and 200).
        assert_eq!(max_tokens_of(Kind::MlxOpenaiServer, both), Some(8));
        assert_eq!(max_tokens_of(Kind::MlxOpenaiServer, reversed), Some(200));
        // mlx-omni-server: max_completion_tokens first, a 0 falls through (Python's `or`).
        assert_eq!(max_tokens_of(Kind::MlxOmniServer, both), Some(200));
        assert_eq!(max_tokens_of(Kind::MlxOmniServer, reversed), Some(8));
        let zero = br#"{"max_tokens":30,"max_completion_tokens":0}"#;
        assert_eq!(max_tokens_of(Kind::MlxOmniServer, zero), Some(30));
        // Unknown precedence: the larger, which never calls a finished answer cut.
        assert_eq!(max_tokens_of(Kind::Custom, both), Some(200));
        assert_eq!(max_tokens_of(Kind::Custom, reversed), Some(200));
        // One of them, whichever it is, for every kind.
        for kind in [Kind::MlxOpenaiServer, Kind::MlxOmniServer, Kind::Custom] {
            assert_eq!(max_tokens_of(kind, br#"{"max_tokens":5}"#), Some(5), "{kind:?}");
            assert_eq!(max_tokens_of(kind, br#"{"max_completion_tokens":6,"max_tokens":null}"#), Some(6), "{kind:?}");
            assert_eq!(max_tokens_of(kind, br#"{"model":"m"}"#), None, "{kind:?}");
        }
    }
}
