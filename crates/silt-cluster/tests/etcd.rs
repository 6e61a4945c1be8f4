//! `EtcdMembership` against a real etcd (`silt_testkit::Etcd`, the Debian `etcd-server`).
//!
//! Every wait is on `subscribe()` under a generous timeout that only guards against hangs;
//! nothing here synchronizes by sleeping.

use std::future::Future;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use silt_cluster::{EtcdMembership, Member, Membership, View};
use silt_common::ErrorKind;
use silt_testkit::Etcd;

/// Only guards against hangs: every wait below normally ends within a few seconds.
const GUARD: Duration = Duration::from_secs(30);
/// Long enough that a member disappearing within `GUARD` must have been revoked.
const LONG_TTL: Duration = Duration::from_secs(60);
/// etcd's minimum lease TTL with its default election timeout is 2 s; asking for 1 s gets that.
const SHORT_TTL: Duration = Duration::from_secs(1);

fn member(id: &str, addr: &str) -> Member {
    Member {
        id: id.into(),
        addr: addr.into(),
        host: "test-host".into(),
        uds: Some(format!("/run/silt/{id}.sock")),
        capacity: 1 << 30,
    }
}

fn ids(view: &View) -> Vec<&str> {
    view.members.iter().map(|m| m.id.as_str()).collect()
}

async fn connect(etcd: &Etcd, cluster: &str, ttl: Duration) -> Arc<EtcdMembership> {
    EtcdMembership::connect(&[etcd.endpoint()], cluster, ttl)
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}\n{}", etcd.endpoint(), etcd.log()))
}

async fn guarded<T>(what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(GUARD, fut)
        .await
        .unwrap_or_else(|_| panic!("timed out after {GUARD:?} waiting for {what}"))
}

/// Waits until `m`'s view satisfies `pred` and returns that view.
async fn wait_view(
    m: &EtcdMembership,
    what: &str,
    pred: impl FnMut(&Arc<View>) -> bool,
) -> Arc<View> {
    let mut rx = m.subscribe();
    let result = tokio::time::timeout(GUARD, rx.wait_for(pred)).await;
    match result {
        Ok(Ok(view)) => view.clone(),
        Ok(Err(_)) => panic!("view channel closed while waiting for {what}"),
        Err(_) => panic!(
            "timed out after {GUARD:?} waiting for {what}; view is {:?}",
            m.view()
        ),
    }
}

#[tokio::test]
async fn members_appear_in_every_view_and_leave_at_once_when_deregistered() {
    let etcd = Etcd::start();
    let a = connect(&etcd, "silt", LONG_TTL).await;
    let b = connect(&etcd, "silt", LONG_TTL).await;
    let observer = connect(&etcd, "silt", LONG_TTL).await;
    assert!(observer.view().members.is_empty());
    let first_revision = observer.view().revision;
    assert!(observer.describe().contains(&etcd.endpoint()));
    assert!(observer.describe().contains("/silt/"));

    let w2 = member("w2", "10.0.0.2:7000");
    let w1 = member("w1", "10.0.0.1:7000");
    let reg2 = guarded("register w2", b.register(w2.clone()))
        .await
        .unwrap();
    let reg1 = guarded("register w1", a.register(w1.clone()))
        .await
        .unwrap();

    let view = wait_view(&observer, "w1 and w2", |v| v.members.len() == 2).await;
    assert_eq!(view.members, vec![w1.clone(), w2.clone()], "sorted by id");
    assert!(view.revision > first_revision);
    wait_view(&a, "w1 and w2 in a's view", |v| v.members.len() == 2).await;

    // A clean shutdown revokes the lease: gone long before the 60 s TTL could expire.
    let mut rx = observer.subscribe();
    let before = rx.borrow_and_update().revision;
    drop(reg1);
    let view = wait_view(&observer, "w1 to leave", |v| v.get("w1").is_none()).await;
    assert_eq!(view.members, vec![w2.clone()]);
    assert!(view.revision > before);
    wait_view(&b, "w1 to leave b's view", |v| ids(v) == ["w2"]).await;
    drop(reg2);
    wait_view(&observer, "an empty view", |v| v.members.is_empty()).await;
}

#[tokio::test]
async fn views_never_go_back_in_revision() {
    let etcd = Etcd::start();
    let m = connect(&etcd, "silt", LONG_TTL).await;
    let observer = connect(&etcd, "silt", LONG_TTL).await;
    let mut rx = observer.subscribe();
    let mut last = rx.borrow_and_update().revision;
    let mut regs = Vec::new();
    for i in 0..5 {
        regs.push(m.register(member(&format!("w{i}"), "h:1")).await.unwrap());
    }
    regs.truncate(2);
    // Every view seen has a larger revision than the one before, until the final state.
    guarded("five registrations and three deregistrations", async {
        loop {
            rx.changed().await.unwrap();
            let view = rx.borrow_and_update().clone();
            assert!(view.revision > last, "{} after {last}", view.revision);
            last = view.revision;
            if ids(&view) == ["w0", "w1"] {
                break;
            }
        }
    })
    .await;
}

#[tokio::test]
async fn a_crashed_member_disappears_when_its_lease_expires() {
    let etcd = Etcd::start();
    let crashing = connect(&etcd, "silt", SHORT_TTL).await;
    let living = connect(&etcd, "silt", SHORT_TTL).await;
    let observer = connect(&etcd, "silt", LONG_TTL).await;
    let _crash_reg = crashing.register(member("crash", "h:1")).await.unwrap();
    let _live_reg = living.register(member("live", "h:2")).await.unwrap();
    wait_view(&observer, "both members", |v| v.members.len() == 2).await;

    // No keepalives and no revoke from now on, as if the process had been SIGKILLed.
    crashing.abandon_registrations_for_tests();
    let view = wait_view(&observer, "the crashed member to expire", |v| {
        v.get("crash").is_none()
    })
    .await;
    // The other member, with the same TTL, lived through at least one TTL on keepalives.
    assert_eq!(ids(&view), ["live"]);
}

#[tokio::test]
async fn a_member_that_registers_again_after_expiry_keeps_its_id() {
    let etcd = Etcd::start();
    let observer = connect(&etcd, "silt", LONG_TTL).await;
    {
        let first_life = connect(&etcd, "silt", SHORT_TTL).await;
        let reg = first_life
            .register(member("w7", "10.0.0.7:7000"))
            .await
            .unwrap();
        wait_view(&observer, "w7", |v| v.get("w7").is_some()).await;
        first_life.abandon_registrations_for_tests();
        drop(reg);
        wait_view(&observer, "w7 to expire", |v| v.get("w7").is_none()).await;
    }
    // The restarted worker keeps its id (from its state dir), maybe on a new port.
    let second_life = connect(&etcd, "silt", SHORT_TTL).await;
    let again = member("w7", "10.0.0.7:7001");
    let _reg = second_life.register(again.clone()).await.unwrap();
    let view = wait_view(&observer, "w7 back", |v| v.get("w7").is_some()).await;
    assert_eq!(view.members, vec![again]);
}

#[tokio::test]
async fn a_member_whose_lease_was_lost_registers_again() {
    let etcd = Etcd::start();
    let worker = connect(&etcd, "silt", Duration::from_secs(3)).await;
    let observer = connect(&etcd, "silt", LONG_TTL).await;
    let _reg = worker.register(member("w1", "h:1")).await.unwrap();
    wait_view(&observer, "w1", |v| v.get("w1").is_some()).await;

    // What a worker cut off from etcd for longer than its TTL finds when it comes back: its
    // lease is gone (here revoked behind its back) and its key with it.
    let (revoked, deleted_at) = revoke_all_leases(&etcd.endpoint()).await;
    assert_eq!(revoked, 1);
    // Its next keepalive learns the lease is gone; it grants a new one and puts its key again.
    // (A view after the deletion that lists w1 can only come from that new put.)
    let view = wait_view(&observer, "w1 to come back", |v| {
        v.revision > deleted_at && v.get("w1").is_some()
    })
    .await;
    assert_eq!(ids(&view), ["w1"]);
}

#[tokio::test]
async fn the_first_published_mount_table_wins() {
    let etcd = Etcd::start();
    let a = connect(&etcd, "silt", LONG_TTL).await;
    let b = connect(&etcd, "silt", LONG_TTL).await;
    assert_eq!(a.mounts().await.unwrap(), None);
    assert_eq!(a.publish_mounts("/=s3://a").await.unwrap(), "/=s3://a");
    assert_eq!(b.publish_mounts("/=s3://b").await.unwrap(), "/=s3://a");
    assert_eq!(b.mounts().await.unwrap().as_deref(), Some("/=s3://a"));

    // Racing publishers (another cluster prefix, same etcd) all end up with one table.
    let c = connect(&etcd, "other", LONG_TTL).await;
    let d = connect(&etcd, "other", LONG_TTL).await;
    let (x, y) = tokio::join!(
        c.publish_mounts("/=file:///x"),
        d.publish_mounts("/=file:///y")
    );
    let (x, y) = (x.unwrap(), y.unwrap());
    assert_eq!(x, y);
    assert_eq!(c.mounts().await.unwrap(), Some(x));
    // Clusters do not see each other's tables or members.
    assert_eq!(a.mounts().await.unwrap().as_deref(), Some("/=s3://a"));
    let _o1 = c.register(member("o1", "h:1")).await.unwrap();
    wait_view(&d, "o1 in its own cluster", |v| v.get("o1").is_some()).await;
    // A member of `a`'s cluster registered after o1: the watch delivers changes in revision
    // order, so once `a` sees s1 it has seen every change before it, o1 included had it leaked.
    let _s1 = b.register(member("s1", "h:2")).await.unwrap();
    let view = wait_view(&a, "s1 in a's view", |v| v.get("s1").is_some()).await;
    assert_eq!(
        ids(&view),
        ["s1"],
        "o1 of the other cluster leaked into a's view"
    );
}

#[tokio::test]
async fn connecting_where_nothing_listens_fails_quickly_as_unavailable() {
    // A port that was free a moment ago: connection refused.
    let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let dead = format!("http://127.0.0.1:{port}");
    let err = guarded(
        "connect to a dead endpoint to fail",
        EtcdMembership::connect(std::slice::from_ref(&dead), "silt", LONG_TTL),
    )
    .await
    .expect_err("nothing listens there");
    assert_eq!(err.kind(), ErrorKind::Unavailable, "{err}");
    assert!(err.is_retryable());
    assert!(err.to_string().contains(&dead), "{err}");

    // With a live endpoint after the dead one, it connects (endpoints are tried in order).
    let etcd = Etcd::start();
    let m = guarded(
        "connect with one dead endpoint",
        EtcdMembership::connect(&[dead, etcd.endpoint()], "silt", LONG_TTL),
    )
    .await
    .unwrap();
    assert_eq!(m.mounts().await.unwrap(), None);

    // Malformed arguments are not network errors.
    let err = EtcdMembership::connect(&[], "silt", LONG_TTL)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidInput);
    let err = EtcdMembership::connect(&["https://127.0.0.1:1".into()], "silt", LONG_TTL)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Unsupported);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_watch_reconnects_after_etcd_restarts() {
    let mut etcd = Etcd::start();
    let observer = connect(&etcd, "silt", LONG_TTL).await;
    let worker = connect(&etcd, "silt", Duration::from_secs(5)).await;
    let _reg1 = worker.register(member("w1", "h:1")).await.unwrap();
    wait_view(&observer, "w1", |v| v.get("w1").is_some()).await;

    // A crash and restart of etcd breaks every watch stream and connection.
    tokio::task::block_in_place(|| etcd.restart());

    // A change made after the restart reaches the old observer through its new watch.
    let late = connect(&etcd, "silt", LONG_TTL).await;
    let _reg2 = late.register(member("w2", "h:2")).await.unwrap();
    let view = wait_view(&observer, "w2 after the restart", |v| v.get("w2").is_some()).await;
    // w1's lease survived the restart (etcd keeps leases) and its keepalives resumed.
    assert_eq!(ids(&view), ["w1", "w2"]);
}

/// Revokes every lease in etcd (raw JSON gateway calls); returns how many, and etcd's revision
/// after the last revoke.
async fn revoke_all_leases(endpoint: &str) -> (usize, u64) {
    let http = reqwest::Client::builder().no_proxy().build().unwrap();
    let call = |path: &str, body: String| {
        let req = http.post(format!("{endpoint}{path}")).body(body);
        async move {
            let resp = req.send().await.unwrap();
            assert!(resp.status().is_success(), "{}", resp.status());
            serde_json::from_slice::<serde_json::Value>(&resp.bytes().await.unwrap()).unwrap()
        }
    };
    let leases = call("/v3/lease/leases", "{}".into()).await;
    let ids: Vec<String> = leases["leases"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|l| l["ID"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default();
    let mut revision = 0;
    for id in &ids {
        let resp = call(
            "/v3/lease/revoke",
            serde_json::json!({ "ID": id }).to_string(),
        )
        .await;
        revision = resp["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .expect("revoke answers with a revision");
    }
    (ids.len(), revision)
}
