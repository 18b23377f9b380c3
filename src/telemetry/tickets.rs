//! Upload tickets: the signed URL a client PUTs its export to. The URL is bound to
//! its method, path (which names the ingest) and expiry by an HMAC-SHA256 under the
//! key in `[storage] signing_secret_env`; without that variable a random key is
//! made per process (one instance only: another instance could not check it).

use ring::hmac;
use std::sync::OnceLock;

/// Where signed uploads are PUT, under the gateway's `/api` (the only prefix besides
/// `/v1` and its twins the gateway serves).
pub const UPLOAD_PREFIX: &str = "/api/telemetry/uploads/";

pub struct Signer {
    key: hmac::Key,
}

static SIGNER: OnceLock<Signer> = OnceLock::new();

impl Signer {
    /// The process's signer, keyed from the variable `env_name` names.
    pub fn get(env_name: &str) -> &'static Signer {
        SIGNER.get_or_init(|| {
            let secret = std::env::var(env_name).ok().filter(|s| !s.is_empty());
            let bytes = match secret {
                Some(s) => s.into_bytes(),
                None => {
                    tracing::warn!(
                        "{env_name} is not set: signed upload URLs use a random key of this process \
                         and work on this instance only"
                    );
                    rand::random::<[u8; 32]>().to_vec()
                }
            };
            Signer {
                key: hmac::Key::new(hmac::HMAC_SHA256, &bytes),
            }
        })
    }

    fn message(path: &str, expires: i64) -> String {
        format!("PUT\n{path}\n{expires}")
    }

    /// The hex signature of a PUT to `path` until `expires` (Unix seconds).
    pub fn sign(&self, path: &str, expires: i64) -> String {
        hex::encode(hmac::sign(
            &self.key,
            Self::message(path, expires).as_bytes(),
        ))
    }

    /// Whether `sig` signs a PUT to `path` until `expires` (compared in constant time).
    pub fn verify(&self, path: &str, expires: i64, sig: &str) -> bool {
        let Ok(raw) = hex::decode(sig) else {
            return false;
        };
        hmac::verify(&self.key, Self::message(path, expires).as_bytes(), &raw).is_ok()
    }
}

pub fn upload_path(ingest_id: &str) -> String {
    format!("{UPLOAD_PREFIX}{ingest_id}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signatures_bind_path_and_expiry() {
        let s = Signer {
            key: hmac::Key::new(hmac::HMAC_SHA256, b"k"),
        };
        let p = upload_path("ing_1");
        let sig = s.sign(&p, 100);
        assert!(s.verify(&p, 100, &sig));
        assert!(!s.verify(&p, 101, &sig));
        assert!(!s.verify(&upload_path("ing_2"), 100, &sig));
        assert!(!s.verify(&p, 100, "zz"));
        let mut bad = sig.clone().into_bytes();
        bad[0] = if bad[0] == b'a' { b'b' } else { b'a' };
        assert!(!s.verify(&p, 100, std::str::from_utf8(&bad).unwrap()));
    }
}
