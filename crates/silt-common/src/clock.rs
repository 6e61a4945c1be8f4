//! The time source of metadata ages. Production uses the monotonic clock; tests use a manual
//! clock they advance, so sync policies are tested without sleeping.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Clone, Default)]
pub struct Clock {
    manual: Option<Arc<Manual>>,
}

struct Manual {
    base: Instant,
    offset_ns: AtomicU64,
}

impl Clock {
    /// The monotonic clock.
    pub fn system() -> Self {
        Clock { manual: None }
    }

    /// A clock that moves only when `advance` is called.
    pub fn manual() -> Self {
        Clock {
            manual: Some(Arc::new(Manual {
                base: Instant::now(),
                offset_ns: AtomicU64::new(0),
            })),
        }
    }

    pub fn now(&self) -> Instant {
        match &self.manual {
            None => Instant::now(),
            Some(m) => m.base + Duration::from_nanos(m.offset_ns.load(Ordering::SeqCst)),
        }
    }

    /// Moves a manual clock forward; does nothing to the system clock.
    pub fn advance(&self, d: Duration) {
        if let Some(m) = &self.manual {
            let ns = u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
            m.offset_ns.fetch_add(ns, Ordering::SeqCst);
        }
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.manual.is_some() {
            "Clock(manual)"
        } else {
            "Clock(system)"
        })
    }
}
