//! Response streams: the body wrapper that forwards, meters and ends each proxied response.

pub mod meter;
pub mod sse;
