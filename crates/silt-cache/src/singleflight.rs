//! Async single-flight: concurrent callers for the same key share one execution.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;

use parking_lot::Mutex;
use tokio::sync::watch;

struct Call<V> {
    /// Tells a finishing leader whether the map entry is still its own.
    id: u64,
    rx: watch::Receiver<Option<V>>,
}

/// Runs at most one future per key at a time; callers that arrive while one runs wait for
/// its result instead of starting their own.
///
/// If the leader's future is dropped (its task cancelled) or panics, its sender is dropped
/// without a value: waiters see the channel close and retry, so one of them becomes the new
/// leader and runs its own closure. Nobody hangs.
pub struct SingleFlight<K, V> {
    calls: Mutex<State<K, V>>,
}

struct State<K, V> {
    next_id: u64,
    calls: HashMap<K, Call<V>>,
}

impl<K, V> Default for SingleFlight<K, V> {
    fn default() -> Self {
        SingleFlight {
            calls: Mutex::new(State {
                next_id: 0,
                calls: HashMap::new(),
            }),
        }
    }
}

impl<K, V> SingleFlight<K, V> {
    pub fn new() -> Self {
        Self::default()
    }
}

/// Removes the leader's map entry however the leader ends (value, cancel or panic).
struct Leader<'a, K: Eq + Hash, V> {
    flight: &'a SingleFlight<K, V>,
    key: &'a K,
    id: u64,
    tx: Option<watch::Sender<Option<V>>>,
}

impl<K: Eq + Hash, V> Leader<'_, K, V> {
    fn unregister(&self) {
        let mut st = self.flight.calls.lock();
        if st.calls.get(self.key).is_some_and(|c| c.id == self.id) {
            st.calls.remove(self.key);
        }
    }

    fn finish(mut self, v: V) {
        // Unregister first so that callers arriving from now on start a fresh call rather
        // than read a result that may already be outdated.
        self.unregister();
        if let Some(tx) = self.tx.take() {
            tx.send_replace(Some(v));
        }
    }
}

impl<K: Eq + Hash, V> Drop for Leader<'_, K, V> {
    fn drop(&mut self) {
        if self.tx.is_some() {
            // Cancelled or panicked: dropping `tx` wakes the waiters, who retry.
            self.unregister();
        }
    }
}

impl<K, V> SingleFlight<K, V>
where
    K: Eq + Hash + Clone,
    V: Clone,
{
    /// Runs `f` for `key` unless a call for `key` is already running, in which case waits for
    /// and returns that call's value. Returns `(value, joined)`: `joined` is true when the
    /// value came from another caller's execution.
    pub async fn run<F, Fut>(&self, key: K, f: F) -> (V, bool)
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = V>,
    {
        let (id, tx) = loop {
            let mut rx = {
                let mut st = self.calls.lock();
                match st.calls.get(&key) {
                    Some(call) => call.rx.clone(),
                    None => {
                        let id = st.next_id;
                        st.next_id = st.next_id.wrapping_add(1);
                        let (tx, rx) = watch::channel(None);
                        st.calls.insert(key.clone(), Call { id, rx });
                        break (id, tx);
                    }
                }
            };
            let joined = match rx.wait_for(Option::is_some).await {
                Ok(v) => v.as_ref().cloned(),
                // The leader went away without a value: try again (maybe as leader).
                Err(_) => None,
            };
            if let Some(v) = joined {
                return (v, true);
            }
        };
        let leader = Leader {
            flight: self,
            key: &key,
            id,
            tx: Some(tx),
        };
        let v = f().await;
        leader.finish(v.clone());
        (v, false)
    }

    /// Number of keys with a call in flight.
    pub fn in_flight(&self) -> usize {
        self.calls.lock().calls.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn fifty_concurrent_callers_run_once() {
        let sf = Arc::new(SingleFlight::<u32, u64>::new());
        let count = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Notify::new());
        let entered = Arc::new(AtomicUsize::new(0));
        let mut tasks = Vec::new();
        for _ in 0..50 {
            let (sf, count, gate, entered) =
                (sf.clone(), count.clone(), gate.clone(), entered.clone());
            tasks.push(tokio::spawn(async move {
                entered.fetch_add(1, Ordering::SeqCst);
                sf.run(7, || async move {
                    count.fetch_add(1, Ordering::SeqCst);
                    // Hold the flight open until every caller has joined.
                    gate.notified().await;
                    42u64
                })
                .await
            }));
        }
        while entered.load(Ordering::SeqCst) < 50 {
            tokio::task::yield_now().await;
        }
        // Every caller is inside `run`; give the last ones time to park on the leader.
        tokio::time::sleep(Duration::from_millis(200)).await;
        gate.notify_one();
        let mut leaders = 0;
        for t in tasks {
            let (v, joined) = t.await.unwrap();
            assert_eq!(v, 42);
            if !joined {
                leaders += 1;
            }
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(leaders, 1);
        assert_eq!(sf.in_flight(), 0);
    }

    #[tokio::test]
    async fn sequential_calls_each_run() {
        let sf = SingleFlight::<&str, u32>::new();
        assert_eq!(sf.run("a", || async { 1 }).await, (1, false));
        assert_eq!(sf.run("a", || async { 2 }).await, (2, false));
        assert_eq!(sf.run("b", || async { 3 }).await, (3, false));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cancelled_leader_does_not_hang_waiters() {
        let sf = Arc::new(SingleFlight::<u32, u32>::new());
        let started = Arc::new(tokio::sync::Notify::new());
        let leader = {
            let (sf, started) = (sf.clone(), started.clone());
            tokio::spawn(async move {
                sf.run(1, || async move {
                    started.notify_one();
                    std::future::pending::<u32>().await
                })
                .await
            })
        };
        started.notified().await;
        let runs = Arc::new(AtomicUsize::new(0));
        let mut waiters = Vec::new();
        for _ in 0..10 {
            let (sf, runs) = (sf.clone(), runs.clone());
            waiters.push(tokio::spawn(async move {
                sf.run(1, || async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    5
                })
                .await
            }));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(runs.load(Ordering::SeqCst), 0, "waiters joined the leader");
        leader.abort();
        let results = tokio::time::timeout(Duration::from_secs(10), async {
            let mut out = Vec::new();
            for w in waiters {
                out.push(w.await.unwrap());
            }
            out
        })
        .await
        .expect("waiters hung after the leader was cancelled");
        assert!(results.iter().all(|&(v, _)| v == 5));
        let new_leaders = results.iter().filter(|r| !r.1).count();
        assert!(new_leaders >= 1);
        assert_eq!(new_leaders, runs.load(Ordering::SeqCst));
        assert_eq!(sf.in_flight(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn panicking_leader_does_not_hang_waiters() {
        let sf = Arc::new(SingleFlight::<u32, u32>::new());
        let started = Arc::new(tokio::sync::Notify::new());
        let release = Arc::new(tokio::sync::Notify::new());
        let leader = {
            let (sf, started, release) = (sf.clone(), started.clone(), release.clone());
            tokio::spawn(async move {
                sf.run(1, || async move {
                    started.notify_one();
                    release.notified().await;
                    panic!("leader fails");
                })
                .await
            })
        };
        started.notified().await;
        let waiter = {
            let sf = sf.clone();
            tokio::spawn(async move { sf.run(1, || async { 9 }).await })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        release.notify_one();
        assert!(leader.await.is_err());
        let r = tokio::time::timeout(Duration::from_secs(10), waiter)
            .await
            .expect("waiter hung after the leader panicked")
            .unwrap();
        assert_eq!(r, (9, false));
    }
}
