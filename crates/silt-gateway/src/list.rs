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

use silt_client::{Client, Entry};
use silt_common::Result;
use silt_ufs::EntryKind;

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
