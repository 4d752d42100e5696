//! An environment file (`--env-file`): the values of the `${VAR}`s a configuration names (API
//! keys, Redis URLs, …), kept out of a service's plist or unit, in a file only its owner can read
//! (0600). `mlxgate serve --env-file PATH` sets them before the configuration is read, and reads
//! the file again for each reload; `mlxgate check --env-file` checks with them; `mlxgate service
//! install` writes it.
//!
//! The format is `NAME=value`, a variable a line, the value taken to the end of the line as it
//! is (no quotes, no escapes: a value with a newline cannot be kept and is refused); blank lines
//! and lines starting with `#` are skipped.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Reads the variables `text` sets; a malformed line is an error naming its number.
pub fn parse(text: &str) -> Result<BTreeMap<String, String>, String> {
    let mut vars = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let (name, value) = trimmed.split_once('=').ok_or_else(|| format!("line {}: not NAME=value", i + 1))?;
        let name = name.trim_end();
        if !is_name(name) {
            return Err(format!("line {}: {name:?} is not a variable name", i + 1));
        }
        if value.contains('\0') {
            return Err(format!("line {}: {name}'s value has a NUL byte", i + 1));
        }
        vars.insert(name.to_owned(), value.to_owned());
    }
    Ok(vars)
}

fn is_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// The file's text for `vars`; refused, naming the variable, when a value has a newline.
pub fn render(vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut text = String::from(
        "# The values of the ${VAR}s the gateway's configuration names, read by `mlxgate serve --env-file`.\n\
         # Written by `mlxgate service install` (mode 0600). After an edit, `mlxgate reload` puts keys,\n\
         # clients and limits in force; anything else takes `mlxgate service restart`.\n",
    );
    for (name, value) in vars {
        if value.contains(['\n', '\r', '\0']) {
            return Err(format!(
                "{name}'s value has a line break or a NUL byte, which an environment file cannot keep"
            ));
        }
        text.push_str(name);
        text.push('=');
        text.push_str(value);
        text.push('\n');
    }
    Ok(text)
}

/// `text` (an environment file) with `vars` set: a variable's line is replaced where it is (later
/// lines of the same name, which would win over it, are dropped), new ones are added at the end;
/// comments, blank lines and every other line stay as they are. Refused, naming the variable,
/// when a value has a newline.
pub fn update(text: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    if text.trim().is_empty() {
        return render(vars);
    }
    for (name, value) in vars {
        if value.contains(['\n', '\r', '\0']) {
            return Err(format!(
                "{name}'s value has a line break or a NUL byte, which an environment file cannot keep"
            ));
        }
    }
    let mut out = String::with_capacity(text.len());
    let mut written = std::collections::BTreeSet::new();
    for line in text.lines() {
        let name = line.trim_start().split_once('=').map(|(n, _)| n.trim_end()).filter(|n| is_name(n));
        match name.and_then(|n| vars.get_key_value(n)) {
            Some((name, value)) => {
                if written.insert(name.as_str()) {
                    out.push_str(&format!("{name}={value}\n"));
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    for (name, value) in vars.iter().filter(|(n, _)| !written.contains(n.as_str())) {
        out.push_str(&format!("{name}={value}\n"));
    }
    Ok(out)
}

/// Reads `path`'s variables. A file that others than its owner can read is refused: it holds
/// secrets.
pub fn read(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(format!(
            "{} can be read or written by others than its owner (mode {mode:03o}); it holds secrets: chmod 600 it",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Writes `text` to `path` with mode 0600, whole or not at all (written aside, then renamed), so
/// that no reader ever sees it with wider permissions or half written.
pub fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    let aside = path.with_extension(format!("tmp.{}", std::process::id()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&aside)?;
        file.write_all(text.as_bytes())?;
        file.sync_all()?;
        // create_new with the mode is subject to the umask, which only narrows it; set it
        // exactly anyway.
        std::fs::set_permissions(&aside, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&aside, path)
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&aside);
    }
    written
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rendered_file_parses_back_to_its_variables() {
        let vars: BTreeMap<String, String> =
            [("OPENAI_KEY".to_string(), "sk-a=b c#d \"q\" $HOME".to_string()), ("EMPTY".into(), String::new())].into();
        assert_eq!(parse(&render(&vars).unwrap()).unwrap(), vars);
        let broken: BTreeMap<String, String> = [("K".to_string(), "a\nb".to_string())].into();
        assert!(render(&broken).unwrap_err().starts_with("K's value"));
    }

    #[test]
    fn an_update_keeps_every_other_line_where_it_is() {
        let text = "# my notes\nRUST_LOG=debug\n  # indented\nKEY=k1\nHF_TOKEN=hf\nKEY=dup\n";
        let vars: BTreeMap<String, String> = [("KEY".to_string(), "k2".to_string()), ("NEW".into(), "n".into())].into();
        let updated = update(text, &vars).unwrap();
        assert_eq!(updated, "# my notes\nRUST_LOG=debug\n  # indented\nKEY=k2\nHF_TOKEN=hf\nNEW=n\n");
        assert_eq!(parse(&updated).unwrap()["KEY"], "k2");
        assert_eq!(update("", &vars).unwrap(), render(&vars).unwrap());
    }

    #[test]
    fn malformed_lines_are_named() {
        assert_eq!(parse("# c\n\nA=1\nnot a line\n").unwrap_err(), "line 4: not NAME=value");
        assert_eq!(parse("1A=1\n").unwrap_err(), "line 1: \"1A\" is not a variable name");
        assert_eq!(parse("A=x\0y\n").unwrap_err(), "line 1: A's value has a NUL byte");
    }

    #[test]
    fn the_file_is_written_private_and_a_shared_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("env");
        write_private(&path, "A=1\n").unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        assert_eq!(read(&path).unwrap()["A"], "1");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(read(&path).unwrap_err().contains("chmod 600"));
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "nothing is left aside");
    }
}
