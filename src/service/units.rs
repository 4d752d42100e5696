//! The files a service manager reads, written from a [`Plan`]: a launchd property list (macOS)
//! or a systemd unit (Linux). Pure: the plan holds every path and name; nothing here looks at
//! the machine. Each file carries [`MARKER`], by which `service install` knows it wrote the file
//! it would replace.

use std::path::{Path, PathBuf};

/// The line every file written here carries (an XML comment in a plist, a `#` line in a unit).
pub const MARKER: &str = "Written by `mlxgate service install`";

/// launchd's name for the gateway's job (its plist is `<LABEL>.plist`).
pub const LAUNCHD_LABEL: &str = "io.mlxgate.gateway";
/// systemd's name for the gateway's unit.
pub const SYSTEMD_UNIT: &str = "mlxgate.service";

/// Which service manager the files are for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Manager {
    /// macOS: a LaunchAgent (or, with `--system`, a LaunchDaemon).
    Launchd,
    /// Linux: a `systemd --user` unit (or, with `--system`, a system unit).
    Systemd,
}

impl Manager {
    /// This machine's manager.
    pub fn native() -> Manager {
        if cfg!(target_os = "macos") { Manager::Launchd } else { Manager::Systemd }
    }
}

/// Everything the service's file says.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub manager: Manager,
    /// `Some(user)`: a system service (LaunchDaemon or system unit) run as `user`; `None`: the
    /// user's own (LaunchAgent or `systemd --user`).
    pub run_as: Option<String>,
    /// Where the service's file is written.
    pub unit_path: PathBuf,
    /// The mlxgate binary the service runs.
    pub binary: PathBuf,
    /// The configuration, by its absolute path.
    pub config: PathBuf,
    /// The `${VAR}` values, mode 0600.
    pub env_file: PathBuf,
    /// The rotated log.
    pub log_file: PathBuf,
    pub log_size: u64,
    pub log_keep: usize,
    /// JSON log lines (`--log-format json`) rather than text.
    pub json_logs: bool,
    /// launchd only: where the process's stdout and stderr go (what is printed before logging
    /// starts); systemd keeps them in the journal.
    pub early_output: PathBuf,
    /// The working directory: the configuration's.
    pub workdir: PathBuf,
    /// `PATH` for the service and the servers it starts.
    pub path_var: String,
    /// Other variables that are not secrets (`TMPDIR`, so that `mlxgate reload` finds the
    /// gateway's pid file where a shell looks for it).
    pub plain_env: Vec<(String, String)>,
}

impl Plan {
    /// The command the service runs, one argument an item.
    pub fn arguments(&self) -> Vec<String> {
        let mut args = vec![
            self.binary.display().to_string(),
            "serve".into(),
            "--config".into(),
            self.config.display().to_string(),
            "--env-file".into(),
            self.env_file.display().to_string(),
            "--log-file".into(),
            self.log_file.display().to_string(),
            "--log-file-size".into(),
            self.log_size.to_string(),
            "--log-file-keep".into(),
            self.log_keep.to_string(),
        ];
        if self.json_logs {
            args.extend(["--log-format".into(), "json".into()]);
        }
        args
    }

    /// The file's text, for this plan's manager.
    pub fn render(&self) -> String {
        match self.manager {
            Manager::Launchd => launchd_plist(self),
            Manager::Systemd => systemd_unit(self),
        }
    }
}

/// A launchd property list: started at load (login, or boot for a daemon), restarted when it
/// exits with a failure or a signal but left stopped after a clean exit (`KeepAlive` with
/// `SuccessfulExit: false`), with the configuration's absolute path, a PATH that reaches the
/// servers, and its early output in a file.
pub fn launchd_plist(plan: &Plan) -> String {
    use plist::{Dictionary, Value};
    let mut dict = Dictionary::new();
    dict.insert("Label".into(), LAUNCHD_LABEL.into());
    dict.insert("ProgramArguments".into(), Value::Array(plan.arguments().into_iter().map(Value::String).collect()));
    dict.insert("RunAtLoad".into(), true.into());
    let mut keep_alive = Dictionary::new();
    keep_alive.insert("SuccessfulExit".into(), false.into());
    dict.insert("KeepAlive".into(), Value::Dictionary(keep_alive));
    // launchd's default throttle is 10 s between starts; a crash loop is slowed, not stopped.
    dict.insert("ThrottleInterval".into(), Value::Integer(10.into()));
    // On SIGTERM the gateway lets running streams finish (shutdown_grace, 30 s by default),
    // then stops its servers: launchd's default of 20 s before SIGKILL is too short for that.
    dict.insert("ExitTimeOut".into(), Value::Integer(60.into()));
    dict.insert("WorkingDirectory".into(), path_value(&plan.workdir));
    let mut env = Dictionary::new();
    env.insert("PATH".into(), plan.path_var.clone().into());
    for (name, value) in &plan.plain_env {
        env.insert(name.clone(), value.clone().into());
    }
    dict.insert("EnvironmentVariables".into(), Value::Dictionary(env));
    dict.insert("StandardOutPath".into(), path_value(&plan.early_output));
    dict.insert("StandardErrorPath".into(), path_value(&plan.early_output));
    dict.insert("ProcessType".into(), "Interactive".into());
    if let Some(user) = &plan.run_as {
        dict.insert("UserName".into(), user.clone().into());
    }
    let mut xml = Vec::new();
    // Writing into a Vec cannot fail, and every value is a string, bool, integer, array or
    // dictionary.
    plist::to_writer_xml(&mut xml, &Value::Dictionary(dict)).expect("a plist of plain values is written");
    let text = String::from_utf8(xml).expect("plist XML is UTF-8");
    // The marker goes after the DOCTYPE line, where launchd and plistlib read past comments.
    match text.find("<plist") {
        Some(at) => format!(
            "{}<!-- {MARKER}; edit with care: it is rewritten by the next install. -->\n{}\n",
            &text[..at],
            text[at..].trim_end()
        ),
        None => text,
    }
}

fn path_value(path: &Path) -> plist::Value {
    plist::Value::String(path.display().to_string())
}

/// A systemd unit: restarted on failure (a clean stop stays stopped), started at boot for a
/// system unit or at login for a user unit (`WantedBy`), with the same command line.
pub fn systemd_unit(plan: &Plan) -> String {
    let exec = plan.arguments().iter().map(|a| systemd_quote(a, Expands::Variables)).collect::<Vec<_>>().join(" ");
    let mut env =
        vec![format!("Environment={}", systemd_quote(&format!("PATH={}", plan.path_var), Expands::Specifiers))];
    for (name, value) in &plan.plain_env {
        env.push(format!("Environment={}", systemd_quote(&format!("{name}={value}"), Expands::Specifiers)));
    }
    // A system unit waits for the network (remote backends, a listen address on an interface);
    // a user manager has no such target to wait for.
    let (user, wanted_by, after) = match &plan.run_as {
        Some(user) => (
            format!("User={user}\n"),
            "multi-user.target",
            "After=network-online.target\nWants=network-online.target\n",
        ),
        None => (String::new(), "default.target", ""),
    };
    format!(
        "# {MARKER}; edit with care: it is rewritten by the next install.\n\
         [Unit]\n\
         Description=mlxgate: a gateway in front of local MLX model servers\n\
         Documentation=https://github.com/mlxgate/mlxgate\n\
         {after}\
         \n\
         [Service]\n\
         Type=exec\n\
         {user}\
         ExecStart={exec}\n\
         ExecReload=/bin/kill -HUP $MAINPID\n\
         WorkingDirectory={workdir}\n\
         {env}\n\
         Restart=on-failure\n\
         RestartSec=2\n\
         # SIGTERM to the gateway alone: it lets running streams finish (shutdown_grace), then\n\
         # stops its servers; whatever is left after it exits is killed.\n\
         KillMode=mixed\n\
         TimeoutStopSec=60\n\
         \n\
         [Install]\n\
         WantedBy={wanted_by}\n",
        // A path setting: taken whole (no quotes), only `%` specifiers expanded.
        workdir = plan.workdir.display().to_string().replace('%', "%%"),
        env = env.join("\n"),
    )
}

/// What systemd expands in a setting's value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Expands {
    /// `ExecStart=`: `%` specifiers and `$VAR`s.
    Variables,
    /// `Environment=`: `%` specifiers only.
    Specifiers,
}

/// One word as systemd reads it: bare when it has no space, quote, backslash or `;`; otherwise
/// in double quotes with `\` and `"` escaped. `%` is doubled (and `$` too where variables are
/// expanded), since systemd expands them even in quotes.
pub fn systemd_quote(arg: &str, expands: Expands) -> String {
    let mut escaped = arg.replace('%', "%%");
    if expands == Expands::Variables {
        escaped = escaped.replace('$', "$$");
    }
    let plain =
        !escaped.is_empty() && !escaped.chars().any(|c| c.is_whitespace() || matches!(c, '"' | '\'' | '\\' | ';'));
    if plain { escaped } else { format!("\"{}\"", escaped.replace('\\', "\\\\").replace('"', "\\\"")) }
}

/// The arguments of a unit's `ExecStart=` line, unquoted as systemd does (for `service status`
/// and the tests that run the line as written).
pub fn systemd_exec_start(unit: &str) -> Option<Vec<String>> {
    let line = unit.lines().find_map(|l| l.strip_prefix("ExecStart="))?;
    let mut args = Vec::new();
    let mut chars = line.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| c.is_whitespace()) {
            chars.next();
        }
        let Some(&first) = chars.peek() else { break };
        let mut arg = String::new();
        if first == '"' {
            chars.next();
            loop {
                match chars.next()? {
                    '"' => break,
                    '\\' => arg.push(chars.next()?),
                    c => arg.push(c),
                }
            }
        } else {
            while let Some(&c) = chars.peek() {
                if c.is_whitespace() {
                    break;
                }
                arg.push(c);
                chars.next();
            }
        }
        args.push(arg.replace("%%", "%").replace("$$", "$"));
    }
    Some(args)
}

/// The `ProgramArguments` of a plist written here.
pub fn launchd_arguments(plist_text: &str) -> Option<Vec<String>> {
    let value = plist::Value::from_reader_xml(plist_text.as_bytes()).ok()?;
    let args = value.as_dictionary()?.get("ProgramArguments")?.as_array()?;
    args.iter().map(|a| a.as_string().map(str::to_owned)).collect()
}

/// The arguments of the service's command, from its file's text.
pub fn arguments_in(manager: Manager, text: &str) -> Option<Vec<String>> {
    match manager {
        Manager::Launchd => launchd_arguments(text),
        Manager::Systemd => systemd_exec_start(text),
    }
}

/// The value that follows `flag` among `args`.
pub fn flag_value<'a>(args: &'a [String], flag: &str) -> Option<&'a str> {
    args.iter().position(|a| a == flag).and_then(|i| args.get(i + 1)).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn plan(manager: Manager) -> Plan {
        Plan {
            manager,
            run_as: None,
            unit_path: "/home/ann/.config/systemd/user/mlxgate.service".into(),
            binary: "/home/ann/.cargo/bin/mlxgate".into(),
            config: "/home/ann/my gateway/gateway.yaml".into(),
            env_file: "/home/ann/.config/mlxgate/env".into(),
            log_file: "/home/ann/.local/state/mlxgate/mlxgate.log".into(),
            log_size: 10 << 20,
            log_keep: 5,
            json_logs: false,
            early_output: "/home/ann/.local/state/mlxgate/early.log".into(),
            workdir: "/home/ann/my gateway".into(),
            path_var: "/home/ann/venv/bin:/usr/bin:/bin".into(),
            plain_env: vec![("TMPDIR".into(), "/tmp/ann 100%".into())],
        }
    }

    #[test]
    fn a_unit_s_exec_start_reads_back_as_the_plan_s_arguments() {
        let p = plan(Manager::Systemd);
        let unit = systemd_unit(&p);
        assert!(unit.starts_with(&format!("# {MARKER}")));
        assert_eq!(systemd_exec_start(&unit).unwrap(), p.arguments());
        assert!(unit.contains("Restart=on-failure\n"));
        assert!(unit.contains("WantedBy=default.target\n"));
        assert!(unit.contains("Environment=\"TMPDIR=/tmp/ann 100%%\"\n"), "{unit}");
        assert!(!unit.contains("User="));
        let system = systemd_unit(&Plan { run_as: Some("ann".into()), ..p });
        assert!(system.contains("User=ann\n") && system.contains("WantedBy=multi-user.target\n"));
    }

    #[test]
    fn a_plist_reads_back_as_the_plan_s_arguments() {
        let p = plan(Manager::Launchd);
        let text = launchd_plist(&p);
        assert!(text.contains(MARKER));
        assert_eq!(launchd_arguments(&text).unwrap(), p.arguments());
        let value = plist::Value::from_reader_xml(text.as_bytes()).unwrap();
        let dict = value.as_dictionary().unwrap();
        assert_eq!(dict.get("Label").and_then(|v| v.as_string()), Some(LAUNCHD_LABEL));
        assert_eq!(dict.get("RunAtLoad").and_then(|v| v.as_boolean()), Some(true));
        let keep = dict.get("KeepAlive").and_then(|v| v.as_dictionary()).unwrap();
        assert_eq!(keep.get("SuccessfulExit").and_then(|v| v.as_boolean()), Some(false));
        assert!(dict.get("UserName").is_none());
        let daemon = launchd_plist(&Plan { run_as: Some("ann".into()), ..p });
        let value = plist::Value::from_reader_xml(daemon.as_bytes()).unwrap();
        assert_eq!(value.as_dictionary().unwrap().get("UserName").and_then(|v| v.as_string()), Some("ann"));
    }

    proptest! {
        #[test]
        fn any_argument_survives_systemd_quoting(arg in "[ -~\t]{0,24}") {
            let unit = format!("ExecStart=/bin/x {} end\n", systemd_quote(&arg, Expands::Variables));
            prop_assert_eq!(systemd_exec_start(&unit).unwrap(), vec!["/bin/x".to_string(), arg, "end".into()]);
        }
    }
}
