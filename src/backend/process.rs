//! One backend server process: spawned through the keeper (`mlxgate keep`, see `keeper.rs`)
//! with the backend's environment, its output turned into log lines tagged with the backend's
//! name and kept in its ring (`logs.rs`), and stopped by closing the
//! keeper's pipe (SIGTERM to the server's group, SIGKILL after `stop_timeout`).

use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::process::{Child, ChildStdin, Command};
use tokio::sync::watch;

use super::logs::LogBuffer;
use crate::config::ManagedConfig;

/// A running server (through its keeper).
pub struct ServerProcess {
    keeper: Child,
    /// The gateway's end of the keeper's pipe: dropping it stops the server.
    pipe: Option<ChildStdin>,
    /// The server's own pid (0 until the keeper reports it on its first line). The server leads
    /// a process group of its own, so this is also the group that holds its children.
    server_pid: watch::Receiver<u32>,
    /// The backend's port: the key of the server's record (see [`super::keeper::ServerRecord`]).
    port: u16,
}

/// How long the gateway waits for a dead keeper's pid report still in its pipe.
const PID_REPORT_WAIT: Duration = Duration::from_secs(2);

impl ServerProcess {
    /// Starts the managed server's [`launch_command`] under the keeper at `keeper_exe`.
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
            .args(launch_command(managed))
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
            command.env("PATH", std::env::join_paths(search_path(managed)).map_err(std::io::Error::other)?);
            command.env("VIRTUAL_ENV", venv);
        }
        let mut keeper = command.spawn()?;
        let (report, server_pid) = watch::channel(0);
        if let Some(out) = keeper.stdout.take() {
            tokio::spawn(pump(out, backend.to_string(), Arc::clone(&logs), None));
        }
        if let Some(err) = keeper.stderr.take() {
            tokio::spawn(pump(err, backend.to_string(), logs, Some(report)));
        }
        let pipe = keeper.stdin.take();
        tokio::spawn(record_when_reported(server_pid.clone(), managed.port));
        Ok(ServerProcess { keeper, pipe, server_pid, port: managed.port })
    }

    /// The server's pid once the keeper has reported it, else the keeper's.
    pub fn pid(&self) -> Option<u32> {
        match *self.server_pid.borrow() {
            0 => self.keeper.id(),
            pid => Some(pid),
        }
    }

    /// Records the server again, as it runs now (a server that replaced its program with `exec`
    /// since it started has another command line): call once it is ready.
    pub async fn record(&self) {
        let (port, pid) = (self.port, *self.server_pid.borrow());
        if pid != 0 {
            let _ = tokio::task::spawn_blocking(move || super::keeper::record_server(port, pid)).await;
        }
    }

    /// Resolves when the keeper has exited: with the server's status when the server exited by
    /// itself. Whatever ended the keeper (a `kill -9` of the keeper included, which it cannot
    /// handle), the server's process group is then killed, so no server outlives its keeper
    /// while the gateway runs.
    pub async fn wait(&mut self) -> std::io::Result<ExitStatus> {
        let status = self.keeper.wait().await;
        self.kill_server_group().await;
        status
    }

    /// SIGKILL to the server's group, once its pid is known (the report may still be in the
    /// pipe of a keeper that was just killed). A group already gone is no error.
    async fn kill_server_group(&mut self) {
        let reported = tokio::time::timeout(PID_REPORT_WAIT, self.server_pid.wait_for(|pid| *pid != 0)).await;
        let pid = match reported {
            Ok(Ok(pid)) => *pid,
            // The keeper died before it could start a server, or its report is lost.
            _ => return,
        };
        if let Ok(pgid) = i32::try_from(pid) {
            let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
        }
        super::keeper::forget_server(self.port, pid);
    }

    /// Stops the server: closes the pipe, and waits for the keeper to finish its SIGTERM /
    /// SIGKILL sequence; kills the keeper (and the server's group) if it does not.
    pub async fn stop(mut self, stop_timeout: Duration) {
        self.pipe.take();
        let bound = stop_timeout + Duration::from_secs(5);
        if tokio::time::timeout(bound, self.keeper.wait()).await.is_err() {
            tracing::warn!("keeper did not stop in time; killing it");
            let _ = self.keeper.kill().await;
        }
        self.kill_server_group().await;
    }
}

/// Records the server once its keeper reports its pid, so that a later gateway can reclaim it
/// should the gateway and the keeper both be killed.
async fn record_when_reported(mut server_pid: watch::Receiver<u32>, port: u16) {
    let Ok(pid) = server_pid.wait_for(|pid| *pid != 0).await.map(|p| *p) else { return };
    let _ = tokio::task::spawn_blocking(move || super::keeper::record_server(port, pid)).await;
}

/// The command line a managed server is started with: its template filled in by the kinds
/// catalogue, now that it starts (the configuration keeps the template as written).
pub fn launch_command(managed: &ManagedConfig) -> Vec<String> {
    crate::kinds::launch::command(&managed.template, &managed.model, managed.port)
}

/// The directories a managed command's program is looked up in, in order: the venv's `bin/`,
/// then the PATH the server gets.
pub fn search_path(managed: &ManagedConfig) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = managed.venv.iter().map(|v| v.join("bin")).collect();
    // With a venv, the gateway's PATH follows it; without, the backend's own `env: PATH` wins.
    let path = match (&managed.venv, managed.env.get("PATH")) {
        (None, Some(own)) => Some(std::ffi::OsString::from(own)),
        _ => std::env::var_os("PATH"),
    };
    dirs.extend(path.iter().flat_map(std::env::split_paths));
    dirs
}

/// Longest log line kept; the rest of a longer line is dropped and the line marked.
pub const MAX_LOG_LINE: usize = 16 * 1024;
/// Appended to a line cut at [`MAX_LOG_LINE`].
pub const TRUNCATED: &str = " [line truncated by mlxgate]";

/// Splits a byte stream into lines of at most [`MAX_LOG_LINE`] bytes, whatever it holds.
#[derive(Default)]
struct LineSplitter {
    line: Vec<u8>,
    /// The current line went past the cap: its rest is skipped up to the newline.
    cut: bool,
}

impl LineSplitter {
    /// Feeds bytes; returns the lines they complete (lossy UTF-8, no line ending).
    fn feed(&mut self, mut bytes: &[u8]) -> Vec<String> {
        let mut done = Vec::new();
        while !bytes.is_empty() {
            let (part, rest, ended) = match bytes.iter().position(|b| *b == b'\n') {
                Some(i) => (&bytes[..i], &bytes[i + 1..], true),
                None => (bytes, &bytes[bytes.len()..], false),
            };
            if !self.cut {
                let room = MAX_LOG_LINE - self.line.len();
                self.line.extend_from_slice(&part[..part.len().min(room)]);
                self.cut = part.len() > room;
            }
            if ended {
                done.push(self.take());
            }
            bytes = rest;
        }
        done
    }

    /// The unfinished last line, at end of file.
    fn finish(&mut self) -> Option<String> {
        (!self.line.is_empty() || self.cut).then(|| self.take())
    }

    fn take(&mut self) -> String {
        if self.line.last() == Some(&b'\r') {
            self.line.pop();
        }
        let mut text = String::from_utf8_lossy(&self.line).into_owned();
        if std::mem::take(&mut self.cut) {
            text.push_str(TRUNCATED);
        }
        self.line.clear();
        text
    }
}

/// Forwards a stream's lines to the log and the ring buffer, until end of file whatever the
/// server writes (invalid UTF-8 is replaced, over-long lines are cut), so that the server never
/// writes into a closed pipe.
async fn pump(
    mut stream: impl AsyncRead + Unpin,
    backend: String,
    logs: Arc<LogBuffer>,
    pid: Option<watch::Sender<u32>>,
) {
    let mut splitter = LineSplitter::default();
    let mut buf = vec![0u8; 8192];
    loop {
        let (lines, eof) = match stream.read(&mut buf).await {
            Ok(0) => (splitter.finish().into_iter().collect(), true),
            Ok(n) => (splitter.feed(&buf[..n]), false),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!(backend = %backend, "cannot read the server's output: {e}");
                return;
            }
        };
        for line in lines {
            if let Some(pid) = &pid
                && let Some(n) = super::keeper::reported_pid(&line)
            {
                pid.send_replace(n);
            }
            if logs.is_probe(&line) {
                tracing::debug!(target: "mlxgate::backend::output", backend = %backend, "{line}");
                continue;
            }
            tracing::info!(target: "mlxgate::backend::output", backend = %backend, "{line}");
            logs.push(line);
        }
        if eof {
            return;
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_survive_invalid_utf8_any_split_and_overlong_lines() {
        let mut s = LineSplitter::default();
        assert!(s.feed(b"\xff\xfe").is_empty());
        assert_eq!(s.feed(b"x\r\nnext\npart"), ["\u{fffd}\u{fffd}x", "next"]);
        assert_eq!(s.feed(b"ial\n"), ["partial"]);
        let long = vec![b'a'; MAX_LOG_LINE * 3];
        for chunk in long.chunks(1000) {
            assert!(s.feed(chunk).is_empty());
        }
        let lines = s.feed(b"\nafter\n");
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0], format!("{}{TRUNCATED}", "a".repeat(MAX_LOG_LINE)));
        assert_eq!(lines[1], "after");
        assert!(s.feed(b"tail").is_empty());
        assert_eq!(s.finish().as_deref(), Some("tail"));
        assert_eq!(s.finish(), None);
    }
}
