//! The usage journal: every served answer's usage event, appended to a local file
//! when it is recorded, so a process that dies after answering has still kept
//! what the answer cost. The usage writer moves events to the database in batches.
//! A segment is sealed once it holds [`SEGMENT_BYTES`], and goes once every event
//! in it is stored (or spooled). A segment a dead process left behind is picked up
//! by the next start on that machine (its stored events are no-ops by their ids).
//!
//! Bounds: an event is in the operating system's page cache the moment it is
//! recorded (one `write` of its line, no wait), so a killed process loses nothing.
//! A segment is flushed to the disk only when a batch of its events could be
//! neither stored nor spooled (then it is the only copy): in the common case the
//! database holds each batch within a writer tick, so a machine crash loses what
//! that tick had not written yet, as it would with a flush per tick. No file is
//! made, flushed or deleted per tick: on a shared core those were the writer's
//! dearest steps after the database's own.
//!
//! Several processes may share the directory (instances on one machine, tests):
//! each writes segments named with its instance id and holds an exclusive `flock`
//! on each until it deletes it, and a start takes over only segments whose lock it
//! can get, whose owner is gone.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// A segment is sealed at the first writer tick after it holds this much (about
/// 2,500 events): what a start replays of a segment its dead writer had already
/// stored, at most.
pub const SEGMENT_BYTES: u64 = 1 << 20;

/// One segment file of this process, locked while it exists.
struct Segment {
    path: PathBuf,
    file: File,
    bytes: u64,
    /// Holds events nothing else holds (a batch neither stored nor spooled): left
    /// on the disk for the next start.
    pinned: bool,
}

/// The journal of one process.
pub struct Journal {
    dir: PathBuf,
    instance: String,
    next: u64,
    current: Option<Segment>,
}

/// A sealed segment: deleted once its events are stored.
pub struct Sealed {
    path: PathBuf,
    file: File,
    pinned: bool,
}

impl Sealed {
    /// The events are stored (or spooled): the segment goes, unless an earlier
    /// batch of it was neither.
    pub fn done(self) {
        if self.pinned {
            return;
        }
        if let Err(e) = std::fs::remove_file(&self.path) {
            tracing::warn!(error = %e, path = %self.path.display(), "usage journal segment not removed");
        }
    }

    /// Its events are its only copy: to the disk with them, and the segment stays
    /// for the next start.
    pub fn keep(self) {
        let _ = self.file.sync_data();
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
        self.current = Some(Segment {
            path,
            file,
            bytes: 0,
            pinned: false,
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

    /// Seals the current segment when it holds at least `min_bytes` (and
    /// anything at all), and starts the next.
    pub fn seal(&mut self, min_bytes: u64) -> Option<Sealed> {
        if self
            .current
            .as_ref()
            .is_none_or(|s| s.bytes == 0 || s.bytes < min_bytes)
        {
            return None;
        }
        let seg = self.current.take()?;
        if let Err(e) = self.start_segment() {
            tracing::error!(error = %e, "usage journal: no new segment; events are kept in memory only");
        }
        Some(Sealed {
            path: seg.path,
            file: seg.file,
            pinned: seg.pinned,
        })
    }

    /// The current segment holds events of a batch that was neither stored nor
    /// spooled: it goes to the disk now and stays there for the next start.
    pub fn keep_current(&mut self) {
        if let Some(seg) = self.current.as_mut() {
            seg.pinned = true;
            let _ = seg.file.sync_data();
        }
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
        out.push((
            Sealed {
                path,
                file,
                pinned: false,
            },
            text,
        ));
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
        assert!(a.seal(0).is_none(), "an empty segment is not sealed");
        a.append(b"{\"id\":\"ue_1\"}\n").unwrap();
        assert!(a.seal(1 << 20).is_none(), "nor one short of the size");
        let sealed = a.seal(0).unwrap();
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

    #[test]
    fn a_segment_holding_a_batch_kept_nowhere_else_outlives_its_seal() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Journal::open(dir.path(), "inst_a").unwrap();
        a.append(b"{\"id\":\"ue_1\"}\n").unwrap();
        // Its batch was neither stored nor spooled.
        a.keep_current();
        a.append(b"{\"id\":\"ue_2\"}\n").unwrap();
        // A later batch of the segment is stored: the segment still stays.
        a.seal(0).unwrap().done();
        drop(a);
        let found: Vec<_> = orphans(dir.path())
            .into_iter()
            .filter(|(_, text)| !text.is_empty())
            .collect();
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].1, "{\"id\":\"ue_1\"}\n{\"id\":\"ue_2\"}\n");
    }
}
