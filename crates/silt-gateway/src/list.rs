//! ListObjects (V1 and V2) over Silt's hierarchical namespace.
//!
//! S3 lists keys in UTF-8 byte order; the namespace is a tree of directories. A depth-first
//! walk yields keys in byte order when the children of each directory are visited in the
//! order of their *keys*, a directory's key being its name followed by `/` (so `a-b` comes
//! before the directory `a`, whose keys all start with `a/`). Proof sketch: every key below a
//! directory `d/` starts with `d/`, and a sibling `x` that sorts after `d/` without starting
//! with it sorts after every key that does.
//!
//! The walk starts at the deepest directory the prefix names (`train/x` starts in `train/`),
//! skips subtrees that the prefix or the marker rule out without listing them, and stops once
//! it has one item more than the page holds. Keys after the marker (StartAfter, Marker, a
//! continuation token) roll up into common prefixes as they come (keys are visited in order,
//! so one common prefix's keys are adjacent); a common prefix equal to the marker is left
//! out, so a page ending with a common prefix continues after all of it. With the delimiter
//! `/`, a directory inside the prefix is one common prefix, found without listing it.
//!
//! Every listing comes from the client's metadata cache (`Client::list`), revalidated by the
//! mount's sync policy like any other lookup.
//!
//! The S3 answers are built here too: a page of a bucket (`Gateway::list_page`), the
//! ListObjects and ListObjectsV2 responses, their continuation tokens, `max-keys` and
//! `encoding-type=url`.

use base64::Engine;
use s3s::dto::*;
use s3s::{s3_error, S3Request, S3Response, S3Result};
use silt_client::{Client, Entry};
use silt_common::Result;
use silt_ufs::EntryKind;

use crate::{bucket, etag_of, len_i64, to_s3, Gateway};

/// One item of a listing page, in key order.
#[derive(Debug, Clone)]
pub enum Item {
    /// An object: its key and its entry.
    Key(String, Entry),
    /// A common prefix (ends with the delimiter).
    Prefix(String),
}

impl Item {
    /// What the marker and continuation tokens compare against: the key, or the prefix.
    pub fn marker(&self) -> &str {
        match self {
            Item::Key(k, _) => k,
            Item::Prefix(p) => p,
        }
    }
}

/// What to list in one bucket.
pub struct Query<'a> {
    pub prefix: &'a str,
    pub delimiter: Option<&'a str>,
    /// Only items whose key (or common prefix) sorts after this.
    pub after: Option<&'a str>,
    /// Page size; the result holds up to one more, to tell whether the page is truncated.
    pub max: usize,
}

/// Lists the bucket whose root is the namespace directory `root` (`/data`): up to
/// `q.max + 1` items in key order.
pub async fn list(client: &Client, root: &str, q: &Query<'_>) -> Result<Vec<Item>> {
    let want = q.max.saturating_add(1);
    let mut out: Vec<Item> = Vec::new();
    if want == 0 {
        return Ok(out);
    }
    // The deepest directory every matching key lies in.
    let start = match q.prefix.rfind('/') {
        Some(i) => &q.prefix[..=i],
        None => "",
    };
    // A directory part no key can have (`../`, `a/./`, `a//`: keys are paths without such
    // components): S3 compares prefixes as strings, so nothing matches, and that is no error.
    if start
        .trim_end_matches('/')
        .split('/')
        .any(|c| matches!(c, "." | ".."))
        || start.contains("//")
        || start.starts_with('/')
    {
        return Ok(out);
    }
    // Stack of directories still to visit, each with its children in key order and the
    // index of the next child.
    let mut stack: Vec<(Vec<(String, Entry)>, usize)> = Vec::new();
    match children(client, root, start).await {
        Ok(c) => stack.push((c, 0)),
        // A prefix naming no directory: nothing matches.
        Err(e)
            if matches!(
                e.kind(),
                silt_common::ErrorKind::NotFound | silt_common::ErrorKind::NotADirectory
            ) =>
        {
            return Ok(out)
        }
        Err(e) => return Err(e),
    }
    let delimiter = q.delimiter.filter(|d| !d.is_empty());
    // The common prefix a key (or a directory's key) rolls up into, if any.
    let rolled = |key: &str| -> Option<String> {
        let d = delimiter?;
        let i = key.strip_prefix(q.prefix)?.find(d)?;
        Some(key[..q.prefix.len() + i + d.len()].to_string())
    };
    while let Some((kids, next)) = stack.last_mut() {
        let Some((key, entry)) = kids.get(*next).cloned() else {
            stack.pop();
            continue;
        };
        *next += 1;
        if entry.is_dir() {
            // `key` ends with '/'. Relevant only if it lies inside the prefix, or the prefix
            // inside it.
            let inside = key.starts_with(q.prefix);
            if !inside && !q.prefix.starts_with(key.as_str()) {
                continue;
            }
            // Every key below sorts before the marker (the marker is past `key` without
            // lying inside it).
            if let Some(a) = q.after {
                if a > key.as_str() && !a.starts_with(key.as_str()) {
                    continue;
                }
            }
            // With the delimiter `/`, everything below a directory inside the prefix rolls up
            // into one common prefix: no need to look inside, unless the marker lies strictly
            // inside it (then only keys past the marker count, and there may be none).
            let marker_inside = q
                .after
                .is_some_and(|a| a.starts_with(key.as_str()) && a != key);
            match rolled(&key) {
                Some(cp) if inside && delimiter == Some("/") && !marker_inside => {
                    push(&mut out, Item::Prefix(cp), q)
                }
                _ => {
                    let c = children(client, root, &key).await?;
                    stack.push((c, 0));
                }
            }
        } else if entry.kind == EntryKind::File && key.starts_with(q.prefix) {
            if q.after.is_some_and(|a| key.as_str() <= a) {
                continue;
            }
            let item = match rolled(&key) {
                Some(cp) => Item::Prefix(cp),
                None => Item::Key(key, entry),
            };
            push(&mut out, item, q);
        }
        if out.len() >= want {
            break;
        }
    }
    Ok(out)
}

/// Appends `item` unless it repeats the last common prefix, or is the common prefix the
/// marker names (a continuation token or V1 NextMarker ending a page with it: the next page
/// starts after all of it).
fn push(out: &mut Vec<Item>, item: Item, q: &Query<'_>) {
    if let Item::Prefix(p) = &item {
        if q.after == Some(p.as_str()) {
            return;
        }
        if let Some(Item::Prefix(last)) = out.last() {
            if p == last {
                return;
            }
        }
    }
    out.push(item);
}

/// The children of the bucket directory `dir` (a key prefix ending with '/', or "" for the
/// bucket root), as (key, entry) in key order; symbolic links are left out (S3 has none).
async fn children(client: &Client, root: &str, dir: &str) -> Result<Vec<(String, Entry)>> {
    let path = if dir.is_empty() {
        root.to_string()
    } else {
        format!("{root}/{}", dir.trim_end_matches('/'))
    };
    let entries = client.list(&path).await?;
    let mut kids: Vec<(String, Entry)> = entries
        .iter()
        .filter_map(|e| {
            let key = match e.kind {
                EntryKind::Dir => format!("{dir}{}/", e.name()),
                EntryKind::File => format!("{dir}{}", e.name()),
                EntryKind::Symlink | EntryKind::Special(_) => return None,
            };
            Some((key, e.clone()))
        })
        .collect();
    kids.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(kids)
}

/// Longest page of a listing (S3's).
const MAX_KEYS: i32 = 1000;

impl Gateway {
    /// Lists one page of `bucket` (items in key order, up to `max + 1`).
    pub(crate) async fn list_page(
        &self,
        bucket: &str,
        prefix: &str,
        delimiter: Option<&str>,
        after: Option<&str>,
        max: usize,
    ) -> S3Result<(Vec<Item>, bool)> {
        let root = self.bucket_root(bucket).await?;
        if max == 0 {
            return Ok((Vec::new(), false));
        }
        let q = Query {
            prefix,
            delimiter: delimiter.filter(|d| !d.is_empty()),
            after,
            max,
        };
        let mut items = list(&self.client, &root, &q).await.map_err(to_s3)?;
        let truncated = items.len() > max;
        items.truncate(max);
        Ok((items, truncated))
    }

    pub(crate) async fn list_objects_v2_impl(
        &self,
        req: S3Request<ListObjectsV2Input>,
    ) -> S3Result<S3Response<ListObjectsV2Output>> {
        let i = req.input;
        let max = page_size(i.max_keys, "max-keys")?;
        let token = i
            .continuation_token
            .as_deref()
            .map(decode_token)
            .transpose()?;
        // A continuation token carries on where the last page stopped; StartAfter applies to
        // the first page only.
        let after = token.as_deref().or(i.start_after.as_deref());
        let prefix = i.prefix.clone().unwrap_or_default();
        let (items, truncated) = self
            .list_page(&i.bucket, &prefix, i.delimiter.as_deref(), after, max)
            .await?;
        let url = is_url(i.encoding_type.as_ref());
        let next = truncated
            .then(|| items.last().map(|it| encode_token(it.marker())))
            .flatten();
        let key_count = items.len() as i32;
        let (contents, common_prefixes) = split(items, url, i.fetch_owner == Some(true));
        Ok(S3Response::new(ListObjectsV2Output {
            name: Some(i.bucket),
            prefix: Some(enc(&prefix, url)),
            max_keys: Some(max as i32),
            key_count: Some(key_count),
            continuation_token: i.continuation_token,
            is_truncated: Some(truncated),
            next_continuation_token: next,
            contents: Some(contents),
            common_prefixes: Some(common_prefixes),
            // An empty delimiter is no delimiter: S3 does not echo it.
            delimiter: i.delimiter.filter(|d| !d.is_empty()).map(|d| enc(&d, url)),
            encoding_type: i.encoding_type,
            start_after: i.start_after.map(|s| enc(&s, url)),
            ..Default::default()
        }))
    }

    pub(crate) async fn list_objects_impl(
        &self,
        req: S3Request<ListObjectsInput>,
    ) -> S3Result<S3Response<ListObjectsOutput>> {
        let i = req.input;
        let max = page_size(i.max_keys, "max-keys")?;
        let prefix = i.prefix.clone().unwrap_or_default();
        let (items, truncated) = self
            .list_page(
                &i.bucket,
                &prefix,
                i.delimiter.as_deref(),
                i.marker.as_deref(),
                max,
            )
            .await?;
        let url = is_url(i.encoding_type.as_ref());
        // S3 returns NextMarker only with a delimiter (without one, the last key is the
        // next marker, and clients use it).
        let next_marker = (truncated && i.delimiter.as_deref().is_some_and(|d| !d.is_empty()))
            .then(|| items.last().map(|it| enc(it.marker(), url)))
            .flatten();
        // V1 names every object's owner (V2 only when asked, FetchOwner).
        let (contents, common_prefixes) = split(items, url, true);
        Ok(S3Response::new(ListObjectsOutput {
            name: Some(i.bucket),
            // V1 encodes the keys, markers and delimiter but echoes the prefix as given (S3
            // does; botocore decodes every V1 field but this one).
            prefix: Some(prefix),
            marker: Some(i.marker.map(|m| enc(&m, url)).unwrap_or_default()),
            max_keys: Some(max as i32),
            is_truncated: Some(truncated),
            contents: Some(contents),
            common_prefixes: Some(common_prefixes),
            delimiter: i.delimiter.filter(|d| !d.is_empty()).map(|d| enc(&d, url)),
            next_marker,
            encoding_type: i.encoding_type,
            ..Default::default()
        }))
    }
}

/// How many entries a page of a listing holds: what the request asked for (`what`: its
/// parameter, `max-keys`, `max-parts`, `max-uploads`) up to S3's 1,000, 1,000 when it did not
/// ask; a negative count is `InvalidArgument`.
pub(crate) fn page_size(asked: Option<i32>, what: &str) -> S3Result<usize> {
    match asked {
        None => Ok(MAX_KEYS as usize),
        Some(n) if n < 0 => Err(s3s::S3Error::with_message(
            s3s::S3ErrorCode::InvalidArgument,
            format!("{what} must not be negative"),
        )),
        Some(n) => Ok(n.min(MAX_KEYS) as usize),
    }
}

/// Continuation tokens are the last key (or common prefix) of the page, base64url-encoded:
/// opaque to clients, and the next page needs nothing else (no server-side state).
fn encode_token(marker: &str) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(marker.as_bytes())
}

fn decode_token(t: &str) -> S3Result<String> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(t.as_bytes())
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .ok_or_else(|| {
            s3_error!(
                InvalidArgument,
                "The continuation token provided is incorrect"
            )
        })
}

fn is_url(e: Option<&EncodingType>) -> bool {
    e.is_some_and(|e| e.as_str() == EncodingType::URL)
}

/// `encoding-type=url`: keys and prefixes percent-encoded (all but unreserved characters
/// and `/`), as S3 does.
fn enc(s: &str, url: bool) -> String {
    if !url {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~' | b'/') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// A page's items as S3 answers them; `owner`: each object names its owner.
fn split(items: Vec<Item>, url: bool, owner: bool) -> (Vec<Object>, Vec<CommonPrefix>) {
    let mut contents = Vec::new();
    let mut prefixes = Vec::new();
    for it in items {
        match it {
            Item::Key(k, e) => contents.push(Object {
                e_tag: Some(ETag::Strong(etag_of(&e))),
                key: Some(enc(&k, url)),
                last_modified: e.mtime.map(Timestamp::from),
                owner: owner.then(bucket::owner),
                size: Some(len_i64(e.size)),
                storage_class: Some(ObjectStorageClass::from_static(
                    ObjectStorageClass::STANDARD,
                )),
                ..Default::default()
            }),
            Item::Prefix(p) => prefixes.push(CommonPrefix {
                prefix: Some(enc(&p, url)),
            }),
        }
    }
    (contents, prefixes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_encoding_keeps_slashes() {
        assert_eq!(enc("a b/c+d%é", true), "a%20b/c%2Bd%25%C3%A9");
        assert_eq!(enc("a b", false), "a b");
    }

    #[test]
    fn tokens_round_trip_and_reject_garbage() {
        let t = encode_token("dir/ü x");
        assert_eq!(decode_token(&t).unwrap(), "dir/ü x");
        assert!(decode_token("!!!").is_err());
    }
}
