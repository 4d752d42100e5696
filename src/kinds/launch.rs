//! A managed server's launch command: its kind's template (or the file's `command`) with
//! `{model}`, `{host}` and `{port}` filled in, when the server is started — not when the
//! configuration is read, which keeps the template as written.

/// Managed servers listen on loopback only: the gateway is their one client.
pub const MANAGED_HOST: &str = "127.0.0.1";

/// The command line a managed server is started with: `template` (the file's `command` or the
/// kind's) filled with its `model`, [`MANAGED_HOST`] and its `port`.
pub fn command(template: &[String], model: &str, port: u16) -> Vec<String> {
    fill_template(template, model, MANAGED_HOST, port)
}

/// Replaces `{model}`, `{host}` and `{port}` in each argument.
pub fn fill_template(template: &[String], model: &str, host: &str, port: u16) -> Vec<String> {
    template
        .iter()
        .map(|arg| arg.replace("{model}", model).replace("{host}", host).replace("{port}", &port.to_string()))
        .collect()
}
