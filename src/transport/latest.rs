//! The keep-latest hand-over between the thread that receives frames and the one that
//! processes them: one slot; a frame that arrives while the previous one still waits
//! replaces it, and the replaced one is counted as dropped. Memory stays bounded
//! whatever the input rate, and the frame processed next is always the newest.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Duration;

/// How often a waiting [`Latest::take`] checks for a stop that raced its wait.
const WAKE_PERIOD: Duration = Duration::from_millis(100);

/// A one-item slot holding the newest `T`, with the counts of what went through it.
///
/// Every item `put` is counted in `received`; it then ends as taken, or in `dropped`
/// (replaced by a newer one, or still waiting at [`Latest::stop`]). The counters are
/// shared (`Arc`) so that the owner's statistics can read them where they live.
pub struct Latest<T> {
    slot: Mutex<Option<T>>,
    ready: Condvar,
    shutdown: AtomicBool,
    received: Arc<AtomicU64>,
    dropped: Arc<AtomicU64>,
}

impl<T> Default for Latest<T> {
    fn default() -> Self {
        Latest::with_counters(Arc::default(), Arc::default())
    }
}

impl<T> Latest<T> {
    /// An empty slot counting into `received` and `dropped`.
    pub fn with_counters(received: Arc<AtomicU64>, dropped: Arc<AtomicU64>) -> Self {
        Latest {
            slot: Mutex::new(None),
            ready: Condvar::new(),
            shutdown: AtomicBool::new(false),
            received,
            dropped,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<T>> {
        self.slot.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Hand over `item`; one still waiting is replaced (and dropped after the lock is
    /// released, so a large item's destructor does not hold up the taker). Returns true
    /// when one was replaced. After [`Latest::stop`] the item is counted and dropped.
    pub fn put(&self, item: T) -> bool {
        self.received.fetch_add(1, Ordering::Relaxed);
        if self.is_stopped() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        let replaced = self.lock().replace(item);
        self.ready.notify_one();
        let was = replaced.is_some();
        if was {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        drop(replaced);
        was
    }

    /// [`Latest::put`], handing back the item it replaced (counted as dropped) so that
    /// the caller can account for what it held; after [`Latest::stop`], `item` itself.
    pub fn replace(&self, item: T) -> Option<T> {
        self.received.fetch_add(1, Ordering::Relaxed);
        if self.is_stopped() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return Some(item);
        }
        let replaced = self.lock().replace(item);
        self.ready.notify_one();
        if replaced.is_some() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        replaced
    }

    /// [`Latest::stop`], handing back the item still waiting (counted as dropped).
    pub fn stop_and_take(&self) -> Option<T> {
        self.shutdown.store(true, Ordering::Release);
        let waiting = self.lock().take();
        if waiting.is_some() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
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

    /// Stop: [`Latest::take`] returns `None` from now on (an item being processed
    /// finishes); an item still waiting is counted as dropped.
    pub fn stop(&self) {
        self.shutdown.store(true, Ordering::Release);
        let waiting = self.lock().take();
        if waiting.is_some() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        self.ready.notify_all();
        drop(waiting);
    }

    /// True once [`Latest::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        self.shutdown.load(Ordering::Acquire)
    }

    /// Items put so far.
    pub fn received(&self) -> u64 {
        self.received.load(Ordering::Relaxed)
    }

    /// Items replaced or discarded at stop so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Instant;

    /// An item that counts its drops, to check nothing leaks or is dropped twice.
    struct Tracked(u32, Arc<AtomicUsize>);
    impl Drop for Tracked {
        fn drop(&mut self) {
            self.1.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn a_newer_item_replaces_the_waiting_one_and_is_counted() {
        let drops = Arc::new(AtomicUsize::new(0));
        let slot = Latest::default();
        assert!(!slot.put(Tracked(1, drops.clone())));
        assert!(slot.put(Tracked(2, drops.clone())));
        assert!(slot.put(Tracked(3, drops.clone())));
        // Items 1 and 2 were replaced (and freed); 3 is the one taken.
        assert_eq!(drops.load(Ordering::Relaxed), 2);
        assert_eq!(slot.take().map(|t| t.0), Some(3));
        assert_eq!((slot.received(), slot.dropped()), (3, 2));
        assert!(!slot.put(Tracked(4, drops.clone())));
        assert_eq!(slot.take().map(|t| t.0), Some(4));
        assert_eq!((slot.received(), slot.dropped()), (4, 2));
        assert_eq!(drops.load(Ordering::Relaxed), 4);
    }

    #[test]
    fn replace_hands_back_what_it_replaced() {
        let slot = Latest::default();
        assert_eq!(slot.replace(1u8), None);
        assert_eq!(slot.replace(2u8), Some(1));
        assert_eq!(slot.stop_and_take(), Some(2));
        assert_eq!(slot.replace(3u8), Some(3));
        assert_eq!((slot.received(), slot.dropped(), slot.take()), (3, 3, None));
    }

    #[test]
    fn counters_are_the_owners() {
        let (received, dropped) = (Arc::new(AtomicU64::new(10)), Arc::new(AtomicU64::new(5)));
        let slot = Latest::with_counters(received.clone(), dropped.clone());
        slot.put(1u8);
        slot.put(2u8);
        assert_eq!((received.load(Ordering::Relaxed), dropped.load(Ordering::Relaxed)), (12, 6));
    }

    #[test]
    fn stop_discards_the_waiting_item_and_wakes_the_taker() {
        let slot = Arc::new(Latest::<u32>::default());
        let taker = {
            let slot = slot.clone();
            std::thread::spawn(move || {
                let first = slot.take();
                let t = Instant::now();
                (first, slot.take(), t.elapsed())
            })
        };
        slot.put(7);
        // Wait until the taker has the first item, then leave one waiting and stop.
        let deadline = Instant::now() + Duration::from_secs(5);
        while slot.lock().is_some() {
            assert!(Instant::now() < deadline, "the taker never took the first item");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(20));
        slot.stop();
        let (first, second, waited) = taker.join().unwrap();
        assert_eq!((first, second), (Some(7), None));
        assert!(waited < Duration::from_secs(2), "stop did not wake the taker: {waited:?}");
        // Put after stop: counted as received and dropped, never handed out.
        slot.put(8);
        assert_eq!(slot.take(), None);
        assert_eq!((slot.received(), slot.dropped()), (2, 1));

        let slot = Latest::<u32>::default();
        slot.put(9);
        slot.stop();
        assert_eq!((slot.received(), slot.dropped(), slot.take()), (1, 1, None));
    }
}
