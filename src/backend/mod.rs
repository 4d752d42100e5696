//! Backends: the servers requests are forwarded to, the client that reaches them, and for
//! managed backends the process, its keeper and its supervisor.

pub mod footprint;
pub mod gate;
pub mod handle;
pub mod keeper;
pub mod logs;
pub mod preflight;
pub mod probe_remote;
pub mod process;
pub mod supervisor;
pub mod upstream;
