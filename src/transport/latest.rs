//! The keep-latest hand-over between the thread that forms frame sets and the one that
//! processes them: one slot; a set that arrives while the previous one still waits
//! replaces it, and the replaced one is handed back to the caller, who counts its frames
//! as dropped. Memory stays bounded whatever the input rate, and the set processed next
//! is always the newest.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How often a waiting [`Latest::take`] checks for a stop that raced its wait.
const WAKE_PERIOD: Duration = Duration::from_millis(100);

/// A one-item slot holding the newest `T`. Every item given to it ends as taken, or is
/// handed back: replaced by a newer one, still waiting at `Latest::stop_and_take`, or
/// given after the stop.
pub struct Latest<T> {
    slot: Mutex<Option<T>>,
    ready: Condvar,
    shutdown: AtomicBool,
}

impl<T> Default for Latest<T> {
    fn default() -> Self {
        Latest { slot: Mutex::new(None), ready: Condvar::new(), shutdown: AtomicBool::new(false) }
    }
}

impl<T> Latest<T> {
    fn lock(&self) -> MutexGuard<'_, Option<T>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hand over `item`, handing back the one it replaced; after `Latest::stop_and_take`,
    /// `item` itself.
    pub fn replace(&self, item: T) -> Option<T> {
        if self.is_stopped() {
            return Some(item);
        }
        let replaced = self.lock().replace(item);
        self.ready.notify_one();
        replaced
    }

    /// Stop: [`Latest::take`] returns `None` from now on (an item being processed
    /// finishes); hands back the item still waiting.
    pub(crate) fn stop_and_take(&self) -> Option<T> {
        self.shutdown.store(true, Ordering::Release);
        let waiting = self.lock().take();
        self.ready.notify_all();
        waiting
    }

    /// The next item, waiting for one; `None` once stopped.
    pub fn take(&self) -> Option<T> {
        let mut slot = self.lock();
        loop {
            if self.is_stopped() {
                return None;
            }
            if let Some(item) = slot.take() {
                return Some(item);
            }
            slot = self.ready.wait_timeout(slot, WAKE_PERIOD).unwrap_or_else(|p| p.into_inner()).0;
        }
    }

    /// The item waiting now, without waiting for one; `None` when there is none or once
    /// stopped.
    pub(crate) fn try_take(&self) -> Option<T> {
        if self.is_stopped() {
            return None;
        }
        self.lock().take()
    }

    /// True once [`Latest::stop_and_take`] was called.
    pub(crate) fn is_stopped(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn a_newer_item_replaces_the_waiting_one_which_is_handed_back() {
        let slot = Latest::default();
        assert_eq!(slot.replace(1u8), None);
        assert_eq!(slot.replace(2u8), Some(1));
        assert_eq!(slot.replace(3u8), Some(2));
        assert_eq!(slot.take(), Some(3));
        assert_eq!(slot.try_take(), None, "nothing waits");
        assert_eq!(slot.replace(4u8), None);
        assert_eq!(slot.try_take(), Some(4));
        assert_eq!(slot.replace(4u8), None);
        assert_eq!(slot.stop_and_take(), Some(4));
        assert_eq!(slot.replace(5u8), Some(5), "after the stop the item comes back");
        assert_eq!(slot.take(), None);
    }

    #[test]
    fn stop_wakes_the_taker() {
        let slot = Arc::new(Latest::<u32>::default());
        let taker = {
            let slot = slot.clone();
            std::thread::spawn(move || {
                let first = slot.take();
                let t = Instant::now();
                (first, slot.take(), t.elapsed())
            })
        };
        slot.replace(7);
        // Wait until the taker has the first item, then leave one waiting and stop.
        let deadline = Instant::now() + Duration::from_secs(5);
        while slot.lock().is_some() {
            assert!(Instant::now() < deadline, "the taker never took the first item");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(slot.stop_and_take(), None);
        let (first, second, waited) = taker.join().unwrap();
        assert_eq!((first, second), (Some(7), None));
        assert!(waited < Duration::from_secs(2), "stop did not wake the taker: {waited:?}");
    }
}
