//! The `store_*` operations: calls of a worker's own under-stores for a same-host client.
//!
//! A process attached to a `silt up` (`silt_node::Node::attach`) has no store of its own: its
//! namespace's stores stand for the owner's and make each call here, on the owner's Unix
//! socket, so only the owner holds store endpoints and credentials. Each request names the
//! store by its URI (one of the worker's mount table, as `read` does) and carries the call's
//! arguments; the answer is the call's result, typed (`answer::Store*`), or its error with
//! its kind. `store_write` sends the object's bytes after the request as `Data` frames closed
//! by `End` (as `rput`), `store_read` answers with them (as `rget`). Only over the Unix
//! socket: over TCP they are `Unsupported` (a remote client opens the stores itself).

use std::os::unix::fs::{FileExt, OpenOptionsExt};

use super::*;

/// Entries in one page of a paged `store_list` answer: a few MiB of JSON, far below a frame's
/// limit.
pub const LIST_PAGE: usize = 10_000;

/// A write at most this large is received into memory; a larger one into an unnamed file.
const MEMORY_SPOOL: u64 = 8 << 20;

/// Answers the store call `req` on `u`.
pub(super) async fn serve(
    u: &mut UnixStream,
    stores: &dyn StoreResolver,
    req: Request,
) -> std::result::Result<(), ServeError> {
    let op = req.name();
    let meta = |meta: ObjectMeta| answer::StoreMeta { meta };
    match req {
        Request::StoreWrite {
            store,
            path,
            size,
            attrs,
            headers,
        } => {
            // The bytes first, whatever happens: the connection stays usable.
            let spool = receive(u, &path, size).await?;
            let st = stores.store(&store).await?;
            let m = match spool {
                Spool::Memory(b) => {
                    let b = b.freeze();
                    st.write_from_attrs(&path, &b, size, &attrs, headers.as_ref())
                        .await?
                }
                Spool::File(f) => {
                    st.write_from_attrs(&path, &f, size, &attrs, headers.as_ref())
                        .await?
                }
            };
            reply(u, op, &meta(m)).await
        }
        Request::StoreInfo { store } => {
            let st = stores.store(&store).await?;
            let info = answer::StoreInfo {
                uri: st.uri().to_string(),
                capabilities: st.capabilities(),
            };
            reply(u, op, &info).await
        }
        Request::StoreStat { store, path } => {
            let m = match stores.known_file(&store, &path).await {
                Some(m) => m,
                None => stores.store(&store).await?.stat(&path).await?,
            };
            reply(u, op, &meta(m)).await
        }
        Request::StoreList {
            store,
            path,
            recursive,
            paged,
        } => {
            let known = match recursive {
                false => stores.known_listing(&store, &path).await,
                true => None,
            };
            let entries = match known {
                Some(entries) => entries,
                None => stores.store(&store).await?.list(&path, recursive).await?,
            };
            if !paged || entries.len() <= LIST_PAGE {
                return reply(u, op, &answer::StoreEntries { entries }).await;
            }
            for page in entries.chunks(LIST_PAGE) {
                let page = answer::StoreEntries {
                    entries: page.to_vec(),
                };
                reply(u, op, &page).await?;
            }
            Ok(())
        }
        Request::StoreListTree { store, path, max } => {
            let max = usize::try_from(max).unwrap_or(usize::MAX);
            let entries = stores.store(&store).await?.list_tree(&path, max).await?;
            reply(u, op, &answer::StoreTree { entries }).await
        }
        Request::StoreHeaders {
            store,
            path,
            expected,
        } => {
            let headers = stores
                .store(&store)
                .await?
                .headers(&path, &expected)
                .await?;
            reply(u, op, &answer::StoreHeaders { headers }).await
        }
        Request::StoreRead {
            store,
            path,
            expected,
            offset,
            len,
        } => {
            let end = range_end(offset, len)?;
            let st = stores.store(&store).await?;
            let bytes = st.read(&path, offset..end, &expected).await?;
            reply(
                u,
                op,
                &answer::Sending {
                    size: bytes.len() as u64,
                },
            )
            .await?;
            for piece in bytes.chunks(RESIDENT_CHUNK) {
                write_frame(u, FrameKind::Data, piece)
                    .await
                    .map_err(broken)?;
            }
            Ok(())
        }
        Request::StoreDelete { store, path } => {
            stores.store(&store).await?.delete(&path).await?;
            reply(u, op, &answer::StoreDone { ok: true }).await
        }
        Request::StoreCreateDir { store, path } => {
            let m = stores.store(&store).await?.create_dir(&path).await?;
            reply(u, op, &meta(m)).await
        }
        Request::StoreRemoveDir { store, path } => {
            stores.store(&store).await?.remove_dir(&path).await?;
            reply(u, op, &answer::StoreDone { ok: true }).await
        }
        Request::StoreRename { store, from, to } => {
            let m = stores.store(&store).await?.rename(&from, &to).await?;
            reply(u, op, &meta(m)).await
        }
        Request::StoreCopy { store, from, to } => {
            let m = stores.store(&store).await?.copy(&from, &to).await?;
            reply(u, op, &meta(m)).await
        }
        Request::StoreSymlink {
            store,
            path,
            target,
        } => {
            let m = stores.store(&store).await?.symlink(&path, &target).await?;
            reply(u, op, &meta(m)).await
        }
        Request::StoreReadLink { store, path } => {
            let target = stores.store(&store).await?.read_link(&path).await?;
            reply(u, op, &answer::StoreLink { target }).await
        }
        Request::StoreSetAttrs { store, path, attrs } => {
            let m = stores.store(&store).await?.set_attrs(&path, &attrs).await?;
            reply(u, op, &meta(m)).await
        }
        Request::StoreMknod {
            store,
            path,
            kind,
            rdev,
            attrs,
        } => {
            let m = stores
                .store(&store)
                .await?
                .mknod(&path, kind, rdev, &attrs)
                .await?;
            reply(u, op, &meta(m)).await
        }
        Request::StoreHardLink { store, from, to } => {
            let m = stores.store(&store).await?.hard_link(&from, &to).await?;
            reply(u, op, &meta(m)).await
        }
        other => Err(Error::internal(format!("{} is not a store call", other.name())).into()),
    }
}

/// Where the bytes of a `store_write` wait for the store.
enum Spool {
    Memory(BytesMut),
    /// An unnamed file of the temporary directory (gone when closed).
    File(std::fs::File),
}

/// An unnamed file in the temporary directory, readable and writable by this user only.
fn unnamed_file() -> std::io::Result<std::fs::File> {
    let dir = std::env::temp_dir();
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE)
        .open(&dir)
        .or_else(|_| {
            // No O_TMPFILE here: a named file, unlinked at once.
            let path = dir.join(format!(
                ".silt-store-write-{}-{:x}",
                std::process::id(),
                rand::random::<u64>()
            ));
            let f = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)?;
            std::fs::remove_file(&path)?;
            Ok(f)
        })
}

/// The `size` bytes of a `store_write`, read to their `End` whatever happens (so the
/// connection stays usable); a failure to keep them is the call's error.
async fn receive(
    u: &mut UnixStream,
    path: &str,
    size: u64,
) -> std::result::Result<Spool, ServeError> {
    let spool = if size <= MEMORY_SPOOL {
        Ok(Spool::Memory(BytesMut::with_capacity(size as usize)))
    } else {
        unnamed_file()
            .map(Spool::File)
            .map_err(|e| Error::from(e).context("a file for the bytes of a store write"))
    };
    let mut spool = match spool {
        Ok(spool) => spool,
        Err(e) => {
            // No place for them: read past the bytes, then say why.
            skip_bytes(u).await?;
            return Err(e.into());
        }
    };
    receive_bytes(u, path, size, |at, p| match &mut spool {
        Spool::Memory(b) => {
            b.extend_from_slice(p);
            Ok(())
        }
        Spool::File(f) => f.write_all_at(p, at).map_err(Error::from),
    })
    .await?;
    Ok(spool)
}

/// Reads past the bytes of a `store_write` that is refused, to their `End`.
pub(super) async fn skip_bytes<S: AsyncRead + Unpin>(
    s: &mut S,
) -> std::result::Result<(), ServeError> {
    loop {
        match read_frame(s).await.map_err(broken)? {
            Some((FrameKind::Data, _)) => {}
            Some((FrameKind::End, _)) => return Ok(()),
            _ => {
                return Err(broken(Error::invalid(
                    "the bytes of a store write ended early",
                )))
            }
        }
    }
}

impl WorkerClient {
    /// Bytes `range` (at most [`MAX_RANGE`]) of the version `expected` of `path` in the
    /// worker's store `store`, clamped to its size.
    pub async fn store_read(
        &self,
        store: &str,
        path: &str,
        expected: &ObjectMeta,
        range: std::ops::Range<u64>,
    ) -> std::result::Result<Bytes, CallError> {
        let req = Request::StoreRead {
            store: store.to_string(),
            path: path.to_string(),
            expected: expected.clone(),
            offset: range.start,
            len: range.end.saturating_sub(range.start),
        };
        let asked = range.end.saturating_sub(range.start);
        self.ask_bytes(&req, asked, false, "bytes of a store read")
            .await
    }

    /// Writes the first `len` bytes of `src` as the object `path` of the worker's store
    /// `store` (`UnderStore::write_from_attrs`); the new version's metadata. A failure to
    /// read `src` here is returned as final (`CallError::Worker`).
    pub async fn store_write(
        &self,
        store: &str,
        path: &str,
        src: &dyn ReadAt,
        len: u64,
        attrs: &SetAttrs,
        headers: Option<&Headers>,
    ) -> std::result::Result<ObjectMeta, CallError> {
        let req = Request::StoreWrite {
            store: store.to_string(),
            path: path.to_string(),
            size: len,
            attrs: *attrs,
            headers: headers.cloned(),
        };
        self.with_conn(|mut c| {
            let req = &req;
            async move {
                write_json(&mut c, &req.envelope()).await?;
                send_bytes(&mut c, src, len).await?;
                let answer::StoreMeta { meta } = expect_answer(&mut c, "store_write").await?;
                expect_end(&mut c).await?;
                self.put_back(c);
                Ok(meta)
            }
        })
        .await
    }
}
