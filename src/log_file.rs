//! `--log-file`: the gateway's log (its own lines, the access log, and the managed servers'
//! output, tagged `mlxgate::backend::output backend=NAME`) appended to one file that is rotated
//! by size, so that a service left running for months keeps a bounded amount of disk.
//!
//! The file is cut between lines: a line that would take the current file past its size limit
//! goes first to a fresh file (the current one becomes `PATH.1`, `PATH.1` becomes `PATH.2`, …,
//! and the oldest beyond `keep` is deleted; with `keep` 0 the current file is only emptied). So
//! every file stays within the limit and the newest line is always in `PATH` itself. A single line
//! longer than the whole limit is cut to it. Each line is one `write` to the file (no buffer to
//! lose in a crash); a line that cannot be written is dropped, and the first such failure is
//! reported on stderr.
//!
//! The renames are done here, each one tolerating a file that is not there: a user's
//! `rm PATH.*`, a second process given the same file, or a log rotator moving `PATH` away must
//! not stop the gateway (the `file-rotate` crate asserts that the files it saw at start are still
//! there, and panicked on every later line). At most once a second the path is checked to still
//! name the open file; when it does not (deleted, moved), it is opened anew.
//!
//! Files are created with mode 0600: the log can name a server's command line.
//!
//! Two processes given the same file both survive, but each counts only its own bytes: their
//! files can pass the limit.
//!
//! Without `--log-file` everything goes to stderr, as before.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The default size limit of each file (`--log-file-size`).
pub const DEFAULT_SIZE: u64 = 10 << 20;
/// How many rotated files are kept beside the current one by default (`--log-file-keep`).
pub const DEFAULT_KEEP: usize = 5;
/// The smallest size limit taken: below it a file would hold a handful of lines.
pub const MIN_SIZE: u64 = 4096;
/// The most rotated files kept.
pub const MAX_KEEP: usize = 1000;

/// How often the path is checked to still name the open file.
const RECHECK: Duration = Duration::from_secs(1);

/// Where the log goes once [`install`] has been called; stderr until then.
static SINK: OnceLock<LogFile> = OnceLock::new();

/// A size-limited log file and its rotated predecessors.
pub struct LogFile {
    path: PathBuf,
    limit: u64,
    keep: usize,
    inner: Mutex<Current>,
    failed: AtomicBool,
}

/// The open file.
struct Current {
    file: File,
    /// Bytes in it.
    written: u64,
    /// When the path was last checked to name it.
    checked: Instant,
}

impl LogFile {
    /// Opens (appending to) `path`, creating its directory; files beyond `keep` rotated ones are
    /// deleted at each rotation. Fails with the reason when the file cannot be written.
    pub fn open(path: &Path, limit: u64, keep: usize) -> io::Result<LogFile> {
        if limit < MIN_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a log file's size limit must be at least {MIN_SIZE} bytes"),
            ));
        }
        if keep > MAX_KEEP {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("at most {MAX_KEEP} rotated log files are kept"),
            ));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(|e| with_path(e, dir))?;
        }
        let current = Current::open(path).map_err(|e| with_path(e, path))?;
        Ok(LogFile {
            path: path.to_path_buf(),
            limit,
            keep,
            inner: Mutex::new(current),
            failed: AtomicBool::new(false),
        })
    }

    /// The current file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `line` (one whole line, its `\n` included), rotating first when it would take the
    /// current file past the limit.
    pub fn write_line(&self, line: &[u8]) {
        let mut cut_line = Vec::new();
        let line = cut(line, self.limit, &mut cut_line);
        let done = {
            let mut current = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            self.write_locked(&mut current, line)
        };
        if let Err(e) = done
            && !self.failed.swap(true, Ordering::Relaxed)
        {
            let _ = writeln!(io::stderr(), "mlxgate: cannot write the log file {}: {e}", self.path.display());
        }
    }

    /// A file that cannot be opened (no file descriptors left, the directory gone) leaves the
    /// line in the file already open, its count reset so that the next lines do not rotate again
    /// (each rotation deletes the oldest file); the path is tried again at the next check.
    fn write_locked(&self, current: &mut Current, line: &[u8]) -> io::Result<()> {
        let len = line.len() as u64;
        let mut failed = None;
        if current.checked.elapsed() >= RECHECK {
            current.checked = Instant::now();
            if !current.is_at(&self.path) {
                match Current::open(&self.path) {
                    Ok(fresh) => *current = fresh,
                    Err(e) => failed = Some(e),
                }
            }
        }
        if current.written > 0 && current.written + len > self.limit {
            self.rotate();
            match Current::open(&self.path) {
                Ok(fresh) => *current = fresh,
                Err(e) => {
                    current.written = 0;
                    failed = Some(e);
                }
            }
        }
        current.file.write_all(line)?;
        current.written += len;
        failed.map_or(Ok(()), Err)
    }

    /// Moves `PATH.(k-1)` to `PATH.k` down to `PATH` to `PATH.1`, the oldest beyond `keep`
    /// deleted; with `keep` 0, removes `PATH`. A file that is not there is skipped: the chain has
    /// a gap, which the next rotations close.
    fn rotate(&self) {
        let numbered = |n: usize| {
            let mut name = self.path.as_os_str().to_owned();
            name.push(format!(".{n}"));
            PathBuf::from(name)
        };
        if self.keep == 0 {
            let _ = fs::remove_file(&self.path);
            return;
        }
        let _ = fs::remove_file(numbered(self.keep));
        for n in (1..self.keep).rev() {
            let _ = fs::rename(numbered(n), numbered(n + 1));
        }
        let _ = fs::rename(&self.path, numbered(1));
    }
}

impl Current {
    fn open(path: &Path) -> io::Result<Current> {
        let file = OpenOptions::new().create(true).append(true).mode(0o600).open(path)?;
        let meta = file.metadata()?;
        if !meta.is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file"));
        }
        Ok(Current { written: meta.len(), file, checked: Instant::now() })
    }

    /// Whether `path` still names this file (not deleted, moved away or replaced).
    fn is_at(&self, path: &Path) -> bool {
        match (fs::metadata(path), self.file.metadata()) {
            (Ok(named), Ok(open)) => named.dev() == open.dev() && named.ino() == open.ino(),
            _ => false,
        }
    }
}

/// `line` cut to `limit` bytes at a character boundary, ending in a newline, when it is longer.
fn cut<'a>(line: &'a [u8], limit: u64, buffer: &'a mut Vec<u8>) -> &'a [u8] {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if line.len() <= limit {
        return line;
    }
    let mut end = limit - 1;
    // Back to the start of a character: a UTF-8 continuation byte is 0b10xxxxxx.
    while end > 0 && line[end] & 0xC0 == 0x80 {
        end -= 1;
    }
    buffer.extend_from_slice(&line[..end]);
    buffer.push(b'\n');
    buffer
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Sends the log to `file` from now on. A second call is refused (the first file stays): false.
pub fn install(file: LogFile) -> bool {
    SINK.set(file).is_ok()
}

/// The file the log goes to, when there is one.
pub fn installed() -> Option<&'static LogFile> {
    SINK.get()
}

/// Writes one whole line to the log: the file when one is installed, stderr otherwise.
pub fn write_line(line: &[u8]) {
    match SINK.get() {
        Some(file) => file.write_line(line),
        None => {
            let _ = io::stderr().lock().write_all(line);
        }
    }
}

/// The writer `tracing`'s formatter is given: it writes each event (one line) in one call, so
/// each `write` is passed on as one line.
#[derive(Clone, Copy, Default)]
pub struct Writer;

impl Write for Writer {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        write_line(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Writer {
    type Writer = Writer;

    fn make_writer(&'a self) -> Writer {
        Writer
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn sizes(dir: &Path) -> Vec<(String, u64)> {
        let mut files: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (e.file_name().to_string_lossy().into_owned(), e.metadata().unwrap().len())
            })
            .collect();
        files.sort();
        files
    }

    #[test]
    fn files_stay_within_the_limit_and_the_newest_line_is_in_the_current_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs").join("gateway.log");
        let log = LogFile::open(&path, MIN_SIZE, 3).unwrap();
        for i in 0..2000 {
            log.write_line(format!("line {i} {}\n", "x".repeat(i % 97)).as_bytes());
        }
        let files = sizes(path.parent().unwrap());
        assert_eq!(
            files.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["gateway.log", "gateway.log.1", "gateway.log.2", "gateway.log.3"]
        );
        assert!(files.iter().all(|(_, size)| *size <= MIN_SIZE), "{files:?}");
        let current = fs::read_to_string(&path).unwrap();
        assert!(current.ends_with(&format!("line 1999 {}\n", "x".repeat(1999 % 97))), "{current}");
        // Lines are whole in every file, and the rotated ones run on into the current one.
        let older = fs::read_to_string(path.with_extension("log.1")).unwrap();
        let last_older: usize = older.lines().last().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
        let first_current: usize = current.lines().next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
        assert_eq!(last_older + 1, first_current);
    }

    #[test]
    fn reopening_appends_and_counts_what_is_there() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.log");
        fs::write(&path, vec![b'a'; MIN_SIZE as usize - 10]).unwrap();
        let log = LogFile::open(&path, MIN_SIZE, 2).unwrap();
        log.write_line(b"0123456789abcdef\n");
        assert_eq!(fs::read_to_string(&path).unwrap(), "0123456789abcdef\n");
        assert_eq!(fs::metadata(path.with_extension("log.1")).unwrap().len(), MIN_SIZE - 10);
    }

    #[test]
    fn a_line_longer_than_the_limit_is_cut_to_it_at_a_character_and_ends_its_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.log");
        let log = LogFile::open(&path, MIN_SIZE, 2).unwrap();
        log.write_line("☃".repeat(2 * MIN_SIZE as usize).as_bytes());
        let text = fs::read_to_string(&path).expect("whole characters");
        assert!(text.len() as u64 <= MIN_SIZE && text.len() as u64 > MIN_SIZE - 4 && text.ends_with("☃\n"));
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
    }

    /// A user's `rm PATH.*` (or a second writer) between rotations: the gateway goes on writing,
    /// and the chain fills up again.
    #[test]
    fn rotated_files_deleted_under_it_do_not_stop_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.log");
        let log = LogFile::open(&path, MIN_SIZE, 2).unwrap();
        let line = format!("{}\n", "z".repeat(1000));
        for round in 0..3 {
            for _ in 0..20 {
                log.write_line(line.as_bytes());
            }
            for n in [1, 2] {
                let _ = fs::remove_file(dir.path().join(format!("gateway.log.{n}")));
            }
            assert!(path.exists(), "round {round}");
        }
        for _ in 0..20 {
            log.write_line(line.as_bytes());
        }
        let files = sizes(dir.path());
        assert_eq!(
            files.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["gateway.log", "gateway.log.1", "gateway.log.2"]
        );
        assert!(files.iter().all(|(_, size)| *size <= MIN_SIZE), "{files:?}");
    }

    /// The current file deleted (or moved away by a log rotator): within a second the path is
    /// opened anew and the next lines land there.
    #[test]
    fn a_current_file_deleted_under_it_is_made_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.log");
        let log = LogFile::open(&path, MIN_SIZE, 2).unwrap();
        log.write_line(b"before\n");
        fs::remove_file(&path).unwrap();
        std::thread::sleep(RECHECK + Duration::from_millis(50));
        log.write_line(b"after\n");
        assert_eq!(fs::read_to_string(&path).unwrap(), "after\n");
    }

    #[test]
    fn keep_zero_keeps_only_the_current_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.log");
        let log = LogFile::open(&path, MIN_SIZE, 0).unwrap();
        for i in 0..100 {
            log.write_line(format!("{i} {}\n", "k".repeat(200)).as_bytes());
        }
        assert_eq!(sizes(dir.path()).len(), 1);
        assert!(fs::read_to_string(&path).unwrap().ends_with(&format!("99 {}\n", "k".repeat(200))));
    }

    #[test]
    fn an_unwritable_place_is_refused_with_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let blocker = dir.path().join("file");
        fs::write(&blocker, "").unwrap();
        let err = LogFile::open(&blocker.join("gateway.log"), MIN_SIZE, 2).err().unwrap();
        assert!(err.to_string().contains(&blocker.display().to_string()), "{err}");
        assert!(LogFile::open(&dir.path().join("x.log"), 10, 2).is_err());
    }
}
