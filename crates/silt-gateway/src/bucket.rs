//! Buckets: CreateBucket, DeleteBucket and ListBuckets over the namespace's top level.
//!
//! A bucket is a top-level directory of the namespace (`/data`). One can be made or removed
//! only where the namespace holds top-level directories of its own: a mount at `/` whose
//! store takes directories, writable by the write rules. A top level made of mount points
//! (`--mount /data=...`) holds no new names: CreateBucket there, and DeleteBucket of a
//! mount, are refused with `405 MethodNotAllowed`; a read-only path with `403 AccessDenied`
//! (as PutObject). Both are in docs/gateway.md.

use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use silt_client::namespace::Resolved;
use silt_common::ErrorKind;

use crate::{to_s3, Gateway};

/// S3's limits of a ListBuckets page.
const MAX_BUCKETS: i32 = 10_000;

/// The owner the gateway names (ListBuckets, listings with FetchOwner): Silt keeps no owners,
/// so one stable id for every bucket and object.
pub(crate) fn owner() -> Owner {
    Owner {
        display_name: Some("silt".into()),
        id: Some("silt".into()),
    }
}

/// Whether `name` may name a new bucket: S3's rules for general purpose buckets (3-63
/// lowercase letters, digits, dots and hyphens, starting and ending with a letter or digit,
/// no `..`, no IP address form, and the prefixes and suffixes S3 reserves).
pub(crate) fn valid_new_bucket_name(name: &str) -> bool {
    const RESERVED_PREFIXES: &[&str] = &["xn--", "sthree-", "amzn-s3-demo-"];
    const RESERVED_SUFFIXES: &[&str] = &["-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"];
    s3s::path::check_bucket_name(name)
        && !RESERVED_PREFIXES.iter().any(|p| name.starts_with(p))
        && !RESERVED_SUFFIXES.iter().any(|s| name.ends_with(s))
}

/// The refusal of a bucket operation the namespace cannot carry out (the top level is made
/// of mount points, or the bucket is a mount).
fn not_here(why: String) -> S3Error {
    S3Error::with_message(S3ErrorCode::MethodNotAllowed, why)
}

fn read_only(bucket: &str) -> S3Error {
    s3_error!(
        AccessDenied,
        "Access Denied: /{} is read-only (the write rules allow no writes here)",
        bucket
    )
}

impl Gateway {
    pub(crate) async fn create_bucket_impl(
        &self,
        req: S3Request<CreateBucketInput>,
    ) -> S3Result<S3Response<CreateBucketOutput>> {
        let i = &req.input;
        let name = i.bucket.as_str();
        if !valid_new_bucket_name(name) {
            return Err(s3_error!(
                InvalidBucketName,
                "The specified bucket is not valid."
            ));
        }
        if i.object_lock_enabled_for_bucket == Some(true) {
            return Err(s3_error!(NotImplemented, "object lock is not supported"));
        }
        let path = format!("/{name}");
        match self.client.stat(&path).await {
            Ok(e) if e.is_dir() => {
                return Err(s3_error!(
                    BucketAlreadyOwnedByYou,
                    "Your previous request to create the named bucket succeeded and you already own it."
                ))
            }
            // A file at the top level: the name is taken, though not by a bucket.
            Ok(_) => {
                return Err(s3_error!(
                    BucketAlreadyExists,
                    "The requested bucket name is not available."
                ))
            }
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(to_s3(e)),
        }
        match self.client.namespace().resolve(&path) {
            Ok(Resolved::Store { rel, .. }) if !rel.is_empty() => {}
            _ => {
                return Err(not_here(format!(
                    "CreateBucket: the top level of this namespace is made of mount points ({}); \
                     a bucket can be made only under a mount at / (docs/gateway.md)",
                    self.mount_list()
                )))
            }
        }
        match self.client.mkdir(&path).await {
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::ReadOnly => return Err(read_only(name)),
            Err(e) if e.kind() == ErrorKind::AlreadyExists => {
                // Made meanwhile, by another request or behind Silt's back.
                return Err(s3_error!(
                    BucketAlreadyOwnedByYou,
                    "Your previous request to create the named bucket succeeded and you already own it."
                ));
            }
            Err(e) => return Err(to_s3(e)),
        }
        Ok(S3Response::new(CreateBucketOutput {
            location: Some(path),
        }))
    }

    pub(crate) async fn delete_bucket_impl(
        &self,
        req: S3Request<DeleteBucketInput>,
    ) -> S3Result<S3Response<DeleteBucketOutput>> {
        let bucket = req.input.bucket.as_str();
        let root = self.bucket_root(bucket).await?;
        match self.client.namespace().resolve(&root) {
            Ok(Resolved::Store { rel, .. }) if !rel.is_empty() => {}
            _ => {
                return Err(not_here(format!(
                    "DeleteBucket: {root} is a mount point of this namespace, not a directory that can be removed (docs/gateway.md)"
                )))
            }
        }
        if !self.client.write_rules().writable_at_or_below(&root) {
            return Err(read_only(bucket));
        }
        // S3 counts objects: a bucket holding only empty directories (which a local store has
        // and S3 does not) is empty, and they go with it.
        // One key is enough to know (the listing walk stops at the first).
        let q = crate::list::Query {
            prefix: "",
            delimiter: None,
            after: None,
            max: 0,
        };
        let first = crate::list::list(&self.client, &root, &q)
            .await
            .map_err(to_s3)?;
        if !first.is_empty() {
            return Err(bucket_not_empty());
        }
        self.remove_empty_tree(&root).await?;
        // 204: s3s answers DeleteBucket so (a status set here would not be used).
        Ok(S3Response::new(DeleteBucketOutput::default()))
    }

    /// Removes the directory `dir` and the empty directories below it, deepest first.
    async fn remove_empty_tree(&self, dir: &str) -> S3Result<()> {
        let mut stack = vec![(dir.to_string(), false)];
        while let Some((d, listed)) = stack.pop() {
            if !listed {
                let kids = self.client.list(&d).await.map_err(to_s3)?;
                stack.push((d.clone(), true));
                for k in kids.iter().filter(|k| k.is_dir()) {
                    stack.push((k.path.clone(), false));
                }
                continue;
            }
            match self.client.rmdir(&d).await {
                Ok(()) => {}
                Err(e) if e.kind() == ErrorKind::NotFound => {}
                // A file, link or special file appeared or was never an object.
                Err(e) if e.kind() == ErrorKind::NotEmpty => return Err(bucket_not_empty()),
                Err(e) if e.kind() == ErrorKind::ReadOnly => {
                    return Err(read_only(d.trim_start_matches('/')))
                }
                Err(e) => return Err(to_s3(e)),
            }
        }
        Ok(())
    }

    pub(crate) async fn list_buckets_impl(
        &self,
        req: S3Request<ListBucketsInput>,
    ) -> S3Result<S3Response<ListBucketsOutput>> {
        let i = &req.input;
        let max = match i.max_buckets {
            None => usize::MAX,
            Some(n) if (1..=MAX_BUCKETS).contains(&n) => n as usize,
            Some(_) => {
                return Err(s3_error!(
                    InvalidArgument,
                    "Argument max-buckets must be an integer between 1 and 10000."
                ))
            }
        };
        let rights = req
            .credentials
            .as_ref()
            .and_then(|c| self.keys.get(&c.access_key));
        let prefix = i.prefix.as_deref().unwrap_or("");
        // The token is the last name of the previous page: names sort, and nothing else is
        // needed to carry on.
        let after = i.continuation_token.as_deref().filter(|t| !t.is_empty());
        let top = self.client.list("/").await.map_err(to_s3)?;
        let mut all: Vec<_> = top
            .iter()
            .filter(|e| e.is_dir())
            .filter(|e| rights.is_none_or(|r| r.allows_bucket(e.name())))
            .filter(|e| e.name().starts_with(prefix))
            .filter(|e| after.is_none_or(|a| e.name() > a))
            .collect();
        all.sort_by(|a, b| a.name().cmp(b.name()));
        let truncated = all.len() > max;
        all.truncate(max);
        let next = truncated
            .then(|| all.last().map(|e| e.name().to_string()))
            .flatten();
        let buckets: Vec<Bucket> = all
            .iter()
            .map(|e| Bucket {
                name: Some(e.name().to_string()),
                // A store directory's own time where it has one; an S3 prefix or a mount
                // above the stores has none: the time this gateway opened the namespace.
                creation_date: Some(Timestamp::from(e.mtime.unwrap_or(self.opened))),
                bucket_region: Some("us-east-1".into()),
            })
            .collect();
        Ok(S3Response::new(ListBucketsOutput {
            buckets: Some(buckets),
            continuation_token: next,
            owner: Some(owner()),
            prefix: i.prefix.clone(),
        }))
    }

    fn mount_list(&self) -> String {
        let m: Vec<&str> = self
            .client
            .namespace()
            .mounts()
            .iter()
            .map(|m| m.path.as_str())
            .collect();
        m.join(", ")
    }
}

fn bucket_not_empty() -> S3Error {
    s3_error!(
        BucketNotEmpty,
        "The bucket you tried to delete is not empty"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_bucket_names_follow_s3s_rules() {
        for ok in [
            "abc",
            "my-bucket.2",
            "a1b",
            &"a".repeat(63),
            "xn-a",
            "s3alias",
        ] {
            assert!(valid_new_bucket_name(ok), "{ok}");
        }
        for bad in [
            "ab",
            &"a".repeat(64),
            "My-Bucket",
            "my_bucket",
            "-abc",
            "abc-",
            ".abc",
            "a..b",
            "192.168.5.4",
            "xn--abc",
            "sthree-abc",
            "amzn-s3-demo-x",
            "abc-s3alias",
            "abc--ol-s3",
            "abc.mrap",
            "abc--x-s3",
            "abc--table-s3",
        ] {
            assert!(!valid_new_bucket_name(bad), "{bad}");
        }
    }
}
