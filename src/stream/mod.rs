//! Response streams: the SSE parser, the reading of one event's fields, the figures an answer
//! shows, the byte slicer with its finish normalisations, and the body wrapper that forwards,
//! meters and ends each proxied response; the shutdown cut and the hold of an abandoned answer.

pub mod abandoned;
mod alarms;
pub mod figures;
pub mod finish;
mod forward;
pub mod frame;
pub mod meter;
pub mod shutdown;
pub mod sse;
