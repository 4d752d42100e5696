//! The integration tests, one binary: each module was once a binary of its own under `tests/`,
//! each linking the whole library; as modules of this one it is linked once. A test's name is
//! `MODULE::TEST` (`cargo nextest run -E 'test(/^proxy::/)'` runs one module), and
//! `.config/nextest.toml` groups the tests that need real servers or agents by those prefixes.
//!
//! A new test file: put it in `tests/it/`, add its `mod` line below (in order), and reach the
//! shared helpers as `crate::common`.

mod common;

mod abandoned_swap;
mod access_log;
mod agents;
mod architecture;
mod auth;
mod balance;
mod balance_real;
mod bench_balance;
mod bench_cli;
mod bench_swaps;
mod bench_ui;
mod cached_tokens;
mod cli;
mod context;
mod context_agents;
mod context_real;
mod context_shapes;
mod dashboards;
mod dashboards_files;
mod docs;
mod drain;
mod faults;
mod golden;
mod hostile;
mod kinds_real;
mod lifecycle;
mod limits;
mod limits_redis;
mod limits_sdk;
mod managed;
mod managed_real;
mod messages;
mod messages_count;
mod messages_history_real;
mod messages_kinds_real;
mod messages_real;
mod messages_sdk;
mod metrics;
mod metrics_real;
mod model_names;
mod normalise_stream;
mod normalise_transport;
mod pool;
mod probe;
mod profile;
mod proxy;
mod reload;
mod responses;
mod responses_real;
mod responses_sdk;
mod service;
mod sim;
mod swap_budget;
mod swap_review;
mod swap_schedule;
mod tokens_exactness;
mod tokens_reference;
mod ui;
mod ui_browser;
mod ui_rev;
mod upstream_pool;
