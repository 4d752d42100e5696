//! One backend server process: spawned through the keeper (`mlxgate keep`, see `keeper.rs`)
//! with the backend's environment, its output turned into log lines tagged with the backend's
//! name and kept in a ring for `/admin/backends/{name}/logs`, and stopped by closing the
//! keeper's pipe (SIGTERM to the server's group, SIGKILL after `stop_timeout`).

use std::collections::VecDeque;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, ChildStdin, Command};

use crate::config::ManagedConfig;

/// How many of a backend's last output lines are kept.
const LOG_LINES: usize = 1000;

/// The last lines a backend's server printed, newest last.
#[derive(Default)]
pub struct LogBuffer {
    lines: Mutex<VecDeque<String>>,
}

impl LogBuffer {
    pub fn push(&self, line: String) {
        let mut lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        if lines.len() == LOG_LINES {
            lines.pop_front();
        }
        lines.push_back(line);
    }

    /// The last `n` lines.
    pub fn tail(&self, n: usize) -> Vec<String> {
        let lines = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        lines.iter().skip(lines.len().saturating_sub(n)).cloned().collect()
    }
}

/// A running server (through its keeper).
pub struct ServerProcess {
    keeper: Child,
    /// The gateway's end of the keeper's pipe: dropping it stops the server.
    pipe: Option<ChildStdin>,
    /// The server's own pid, reported by the keeper on its first line.
    server_pid: Arc<AtomicU32>,
}

impl ServerProcess {
    /// Starts `managed.command` under the keeper at `keeper_exe`.
    pub fn spawn(
        keeper_exe: &Path,
        backend: &str,
        managed: &ManagedConfig,
        logs: Arc<LogBuffer>,
    ) -> std::io::Result<Self> {
        let mut command = Command::new(keeper_exe);
        command
            .arg("keep")
            .arg("--grace")
            .arg(humantime::format_duration(managed.stop_timeout).to_string())
            .arg("--")
            .args(&managed.command)
            .envs(&managed.env)
            .current_dir(&managed.workdir)
            .env("PYTHONUNBUFFERED", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            // Its own group: a Ctrl-C in the gateway's terminal reaches the gateway, which then
            // stops the backend in order, rather than every process at once.
            .process_group(0)
            .kill_on_drop(false);
        if let Some(venv) = &managed.venv {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let mut dirs = vec![venv.join("bin")];
            dirs.extend(std::env::split_paths(&path));
            command.env("PATH", std::env::join_paths(dirs).map_err(std::io::Error::other)?);
            command.env("VIRTUAL_ENV", venv);
        }
        let mut keeper = command.spawn()?;
        let server_pid = Arc::new(AtomicU32::new(0));
        if let Some(out) = keeper.stdout.take() {
            tokio::spawn(pump(out, backend.to_string(), Arc::clone(&logs), None));
        }
        if let Some(err) = keeper.stderr.take() {
            tokio::spawn(pump(err, backend.to_string(), logs, Some(Arc::clone(&server_pid))));
        }
        let pipe = keeper.stdin.take();
        Ok(ServerProcess { keeper, pipe, server_pid })
    }

    /// The server's pid once the keeper has reported it, else the keeper's.
    pub fn pid(&self) -> Option<u32> {
        match self.server_pid.load(Ordering::SeqCst) {
            0 => self.keeper.id(),
            pid => Some(pid),
        }
    }

    /// Resolves when the server has exited (the keeper exits with its status).
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        self.keeper.wait().await
    }

    /// Stops the server: closes the pipe, and waits for the keeper to finish its SIGTERM /
    /// SIGKILL sequence; kills the keeper if it does not.
    pub async fn stop(mut self, stop_timeout: Duration) {
        self.pipe.take();
        let bound = stop_timeout + Duration::from_secs(5);
        if tokio::time::timeout(bound, self.keeper.wait()).await.is_err() {
            tracing::warn!("keeper did not stop in time; killing it");
            let _ = self.keeper.kill().await;
        }
    }
}

/// Forwards a stream's lines to the log and the ring buffer.
async fn pump(stream: impl AsyncRead + Unpin, backend: String, logs: Arc<LogBuffer>, pid: Option<Arc<AtomicU32>>) {
    let mut lines = BufReader::new(stream).lines();
    while let Ok(Some(line)) = lines.next_line().await {
        if let Some(pid) = &pid
            && let Some(n) = super::keeper::reported_pid(&line)
        {
            pid.store(n, Ordering::SeqCst);
        }
        tracing::info!(target: "mlxgate::backend::output", backend = %backend, "{line}");
        logs.push(line);
    }
}

/// A short description of how a process ended, for logs and `last_error`.
pub fn describe_exit(status: &std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => match s.code() {
            Some(code) if code > 128 => format!("exited with status {code} (signal {})", code - 128),
            Some(code) => format!("exited with status {code}"),
            None => format!("ended by {s}"),
        },
        Err(e) => format!("could not be waited for: {e}"),
    }
}
