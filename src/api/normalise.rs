//! The backend's normalisations that act on its answer to one request (`normalise:`), read
//! from the request as it goes out: where a `stop` finish counts as cut by `max_tokens`
//! (`finish_length`), and the switches the stream meter carries out.

use super::outgoing::Outgoing;
use crate::config::BackendConfig;
use crate::stream::finish::StreamNormalise;

/// The backend's normalisations that act on its answer to this request.
pub(crate) fn stream_normalise(config: &BackendConfig, outgoing: &Outgoing) -> StreamNormalise {
    let on = &config.normalise;
    let length_at = if on.finish_length && outgoing.generates {
        config.kind.max_tokens_of(&outgoing.outbound.body).map(|max| config.kind.length_at(max))
    } else {
        None
    };
    StreamNormalise { length_at, single_finish: on.single_finish, hold_abandoned: on.hold_abandoned }
}
