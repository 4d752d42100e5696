//! Backends: the servers requests are forwarded to, and the client that reaches them.

pub mod upstream;
