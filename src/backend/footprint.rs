//! The memory a managed server holds: the resident memory of its process group (the server
//! leads its own group, so helpers it forks are counted with it). On Linux from `/proc`, on
//! macOS from `ps` (its RSS; on Apple Silicon the unified memory an MLX server's Metal buffers
//! take is resident in its process). A configured `footprint:` takes precedence over this.

/// The resident bytes of every process in group `pgid`, if any process of it was found.
pub fn group_resident_bytes(pgid: u32) -> Option<u64> {
    if cfg!(target_os = "linux") { from_proc(pgid) } else { from_ps(pgid) }
}

/// Linux: every `/proc/<pid>/stat` whose process group is `pgid`, its `VmRSS` summed.
fn from_proc(pgid: u32) -> Option<u64> {
    let mut total = None;
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        if group_of_stat(&stat) != Some(pgid) {
            continue;
        }
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else { continue };
        let rss = status.lines().find_map(|l| l.strip_prefix("VmRSS:"));
        if let Some(kib) = rss.and_then(|r| r.trim().trim_end_matches("kB").trim().parse::<u64>().ok()) {
            *total.get_or_insert(0) += kib * 1024;
        }
    }
    total
}

/// The process group in a `/proc/<pid>/stat` line (its fifth field; the second, the command,
/// is in parentheses and may hold spaces).
fn group_of_stat(stat: &str) -> Option<u32> {
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(2)?.parse().ok()
}

/// Elsewhere (macOS): `ps -axo pgid=,rss=` (RSS in KiB), the rows of group `pgid` summed.
fn from_ps(pgid: u32) -> Option<u64> {
    let out = std::process::Command::new("ps").args(["-axo", "pgid=,rss="]).output().ok()?;
    sum_ps_rows(&String::from_utf8_lossy(&out.stdout), pgid)
}

fn sum_ps_rows(text: &str, pgid: u32) -> Option<u64> {
    let mut total = None;
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(group), Some(rss)) = (fields.next(), fields.next()) else { continue };
        if group.parse::<u32>().ok() == Some(pgid)
            && let Ok(kib) = rss.parse::<u64>()
        {
            *total.get_or_insert(0) += kib * 1024;
        }
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_group_of_a_stat_line_whose_command_has_spaces_and_parentheses() {
        let stat = "4242 (python3 (mlx) x) S 1 4242 4242 0 -1 4194560 100";
        assert_eq!(group_of_stat(stat), Some(4242));
        assert_eq!(group_of_stat("garbage"), None);
    }

    #[test]
    fn sums_the_ps_rows_of_one_group() {
        let text = "  100  2048\n  100 1024\n  200 999999\n junk\n";
        assert_eq!(sum_ps_rows(text, 100), Some(3 * 1024 * 1024));
        assert_eq!(sum_ps_rows(text, 300), None);
    }

    #[test]
    fn measures_this_test_process_group() {
        let group = nix::unistd::getpgrp().as_raw() as u32;
        let bytes = group_resident_bytes(group).expect("this process's own group is found");
        assert!(bytes > 1 << 20, "a test process holds more than 1 MiB resident: {bytes}");
    }
}
