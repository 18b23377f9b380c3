//! Sealing BYOK secrets at rest: AES-256-GCM (ring) with a random 96-bit nonce per
//! seal, the row's id as associated data (a sealed secret copied onto another row
//! does not open), stored as `v1:<base64(nonce | ciphertext | tag)>`.
//!
//! The key is `secrets.key` (base64 of 32 bytes) when set, else the key file
//! (`secrets.key_file`), generated on first start with 0600 permissions. Every
//! instance of one service must use the same key.

use anyhow::{bail, Context};
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use ring::aead::{Aad, LessSafeKey, Nonce, UnboundKey, AES_256_GCM, NONCE_LEN};
use std::path::Path;

pub(crate) struct Sealer {
    key: LessSafeKey,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Sealer(..)")
    }
}

impl Sealer {
    pub(crate) fn from_key(bytes: &[u8]) -> anyhow::Result<Sealer> {
        if bytes.len() != 32 {
            bail!("the secrets key must be 32 bytes (base64 of 32 random bytes)");
        }
        let key = UnboundKey::new(&AES_256_GCM, bytes).map_err(|_| anyhow::anyhow!("bad key"))?;
        Ok(Sealer {
            key: LessSafeKey::new(key),
        })
    }

    /// The configured key, or the key file's (created when missing).
    pub(crate) fn load(key_b64: &str, key_file: &str) -> anyhow::Result<Sealer> {
        if !key_b64.trim().is_empty() {
            let bytes = B64
                .decode(key_b64.trim())
                .context("secrets.key is not base64")?;
            return Sealer::from_key(&bytes);
        }
        let path = Path::new(key_file);
        if !path.exists() {
            write_new_key(path)?;
        }
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading the secrets key file {}", path.display()))?;
        let bytes = B64
            .decode(text.trim())
            .with_context(|| format!("{} is not base64", path.display()))?;
        Sealer::from_key(&bytes)
    }

    pub(crate) fn seal(&self, plaintext: &str, bound_to: &str) -> String {
        let nonce_bytes: [u8; NONCE_LEN] = rand::random();
        let mut buf = plaintext.as_bytes().to_vec();
        let nonce = Nonce::assume_unique_for_key(nonce_bytes);
        self.key
            .seal_in_place_append_tag(nonce, Aad::from(bound_to.as_bytes()), &mut buf)
            .expect("AES-GCM seals any message under 64 GiB");
        let mut out = nonce_bytes.to_vec();
        out.extend_from_slice(&buf);
        format!("v1:{}", B64.encode(out))
    }

    pub(crate) fn open(&self, sealed: &str, bound_to: &str) -> anyhow::Result<String> {
        let body = sealed
            .strip_prefix("v1:")
            .context("unknown sealed-secret version")?;
        let raw = B64.decode(body).context("sealed secret is not base64")?;
        if raw.len() < NONCE_LEN + 16 {
            bail!("sealed secret too short");
        }
        let (n, rest) = raw.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(n).map_err(|_| anyhow::anyhow!("nonce"))?;
        let mut buf = rest.to_vec();
        let plain = self
            .key
            .open_in_place(nonce, Aad::from(bound_to.as_bytes()), &mut buf)
            .map_err(|_| anyhow::anyhow!("sealed secret does not open with this key"))?;
        Ok(String::from_utf8(plain.to_vec())?)
    }
}

fn write_new_key(path: &Path) -> anyhow::Result<()> {
    use std::io::Write as _;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let key: [u8; 32] = rand::random();
    // Written whole under a temporary name, then linked into place: a process that
    // starts at the same moment sees either no file or the whole key, never half.
    let tmp = path.with_extension(format!("tmp{}", rand::random::<u32>()));
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        opts.mode(0o600);
    }
    let mut f = opts
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    f.write_all(B64.encode(key).as_bytes())?;
    f.sync_all()?;
    drop(f);
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Ok(()) => {
            tracing::info!(path = %path.display(), "generated the secrets key file");
            Ok(())
        }
        // Another process linked its key first: use that one.
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(e).with_context(|| format!("creating {}", path.display())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sealed_secrets_open_only_on_their_row_with_their_key() {
        let s = Sealer::from_key(&[7u8; 32]).unwrap();
        let sealed = s.seal("sk-live-123", "conn_a");
        assert!(!sealed.contains("sk-live"));
        assert_ne!(
            sealed,
            s.seal("sk-live-123", "conn_a"),
            "a fresh nonce each time"
        );
        assert_eq!(s.open(&sealed, "conn_a").unwrap(), "sk-live-123");
        assert!(s.open(&sealed, "conn_b").is_err(), "bound to its row");
        let other = Sealer::from_key(&[8u8; 32]).unwrap();
        assert!(other.open(&sealed, "conn_a").is_err());
        assert!(Sealer::from_key(&[1u8; 16]).is_err());
    }

    #[test]
    fn a_generated_key_file_is_private_and_reused() {
        let dir = tempfile_dir();
        let path = dir.join("k/secret.key");
        let p = path.to_str().unwrap();
        let a = Sealer::load("", p).unwrap();
        let sealed = a.seal("x", "r");
        let b = Sealer::load("", p).unwrap();
        assert_eq!(b.open(&sealed, "r").unwrap(), "x");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let _ = std::fs::remove_dir_all(dir);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("sluice-secrets-{}", rand::random::<u64>()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
