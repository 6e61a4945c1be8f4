//! The loads a daemon ran lately (`silt load`), with their progress, for the web page.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use parking_lot::Mutex;

/// How many loads the page remembers (the oldest finished one is forgotten first).
const KEPT: usize = 16;

/// The recent loads of one process.
#[derive(Default)]
pub struct Loads {
    recent: Mutex<VecDeque<Arc<Load>>>,
}

impl Loads {
    /// Records a load of `paths` starting now.
    pub fn start(&self, paths: &[String]) -> Arc<Load> {
        let load = Arc::new(Load {
            paths: paths.to_vec(),
            started: SystemTime::now(),
            began: Instant::now(),
            state: Mutex::new(LoadState::default()),
        });
        let mut recent = self.recent.lock();
        if recent.len() >= KEPT {
            // Forget the oldest finished load; running ones stay however many there are.
            if let Some(i) = recent.iter().position(|l| l.state.lock().outcome.is_some()) {
                recent.remove(i);
            }
        }
        recent.push_back(load.clone());
        load
    }

    /// The loads remembered, oldest first.
    pub fn list(&self) -> Vec<Arc<Load>> {
        self.recent.lock().iter().cloned().collect()
    }
}

/// One load and where it stands.
pub struct Load {
    pub paths: Vec<String>,
    pub started: SystemTime,
    began: Instant,
    state: Mutex<LoadState>,
}

/// Progress of a load as the client reports it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadState {
    pub files_total: u64,
    pub bytes_total: u64,
    /// Bytes fetched by this load.
    pub bytes_done: u64,
    /// Bytes that were cached already (skipped).
    pub bytes_cached: u64,
    /// `None` while it runs; then `Ok` or the error it ended with.
    pub outcome: Option<Result<(), String>>,
    /// Seconds it ran, once it ended.
    pub seconds: Option<f64>,
}

impl Load {
    pub fn progress(&self, files_total: u64, bytes_total: u64, bytes_done: u64, bytes_cached: u64) {
        let mut st = self.state.lock();
        st.files_total = files_total;
        st.bytes_total = bytes_total;
        st.bytes_done = bytes_done;
        st.bytes_cached = bytes_cached;
    }

    pub fn finish(&self, outcome: Result<(), String>) {
        let mut st = self.state.lock();
        st.outcome = Some(outcome);
        st.seconds = Some(self.began.elapsed().as_secs_f64());
    }

    pub fn state(&self) -> LoadState {
        self.state.lock().clone()
    }

    /// Seconds since it started (while it runs) or that it ran.
    pub fn seconds(&self) -> f64 {
        self.state
            .lock()
            .seconds
            .unwrap_or_else(|| self.began.elapsed().as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_latest_and_every_running_load() {
        let loads = Loads::default();
        let first = loads.start(&["/running".into()]);
        for i in 0..KEPT + 4 {
            let l = loads.start(&[format!("/done/{i}")]);
            l.progress(1, 10, 10, 0);
            l.finish(Ok(()));
        }
        let list = loads.list();
        assert_eq!(list.len(), KEPT);
        assert!(Arc::ptr_eq(&list[0], &first), "the running load stays");
        assert_eq!(list[KEPT - 1].paths, vec![format!("/done/{}", KEPT + 3)]);
        assert_eq!(first.state().outcome, None);
        first.finish(Err("no such file".into()));
        assert_eq!(first.state().outcome, Some(Err("no such file".into())));
    }
}
