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
//!
//! When the gateway and the keeper are killed together (`pkill -9 mlxgate`) nobody is left to
//! stop the server: it lives on with a reaper for parent. For that case the gateway keeps a
//! [`ServerRecord`] per backend port while a server runs (pid, start time and command line, as
//! the OS reports them), and a later gateway that finds the port taken reclaims the process the
//! record names ([`reclaim_orphan`]) — only once the OS confirms it is that very process, still
//! leading its group and no longer the keeper's child; never a process it cannot prove is its
//! own (pids are reused).

use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;
use tokio::process::Command;

/// The first line the keeper prints: the server's pid, which is also its process group.
const PID_REPORT: &str = "mlxgate keep: server pid ";

/// The pid in the keeper's report line, if `line` is one.
pub fn reported_pid(line: &str) -> Option<u32> {
    line.strip_prefix(PID_REPORT)?.split_whitespace().next()?.parse().ok()
}

/// Writes a line for the gateway on standard error. Never panics (as `eprintln!` does): when the
/// gateway has died the pipe is closed, and the keeper must go on to stop its server.
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// Runs the keeper until the server exits or the gateway's pipe closes.
pub fn run(grace: Duration, argv: &[String]) -> ExitCode {
    let Some((program, args)) = argv.split_first() else {
        say(format_args!("mlxgate keep: no command given"));
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            say(format_args!("mlxgate keep: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let code = runtime.block_on(async move {
        let mut server =
            match Command::new(program).args(args).stdin(Stdio::null()).process_group(0).kill_on_drop(false).spawn() {
                Ok(child) => child,
                Err(e) => {
                    say(format_args!("mlxgate keep: cannot start {program}: {e}"));
                    return ExitCode::from(127);
                }
            };
        let Some(pid) = server.id() else { return ExitCode::FAILURE };
        say(format_args!("{PID_REPORT}{pid} ({program})"));
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

// ---- Orphans: a server whose gateway and keeper were both killed ----

/// What a gateway knows of a server it runs, kept in a file per backend port for as long as the
/// server runs, so that a later gateway can recognise the server as its own orphan when the
/// gateway and the keeper were killed together (`pkill -9 mlxgate`): nothing is left then to
/// kill the server's group.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerRecord {
    /// The server's pid, which is also its process group.
    pub pid: u32,
    /// Its parent when recorded: the keeper. A server whose parent is no longer that pid lost
    /// its keeper (a process's parent only ever changes to a reaper).
    pub keeper: u32,
    /// When the process started, as the OS reports it: with the pid, the process's identity
    /// (a reused pid belongs to a process started later).
    pub started: String,
    /// Its command line, as the OS reports it.
    pub command: String,
}

/// What the OS says about a live process.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ProcessFacts {
    parent: u32,
    group: u32,
    started: String,
    command: String,
    zombie: bool,
}

/// How often a reclaim looks whether the orphan is gone.
const RECLAIM_POLL: Duration = Duration::from_millis(50);
/// How long a reclaim waits for the orphan to go after SIGKILL.
const AFTER_SIGKILL: Duration = Duration::from_secs(5);

/// Records the server `pid` (just started by its keeper) for the backend on `port`. A record
/// that cannot be written only costs the reclaim of an orphan, so this logs and goes on.
pub fn record_server(port: u16, pid: u32) {
    let written = records_dir().and_then(|dir| write_record(&dir, port, pid));
    if let Err(e) = written {
        tracing::debug!(port, pid, "cannot record the server for a later reclaim: {e}");
    }
}

/// Forgets the record of the server `pid` on `port` (it was stopped or is known dead).
pub fn forget_server(port: u16, pid: u32) {
    if let Ok(dir) = records_dir() {
        forget_in(&dir, port, pid);
    }
}

/// When the process holding the backend's `port` is a server an earlier gateway started (the
/// record names it, the OS confirms it is that very process, and its keeper is gone), stops its
/// group: SIGTERM, SIGKILL after `grace`. Returns the orphan's pid once it is gone. Any process
/// that cannot be proved to be such an orphan is left alone.
pub async fn reclaim_orphan(backend: &str, port: u16, grace: Duration) -> Option<u32> {
    let dir = records_dir().ok()?;
    reclaim_in(&dir, backend, port, grace).await
}

async fn reclaim_in(dir: &Path, backend: &str, port: u16, grace: Duration) -> Option<u32> {
    let record = read_record(dir, port)?;
    if !is_our_orphan(&record, facts_off_thread(record.pid).await.as_ref()) {
        return None;
    }
    let pgid = Pid::from_raw(i32::try_from(record.pid).ok()?);
    let _ = killpg(pgid, Signal::SIGTERM);
    if !gone_within(&record, grace).await {
        let _ = killpg(pgid, Signal::SIGKILL);
        if !gone_within(&record, AFTER_SIGKILL).await {
            tracing::warn!(backend, pid = record.pid, "the orphaned server outlived SIGKILL");
            return None;
        }
    }
    // Children of the orphan that ignored SIGTERM.
    let _ = killpg(pgid, Signal::SIGKILL);
    forget_in(dir, port, record.pid);
    tracing::warn!(
        backend,
        port,
        pid = record.pid,
        "reclaimed an orphaned server (pid {}) left by an earlier gateway",
        record.pid
    );
    Some(record.pid)
}

/// Whether `facts` (of the process `record.pid`) show the very process recorded, still
/// leading its group, alive, and no longer the child of its keeper.
fn is_our_orphan(record: &ServerRecord, facts: Option<&ProcessFacts>) -> bool {
    facts.is_some_and(|f| {
        !f.zombie
            && f.group == record.pid
            && f.started == record.started
            && f.command == record.command
            && f.parent != record.keeper
    })
}

/// Waits up to `limit` for the recorded process to be gone (a zombie holds nothing).
async fn gone_within(record: &ServerRecord, limit: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        let facts = facts_off_thread(record.pid).await;
        let same = facts.is_some_and(|f| !f.zombie && f.started == record.started);
        if !same {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(RECLAIM_POLL).await;
    }
}

fn record_path(dir: &Path, port: u16) -> PathBuf {
    dir.join(format!("server-{port}.json"))
}

fn write_record(dir: &Path, port: u16, pid: u32) -> std::io::Result<()> {
    let facts = process_facts(pid).ok_or_else(|| std::io::Error::other(format!("no process {pid}")))?;
    let record = ServerRecord { pid, keeper: facts.parent, started: facts.started, command: facts.command };
    let text = serde_json::to_vec(&record).map_err(std::io::Error::other)?;
    // Whole or not at all: written aside, then renamed over the old record.
    let partial = dir.join(format!(".server-{port}.json.{}", std::process::id()));
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, record_path(dir, port))
}

fn read_record(dir: &Path, port: u16) -> Option<ServerRecord> {
    let text = std::fs::read(record_path(dir, port)).ok()?;
    serde_json::from_slice(&text).ok()
}

fn forget_in(dir: &Path, port: u16, pid: u32) {
    if read_record(dir, port).is_some_and(|r| r.pid == pid) {
        let _ = std::fs::remove_file(record_path(dir, port));
    }
}

/// Where the records live: `$XDG_RUNTIME_DIR/mlxgate`, else `<temp dir>/mlxgate-<uid>`; made
/// private to this user, and refused when another user could write to it. The gateway's pid
/// file lives there too (see `crate::reload`).
pub fn records_dir() -> std::io::Result<PathBuf> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let uid = own_uid()?;
    let dir = match std::env::var_os("XDG_RUNTIME_DIR").map(PathBuf::from) {
        Some(runtime) if runtime.is_absolute() => runtime.join("mlxgate"),
        _ => std::env::temp_dir().join(format!("mlxgate-{uid}")),
    };
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(&dir)?;
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() || meta.uid() != uid || meta.mode() & 0o022 != 0 {
        return Err(std::io::Error::other(format!("{} is not a directory of this user's alone", dir.display())));
    }
    Ok(dir)
}

/// This process's user id: the owner of a file it creates.
fn own_uid() -> std::io::Result<u32> {
    use std::os::unix::fs::MetadataExt;
    static UID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    if let Some(uid) = UID.get() {
        return Ok(*uid);
    }
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
    let probe = std::env::temp_dir().join(format!(".mlxgate-uid-{}-{nanos}", std::process::id()));
    // A new file (never one planted there, nor a symlink's target).
    let file = std::fs::OpenOptions::new().write(true).create_new(true).open(&probe)?;
    let uid = file.metadata().map(|m| m.uid());
    let _ = std::fs::remove_file(&probe);
    Ok(*UID.get_or_init(|| uid.unwrap_or(u32::MAX)))
}

/// The command line of the live process `pid` (`None` when there is none, or it is a zombie).
pub fn command_of(pid: u32) -> Option<String> {
    process_facts(pid).filter(|f| !f.zombie).map(|f| f.command)
}

async fn facts_off_thread(pid: u32) -> Option<ProcessFacts> {
    tokio::task::spawn_blocking(move || process_facts(pid)).await.ok().flatten()
}

/// The OS's facts about `pid`: from `/proc` on Linux, from `ps` elsewhere (macOS).
fn process_facts(pid: u32) -> Option<ProcessFacts> {
    if cfg!(target_os = "linux") { facts_from_proc(pid) } else { facts_from_ps(pid) }
}

fn facts_from_proc(pid: u32) -> Option<ProcessFacts> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (in parentheses, which may hold anything): state, ppid, pgrp, …,
    // with the start time (in clock ticks since boot) the 20th of them.
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let command = raw.split(|b| *b == 0).filter(|a| !a.is_empty()).map(String::from_utf8_lossy).collect::<Vec<_>>();
    Some(ProcessFacts {
        zombie: *fields.first()? == "Z",
        parent: fields.get(1)?.parse().ok()?,
        group: fields.get(2)?.parse().ok()?,
        started: (*fields.get(19)?).to_string(),
        command: command.join(" "),
    })
}

fn facts_from_ps(pid: u32) -> Option<ProcessFacts> {
    let ps = |columns: &str| -> Option<String> {
        let out = std::process::Command::new("ps")
            .args(["-ww", "-o", columns, "-p", &pid.to_string()])
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !text.is_empty()).then_some(text)
    };
    let head = ps("ppid=,pgid=,stat=,lstart=")?;
    let mut fields = head.split_whitespace();
    let parent = fields.next()?.parse().ok()?;
    let group = fields.next()?.parse().ok()?;
    let zombie = fields.next()?.starts_with('Z');
    let started = fields.collect::<Vec<_>>().join(" ");
    let command = ps("command=")?;
    Some(ProcessFacts { parent, group, started, command, zombie })
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::CommandExt;

    use super::*;

    /// A record for `pid` as the gateway writes it, with `change` applied.
    fn record_of(pid: u32, change: impl FnOnce(&mut ServerRecord)) -> ServerRecord {
        let facts = process_facts(pid).expect("a live process");
        let mut record = ServerRecord { pid, keeper: facts.parent, started: facts.started, command: facts.command };
        change(&mut record);
        record
    }

    fn write(dir: &Path, port: u16, record: &ServerRecord) {
        std::fs::write(record_path(dir, port), serde_json::to_vec(record).expect("json")).expect("write");
    }

    fn alive(pid: u32) -> bool {
        process_facts(pid).is_some_and(|f| !f.zombie)
    }

    #[tokio::test]
    async fn a_record_naming_a_process_that_is_not_our_orphan_never_gets_it_killed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut sleeper = std::process::Command::new("sleep").arg("100").process_group(0).spawn().expect("sleep");
        let pid = sleeper.id();
        let me = std::process::id();
        let server_command = "/opt/mlxgate-sim --port 8101 --style mlx-lm".to_string();
        let grace = Duration::from_secs(5);
        let strangers = [
            // Our own process under the pid of a dead server (pid reuse), with the server's command.
            record_of(me, |r| {
                r.keeper = 0;
                r.command = server_command.clone();
            }),
            // A process in a group of its own, the pid reused: another command line…
            record_of(pid, |r| {
                r.keeper = 0;
                r.command = server_command.clone();
            }),
            // …or another start time.
            record_of(pid, |r| {
                r.keeper = 0;
                r.started = format!("{}0", r.started);
            }),
            // The very process, but its keeper (here, this test) still holds it.
            record_of(pid, |_| {}),
        ];
        for (port, record) in (1..).zip(&strangers) {
            write(dir.path(), port, record);
            assert_eq!(reclaim_in(dir.path(), "b", port, grace).await, None, "{record:?}");
            assert!(alive(pid) && alive(me), "{record:?}");
            assert!(read_record(dir.path(), port).is_some(), "a record that names no orphan stays");
        }
        // Control: the same process is reclaimed once it has lost its keeper.
        let orphan = record_of(pid, |r| r.keeper = 0);
        write(dir.path(), 9, &orphan);
        assert_eq!(reclaim_in(dir.path(), "b", 9, grace).await, Some(pid));
        assert!(!alive(pid));
        assert!(read_record(dir.path(), 9).is_none(), "the record is forgotten");
        let _ = sleeper.wait();
    }

    #[test]
    fn ps_and_proc_agree_on_a_process() {
        let me = std::process::id();
        let (Some(ps), Some(proc)) = (facts_from_ps(me), facts_from_proc(me)) else {
            eprintln!("SKIPPED: needs both ps and /proc (Linux with procps)");
            return;
        };
        assert_eq!((ps.parent, ps.group, ps.zombie), (proc.parent, proc.group, false));
        assert_eq!(ps.command, proc.command);
        assert!(!ps.started.is_empty() && !proc.started.is_empty());
    }

    #[test]
    fn a_record_survives_its_round_trip_and_is_forgotten_only_for_its_pid() {
        let dir = tempfile::tempdir().expect("tempdir");
        let me = std::process::id();
        write_record(dir.path(), 7, me).expect("write");
        let record = read_record(dir.path(), 7).expect("read");
        assert_eq!(record, record_of(me, |_| {}));
        forget_in(dir.path(), 7, me + 1);
        assert!(read_record(dir.path(), 7).is_some());
        forget_in(dir.path(), 7, me);
        assert!(read_record(dir.path(), 7).is_none());
    }
}
