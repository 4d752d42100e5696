//! `--log-file`: the gateway's log (its own lines, the access log, and the managed servers'
//! output, tagged `mlxgate::backend::output backend=NAME`) appended to one file that is rotated
//! by size, so that a service left running for months keeps a bounded amount of disk.
//!
//! The file is cut between lines: a line that would take the current file past its size limit
//! goes first to a fresh file (the current one becomes `PATH.1`, `PATH.1` becomes `PATH.2`, …,
//! and the oldest beyond `keep` is deleted: `file-rotate` does the renames). So every file stays
//! within the limit and the newest line is always in `PATH` itself. A single line longer than the
//! whole limit is cut to it. Each line is one `write` to the file (no buffer to lose in a crash);
//! a line that cannot be written is dropped, and the first such failure is reported on stderr.
//!
//! Without `--log-file` everything goes to stderr, as before.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use file_rotate::compression::Compression;
use file_rotate::suffix::AppendCount;
use file_rotate::{ContentLimit, FileRotate};

/// The default size limit of each file (`--log-file-size`).
pub const DEFAULT_SIZE: u64 = 10 << 20;
/// How many rotated files are kept beside the current one by default (`--log-file-keep`).
pub const DEFAULT_KEEP: usize = 5;
/// The smallest size limit taken: below it a file would hold a handful of lines.
pub const MIN_SIZE: u64 = 4096;

/// Where the log goes once [`install`] has been called; stderr until then.
static SINK: OnceLock<LogFile> = OnceLock::new();

/// A size-limited log file and its rotated predecessors.
pub struct LogFile {
    path: PathBuf,
    limit: u64,
    inner: Mutex<Rotating>,
    failed: AtomicBool,
}

struct Rotating {
    file: FileRotate<AppendCount>,
    /// Bytes in the current file.
    written: u64,
}

impl LogFile {
    /// Opens (appending to) `path`, creating its directory; files beyond `keep` rotated ones are
    /// deleted at the next rotation. Fails with the reason when the file cannot be written.
    pub fn open(path: &Path, limit: u64, keep: usize) -> io::Result<LogFile> {
        if limit < MIN_SIZE {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a log file's size limit must be at least {MIN_SIZE} bytes"),
            ));
        }
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            fs::create_dir_all(dir).map_err(|e| with_path(e, dir))?;
        }
        // Opened once here to give a clear error; file-rotate opens it again (append) and would
        // only drop lines on a failure.
        let existing = OpenOptions::new().create(true).append(true).open(path).map_err(|e| with_path(e, path))?;
        let written = existing.metadata().map(|m| m.len()).unwrap_or(0);
        drop(existing);
        let file = FileRotate::new(path, AppendCount::new(keep.max(1)), ContentLimit::None, Compression::None, None);
        Ok(LogFile {
            path: path.to_path_buf(),
            limit,
            inner: Mutex::new(Rotating { file, written }),
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
        let line = cut(line, self.limit);
        let done = {
            let mut inner = self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            inner.write(line, self.limit)
        };
        if let Err(e) = done
            && !self.failed.swap(true, Ordering::Relaxed)
        {
            let _ = writeln!(io::stderr(), "mlxgate: cannot write the log file {}: {e}", self.path.display());
        }
    }
}

impl Rotating {
    fn write(&mut self, line: &[u8], limit: u64) -> io::Result<()> {
        let len = line.len() as u64;
        if self.written > 0 && self.written + len > limit {
            self.file.rotate()?;
            self.written = 0;
        }
        self.file.write_all(line)?;
        self.written += len;
        Ok(())
    }
}

/// `line` cut to `limit` bytes, still ending in a newline when it did.
fn cut(line: &[u8], limit: u64) -> &[u8] {
    let limit = usize::try_from(limit).unwrap_or(usize::MAX);
    if line.len() <= limit { line } else { &line[..limit] }
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
    fn a_line_longer_than_the_limit_is_cut_to_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("gateway.log");
        let log = LogFile::open(&path, MIN_SIZE, 2).unwrap();
        log.write_line(&vec![b'y'; 3 * MIN_SIZE as usize]);
        assert_eq!(fs::metadata(&path).unwrap().len(), MIN_SIZE);
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
