//! The usage journal: every served answer's usage event, appended to a local file
//! when it is recorded, so a process that dies after answering has still kept
//! what the answer cost. The usage writer moves events to the database in batches;
//! each batch seals the segment its events were appended to, and the segment goes
//! once they are stored (or spooled). A segment a dead process left behind is
//! picked up by the next start on that machine.
//!
//! Bounds: an event is in the operating system's page cache the moment it is
//! recorded (one `write` of its line, no wait), so a killed process loses nothing;
//! the current segment is flushed to the disk on every writer tick (50 ms), so a
//! machine crash loses at most the events of that last interval.
//!
//! Several processes may share the directory (instances on one machine, tests):
//! each writes segments named with its instance id and holds an exclusive `flock`
//! on each until it deletes it, and a start takes over only segments whose lock it
//! can get, whose owner is gone.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// One segment file of this process, locked while it exists.
struct Segment {
    path: PathBuf,
    file: File,
    bytes: u64,
}

/// The journal of one process.
pub struct Journal {
    dir: PathBuf,
    instance: String,
    next: u64,
    current: Option<Segment>,
    /// A handle on the current segment for the writer's flush (outside the lock
    /// the request paths take).
    sync: Option<File>,
}

/// A segment sealed by a writer tick: deleted once its events are stored.
pub struct Sealed {
    path: PathBuf,
    _file: File,
}

impl Sealed {
    /// The events are stored (or spooled): the segment goes.
    pub fn done(self) {
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(error = %e, path = %self.path.display(), "usage journal segment not removed");
        }
    }
}

fn lock(file: &File) -> bool {
    #[cfg(unix)]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: flock only reads the descriptor of a file this process holds open.
        unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
    }
    #[cfg(not(unix))]
    {
        let _ = file;
        true
    }
}

fn name(instance: &str, n: u64) -> String {
    format!("usage-journal.{instance}.{n}.jsonl")
}

impl Journal {
    /// A journal of this process in `dir` (created when missing).
    pub fn open(dir: &Path, instance: &str) -> std::io::Result<Journal> {
        std::fs::create_dir_all(dir)?;
        let mut j = Journal {
            dir: dir.to_path_buf(),
            instance: instance.to_string(),
            next: 0,
            current: None,
            sync: None,
        };
        j.start_segment()?;
        Ok(j)
    }

    fn start_segment(&mut self) -> std::io::Result<()> {
        let path = self.dir.join(name(&self.instance, self.next));
        self.next += 1;
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        if !lock(&file) {
            return Err(std::io::Error::other(
                "journal segment locked by another process",
            ));
        }
        self.sync = file.try_clone().ok();
        self.current = Some(Segment {
            path,
            file,
            bytes: 0,
        });
        Ok(())
    }

    /// Appends one event's line (ending in a newline).
    pub fn append(&mut self, line: &[u8]) -> std::io::Result<()> {
        let seg = self
            .current
            .as_mut()
            .ok_or_else(|| std::io::Error::other("no journal segment"))?;
        seg.file.write_all(line)?;
        seg.bytes += line.len() as u64;
        Ok(())
    }

    /// Seals the current segment (when it holds anything) and starts the next.
    pub fn seal(&mut self) -> Option<Sealed> {
        if self.current.as_ref().is_none_or(|s| s.bytes == 0) {
            return None;
        }
        let seg = self.current.take()?;
        if let Err(e) = self.start_segment() {
            tracing::error!(error = %e, "usage journal: no new segment; events are kept in memory only");
        }
        Some(Sealed {
            path: seg.path,
            _file: seg.file,
        })
    }

    /// A handle to flush the current segment to the disk with.
    pub fn sync_handle(&self) -> Option<File> {
        self.sync.as_ref().and_then(|f| f.try_clone().ok())
    }
}

/// The segments in `dir` whose writer is gone (their lock can be taken), with
/// their lines; the caller stores or spools the events, then calls `done`.
pub fn orphans(dir: &Path) -> Vec<(Sealed, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let is_segment = path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("usage-journal.") && n.ends_with(".jsonl"));
        if !is_segment {
            continue;
        }
        let Ok(file) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
        else {
            continue;
        };
        if !lock(&file) {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        out.push((Sealed { path, _file: file }, text));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segments_seal_and_go_and_only_a_dead_writers_are_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Journal::open(dir.path(), "inst_a").unwrap();
        assert!(a.seal().is_none(), "an empty segment is not sealed");
        a.append(b"{\"id\":\"ue_1\"}\n").unwrap();
        let sealed = a.seal().unwrap();
        a.append(b"{\"id\":\"ue_2\"}\n").unwrap();
        // A live writer's segments (sealed or current) are not another's to take.
        assert!(orphans(dir.path()).is_empty());
        sealed.done();
        drop(a);
        // Its process gone, the segment it left is taken over, once.
        let found = orphans(dir.path());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].1, "{\"id\":\"ue_2\"}\n");
        for (s, _) in found {
            s.done();
        }
        assert!(orphans(dir.path()).is_empty());
    }
}
