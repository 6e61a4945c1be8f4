//! Multipart uploads (CreateMultipartUpload, UploadPart, CompleteMultipartUpload,
//! AbortMultipartUpload, ListParts, ListMultipartUploads): parts are kept in the gateway's
//! own directory until the upload is completed (their concatenation becomes the object, as
//! one whole-object upload of the client: `write::finish`) or aborted (they are removed).
//!
//! Layout under the uploads directory (owner-only):
//!
//! ```text
//! <upload id>/upload          "bucket\nkey\n<initiated, unix seconds>\n"
//! <upload id>/meta.json       the object's headers and checksum algorithm (`UploadMeta`)
//! <upload id>/p00042.<md5>    part 42, its ETag (the MD5 of its bytes, hex) in its name
//! <upload id>/tmp-<random>    a part being received
//! done-<upload id>            a completed upload: "bucket\nkey\n<ETag>\n", kept DONE_KEEP
//! ```
//!
//! A completed upload's answer is kept a while (S3 answers a second CompleteMultipartUpload
//! of a completed upload with its result again, so a client that retries one whose answer
//! it lost gets it); records older than [`DONE_KEEP`] are removed as uploads start.
//!
//! A part is renamed into place only once its body was received whole and matched its
//! digests, so a part that is there is complete; uploading a part number again replaces it.
//! An upload is bound to the gateway that started it (its directory is local): a client
//! must send all of its parts to that gateway. Uploads outlive a gateway's restart.

use std::path::PathBuf;
use std::time::{SystemTime, UNIX_EPOCH};

use rand::RngCore;
use s3s::dto::*;
use s3s::{s3_error, S3Error, S3ErrorCode, S3Request, S3Response, S3Result};
use silt_client::{Client, Entry};
use tokio::io::AsyncReadExt;

use crate::conditions::write_condition;
use crate::write::{self, Expected, Received, Sink};
use crate::{etag_of, len_i64, meta, Gateway};

/// S3's limits: part numbers 1..=10000, every part but the last at least 5 MiB.
pub(crate) const MAX_PART_NUMBER: i32 = 10_000;
pub(crate) const MIN_PART_SIZE: u64 = 5 << 20;

/// How long a completed upload's answer is kept for a repeated CompleteMultipartUpload.
const DONE_KEEP: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// One part on disk.
#[derive(Debug, Clone)]
pub(crate) struct PartFile {
    pub number: i32,
    pub etag: String,
    pub size: u64,
    pub modified: Option<SystemTime>,
    pub path: PathBuf,
}

/// One upload's record.
pub(crate) struct UploadInfo {
    pub id: String,
    pub bucket: String,
    pub key: String,
    pub initiated: SystemTime,
}

/// The uploads directory of one gateway.
pub(crate) struct Uploads {
    dir: PathBuf,
}

impl Uploads {
    pub fn new(dir: PathBuf) -> Uploads {
        Uploads { dir }
    }

    fn io(&self, what: &str, e: std::io::Error) -> S3Error {
        crate::to_s3(silt_common::Error::from(e).context(format!("multipart upload: {what}")))
    }

    /// Starts an upload of `bucket`/`key`; returns its id.
    pub async fn create(&self, bucket: &str, key: &str) -> S3Result<String> {
        self.sweep_done().await;
        let mut raw = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut raw);
        let id: String = raw.iter().map(|b| format!("{b:02x}")).collect();
        let dir = self.dir.join(&id);
        silt_common::private::create_dir(&dir).map_err(|e| self.io("creating", e))?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let record = format!("{bucket}\n{key}\n{now}\n");
        silt_common::private::write(&dir.join("upload"), record.as_bytes())
            .map_err(|e| self.io("recording", e))?;
        Ok(id)
    }

    /// Keeps what the object of upload `id` gets besides its bytes.
    pub async fn save_meta(&self, id: &str, m: &crate::meta::UploadMeta) -> S3Result<()> {
        let json = serde_json::to_vec(m).map_err(|e| {
            crate::to_s3(silt_common::Error::internal(format!(
                "upload metadata: {e}"
            )))
        })?;
        silt_common::private::write(&self.dir.join(id).join("meta.json"), &json)
            .map_err(|e| self.io("recording", e))
    }

    /// What [`Uploads::save_meta`] kept (nothing for an upload started before it was kept).
    pub async fn meta(&self, u: &UploadInfo) -> crate::meta::UploadMeta {
        match tokio::fs::read(self.dir.join(&u.id).join("meta.json")).await {
            Ok(json) => serde_json::from_slice(&json).unwrap_or_default(),
            Err(_) => Default::default(),
        }
    }

    /// The upload `id`, if it is one of `bucket`/`key` (NoSuchUpload otherwise).
    pub async fn get(&self, id: &str, bucket: &str, key: &str) -> S3Result<UploadInfo> {
        match self.read_info(id).await {
            Some(u) if u.bucket == bucket && u.key == key => Ok(u),
            _ => Err(no_such_upload()),
        }
    }

    async fn read_info(&self, id: &str) -> Option<UploadInfo> {
        // An id names a directory here: only what `create` makes is accepted.
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let text = tokio::fs::read_to_string(self.dir.join(id).join("upload"))
            .await
            .ok()?;
        let mut lines = text.split('\n');
        let bucket = lines.next()?.to_string();
        let key = lines.next()?.to_string();
        let secs: u64 = lines.next()?.parse().ok()?;
        Some(UploadInfo {
            id: id.to_string(),
            bucket,
            key,
            initiated: UNIX_EPOCH + std::time::Duration::from_secs(secs),
        })
    }

    /// Receives part `number` of upload `u`; returns its ETag (the MD5 of its bytes, hex)
    /// and what was received.
    pub async fn put_part(
        &self,
        u: &UploadInfo,
        number: i32,
        body: Option<StreamingBlob>,
        content_length: Option<i64>,
        expected: Expected,
        trailers: Option<&s3s::TrailingHeaders>,
    ) -> S3Result<(String, Received)> {
        check_part_number(number)?;
        let dir = self.dir.join(&u.id);
        let mut raw = [0u8; 8];
        rand::thread_rng().fill_bytes(&mut raw);
        let tmp = dir.join(format!("tmp-{:016x}", u64::from_le_bytes(raw)));
        let mut file = match silt_common::private::options()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => tokio::fs::File::from_std(f),
            // Aborted or completed meanwhile.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(no_such_upload()),
            Err(e) => return Err(self.io("creating a part", e)),
        };
        let expected = Expected {
            want_md5: true,
            ..expected
        };
        let got = write::receive(
            Sink::File(&mut file),
            body,
            content_length,
            &expected,
            trailers,
        )
        .await;
        // Every write handed to the file's background task done before the part is renamed
        // into place (and read by a completion).
        let got = match got {
            Ok(g) => {
                use tokio::io::AsyncWriteExt;
                file.flush()
                    .await
                    .map(|()| g)
                    .map_err(|e| self.io("writing a part", e))
            }
            Err(e) => Err(e),
        };
        drop(file);
        let got = match got {
            Ok(g) => g,
            Err(e) => {
                let _ = tokio::fs::remove_file(&tmp).await;
                return Err(e);
            }
        };
        let etag: String = got
            .md5
            .unwrap_or_default()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let name = part_name(number, &etag);
        if let Err(e) = tokio::fs::rename(&tmp, dir.join(&name)).await {
            let _ = tokio::fs::remove_file(&tmp).await;
            return Err(self.io("storing a part", e));
        }
        // The part number uploaded again: the older bytes go.
        for old in self.parts(&u.id).await? {
            if old.number == number && old.etag != etag {
                let _ = tokio::fs::remove_file(&old.path).await;
            }
        }
        Ok((etag, got))
    }

    /// The parts of upload `id`, by part number.
    pub async fn parts(&self, id: &str) -> S3Result<Vec<PartFile>> {
        let mut rd = match tokio::fs::read_dir(self.dir.join(id)).await {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(no_such_upload()),
            Err(e) => return Err(self.io("listing parts", e)),
        };
        let mut parts = Vec::new();
        while let Some(ent) = rd
            .next_entry()
            .await
            .map_err(|e| self.io("listing parts", e))?
        {
            let name = ent.file_name();
            let Some((number, etag)) = name.to_str().and_then(parse_part_name) else {
                continue;
            };
            let Ok(meta) = ent.metadata().await else {
                continue;
            };
            parts.push(PartFile {
                number,
                etag,
                size: meta.len(),
                modified: meta.modified().ok(),
                path: ent.path(),
            });
        }
        parts.sort_by(|a, b| a.number.cmp(&b.number).then(a.modified.cmp(&b.modified)));
        // Two uploads of one part number racing: the later one is the part.
        let mut out: Vec<PartFile> = Vec::with_capacity(parts.len());
        for p in parts {
            match out.last_mut() {
                Some(last) if last.number == p.number => *last = p,
                _ => out.push(p),
            }
        }
        Ok(out)
    }

    /// Completes upload `u` with the parts `asked` (number, ETag): checked as S3 does, then
    /// written to `path` as one whole-object upload; the upload is gone once it is committed.
    pub async fn complete(
        &self,
        client: &Client,
        u: &UploadInfo,
        path: &str,
        asked: &[(i32, String)],
        meta: &crate::meta::UploadMeta,
        condition: Option<silt_client::Precondition>,
    ) -> S3Result<Entry> {
        if asked.is_empty() {
            return Err(s3_error!(
                MalformedXML,
                "You must specify at least one part"
            ));
        }
        if asked.windows(2).any(|w| w[0].0 >= w[1].0) {
            return Err(s3_error!(
                InvalidPartOrder,
                "The list of parts was not in ascending order"
            ));
        }
        let have = self.parts(&u.id).await?;
        let mut chosen = Vec::with_capacity(asked.len());
        for (n, etag) in asked {
            let etag = etag.trim_matches('"').to_ascii_lowercase();
            let Some(p) = have.iter().find(|p| p.number == *n && p.etag == etag) else {
                return Err(s3_error!(
                    InvalidPart,
                    "One or more of the specified parts could not be found"
                ));
            };
            chosen.push(p.clone());
        }
        if chosen[..chosen.len() - 1]
            .iter()
            .any(|p| p.size < MIN_PART_SIZE)
        {
            return Err(s3_error!(
                EntityTooSmall,
                "Your proposed upload is smaller than the minimum allowed object size"
            ));
        }
        let w = client
            .open_upload(path, Default::default())
            .await
            .map_err(write::commit_error)?;
        let mut at = 0u64;
        let mut buf = vec![0u8; 1 << 20];
        let mut sums = crate::meta::Completion::new(meta);
        for p in &chosen {
            let mut f = tokio::fs::File::open(&p.path)
                .await
                .map_err(|e| self.io("reading a part", e))?;
            loop {
                let n = f
                    .read(&mut buf)
                    .await
                    .map_err(|e| self.io("reading a part", e))?;
                if n == 0 {
                    break;
                }
                client
                    .write_at(&w, at, &buf[..n])
                    .map_err(write::write_error)?;
                sums.update(&buf[..n]);
                at += n as u64;
            }
            sums.end_part();
        }
        client.set_headers(&w, sums.finish(meta));
        if let Some(c) = condition {
            // Decided at the commit: a failed one leaves the upload and its parts as they were.
            client.set_precondition(&w, c);
        }
        let entry = write::finish(client, &w).await?;
        // Recorded before the parts go: a failure leaves a repeated Complete NoSuchUpload,
        // as before, and the object is written either way.
        let record = format!("{}\n{}\n{}\n", u.bucket, u.key, crate::etag_of(&entry));
        if let Err(e) = silt_common::private::write(&self.done_path(&u.id), record.as_bytes()) {
            tracing::debug!(id = %u.id, error = %e, "multipart: completion not recorded");
        }
        let _ = tokio::fs::remove_dir_all(self.dir.join(&u.id)).await;
        Ok(entry)
    }

    fn done_path(&self, id: &str) -> PathBuf {
        self.dir.join(format!("done-{id}"))
    }

    /// The ETag upload `id` of `bucket`/`key` was completed with, while its record is kept.
    pub async fn completed(&self, id: &str, bucket: &str, key: &str) -> Option<String> {
        if id.len() != 32 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let text = tokio::fs::read_to_string(self.done_path(id)).await.ok()?;
        let mut lines = text.split('\n');
        let (b, k, etag) = (lines.next()?, lines.next()?, lines.next()?);
        (b == bucket && k == key && !etag.is_empty()).then(|| etag.to_string())
    }

    /// Removes the completion records older than [`DONE_KEEP`].
    async fn sweep_done(&self) {
        let Ok(mut rd) = tokio::fs::read_dir(&self.dir).await else {
            return;
        };
        let now = SystemTime::now();
        while let Ok(Some(ent)) = rd.next_entry().await {
            if !ent
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("done-"))
            {
                continue;
            }
            let old = ent
                .metadata()
                .await
                .ok()
                .and_then(|m| m.modified().ok())
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age > DONE_KEEP);
            if old {
                let _ = tokio::fs::remove_file(ent.path()).await;
            }
        }
    }

    /// Removes upload `u` and its parts.
    pub async fn abort(&self, u: &UploadInfo) -> S3Result<()> {
        match tokio::fs::remove_dir_all(self.dir.join(&u.id)).await {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(no_such_upload()),
            Err(e) => Err(self.io("aborting", e)),
        }
    }

    /// The uploads in progress of `bucket` whose keys start with `prefix`, by key then
    /// initiation.
    pub async fn list(&self, bucket: &str, prefix: &str) -> S3Result<Vec<UploadInfo>> {
        let mut rd = match tokio::fs::read_dir(&self.dir).await {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(self.io("listing uploads", e)),
        };
        let mut out = Vec::new();
        while let Some(ent) = rd
            .next_entry()
            .await
            .map_err(|e| self.io("listing uploads", e))?
        {
            let Some(id) = ent.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if let Some(u) = self.read_info(&id).await {
                if u.bucket == bucket && u.key.starts_with(prefix) {
                    out.push(u);
                }
            }
        }
        out.sort_by(|a, b| a.key.cmp(&b.key).then(a.initiated.cmp(&b.initiated)));
        Ok(out)
    }
}

fn part_name(number: i32, etag: &str) -> String {
    format!("p{number:05}.{etag}")
}

fn parse_part_name(name: &str) -> Option<(i32, String)> {
    let rest = name.strip_prefix('p')?;
    let (n, etag) = rest.split_once('.')?;
    let n: i32 = n.parse().ok()?;
    (etag.len() == 32 && etag.bytes().all(|b| b.is_ascii_hexdigit())).then(|| (n, etag.to_string()))
}

pub(crate) fn check_part_number(n: i32) -> S3Result<()> {
    if (1..=MAX_PART_NUMBER).contains(&n) {
        Ok(())
    } else {
        Err(s3_error!(
            InvalidArgument,
            "Part number must be an integer between 1 and 10000, inclusive"
        ))
    }
}

pub(crate) fn no_such_upload() -> S3Error {
    S3Error::with_message(
        S3ErrorCode::NoSuchUpload,
        "The specified multipart upload does not exist. The upload ID may be invalid, or the upload may have been aborted or completed.",
    )
}

impl Gateway {
    pub(crate) async fn create_multipart_upload_impl(
        &self,
        req: S3Request<CreateMultipartUploadInput>,
    ) -> S3Result<S3Response<CreateMultipartUploadOutput>> {
        let i = &req.input;
        let path = self.write_path(&i.bucket, &i.key).await?;
        // Refused now if it could never complete (read-only, a directory there).
        self.client
            .open_upload(&path, Default::default())
            .await
            .map_err(write::commit_error)?;
        let m = meta::UploadMeta::new(
            meta::request_headers!(i),
            i.checksum_algorithm.as_ref(),
            i.checksum_type.as_ref(),
        )?;
        let id = self.uploads.create(&i.bucket, &i.key).await?;
        self.uploads.save_meta(&id, &m).await?;
        Ok(S3Response::new(CreateMultipartUploadOutput {
            checksum_algorithm: i.checksum_algorithm.clone(),
            checksum_type: m.algorithm.as_ref().map(|_| {
                ChecksumType::from(
                    if m.full_object {
                        ChecksumType::FULL_OBJECT
                    } else {
                        ChecksumType::COMPOSITE
                    }
                    .to_string(),
                )
            }),
            bucket: Some(i.bucket.clone()),
            key: Some(i.key.clone()),
            upload_id: Some(id),
            ..Default::default()
        }))
    }

    pub(crate) async fn upload_part_impl(
        &self,
        req: S3Request<UploadPartInput>,
    ) -> S3Result<S3Response<UploadPartOutput>> {
        let expected = write::expected_of!(req)?;
        let i = req.input;
        let u = self.uploads.get(&i.upload_id, &i.bucket, &i.key).await?;
        let (etag, got) = self
            .uploads
            .put_part(
                &u,
                i.part_number,
                i.body,
                i.content_length,
                expected,
                req.trailing_headers.as_ref(),
            )
            .await?;
        Ok(S3Response::new(write::with_checksums!(
            UploadPartOutput {
                e_tag: Some(ETag::Strong(etag)),
                ..Default::default()
            },
            got.checksums
        )))
    }

    pub(crate) async fn complete_multipart_upload_impl(
        &self,
        req: S3Request<CompleteMultipartUploadInput>,
    ) -> S3Result<S3Response<CompleteMultipartUploadOutput>> {
        let i = req.input;
        let u = match self.uploads.get(&i.upload_id, &i.bucket, &i.key).await {
            Ok(u) => u,
            // Completed already: S3 answers with the result again.
            Err(e) => match self
                .uploads
                .completed(&i.upload_id, &i.bucket, &i.key)
                .await
            {
                Some(etag) => {
                    return Ok(S3Response::new(CompleteMultipartUploadOutput {
                        bucket: Some(i.bucket),
                        key: Some(i.key),
                        e_tag: Some(ETag::Strong(etag)),
                        ..Default::default()
                    }))
                }
                None => return Err(e),
            },
        };
        let path = self.write_path(&i.bucket, &i.key).await?;
        let condition = write_condition(i.if_match.as_ref(), i.if_none_match.as_ref())?;
        let mut asked = Vec::new();
        for p in i.multipart_upload.and_then(|m| m.parts).unwrap_or_default() {
            let (Some(n), Some(etag)) = (p.part_number, p.e_tag) else {
                return Err(s3_error!(
                    MalformedXML,
                    "every part needs its PartNumber and ETag"
                ));
            };
            asked.push((n, etag.value().to_string()));
        }
        let m = self.uploads.meta(&u).await;
        let entry = self
            .uploads
            .complete(&self.client, &u, &path, &asked, &m, condition)
            .await?;
        let h = meta::headers_of(&self.client, &entry)
            .await?
            .unwrap_or_default();
        let c = meta::checksum_of(&h);
        Ok(S3Response::new(CompleteMultipartUploadOutput {
            bucket: Some(i.bucket),
            key: Some(i.key),
            e_tag: Some(ETag::Strong(etag_of(&entry))),
            checksum_crc32: c.checksum_crc32,
            checksum_crc32c: c.checksum_crc32c,
            checksum_sha1: c.checksum_sha1,
            checksum_sha256: c.checksum_sha256,
            checksum_crc64nvme: c.checksum_crc64nvme,
            checksum_type: c.checksum_type,
            ..Default::default()
        }))
    }

    pub(crate) async fn abort_multipart_upload_impl(
        &self,
        req: S3Request<AbortMultipartUploadInput>,
    ) -> S3Result<S3Response<AbortMultipartUploadOutput>> {
        let i = &req.input;
        let u = self.uploads.get(&i.upload_id, &i.bucket, &i.key).await?;
        self.uploads.abort(&u).await?;
        Ok(S3Response::new(AbortMultipartUploadOutput::default()))
    }

    pub(crate) async fn list_parts_impl(
        &self,
        req: S3Request<ListPartsInput>,
    ) -> S3Result<S3Response<ListPartsOutput>> {
        let i = &req.input;
        let u = self.uploads.get(&i.upload_id, &i.bucket, &i.key).await?;
        let max = crate::list::page_size(i.max_parts, "max-parts")?;
        let marker = i.part_number_marker.unwrap_or(0);
        let mut parts: Vec<_> = self
            .uploads
            .parts(&u.id)
            .await?
            .into_iter()
            .filter(|p| p.number > marker)
            .collect();
        let truncated = parts.len() > max;
        parts.truncate(max);
        let next = truncated.then(|| parts.last().map(|p| p.number)).flatten();
        Ok(S3Response::new(ListPartsOutput {
            bucket: Some(u.bucket),
            key: Some(u.key),
            upload_id: Some(u.id),
            max_parts: Some(max as i32),
            is_truncated: Some(truncated),
            part_number_marker: i.part_number_marker,
            next_part_number_marker: next,
            parts: Some(
                parts
                    .into_iter()
                    .map(|p| Part {
                        e_tag: Some(ETag::Strong(p.etag)),
                        last_modified: p.modified.map(Timestamp::from),
                        part_number: Some(p.number),
                        size: Some(len_i64(p.size)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
            ..Default::default()
        }))
    }

    pub(crate) async fn list_multipart_uploads_impl(
        &self,
        req: S3Request<ListMultipartUploadsInput>,
    ) -> S3Result<S3Response<ListMultipartUploadsOutput>> {
        let i = &req.input;
        self.bucket_root(&i.bucket).await?;
        let prefix = i.prefix.clone().unwrap_or_default();
        let max = crate::list::page_size(i.max_uploads, "max-uploads")?;
        let key_marker = i.key_marker.clone().unwrap_or_default();
        let id_marker = i.upload_id_marker.clone().unwrap_or_default();
        let mut all: Vec<_> = self
            .uploads
            .list(&i.bucket, &prefix)
            .await?
            .into_iter()
            .filter(|u| {
                key_marker.is_empty()
                    || u.key > key_marker
                    || (u.key == key_marker && !id_marker.is_empty() && u.id > id_marker)
            })
            .collect();
        let truncated = all.len() > max;
        all.truncate(max);
        let (next_key, next_id) = match (truncated, all.last()) {
            (true, Some(u)) => (Some(u.key.clone()), Some(u.id.clone())),
            _ => (None, None),
        };
        Ok(S3Response::new(ListMultipartUploadsOutput {
            bucket: Some(i.bucket.clone()),
            prefix: Some(prefix),
            key_marker: i.key_marker.clone(),
            upload_id_marker: i.upload_id_marker.clone(),
            max_uploads: Some(max as i32),
            is_truncated: Some(truncated),
            next_key_marker: next_key,
            next_upload_id_marker: next_id,
            uploads: Some(
                all.into_iter()
                    .map(|u| MultipartUpload {
                        initiated: Some(Timestamp::from(u.initiated)),
                        key: Some(u.key),
                        upload_id: Some(u.id),
                        storage_class: Some(StorageClass::from_static(StorageClass::STANDARD)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_names_round_trip_and_reject_others() {
        let etag = "0123456789abcdef0123456789abcdef";
        assert_eq!(
            parse_part_name(&part_name(42, etag)),
            Some((42, etag.into()))
        );
        for bad in [
            "upload",
            "tmp-00ff",
            "p1.abc",
            "pxx.0123456789abcdef0123456789abcdef",
        ] {
            assert_eq!(parse_part_name(bad), None, "{bad}");
        }
    }
}
