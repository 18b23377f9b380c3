//! The usage journal: every served answer's usage event, appended to a local file
//! when it is recorded, so a process that dies after answering has still kept
//! what the answer cost. The usage writer moves events to the database in batches;
//! each batch seals the segment its events were appended to, and the segment is
//! emptied once they are stored (or spooled). A segment a dead process left behind
//! is picked up by the next start on that machine.
//!
//! Bounds: an event is in the operating system's page cache the moment it is
//! recorded (one `write` of its line, no wait), so a killed process loses nothing.
//! A segment goes to the disk only when its batch could be neither stored nor
//! spooled (it is then the batch's only copy): in the common case the database
//! holds each batch within a writer tick, so a machine crash loses what that tick
//! had not written yet, as it did with a flush per tick.
//!
//! Two segments take turns: the one being written to the database is emptied
//! (`ftruncate`) once its batch is kept and is the next to be appended to. No file
//! is created, flushed or deleted per tick; on a core shared with the gateway that
//! file-system work (and the block-layer work it started) ran between requests.
//!
//! Several processes may share the directory (instances on one machine, tests):
//! each writes segments named with its instance id and holds an exclusive `flock`
//! on each until it is done with it, and a start takes over only segments whose
//! lock it can get, whose owner is gone.

use std::fs::File;
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// One segment file of this process, locked while it is open.
pub struct Segment {
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
    /// An emptied segment, appended to at the next seal.
    spare: Option<Segment>,
}

/// A segment sealed by a writer tick, holding that tick's events.
pub struct Sealed(Segment);

impl Sealed {
    /// The events are stored (or spooled): the segment is emptied, for the
    /// journal to append to again ([`Journal::reuse`]). One that cannot be
    /// emptied is deleted.
    pub fn done(self) -> Option<Segment> {
        let mut seg = self.0;
        match seg.file.set_len(0) {
            Ok(()) => {
                seg.bytes = 0;
                Some(seg)
            }
            Err(e) => {
                tracing::warn!(error = %e, path = %seg.path.display(), "usage journal segment not emptied; removed");
                remove(&seg.path);
                None
            }
        }
    }

    /// Its events are their only copy: to the disk with them, and the segment
    /// stays for the next start.
    pub fn keep(self) {
        let _ = self.0.file.sync_data();
    }
}

/// A segment a process that is gone left behind.
pub struct Orphan {
    path: PathBuf,
    _file: File,
}

impl Orphan {
    /// Its events are spooled: the segment goes.
    pub fn done(self) {
        remove(&self.path);
    }
}

fn remove(path: &Path) {
    if let Err(e) = std::fs::remove_file(path) {
        tracing::warn!(error = %e, path = %path.display(), "usage journal segment not removed");
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
            spare: None,
        };
        j.current = Some(j.new_segment()?);
        Ok(j)
    }

    fn new_segment(&mut self) -> std::io::Result<Segment> {
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
        Ok(Segment {
            path,
            file,
            bytes: 0,
        })
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

    /// Seals the current segment (when it holds anything) and appends to the
    /// spare one from now on (a new one when there is none).
    pub fn seal(&mut self) -> Option<Sealed> {
        if self.current.as_ref().is_none_or(|s| s.bytes == 0) {
            return None;
        }
        let sealed = self.current.take()?;
        self.current = match self.spare.take() {
            Some(spare) => Some(spare),
            None => self
                .new_segment()
                .inspect_err(|e| tracing::error!(error = %e, "usage journal: no new segment; events are kept in memory only"))
                .ok(),
        };
        Some(Sealed(sealed))
    }

    /// Takes an emptied segment back as the spare (a second one is removed).
    pub fn reuse(&mut self, seg: Segment) {
        if self.spare.is_none() {
            self.spare = Some(seg);
        } else {
            remove(&seg.path);
        }
    }
}

/// The segments in `dir` whose writer is gone (their lock can be taken), with
/// their lines; the caller stores or spools the events, then calls `done`.
pub fn orphans(dir: &Path) -> Vec<(Orphan, String)> {
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
        out.push((Orphan { path, _file: file }, text));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn segments(dir: &Path) -> usize {
        std::fs::read_dir(dir).unwrap().flatten().count()
    }

    /// The orphaned segments that hold any event, with their lines.
    fn left_with_events(dir: &Path) -> Vec<(Orphan, String)> {
        orphans(dir)
            .into_iter()
            .filter(|(_, text)| !text.is_empty())
            .collect()
    }

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
        a.reuse(sealed.done().unwrap());
        drop(a);
        // Its process gone, what it had not stored is taken over, once; the
        // emptied segment holds nothing.
        let found = left_with_events(dir.path());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].1, "{\"id\":\"ue_2\"}\n");
        for (s, _) in orphans(dir.path()) {
            s.done();
        }
        assert!(orphans(dir.path()).is_empty());
    }

    #[test]
    fn two_segments_take_turns_and_a_batch_kept_nowhere_else_stays() {
        let dir = tempfile::tempdir().unwrap();
        let mut a = Journal::open(dir.path(), "inst_a").unwrap();
        for tick in 0..5 {
            a.append(format!("{{\"id\":\"ue_{tick}\"}}\n").as_bytes())
                .unwrap();
            let sealed = a.seal().unwrap();
            a.reuse(sealed.done().unwrap());
        }
        assert_eq!(segments(dir.path()), 2, "no file made per tick");
        // A batch neither stored nor spooled: its segment stays as it is.
        a.append(b"{\"id\":\"ue_9\"}\n").unwrap();
        a.seal().unwrap().keep();
        drop(a);
        let found = left_with_events(dir.path());
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].1, "{\"id\":\"ue_9\"}\n");
    }
}
