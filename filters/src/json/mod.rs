//! The crate's JSON toolkit, under every format: an object's members with their
//! values unparsed (read once, forwarded untouched), the validating one-pass
//! scanner that reads the common shapes at a fraction of serde's cost (`scan`),
//! and byte-level edits of a provider's answer (`edit`). `inbound` and `upstream`
//! both stand on it and never on each other.

pub mod edit;
pub(crate) mod scan;

pub use scan::{with_long_strings, LongStrings};

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::fmt;

/// One member of a JSON object: its key and its unparsed value.
pub type Member<'a> = (Cow<'a, str>, &'a RawValue);

/// The members of a JSON object in document order, values unparsed: lets a closed
/// schema name the offending key, and lets forwarded values pass untouched.
pub struct Members<'a>(pub Vec<Member<'a>>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(16));
                while let Some(Key(k)) = map.next_key()? {
                    let v: &'de RawValue = map.next_value()?;
                    out.push((k, v));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A key, borrowed from the document unless it holds escapes.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Key<'de>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a string key")
            }
            fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
            fn visit_string<E>(self, v: String) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v)))
            }
        }
        d.deserialize_str(V)
    }
}

/// Splits a JSON object into its top-level members (keys unescaped, values as raw
/// JSON borrowed from `text`). Errors are serde_json's own, for the caller to
/// classify (syntax: not JSON; data: JSON that is not an object). The common shape
/// is split in one validating pass; anything else is serde's to read.
pub fn split_object(text: &str) -> Result<Vec<Member<'_>>, serde_json::Error> {
    members_or_serde(scan::Scan::new(text), text)
}

/// As [`split_object`], for bytes off the wire: the one pass that checks the JSON
/// checks its UTF-8 too (no pass of its own over a long body first). Bytes that
/// are not UTF-8 are serde's syntax error.
/// The long strings it read come with the members: hold them
/// ([`with_long_strings`]) while the members are read further, and those strings
/// are not looked through again.
pub fn split_object_bytes(bytes: &[u8]) -> Result<Split<'_>, serde_json::Error> {
    match scan::members_and_long_of(scan::Scan::of_bytes(bytes)) {
        Some((members, long)) => Ok((members, long)),
        // serde checks the UTF-8 of what it reads.
        None => serde_json::from_slice::<Members>(bytes).map(|m| (m.0, LongStrings::default())),
    }
}

/// A body's members and the long strings among them.
pub type Split<'a> = (Vec<Member<'a>>, LongStrings<'a>);

/// As [`split_object`], for a value already read as JSON: its strings are not
/// checked again, only skipped.
pub(crate) fn split_valid_object(v: &RawValue) -> Result<Vec<Member<'_>>, serde_json::Error> {
    members_or_serde(scan::Scan::of_valid(v), v.get())
}

/// The scan's split of the object that is `text`, or serde's where it declines.
fn members_or_serde<'a>(
    s: scan::Scan<'a>,
    text: &'a str,
) -> Result<Vec<Member<'a>>, serde_json::Error> {
    match scan::members_of(s) {
        Some(members) => Ok(members),
        None => serde_json::from_str::<Members>(text).map(|m| m.0),
    }
}

/// The items of a JSON array, as raw JSON, for a value already read as JSON;
/// as [`split_valid_object`] does.
pub(crate) fn split_valid_array(v: &RawValue) -> Result<Vec<&RawValue>, serde_json::Error> {
    match scan::items_of(scan::Scan::of_valid(v)) {
        Some(items) => Ok(items),
        None => serde_json::from_str(v.get()),
    }
}

/// A JSON string value already read as JSON, borrowed when it holds no escapes.
pub(crate) fn valid_string_value(v: &RawValue) -> Result<Cow<'_, str>, serde_json::Error> {
    match scan::plain_str_of(scan::Scan::of_valid(v)) {
        Some(s) => Ok(Cow::Borrowed(s)),
        None => serde_json::from_str::<String>(v.get()).map(Cow::Owned),
    }
}

/// A JSON object's members with their values unparsed, borrowed from the client's
/// body: forwarded fields are never re-serialized from a parsed form. Each key
/// once, in document order.
#[derive(Clone, Debug, Default)]
pub struct RawObject<'a>(Vec<Member<'a>>);

impl<'a> RawObject<'a> {
    /// The object of a body's members: the last of repeated members wins, as it
    /// does for a JSON reader that keeps one.
    pub fn from_members(members: &[Member<'a>]) -> Self {
        let kept: Vec<Member<'a>> = if members.len() <= 32 {
            // Few members: a look ahead for a later repeat beats building a set.
            members
                .iter()
                .enumerate()
                .filter(|(i, (k, _))| !members[i + 1..].iter().any(|(later, _)| later == k))
                .map(|(_, m)| m.clone())
                .collect()
        } else {
            // Many members: one pass from the back, so a huge body stays linear.
            let mut seen = std::collections::HashSet::with_capacity(members.len());
            let mut out: Vec<Member<'a>> = members
                .iter()
                .rev()
                .filter(|(k, _)| seen.insert(k.as_ref()))
                .cloned()
                .collect();
            out.reverse();
            out
        };
        RawObject(kept)
    }

    /// The object that is the whole of `text`.
    pub fn parse(text: &'a str) -> Result<Self, serde_json::Error> {
        split_object(text).map(|m| Self::from_members(&m))
    }

    pub fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    /// How many members it holds.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn contains_key(&self, key: &str) -> bool {
        self.get(key).is_some()
    }

    pub fn remove(&mut self, key: &str) {
        self.0.retain(|(k, _)| k != key);
    }

    /// Sets `key` to `value`, in place of its member or as a new last one.
    pub fn set(&mut self, key: &'a str, value: &'a RawValue) {
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(m) => m.1 = value,
            None => self.0.push((Cow::Borrowed(key), value)),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &'a RawValue)> + '_ {
        self.0.iter().map(|(k, v)| (k.as_ref(), *v))
    }
}

/// Adds `"key": <json value>` as the last member of the object that ends `buf`
/// (from `start`), in place: only the closing brace and what follows it move. For
/// objects the gateway wrote itself; a provider's answer is edited with
/// [`crate::json_edit`], which also replaces a member of the same name.
pub fn append_member(buf: &mut Vec<u8>, start: usize, key: &str, value_json: &[u8]) {
    let Some(end) = buf[start..]
        .iter()
        .rposition(|&b| b == b'}')
        .map(|e| start + e)
    else {
        return;
    };
    let empty = buf[start..end]
        .iter()
        .rev()
        .find(|b| !b.is_ascii_whitespace())
        .is_some_and(|&b| b == b'{');
    // Appended, then rotated into place before the closing brace: only the tail
    // (the brace and any trailing whitespace) moves.
    let sep: &[u8] = if empty { b"\"" } else { b",\"" };
    let added = sep.len() + key.len() + 2 + value_json.len();
    buf.reserve(added);
    buf.extend_from_slice(sep);
    buf.extend_from_slice(key.as_bytes());
    buf.extend_from_slice(b"\":");
    buf.extend_from_slice(value_json);
    buf[end..].rotate_right(added);
}
