//! Response streams: the body wrapper that forwards, meters and ends each proxied response.

pub mod frame;
pub mod meter;
pub mod sse;
