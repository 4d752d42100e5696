//! Asking the service manager: `launchctl` on macOS, `systemctl` on Linux. Each call says what it
//! ran and, when it failed, what the tool printed, so that a user can run it by hand.

use std::process::Command;

use super::units::{LAUNCHD_LABEL, Manager, SYSTEMD_UNIT};

/// Where the service lives for its manager.
#[derive(Clone, Debug)]
pub struct Scope {
    pub manager: Manager,
    /// A system service (LaunchDaemon, system unit) rather than the user's.
    pub system: bool,
}

/// What the manager says of the service.
#[derive(Debug, Default, PartialEq)]
pub struct State {
    /// `active (running)`, `running`, `inactive (dead)`, …: the manager's own words.
    pub state: String,
    pub running: bool,
    pub pid: Option<u32>,
    /// launchd's `last exit code`, systemd's `NRestarts`: whatever the manager adds.
    pub detail: Option<String>,
}

impl Scope {
    /// The launchd domain the job is in (`gui/<uid>` or `system`).
    fn domain(&self) -> String {
        if self.system { "system".into() } else { format!("gui/{}", nix::unistd::getuid()) }
    }

    fn systemctl(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("systemctl");
        if !self.system {
            cmd.arg("--user");
        }
        cmd.args(args);
        cmd
    }

    /// The command line that starts (or restarts) the installed service, as a user would type
    /// it.
    pub fn start_hint(&self, unit_path: &std::path::Path) -> String {
        match self.manager {
            Manager::Launchd => {
                format!("launchctl bootstrap {} {}", self.domain(), unit_path.display())
            }
            Manager::Systemd => {
                let user = if self.system { "" } else { " --user" };
                format!("systemctl{user} daemon-reload && systemctl{user} enable --now {SYSTEMD_UNIT}")
            }
        }
    }

    /// Loads the freshly written file and starts the service (a running one is restarted, so
    /// that it runs what the file now says).
    pub fn start(&self, unit_path: &std::path::Path) -> Result<(), String> {
        match self.manager {
            Manager::Launchd => {
                let target = format!("{}/{LAUNCHD_LABEL}", self.domain());
                // A job already loaded keeps its old plist until it is booted out.
                let _ = run(Command::new("launchctl").args(["bootout", &target]));
                let _ = run(Command::new("launchctl").args(["enable", &target]));
                run(Command::new("launchctl").args(["bootstrap", &self.domain()]).arg(unit_path)).map(drop)
            }
            Manager::Systemd => {
                run(&mut self.systemctl(&["daemon-reload"]))?;
                run(&mut self.systemctl(&["enable", SYSTEMD_UNIT]))?;
                run(&mut self.systemctl(&["restart", SYSTEMD_UNIT])).map(drop)
            }
        }
    }

    /// Stops the service and unloads it, so that it does not start again.
    pub fn stop(&self) -> Result<(), String> {
        match self.manager {
            Manager::Launchd => {
                run(Command::new("launchctl").args(["bootout", &format!("{}/{LAUNCHD_LABEL}", self.domain())]))
                    .map(drop)
            }
            Manager::Systemd => run(&mut self.systemctl(&["disable", "--now", SYSTEMD_UNIT])).map(drop),
        }
    }

    /// Forgets the removed unit (systemd reads its files again; launchd has nothing to do).
    pub fn forget(&self) -> Result<(), String> {
        match self.manager {
            Manager::Launchd => Ok(()),
            Manager::Systemd => run(&mut self.systemctl(&["daemon-reload"])).map(drop),
        }
    }

    /// Restarts the running service (starts it when it is stopped).
    pub fn restart(&self) -> Result<(), String> {
        match self.manager {
            Manager::Launchd => {
                run(Command::new("launchctl").args(["kickstart", "-k", &format!("{}/{LAUNCHD_LABEL}", self.domain())]))
                    .map(drop)
            }
            Manager::Systemd => run(&mut self.systemctl(&["restart", SYSTEMD_UNIT])).map(drop),
        }
    }

    /// What the manager says of the service.
    pub fn state(&self) -> Result<State, String> {
        match self.manager {
            Manager::Launchd => {
                let out =
                    run(Command::new("launchctl").args(["print", &format!("{}/{LAUNCHD_LABEL}", self.domain())]))?;
                Ok(launchd_state(&out))
            }
            Manager::Systemd => {
                let out = run(&mut self.systemctl(&[
                    "show",
                    SYSTEMD_UNIT,
                    "--property=ActiveState,SubState,MainPID,NRestarts,Result",
                ]))?;
                Ok(systemd_state(&out))
            }
        }
    }
}

/// Runs `cmd`; its stdout, or an error with the command line and what it printed.
fn run(cmd: &mut Command) -> Result<String, String> {
    let line = std::iter::once(cmd.get_program())
        .chain(cmd.get_args())
        .map(|a| a.to_string_lossy().into_owned())
        .collect::<Vec<_>>()
        .join(" ");
    let out = cmd.output().map_err(|e| format!("`{line}` could not run: {e}"))?;
    if out.status.success() {
        return Ok(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    let said = String::from_utf8_lossy(if out.stderr.is_empty() { &out.stdout } else { &out.stderr }).trim().to_owned();
    Err(format!("`{line}` failed ({}): {said}", out.status))
}

/// `systemctl show`'s `Key=value` lines.
pub fn systemd_state(text: &str) -> State {
    let get = |key: &str| text.lines().find_map(|l| l.strip_prefix(key)?.strip_prefix('=')).unwrap_or("");
    let (active, sub) = (get("ActiveState"), get("SubState"));
    let pid = get("MainPID").parse().ok().filter(|p| *p != 0);
    let restarts = get("NRestarts");
    State {
        state: format!("{active} ({sub})"),
        running: active == "active" && sub == "running",
        pid,
        detail: (!restarts.is_empty()).then(|| format!("restarts: {restarts}, last result: {}", get("Result"))),
    }
}

/// `launchctl print`'s `key = value` lines (the job's own, at the first level of indentation).
pub fn launchd_state(text: &str) -> State {
    let get = |key: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.trim().split_once(" = ")?;
            (k == key).then(|| v.trim().to_owned())
        })
    };
    let state = get("state").unwrap_or_else(|| "unknown".into());
    State {
        running: state == "running",
        pid: get("pid").and_then(|p| p.parse().ok()),
        detail: get("last exit code").map(|c| format!("last exit code: {c}")),
        state,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemctl_show_is_read() {
        let s = systemd_state("ActiveState=active\nSubState=running\nMainPID=4242\nNRestarts=1\nResult=success\n");
        assert_eq!(
            s,
            State {
                state: "active (running)".into(),
                running: true,
                pid: Some(4242),
                detail: Some("restarts: 1, last result: success".into())
            }
        );
        let dead = systemd_state("ActiveState=inactive\nSubState=dead\nMainPID=0\n");
        assert!(!dead.running && dead.pid.is_none());
    }

    #[test]
    fn launchctl_print_is_read() {
        let text = "gui/501/io.mlxgate.gateway = {\n\tactive count = 1\n\tpath = /Users/ann/Library/LaunchAgents/io.mlxgate.gateway.plist\n\ttype = LaunchAgent\n\tstate = running\n\n\tprogram = /Users/ann/.cargo/bin/mlxgate\n\tpid = 812\n\tlast exit code = (never exited)\n}\n";
        let s = launchd_state(text);
        assert!(s.running);
        assert_eq!(s.pid, Some(812));
        assert_eq!(s.detail.as_deref(), Some("last exit code: (never exited)"));
    }
}
