//! `mlxgate keep`: the small process that stands between the gateway and a backend server so
//! that the server never outlives the gateway.
//!
//! The gateway starts `mlxgate keep --grace 10s -- CMD…` with a pipe on the keeper's stdin and
//! keeps the write end. The keeper starts CMD in a process group of its own and waits. When the
//! pipe closes (the gateway stopped the backend, exited, or was killed with SIGKILL and the
//! kernel closed its files) the keeper sends SIGTERM to the server's whole group, SIGKILL after
//! the grace period, and exits. When the server exits by itself the keeper exits with its status
//! (127 when it could not start the server at all). Pipes and process groups behave the same on
//! Linux and macOS, and no `unsafe` is needed (unlike `prctl(PR_SET_PDEATHSIG)`, which Linux
//! alone has).
//!
//! The keeper cannot act on its own SIGKILL. The other half is the gateway's: whenever a keeper
//! exits, for whatever reason, the gateway kills the server's group (`ServerProcess::wait`), so
//! a server outlives its keeper only if the gateway is killed at the same moment. The server
//! leads its group (rather than sharing the keeper's) so that the pid `/admin/backends` reports
//! is both the server's and the group's; the keeper reports it on its first line of stderr.

use std::process::{ExitCode, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// The first line the keeper prints: the server's pid, which is also its process group.
const PID_REPORT: &str = "mlxgate keep: server pid ";

/// The pid in the keeper's report line, if `line` is one.
pub fn reported_pid(line: &str) -> Option<u32> {
    line.strip_prefix(PID_REPORT)?.split_whitespace().next()?.parse().ok()
}

/// Runs the keeper until the server exits or the gateway's pipe closes.
pub fn run(grace: Duration, argv: &[String]) -> ExitCode {
    let Some((program, args)) = argv.split_first() else {
        eprintln!("mlxgate keep: no command given");
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mlxgate keep: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async move {
        let mut server =
            match Command::new(program).args(args).stdin(Stdio::null()).process_group(0).kill_on_drop(false).spawn() {
                Ok(child) => child,
                Err(e) => {
                    eprintln!("mlxgate keep: cannot start {program}: {e}");
                    return ExitCode::from(127);
                }
            };
        let Some(pid) = server.id() else { return ExitCode::FAILURE };
        eprintln!("{PID_REPORT}{pid} ({program})");
        let pgid = Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
        let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).ok();
        let stop_asked = async {
            let mut stdin = tokio::io::stdin();
            let mut buf = [0u8; 64];
            // Anything written is ignored; end of file (or an error) means "stop".
            while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
        };
        let sigterm = async {
            match terminate.as_mut() {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            status = server.wait() => {
                // Take the server's own children with it.
                let _ = killpg(pgid, Signal::SIGKILL);
                match status {
                    Ok(s) => exit_code_of(s),
                    Err(_) => ExitCode::FAILURE,
                }
            }
            () = stop_asked => stop(&mut server, pgid, grace).await,
            () = sigterm => stop(&mut server, pgid, grace).await,
        }
    });
    // The stdin reader sits in a blocking read on the pipe, which a normal runtime drop would
    // wait for forever.
    runtime.shutdown_background();
    code
}

/// SIGTERM to the group, SIGKILL after `grace`.
async fn stop(server: &mut tokio::process::Child, pgid: Pid, grace: Duration) -> ExitCode {
    let _ = killpg(pgid, Signal::SIGTERM);
    if tokio::time::timeout(grace, server.wait()).await.is_err() {
        let _ = killpg(pgid, Signal::SIGKILL);
        let _ = server.wait().await;
    }
    // Children of the server that ignored SIGTERM.
    let _ = killpg(pgid, Signal::SIGKILL);
    ExitCode::SUCCESS
}

fn exit_code_of(status: std::process::ExitStatus) -> ExitCode {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        (None, Some(signal)) => ExitCode::from(u8::try_from(128 + signal).unwrap_or(1)),
        _ => ExitCode::FAILURE,
    }
}
