//! The object store: where uploaded files live (telemetry exports today; files and
//! batch outputs next), on the local filesystem (`file://data/objects`, the default)
//! or any S3-compatible store (`s3://bucket/prefix`, with `[storage] s3_endpoint`
//! for one that is not AWS). One small interface over the `object_store` crate:
//! a streaming put that counts, hashes (SHA-256) and caps the bytes as they arrive,
//! a streaming get, head and delete.
//!
//! A put never holds the whole object: bytes are gathered into parts (1 MiB on
//! disk, 5 MiB on S3, its smallest part) and each part is written before more is
//! taken, so an upload costs one part of memory whatever its size. A put that
//! fails or is abandoned leaves nothing behind: the multipart upload is aborted
//! (on disk, the staging file is removed).

use anyhow::Context;
use bytes::{Bytes, BytesMut};
use futures_util::stream::BoxStream;
use object_store::path::Path as ObjectPath;
use object_store::{MultipartUpload, ObjectStore, PutPayload};
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// S3's smallest part (every part but the last).
const S3_PART: usize = 5 * 1024 * 1024;
/// Parts on disk: small, since the filesystem takes any size.
const FS_PART: usize = 1024 * 1024;

/// A configured object store.
#[derive(Clone)]
pub struct Objects {
    store: Arc<dyn ObjectStore>,
    part_size: usize,
    /// How the store was named, for messages (never carries a credential).
    pub location: String,
}

/// What a finished put stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stored {
    pub size: u64,
    /// Lower-case hex SHA-256 of the bytes.
    pub sha256: String,
}

/// Why a put did not store its object.
#[derive(Debug, thiserror::Error)]
pub enum PutError {
    /// The bytes passed the cap; nothing was kept.
    #[error("the object exceeds the limit of {cap} bytes")]
    TooLarge { cap: u64 },
    /// The store failed.
    #[error("object store: {0}")]
    Store(#[from] object_store::Error),
}

impl Objects {
    /// Opens the store `[storage] objects` names: `file://dir` (created when
    /// missing) or `s3://bucket[/prefix]`, whose credentials and region come from
    /// the standard AWS variables and whose endpoint is `s3_endpoint` when set.
    pub fn open(url: &str, s3_endpoint: &str) -> anyhow::Result<Objects> {
        if let Some(dir) = url.strip_prefix("file://") {
            // Nothing is created until an object is put (folders appear as puts
            // need them): a gateway that never takes an upload leaves no trace.
            let abs = lexical_absolute(dir).with_context(|| format!("storage.objects: {dir}"))?;
            let root = ObjectPath::from_absolute_path(&abs)
                .with_context(|| format!("storage.objects: {}", abs.display()))?;
            let fs: Arc<dyn ObjectStore> = Arc::new(object_store::local::LocalFileSystem::new());
            return Ok(Objects {
                store: Arc::new(object_store::prefix::PrefixStore::new(fs, root)),
                part_size: FS_PART,
                location: url.to_string(),
            });
        }
        if let Some(rest) = url.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            anyhow::ensure!(!bucket.is_empty(), "storage.objects: s3:// needs a bucket");
            let mut b = object_store::aws::AmazonS3Builder::from_env().with_bucket_name(bucket);
            if !s3_endpoint.is_empty() {
                b = b
                    .with_endpoint(s3_endpoint)
                    .with_allow_http(s3_endpoint.starts_with("http://"))
                    // S3-compatible servers other than AWS address buckets by path.
                    .with_virtual_hosted_style_request(false);
            }
            let s3: Arc<dyn ObjectStore> = Arc::new(b.build().context("opening the S3 store")?);
            let prefix = prefix.trim_matches('/');
            let store: Arc<dyn ObjectStore> = if prefix.is_empty() {
                s3
            } else {
                Arc::new(object_store::prefix::PrefixStore::new(s3, prefix))
            };
            return Ok(Objects {
                store,
                part_size: S3_PART,
                location: url.to_string(),
            });
        }
        anyhow::bail!("storage.objects must be file://dir or s3://bucket/prefix")
    }

    /// Starts a streaming put of `key`, refused past `cap` bytes.
    pub fn writer(&self, key: &str, cap: u64) -> ObjectWriter {
        ObjectWriter {
            store: self.store.clone(),
            path: ObjectPath::from(key),
            cap,
            part_size: self.part_size,
            buf: BytesMut::new(),
            upload: None,
            size: 0,
            hash: Sha256::new(),
        }
    }

    /// Puts small bytes whole.
    pub async fn put_bytes(&self, key: &str, bytes: Bytes) -> Result<Stored, PutError> {
        let mut w = self.writer(key, u64::MAX);
        w.write(bytes).await?;
        w.finish().await
    }

    /// The object's size, or `None` when there is no such object.
    pub async fn head(&self, key: &str) -> Result<Option<u64>, object_store::Error> {
        match self.store.head(&ObjectPath::from(key)).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The object's bytes as they are read, with its size; `None` when there is no
    /// such object.
    pub async fn get(
        &self,
        key: &str,
    ) -> Result<
        Option<(u64, BoxStream<'static, Result<Bytes, object_store::Error>>)>,
        object_store::Error,
    > {
        match self.store.get(&ObjectPath::from(key)).await {
            Ok(r) => {
                let size = r.meta.size;
                Ok(Some((size, r.into_stream())))
            }
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Deletes the object; a missing one is not an error.
    pub async fn delete(&self, key: &str) -> Result<(), object_store::Error> {
        match self.store.delete(&ObjectPath::from(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

/// `dir` made absolute with `.` and `..` resolved by their text (the folder need
/// not exist yet, so it cannot be canonicalized).
fn lexical_absolute(dir: &str) -> std::io::Result<std::path::PathBuf> {
    use std::path::Component;
    let mut out = std::path::PathBuf::new();
    for c in std::path::absolute(dir)?.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    Ok(out)
}

/// One streaming put: bytes go in with [`write`](Self::write), are counted and
/// hashed, and leave in parts; [`finish`](Self::finish) makes the object visible,
/// [`abort`](Self::abort) (or an error) leaves nothing.
pub struct ObjectWriter {
    store: Arc<dyn ObjectStore>,
    path: ObjectPath,
    cap: u64,
    part_size: usize,
    buf: BytesMut,
    upload: Option<Box<dyn MultipartUpload>>,
    size: u64,
    hash: Sha256,
}

impl ObjectWriter {
    /// Takes the next bytes; writes a part when one is full. Past the cap the
    /// upload is aborted and `TooLarge` returned.
    pub async fn write(&mut self, chunk: Bytes) -> Result<(), PutError> {
        self.size += chunk.len() as u64;
        if self.size > self.cap {
            self.abort().await;
            return Err(PutError::TooLarge { cap: self.cap });
        }
        self.hash.update(&chunk);
        if self.buf.is_empty() && chunk.len() >= self.part_size {
            return self.send_part(chunk).await;
        }
        self.buf.extend_from_slice(&chunk);
        if self.buf.len() >= self.part_size {
            let part = self.buf.split().freeze();
            self.send_part(part).await?;
        }
        Ok(())
    }

    async fn send_part(&mut self, part: Bytes) -> Result<(), PutError> {
        if self.upload.is_none() {
            self.upload = Some(self.store.put_multipart(&self.path).await?);
        }
        let up = self.upload.as_mut().expect("started above");
        // One part in flight: the next bytes wait for it, so memory stays one part.
        if let Err(e) = up.put_part(PutPayload::from(part)).await {
            self.abort().await;
            return Err(e.into());
        }
        Ok(())
    }

    /// Stores what is left and makes the object visible.
    pub async fn finish(mut self) -> Result<Stored, PutError> {
        let rest = self.buf.split().freeze();
        let result = match self.upload.take() {
            // Small objects go up whole: a multipart upload of one short part works
            // on S3 too, but costs three requests.
            None => self
                .store
                .put(&self.path, PutPayload::from(rest))
                .await
                .map(|_| ()),
            Some(mut up) => {
                let mut r = Ok(());
                if !rest.is_empty() {
                    r = up.put_part(PutPayload::from(rest)).await;
                }
                match r {
                    Ok(()) => match up.complete().await {
                        Ok(_) => Ok(()),
                        Err(e) => {
                            let _ = up.abort().await;
                            Err(e)
                        }
                    },
                    Err(e) => {
                        let _ = up.abort().await;
                        Err(e)
                    }
                }
            }
        };
        result?;
        let sha256 = hex::encode(std::mem::take(&mut self.hash).finalize());
        Ok(Stored {
            size: self.size,
            sha256,
        })
    }

    /// Drops what was written so far; the object never appears.
    pub async fn abort(&mut self) {
        self.buf = BytesMut::new();
        if let Some(mut up) = self.upload.take() {
            if let Err(e) = up.abort().await {
                tracing::warn!(error = %e, "aborting an unfinished upload failed");
            }
        }
    }

    /// Bytes taken so far.
    pub fn size(&self) -> u64 {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures_util::StreamExt;

    #[tokio::test]
    async fn streamed_puts_are_hashed_capped_and_leave_nothing_when_refused() {
        let dir = tempfile::tempdir().unwrap();
        let objects = Objects::open(&format!("file://{}", dir.path().display()), "").unwrap();
        // Several parts, written a piece at a time.
        let piece = Bytes::from(vec![b'x'; 300 * 1024]);
        let mut w = objects.writer("a/big", 10 << 20);
        for _ in 0..8 {
            w.write(piece.clone()).await.unwrap();
        }
        let stored = w.finish().await.unwrap();
        assert_eq!(stored.size, 8 * 300 * 1024);
        let whole = vec![b'x'; 8 * 300 * 1024];
        assert_eq!(stored.sha256, hex::encode(Sha256::digest(&whole)));
        let (size, mut body) = objects.get("a/big").await.unwrap().unwrap();
        assert_eq!(size, stored.size);
        let mut got = Vec::new();
        while let Some(c) = body.next().await {
            got.extend_from_slice(&c.unwrap());
        }
        assert_eq!(got, whole);

        // Past the cap: refused, and no object nor staging file remains.
        let mut w = objects.writer("a/over", 2 << 20);
        let mut refused = false;
        for _ in 0..8 {
            if let Err(PutError::TooLarge { .. }) = w.write(piece.clone()).await {
                refused = true;
                break;
            }
        }
        assert!(refused);
        assert_eq!(objects.head("a/over").await.unwrap(), None);
        let left: Vec<_> = std::fs::read_dir(dir.path().join("a"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec!["big".to_string()], "nothing of the refused put");

        // A store's folder appears only with its first object.
        let later = dir.path().join("later");
        let spelled = format!("file://{}/a/../later", dir.path().display());
        let lazy = Objects::open(&spelled, "").unwrap();
        assert!(!later.exists());
        lazy.put_bytes("x/y", Bytes::from_static(b"{}"))
            .await
            .unwrap();
        assert_eq!(std::fs::read(later.join("x/y")).unwrap(), b"{}");

        // Small and empty objects.
        let s = objects.put_bytes("b/empty", Bytes::new()).await.unwrap();
        assert_eq!(s.size, 0);
        assert_eq!(objects.head("b/empty").await.unwrap(), Some(0));
        objects.delete("b/empty").await.unwrap();
        objects.delete("b/empty").await.unwrap();
        assert_eq!(objects.head("b/empty").await.unwrap(), None);
    }
}
