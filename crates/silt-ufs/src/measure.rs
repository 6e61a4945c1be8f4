//! The layer every opened store is measured through: request times by kind under its mount's
//! name, failed calls counted, and a store that stopped answering failing fast ([`Stall`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::future::BoxFuture;
use silt_common::metrics::{Histogram, UfsOp, UFS_ERRORS, UFS_REQUEST_SECONDS};
use silt_common::{Error, ErrorKind, Result};

use crate::layer::{Layer, Layered};
use crate::DynStore;

/// A store that stopped answering: once a request ran out of its deadline (retries
/// included) with no other request answered since it began, requests fail at once with
/// `Timeout` for one deadline (the kernel retries a failed read at once, and each retry would
/// wait a whole deadline again); then one request at a time probes it, the others still
/// failing fast, and the first answer of any kind ends the stall.
#[derive(Default)]
pub(crate) struct Stall {
    state: parking_lot::Mutex<StallState>,
}

#[derive(Default)]
struct StallState {
    since: Option<Instant>,
    probing: bool,
    last_answer: Option<Instant>,
}

enum Admit {
    Go,
    Probe,
    FailFast(Instant),
}

impl Stall {
    fn admit(&self, quiet: Duration) -> Admit {
        let mut st = self.state.lock();
        match st.since {
            None => Admit::Go,
            Some(t) if t.elapsed() < quiet || st.probing => Admit::FailFast(t),
            Some(_) => {
                st.probing = true;
                Admit::Probe
            }
        }
    }

    /// Records how a request that began at `began` ended.
    fn record(&self, began: Instant, timed_out: bool, probe: bool) {
        let mut st = self.state.lock();
        if probe {
            st.probing = false;
        }
        let now = Instant::now();
        if !timed_out {
            st.since = None;
            st.last_answer = Some(now);
        } else if probe || st.last_answer.is_none_or(|a| a < began) {
            // Nothing answered while it waited: the store, not this request, is stuck.
            st.since = Some(now);
        }
    }
}

/// What [`Measured`] keeps of a store: its stall state and its request times.
pub struct Measure {
    inner: DynStore,
    stall: Stall,
    /// How long a stalled store fails at once before one request probes it again: the
    /// store's own deadline.
    quiet: Duration,
    /// Request times by [`UfsOp`], under the store's mount name.
    seconds: Arc<[Histogram]>,
}

/// A store measured: every call timed, as an `op` request of its mount
/// (`silt_ufs_request_seconds`, retries included), every failed call counted
/// (`silt_ufs_errors_total`; the store counts the requests it sends), and once a call ran out
/// of its deadline with nothing else answered since it began, calls fail at once with
/// `Timeout` (see [`Stall`]).
pub type Measured = Layered<Measure>;

/// `store` measured under `mount` (the namespace path it serves, or its URI), a stall lasting
/// `timeout` (the store's request deadline) before it is probed again.
pub fn measured(store: DynStore, mount: &str, timeout: Duration) -> Measured {
    Layered::from_layer(Measure {
        inner: store,
        stall: Stall::default(),
        quiet: timeout,
        seconds: UFS_REQUEST_SECONDS.register(mount),
    })
}

#[async_trait]
impl Layer for Measure {
    fn inner(&self) -> &DynStore {
        &self.inner
    }

    async fn around<'a, T: Send + 'a>(
        &'a self,
        op: UfsOp,
        _path: &'a str,
        call: BoxFuture<'a, Result<T>>,
    ) -> Result<T> {
        let probe = match self.stall.admit(self.quiet) {
            Admit::Go => false,
            Admit::Probe => true,
            Admit::FailFast(since) => {
                UFS_ERRORS.inc();
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "{} has not answered for {:?} (a request ran out of its deadline); \
                         failing at once until it answers again",
                        self.inner.uri(),
                        since.elapsed()
                    ),
                ));
            }
        };
        let began = Instant::now();
        let r = call.await;
        self.seconds[op as usize].since(began);
        let timed_out = matches!(&r, Err(e) if e.kind() == ErrorKind::Timeout);
        self.stall.record(began, timed_out, probe);
        if r.is_err() {
            UFS_ERRORS.inc();
        }
        r
    }
}
