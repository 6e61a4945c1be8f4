//! etcd membership (leases for liveness, watches for changes) — see [`EtcdMembership`].
//!
//! Silt talks to etcd (3.4 or later) through etcd's JSON gRPC gateway (`POST /v3/kv/range`,
//! `/v3/kv/put`, `/v3/kv/txn`, `/v3/lease/*`, `/v3/watch`), so no gRPC stack has to be built.
//! Keys and values travel base64-encoded, 64-bit integers as decimal strings.
//!
//! Layout under the cluster's prefix (`/<cluster>/`, `/silt/` by default):
//!
//! | key | value |
//! |---|---|
//! | `/<cluster>/members/<id>` | JSON of [`Member`], attached to the member's lease |
//! | `/<cluster>/mounts` | the mount table (plain string), written once |
//!
//! Only plain `http://` endpoints are supported: etcd runs on loopback or on a private network
//! (a veth address of a network namespace in the tests). TLS and authentication are not
//! implemented.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde::de::{DeserializeOwned, Error as _};
use serde::{Deserialize, Deserializer};
use serde_json::{json, Value};
use silt_common::{Error, ErrorKind, Result};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;

use crate::membership::{Member, Membership, Registration, View};

/// Deadline of every unary request (range, put, txn, lease grant/revoke).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Deadline of a TCP connect to one endpoint (the next endpoint is tried after it).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// TCP keepalive on every connection, so that a watch stream to a host that vanished (no FIN,
/// no RST) breaks after about idle + interval × retries and is reconnected.
const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(10);
const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);
const TCP_KEEPALIVE_RETRIES: u32 = 3;
/// Reconnect backoff of the watch task.
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A watch stream that buffers more than this without a complete message is broken.
const MAX_MESSAGE: usize = 64 << 20;

/// Membership kept in etcd: each worker holds a lease (TTL `member_ttl`) and keeps its member
/// key alive with it; every process watches the members prefix and publishes a new [`View`]
/// after each change, with etcd's revision of that change as the view's revision.
///
/// A worker that shuts down cleanly revokes its lease (its key vanishes at once); one that
/// dies disappears when its lease expires. A worker whose lease expired while it was cut off
/// from etcd grants a new lease and puts its key again as soon as it reaches etcd.
pub struct EtcdMembership {
    inner: Arc<Inner>,
    watch_task: JoinHandle<()>,
}

struct Inner {
    client: EtcdClient,
    /// `/<cluster>/`.
    prefix: String,
    /// `/<cluster>/members/`.
    members_prefix: String,
    member_ttl: Duration,
    tx: watch::Sender<Arc<View>>,
    /// Set by [`EtcdMembership::abandon_registrations_for_tests`].
    abandon: watch::Sender<bool>,
}

impl EtcdMembership {
    /// Connects to the first of `endpoints` (`http://host:port`, or `host:port`) that answers,
    /// lists the members of cluster `cluster` (the key prefix, `silt` by default) and starts
    /// watching them. Must be called inside a tokio runtime.
    ///
    /// Fails with [`ErrorKind::Unavailable`] (or [`ErrorKind::Timeout`]) naming the endpoints
    /// when none answers, and with [`ErrorKind::InvalidInput`] for a malformed argument.
    pub async fn connect(
        endpoints: &[String],
        cluster: &str,
        member_ttl: Duration,
    ) -> Result<Arc<EtcdMembership>> {
        let client = EtcdClient::new(endpoints)?;
        let cluster = cluster.trim_matches('/');
        if cluster.is_empty() {
            return Err(Error::invalid("etcd membership: empty cluster name"));
        }
        let prefix = format!("/{cluster}/");
        let members_prefix = format!("{prefix}members/");
        let (members, revision) = list_members(&client, &members_prefix).await?;
        let (tx, _) = watch::channel(Arc::new(View::new(
            members.values().cloned().collect(),
            revision,
        )));
        let (abandon, _) = watch::channel(false);
        let inner = Arc::new(Inner {
            client,
            prefix,
            members_prefix,
            member_ttl,
            tx,
            abandon,
        });
        let watch_task = tokio::spawn(watch_loop(inner.clone(), members, revision));
        Ok(Arc::new(EtcdMembership { inner, watch_task }))
    }

    /// Test support: simulates a crash of every process registered through this membership
    /// (including any registered later).
    /// Their keepalive tasks stop without revoking their leases (dropping the registrations
    /// afterwards revokes nothing either), so their members disappear once the leases expire.
    #[doc(hidden)]
    pub fn abandon_registrations_for_tests(&self) {
        self.inner.abandon.send_replace(true);
    }

    /// The lease TTL in whole seconds (at least 1; etcd may raise it to its minimum TTL).
    fn ttl_secs(&self) -> i64 {
        let ms = self.inner.member_ttl.as_millis();
        (ms.div_ceil(1000).clamp(1, i64::MAX as u128)) as i64
    }
}

impl Drop for EtcdMembership {
    fn drop(&mut self) {
        self.watch_task.abort();
    }
}

impl fmt::Debug for EtcdMembership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

#[async_trait]
impl Membership for EtcdMembership {
    fn view(&self) -> Arc<View> {
        self.inner.tx.borrow().clone()
    }

    fn subscribe(&self) -> watch::Receiver<Arc<View>> {
        self.inner.tx.subscribe()
    }

    /// Grants a lease of `member_ttl`, puts `/<cluster>/members/<id>` with it and keeps the
    /// lease alive (a keepalive every third of the TTL) until the registration drops, which
    /// revokes the lease. Registering an id again overwrites its key.
    async fn register(&self, me: Member) -> Result<Registration> {
        if me.id.is_empty() || me.id.contains('/') {
            return Err(Error::invalid(format!(
                "member id {:?}: must be non-empty and contain no '/'",
                me.id
            )));
        }
        let key = format!("{}{}", self.inner.members_prefix, me.id);
        let value = serde_json::to_vec(&me)
            .map_err(|e| Error::internal(format!("encoding member {}: {e}", me.id)))?;
        let ttl = self.ttl_secs();
        let lease = grant_and_put(&self.inner.client, &key, &value, ttl).await?;
        tracing::info!(member = %me.id, lease, ttl, "registered in etcd");
        let (stop_tx, stop_rx) = oneshot::channel();
        let abandon = self.inner.abandon.subscribe();
        let task = tokio::spawn(keepalive_loop(
            self.inner.clone(),
            key,
            value,
            ttl,
            lease,
            stop_rx,
            abandon,
        ));
        Ok(Registration::with_leave(
            RegistrationGuard {
                stop: Some(stop_tx),
            },
            async move {
                let _ = task.await;
            },
        ))
    }

    async fn publish_mounts(&self, table: &str) -> Result<String> {
        let key = self.mounts_key();
        let key64 = B64.encode(&key);
        let body = json!({
            "compare": [{
                "key": key64,
                "target": "CREATE",
                "result": "EQUAL",
                "create_revision": "0",
            }],
            "success": [{"request_put": {"key": key64, "value": B64.encode(table)}}],
            "failure": [{"request_range": {"key": key64}}],
        });
        let resp: TxnResponse = self
            .inner
            .client
            .unary("/v3/kv/txn", &body, REQUEST_TIMEOUT)
            .await
            .map_err(|e| e.context(format!("publishing the mount table at {key}")))?;
        if resp.succeeded {
            return Ok(table.to_string());
        }
        let kv = resp
            .responses
            .into_iter()
            .filter_map(|r| r.response_range)
            .flat_map(|r| r.kvs)
            .next()
            .ok_or_else(|| {
                Error::internal(format!(
                    "etcd: {key} exists but its read in the same transaction returned nothing"
                ))
            })?;
        utf8_value(&key, &kv.value)
    }

    async fn mounts(&self) -> Result<Option<String>> {
        let key = self.mounts_key();
        let body = json!({ "key": B64.encode(&key) });
        let resp: RangeResponse = self
            .inner
            .client
            .unary("/v3/kv/range", &body, REQUEST_TIMEOUT)
            .await
            .map_err(|e| e.context(format!("reading the mount table at {key}")))?;
        match resp.kvs.into_iter().next() {
            Some(kv) => utf8_value(&key, &kv.value).map(Some),
            None => Ok(None),
        }
    }

    fn describe(&self) -> String {
        format!(
            "etcd {} (prefix {})",
            self.inner.client.endpoints.join(","),
            self.inner.prefix
        )
    }
}

impl EtcdMembership {
    fn mounts_key(&self) -> String {
        format!("{}mounts", self.inner.prefix)
    }
}

fn utf8_value(key: &str, value64: &str) -> Result<String> {
    let bytes = decode64(value64).map_err(|e| e.context(format!("value of {key}")))?;
    String::from_utf8(bytes)
        .map_err(|_| Error::new(ErrorKind::Corrupted, format!("etcd: {key} is not UTF-8")))
}

/// Stops the keepalive task when dropped; the task then revokes the lease.
struct RegistrationGuard {
    stop: Option<oneshot::Sender<()>>,
}

impl Drop for RegistrationGuard {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Background tasks

/// Watches the members prefix from `revision + 1` and publishes a view after every change.
/// When the stream breaks (etcd restarted, connection lost, history compacted) it lists the
/// members again, with backoff, and watches from the listed revision. It never publishes a
/// revision older than the one published.
async fn watch_loop(inner: Arc<Inner>, mut members: BTreeMap<String, Member>, mut revision: u64) {
    let mut backoff = BACKOFF_MIN;
    loop {
        match watch_once(&inner, &mut members, &mut revision).await {
            Ok(()) => tracing::debug!("etcd watch stream ended; reconnecting"),
            Err(e) => tracing::warn!("etcd watch on {}: {e}; reconnecting", inner.members_prefix),
        }
        // Re-list: what changed while the stream was down comes back as one view.
        loop {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(BACKOFF_MAX);
            match list_members(&inner.client, &inner.members_prefix).await {
                Ok((listed, rev)) if rev >= revision => {
                    members = listed;
                    revision = rev;
                    publish(&inner.tx, &members, revision);
                    break;
                }
                Ok((_, rev)) => tracing::warn!(
                    "etcd answered at revision {rev}, older than {revision} already seen; retrying"
                ),
                Err(e) => tracing::warn!("listing etcd members: {e}"),
            }
        }
        // A successful re-list is a reconnect; fast retries again after the next break.
        backoff = BACKOFF_MIN;
    }
}

/// Runs one watch stream until it breaks; applies and publishes each batch of events.
async fn watch_once(
    inner: &Inner,
    members: &mut BTreeMap<String, Member>,
    revision: &mut u64,
) -> Result<()> {
    let prefix = &inner.members_prefix;
    let body = json!({
        "create_request": {
            "key": B64.encode(prefix),
            "range_end": B64.encode(prefix_end(prefix.as_bytes())),
            "start_revision": (*revision + 1).to_string(),
        }
    });
    let (endpoint, mut resp) = inner.client.open_stream("/v3/watch", &body).await?;
    let mut buf: Vec<u8> = Vec::new();
    let mut created = false;
    loop {
        let chunk = match resp.chunk().await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => return Ok(()),
            Err(e) => return Err(http_error(&endpoint, e)),
        };
        buf.extend_from_slice(&chunk);
        let (messages, used) = split_messages::<StreamMessage<WatchResponse>>(&buf)
            .map_err(|e| e.context(format!("etcd {endpoint} watch stream")))?;
        buf.drain(..used);
        if buf.len() > MAX_MESSAGE {
            return Err(Error::new(
                ErrorKind::Unavailable,
                format!("etcd {endpoint}: watch message larger than {MAX_MESSAGE} bytes"),
            ));
        }
        for msg in messages {
            let wr = msg.into_result(&endpoint)?;
            if wr.canceled {
                let why = if wr.compact_revision > 0 {
                    format!("history compacted up to revision {}", wr.compact_revision)
                } else {
                    wr.cancel_reason.clone()
                };
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("etcd {endpoint} canceled the watch: {why}"),
                ));
            }
            if wr.created && !created {
                created = true;
                tracing::debug!("etcd watch on {prefix} from revision {}", *revision + 1);
            }
            if wr.events.is_empty() {
                continue;
            }
            let mut last = *revision;
            for ev in &wr.events {
                let rev = u64::try_from(ev.kv.mod_revision).unwrap_or(0);
                if rev <= *revision {
                    // Already part of the state (cannot happen with start_revision; harmless).
                    continue;
                }
                last = last.max(rev);
                let Some(id) = member_id(prefix, &ev.kv.key) else {
                    continue;
                };
                if ev.kind == "DELETE" {
                    members.remove(&id);
                } else if let Some(m) = decode_member(&id, &ev.kv.value) {
                    members.insert(id, m);
                } else {
                    members.remove(&id);
                }
            }
            if last > *revision {
                *revision = last;
                publish(&inner.tx, members, last);
            }
        }
    }
}

/// Publishes `members` at `revision` if that is newer than the published view and the members
/// differ from it.
fn publish(tx: &watch::Sender<Arc<View>>, members: &BTreeMap<String, Member>, revision: u64) {
    let list: Vec<Member> = members.values().cloned().collect();
    tx.send_if_modified(|cur| {
        if revision <= cur.revision || cur.members == list {
            return false;
        }
        *cur = Arc::new(View::new(list, revision));
        true
    });
}

/// Keeps `lease` alive every third of its TTL; re-grants and re-puts the key when etcd says
/// the lease is gone. On `stop` it revokes the lease; on `abandon` it just ends.
async fn keepalive_loop(
    inner: Arc<Inner>,
    key: String,
    value: Vec<u8>,
    ttl: i64,
    lease: i64,
    mut stop: oneshot::Receiver<()>,
    mut abandon: watch::Receiver<bool>,
) {
    let lease = AtomicI64::new(lease);
    let ttl_dur = Duration::from_secs(ttl.unsigned_abs());
    let interval = ttl_dur / 3;
    // A keepalive must not outlive the lease it renews, and a failed one is retried soon
    // (not a whole interval later), so one slow answer from etcd does not lose the lease.
    let timeout = (ttl_dur / 4).clamp(Duration::from_millis(500), REQUEST_TIMEOUT);
    let retry = (interval / 4).max(Duration::from_millis(200));
    let work = async {
        let mut lost = false;
        let mut wait = interval;
        loop {
            tokio::time::sleep(wait).await;
            wait = interval;
            if lost {
                match grant_and_put(&inner.client, &key, &value, ttl).await {
                    Ok(id) => {
                        lease.store(id, Ordering::Relaxed);
                        lost = false;
                        tracing::info!(
                            key,
                            lease = id,
                            "re-registered in etcd after losing the lease"
                        );
                    }
                    Err(e) => {
                        tracing::warn!(key, "re-registering in etcd: {e}");
                        wait = retry;
                    }
                }
                continue;
            }
            let id = lease.load(Ordering::Relaxed);
            match keepalive(&inner.client, id, timeout).await {
                Ok(left) if left > 0 => {}
                Ok(_) => {
                    tracing::warn!(key, lease = id, "etcd lease expired; registering again");
                    lost = true;
                }
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    tracing::warn!(key, lease = id, "etcd lease gone ({e}); registering again");
                    lost = true;
                }
                Err(e) => {
                    tracing::warn!(key, lease = id, "etcd keepalive: {e}");
                    wait = retry;
                }
            }
        }
    };
    let revoke_at_end = tokio::select! {
        _ = work => false,
        _ = &mut stop => true,
        _ = abandon.wait_for(|a| *a) => false,
    };
    if revoke_at_end {
        let id = lease.load(Ordering::Relaxed);
        let body = json!({ "ID": id.to_string() });
        match inner
            .client
            .unary::<Value>("/v3/lease/revoke", &body, REQUEST_TIMEOUT)
            .await
        {
            Ok(_) => tracing::info!(key, lease = id, "deregistered from etcd"),
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => tracing::warn!(key, lease = id, "revoking etcd lease: {e}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Requests

async fn list_members(
    client: &EtcdClient,
    prefix: &str,
) -> Result<(BTreeMap<String, Member>, u64)> {
    let body = json!({
        "key": B64.encode(prefix),
        "range_end": B64.encode(prefix_end(prefix.as_bytes())),
    });
    let resp: RangeResponse = client
        .unary("/v3/kv/range", &body, REQUEST_TIMEOUT)
        .await
        .map_err(|e| e.context(format!("listing {prefix}")))?;
    let mut members = BTreeMap::new();
    for kv in resp.kvs {
        if let Some(id) = member_id(prefix, &kv.key) {
            if let Some(m) = decode_member(&id, &kv.value) {
                members.insert(id, m);
            }
        }
    }
    let revision = u64::try_from(resp.header.revision).unwrap_or(0);
    Ok((members, revision))
}

/// Grants a lease of `ttl` seconds and puts `key` = `value` with it; returns the lease id.
async fn grant_and_put(client: &EtcdClient, key: &str, value: &[u8], ttl: i64) -> Result<i64> {
    let grant: LeaseGrantResponse = client
        .unary(
            "/v3/lease/grant",
            &json!({ "TTL": ttl.to_string() }),
            REQUEST_TIMEOUT,
        )
        .await
        .map_err(|e| e.context("granting an etcd lease"))?;
    if !grant.error.is_empty() || grant.id == 0 {
        return Err(Error::new(
            ErrorKind::Unavailable,
            format!("etcd refused a lease: {:?}", grant.error),
        ));
    }
    let put = json!({
        "key": B64.encode(key),
        "value": B64.encode(value),
        "lease": grant.id.to_string(),
    });
    if let Err(e) = client
        .unary::<Value>("/v3/kv/put", &put, REQUEST_TIMEOUT)
        .await
    {
        // The lease would expire anyway; revoking it just cleans up sooner.
        let _ = client
            .unary::<Value>(
                "/v3/lease/revoke",
                &json!({ "ID": grant.id.to_string() }),
                REQUEST_TIMEOUT,
            )
            .await;
        return Err(e.context(format!("putting {key}")));
    }
    Ok(grant.id)
}

/// One keepalive; returns the TTL left (0 when the lease no longer exists).
async fn keepalive(client: &EtcdClient, lease: i64, timeout: Duration) -> Result<i64> {
    let body = json!({ "ID": lease.to_string() });
    // A streaming RPC in the gateway: one request line in, one response line out.
    let (endpoint, bytes) = client
        .request_bytes("/v3/lease/keepalive", &body, timeout)
        .await?;
    let (messages, _) = split_messages::<StreamMessage<LeaseKeepAliveResponse>>(&bytes)
        .map_err(|e| e.context(format!("etcd {endpoint} keepalive")))?;
    let msg = messages.into_iter().next().ok_or_else(|| {
        Error::new(
            ErrorKind::Unavailable,
            format!("etcd {endpoint}: empty keepalive response"),
        )
    })?;
    Ok(msg.into_result(&endpoint)?.ttl)
}

/// The key right after every key starting with `prefix` (etcd's `range_end` for a prefix).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // All 0xff (or empty): to the end of the keyspace.
    vec![0]
}

/// The member id of base64 `key64` under `prefix`, or `None` (with a warning) if it is not one.
fn member_id(prefix: &str, key64: &str) -> Option<String> {
    let key = decode64(key64).ok()?;
    let key = String::from_utf8(key).ok()?;
    let id = key.strip_prefix(prefix)?;
    if id.is_empty() || id.contains('/') {
        tracing::warn!("ignoring etcd key {key:?} under {prefix}: not a member key");
        return None;
    }
    Some(id.to_string())
}

fn decode_member(id: &str, value64: &str) -> Option<Member> {
    let member = decode64(value64)
        .and_then(|v| {
            serde_json::from_slice::<Member>(&v)
                .map_err(|e| Error::new(ErrorKind::Corrupted, e.to_string()))
        })
        .map_err(|e| tracing::warn!("ignoring member {id} in etcd: {e}"))
        .ok()?;
    if member.id != id {
        tracing::warn!(
            "ignoring member key {id} in etcd: its value names {:?}",
            member.id
        );
        return None;
    }
    Some(member)
}

fn decode64(s: &str) -> Result<Vec<u8>> {
    B64.decode(s).map_err(|e| {
        Error::new(
            ErrorKind::Corrupted,
            format!("etcd sent invalid base64: {e}"),
        )
    })
}

// ---------------------------------------------------------------------------------------------
// HTTP client over the JSON gateway

struct EtcdClient {
    http: reqwest::Client,
    /// Normalized `http://host:port`.
    endpoints: Vec<String>,
    /// Index of the endpoint that answered last; requests start there.
    current: AtomicUsize,
}

impl EtcdClient {
    fn new(endpoints: &[String]) -> Result<EtcdClient> {
        if endpoints.is_empty() {
            return Err(Error::invalid("etcd membership: no endpoints given"));
        }
        let endpoints = endpoints
            .iter()
            .map(|e| normalize_endpoint(e))
            .collect::<Result<Vec<_>>>()?;
        let http = reqwest::Client::builder()
            // etcd is on a private network: never route it through a proxy from the environment.
            .no_proxy()
            .connect_timeout(CONNECT_TIMEOUT)
            .tcp_nodelay(true)
            .tcp_keepalive(TCP_KEEPALIVE_IDLE)
            .tcp_keepalive_interval(TCP_KEEPALIVE_INTERVAL)
            .tcp_keepalive_retries(TCP_KEEPALIVE_RETRIES)
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| Error::internal(format!("building the etcd HTTP client: {e}")))?;
        Ok(EtcdClient {
            http,
            endpoints,
            current: AtomicUsize::new(0),
        })
    }

    /// Sends `body` to `path`, trying each endpoint once (from the last one that answered)
    /// while the failure is retryable. Returns the endpoint and the response (status 2xx).
    async fn send(
        &self,
        path: &str,
        body: &Value,
        timeout: Option<Duration>,
    ) -> Result<(String, reqwest::Response)> {
        let body = serde_json::to_vec(body)
            .map_err(|e| Error::internal(format!("encoding an etcd request: {e}")))?;
        let n = self.endpoints.len();
        let start = self.current.load(Ordering::Relaxed) % n;
        let mut errors = Vec::new();
        for i in 0..n {
            let idx = (start + i) % n;
            let endpoint = &self.endpoints[idx];
            let mut req = self
                .http
                .post(format!("{endpoint}{path}"))
                .header("content-type", "application/json")
                .body(body.clone());
            if let Some(t) = timeout {
                req = req.timeout(t);
            }
            let result: Result<()> = match req.send().await {
                Ok(resp) if resp.status().is_success() => {
                    self.current.store(idx, Ordering::Relaxed);
                    return Ok((endpoint.clone(), resp));
                }
                Ok(resp) => Err(status_error(endpoint, resp).await),
                Err(e) => Err(http_error(endpoint, e)),
            };
            if let Err(e) = result {
                if !e.is_retryable() {
                    return Err(e);
                }
                errors.push(e);
            }
        }
        // Every endpoint failed with a retryable error: report them all, keeping the kind of
        // the last one.
        let kind = errors.last().map_or(ErrorKind::Unavailable, |e| e.kind());
        let all = errors
            .iter()
            .map(|e| e.to_string())
            .collect::<Vec<_>>()
            .join("; ");
        Err(Error::new(kind, format!("cannot reach etcd: {all}")))
    }

    /// A unary request: the whole response body, decoded.
    async fn unary<T: DeserializeOwned>(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<T> {
        let (endpoint, bytes) = self.request_bytes(path, body, timeout).await?;
        serde_json::from_slice(&bytes).map_err(|e| {
            Error::new(
                ErrorKind::Unavailable,
                format!("etcd {endpoint}{path}: unexpected response: {e}"),
            )
        })
    }

    /// The whole response body of a request with a deadline for all of it.
    async fn request_bytes(
        &self,
        path: &str,
        body: &Value,
        timeout: Duration,
    ) -> Result<(String, bytes::Bytes)> {
        let (endpoint, resp) = self.send(path, body, Some(timeout)).await?;
        let bytes = resp.bytes().await.map_err(|e| http_error(&endpoint, e))?;
        Ok((endpoint, bytes))
    }

    /// A streaming request (watch): no overall deadline, only the connect timeout and TCP
    /// keepalive.
    async fn open_stream(&self, path: &str, body: &Value) -> Result<(String, reqwest::Response)> {
        self.send(path, body, None).await
    }
}

fn normalize_endpoint(e: &str) -> Result<String> {
    let e = e.trim().trim_end_matches('/');
    if e.starts_with("https://") {
        return Err(Error::new(
            ErrorKind::Unsupported,
            format!("etcd endpoint {e}: TLS is not supported, use http://"),
        ));
    }
    let e = if e.starts_with("http://") {
        e.to_string()
    } else if e.contains("://") {
        return Err(Error::invalid(format!(
            "etcd endpoint {e}: only http:// is supported"
        )));
    } else {
        format!("http://{e}")
    };
    if e.len() <= "http://".len() {
        return Err(Error::invalid("etcd endpoint: empty address"));
    }
    Ok(e)
}

/// Maps a transport error to Silt's model, naming the endpoint and the underlying cause.
fn http_error(endpoint: &str, e: reqwest::Error) -> Error {
    let kind = if e.is_timeout() {
        ErrorKind::Timeout
    } else if e.is_builder() {
        ErrorKind::InvalidInput
    } else {
        ErrorKind::Unavailable
    };
    let mut msg = format!("etcd {endpoint}: {e}");
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        msg.push_str(": ");
        msg.push_str(&s.to_string());
        source = s.source();
    }
    Error::new(kind, msg).with_source(e)
}

/// An error answer of the gateway: `{"error": "...", "message": "...", "code": <grpc code>}`.
async fn status_error(endpoint: &str, resp: reqwest::Response) -> Error {
    let status = resp.status();
    let body = resp.bytes().await.unwrap_or_default();
    #[derive(Deserialize, Default)]
    #[serde(default)]
    struct GatewayError {
        message: String,
        code: i64,
    }
    let parsed = serde_json::from_slice::<GatewayError>(&body).ok();
    match parsed {
        Some(g) if !g.message.is_empty() => Error::new(
            grpc_kind(g.code),
            format!("etcd {endpoint}: {} (HTTP {status})", g.message),
        ),
        _ => {
            let kind = if status.is_server_error() {
                ErrorKind::Unavailable
            } else {
                ErrorKind::Internal
            };
            let text = String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned();
            Error::new(kind, format!("etcd {endpoint}: HTTP {status}: {text}"))
        }
    }
}

/// gRPC status code → kind.
fn grpc_kind(code: i64) -> ErrorKind {
    match code {
        3 | 11 => ErrorKind::InvalidInput, // INVALID_ARGUMENT, OUT_OF_RANGE
        4 => ErrorKind::Timeout,           // DEADLINE_EXCEEDED
        5 => ErrorKind::NotFound,          // NOT_FOUND (e.g. lease not found)
        6 => ErrorKind::AlreadyExists,     // ALREADY_EXISTS
        7 | 16 => ErrorKind::PermissionDenied, // PERMISSION_DENIED, UNAUTHENTICATED
        8 => ErrorKind::RateLimited,       // RESOURCE_EXHAUSTED (too many requests)
        12 => ErrorKind::Unsupported,      // UNIMPLEMENTED
        1 | 10 | 14 => ErrorKind::Unavailable, // CANCELED, ABORTED, UNAVAILABLE (no leader, …)
        _ => ErrorKind::Internal,
    }
}

/// Splits `buf` into the complete JSON messages it starts with; returns them and the number of
/// bytes they used (a partial message at the end stays in the buffer).
fn split_messages<T: DeserializeOwned>(buf: &[u8]) -> Result<(Vec<T>, usize)> {
    let mut out = Vec::new();
    let mut stream = serde_json::Deserializer::from_slice(buf).into_iter::<T>();
    let mut used = 0;
    loop {
        match stream.next() {
            Some(Ok(msg)) => {
                out.push(msg);
                used = stream.byte_offset();
            }
            Some(Err(e)) if e.is_eof() => break,
            Some(Err(e)) => {
                return Err(Error::new(
                    ErrorKind::Unavailable,
                    format!("malformed message: {e}"),
                ))
            }
            None => {
                used = buf.len();
                break;
            }
        }
    }
    Ok((out, used))
}

// ---------------------------------------------------------------------------------------------
// Gateway messages (only the fields Silt reads; int64 fields arrive as strings)

fn de_i64<'de, D: Deserializer<'de>>(d: D) -> std::result::Result<i64, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Num {
        S(String),
        I(i64),
    }
    match Num::deserialize(d)? {
        Num::S(s) => s.parse().map_err(D::Error::custom),
        Num::I(i) => Ok(i),
    }
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct Header {
    #[serde(deserialize_with = "de_i64")]
    revision: i64,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct KeyValue {
    key: String,
    value: String,
    #[serde(deserialize_with = "de_i64")]
    mod_revision: i64,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct RangeResponse {
    header: Header,
    kvs: Vec<KeyValue>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct TxnResponse {
    succeeded: bool,
    responses: Vec<ResponseOp>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct ResponseOp {
    response_range: Option<RangeResponse>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct LeaseGrantResponse {
    #[serde(rename = "ID", deserialize_with = "de_i64")]
    id: i64,
    #[serde(rename = "error")]
    error: String,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct LeaseKeepAliveResponse {
    #[serde(rename = "TTL", deserialize_with = "de_i64")]
    ttl: i64,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct WatchResponse {
    created: bool,
    canceled: bool,
    #[serde(deserialize_with = "de_i64")]
    compact_revision: i64,
    cancel_reason: String,
    events: Vec<Event>,
}

#[derive(Deserialize, Default, Debug)]
#[serde(default)]
struct Event {
    /// `PUT` (omitted: the default) or `DELETE`.
    #[serde(rename = "type")]
    kind: String,
    kv: KeyValue,
}

/// One message of a streaming response: `{"result": …}` or `{"error": {…}}`.
#[derive(Deserialize, Debug)]
struct StreamMessage<T> {
    result: Option<T>,
    error: Option<Value>,
}

impl<T> StreamMessage<T> {
    fn into_result(self, endpoint: &str) -> Result<T> {
        if let Some(err) = self.error {
            let code = err
                .get("grpc_code")
                .or_else(|| err.get("code"))
                .and_then(Value::as_i64)
                .unwrap_or(14);
            let message = err
                .get("message")
                .and_then(Value::as_str)
                .map(str::to_string)
                .unwrap_or_else(|| err.to_string());
            return Err(Error::new(
                grpc_kind(code),
                format!("etcd {endpoint}: {message}"),
            ));
        }
        self.result.ok_or_else(|| {
            Error::new(
                ErrorKind::Unavailable,
                format!("etcd {endpoint}: stream message without result or error"),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_end_increments_the_last_byte() {
        assert_eq!(prefix_end(b"/silt/members/"), b"/silt/members0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn endpoints_are_normalized() {
        assert_eq!(
            normalize_endpoint("127.0.0.1:2379").unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(normalize_endpoint("http://h:1/").unwrap(), "http://h:1");
        assert_eq!(
            normalize_endpoint("https://h:1").unwrap_err().kind(),
            ErrorKind::Unsupported
        );
        assert_eq!(
            normalize_endpoint("unix://x").unwrap_err().kind(),
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn stream_messages_split_at_object_boundaries() {
        let a = br#"{"result":{"header":{"revision":"3"},"created":true}}
{"result":{"events":[{"kv":{"key":"YQ==","mod_revision":"4","value":"dg=="}},{"type":"DELETE","kv":{"key":"YQ==","mod_revision":"5"}}]}}
{"result":{"eve"#;
        let (msgs, used) = split_messages::<StreamMessage<WatchResponse>>(a).unwrap();
        assert_eq!(msgs.len(), 2);
        assert_eq!(
            &a[used..],
            br#"
{"result":{"eve"#
        );
        let mut it = msgs.into_iter();
        assert!(it.next().unwrap().into_result("e").unwrap().created);
        let w = it.next().unwrap().into_result("e").unwrap();
        assert_eq!(w.events[0].kind, "");
        assert_eq!(w.events[0].kv.mod_revision, 4);
        assert_eq!(w.events[1].kind, "DELETE");
        let err = br#"{"error":{"grpc_code":14,"http_code":503,"message":"no leader"}}"#;
        let (msgs, _) = split_messages::<StreamMessage<WatchResponse>>(err).unwrap();
        let e = msgs
            .into_iter()
            .next()
            .unwrap()
            .into_result("e")
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(split_messages::<StreamMessage<WatchResponse>>(b"{]").is_err());
    }

    #[test]
    fn keepalive_of_an_expired_lease_reads_as_ttl_zero() {
        let line = br#"{"result":{"header":{"revision":"3"},"ID":"2324035534042773514"}}"#;
        let (msgs, _) = split_messages::<StreamMessage<LeaseKeepAliveResponse>>(line).unwrap();
        assert_eq!(
            msgs.into_iter()
                .next()
                .unwrap()
                .into_result("e")
                .unwrap()
                .ttl,
            0
        );
    }

    #[test]
    fn members_decode_only_under_their_own_key() {
        let m = Member {
            id: "w1".into(),
            addr: "10.0.0.1:7000".into(),
            host: "h".into(),
            uds: None,
            capacity: 1,
        };
        let v = B64.encode(serde_json::to_vec(&m).unwrap());
        assert_eq!(decode_member("w1", &v), Some(m));
        assert_eq!(decode_member("w2", &v), None);
        assert_eq!(decode_member("w1", "!!"), None);
        let k = B64.encode("/silt/members/w1");
        assert_eq!(member_id("/silt/members/", &k).as_deref(), Some("w1"));
        assert_eq!(member_id("/other/", &k), None);
    }
}
