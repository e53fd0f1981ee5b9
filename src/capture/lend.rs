//! The memory of a frame lent to the backend: a mapped buffer's one block of GStreamer's
//! system memory, which a GPU backend may register and read in place ([`Lent`]), and the
//! identity kept on the memory itself ([`LentMemory`], as the memory's qdata) whose destroy
//! notify says when GStreamer freed the block. Anything else (a sub-memory, a device's
//! mapping such as V4L2's or a DMA-buf) is not lent: the backend copies it once.

use std::sync::{Arc, OnceLock};

use gstreamer as gst;
use gstreamer::glib::translate::IntoGlib;

use crate::image::{Lent, LentMemory, LentReads};

/// A mapped buffer's memory lent to the backend ([`Lent`]): one block of GStreamer's
/// system memory (not a sub-memory of another, not a device's mapping such as V4L2's or a
/// DMA-buf), whose identity is kept on the memory itself ([`lent_memory`]). `None` for
/// anything else: the backend then copies the frame once, as it copies a topic's.
pub(super) fn lend(
    mapped: &gst::MappedBuffer<gst::buffer::Readable>,
    reads: &Arc<LentReads>,
) -> Option<Lent> {
    let buffer = mapped.buffer();
    if buffer.n_memory() != 1 {
        return None;
    }
    let memory = buffer.peek_memory(0);
    let sysmem =
        std::str::from_utf8(gst::ffi::GST_ALLOCATOR_SYSMEM).ok().map(|t| t.trim_end_matches('\0'));
    if memory.parent().is_some() || !sysmem.is_some_and(|t| memory.is_type(t)) {
        return None;
    }
    // The mapping of the buffer's one memory starts `offset` bytes into its block of
    // `maxsize` bytes (system memory maps its block in place).
    let base = mapped.as_slice().as_ptr().wrapping_sub(memory.offset());
    let identity = lent_memory(memory);
    // SAFETY: system memory's block of `maxsize` bytes at `base` stays allocated until the
    // memory is finalized, which first calls `lent_memory`'s destroy notify (it says
    // freed); the frame keeps the buffer mapped (readable: nobody writes it) for as long
    // as it lives, and the pipeline keeps a set's frames until the set is finished.
    Some(unsafe { Lent::new(base, memory.maxsize(), identity, reads.clone()) })
}

/// The quark under which a memory keeps its [`LentMemory`].
fn lent_quark() -> gst::glib::ffi::GQuark {
    static QUARK: OnceLock<gst::glib::ffi::GQuark> = OnceLock::new();
    *QUARK.get_or_init(|| gst::glib::Quark::from_str("vision-preproc-lent-memory").into_glib())
}

/// The identity of `memory` as a [`LentMemory`]: kept as the memory's qdata, made the
/// first time a frame lies in it; the qdata's destroy notify (called when the memory is
/// finalized, before its block is freed) says it was freed.
fn lent_memory(memory: &gst::MemoryRef) -> Arc<LentMemory> {
    let object = memory.as_ptr() as *mut gst::ffi::GstMiniObject;
    // SAFETY: `memory` is alive (the caller's mapped buffer holds it); the qdata under our
    // quark is only ever an `Arc<LentMemory>` turned into a raw pointer here, owned by the
    // memory (one strong count) until `memory_freed` takes it back.
    unsafe {
        let kept = gst::ffi::gst_mini_object_get_qdata(object, lent_quark()) as *const LentMemory;
        if !kept.is_null() {
            Arc::increment_strong_count(kept);
            return Arc::from_raw(kept);
        }
        let identity = Arc::new(LentMemory::default());
        let owned = Arc::into_raw(identity.clone());
        gst::ffi::gst_mini_object_set_qdata(
            object,
            lent_quark(),
            owned as *mut std::ffi::c_void,
            Some(memory_freed),
        );
        identity
    }
}

/// The destroy notify of a memory's [`LentMemory`]: it was freed.
unsafe extern "C" fn memory_freed(data: gst::glib::ffi::gpointer) {
    // SAFETY: `data` is the pointer `lent_memory` made with `Arc::into_raw`, whose count
    // the memory owned; called once, when the memory is finalized.
    let identity = unsafe { Arc::from_raw(data as *const LentMemory) };
    identity.free();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_memory_says_when_it_is_freed() {
        gst::init().unwrap();
        let mem = gst::Memory::with_size(1000);
        let id = lent_memory(&mem);
        let again = lent_memory(&mem);
        assert!(Arc::ptr_eq(&id, &again));
        assert!(!id.freed());
        drop(mem);
        assert!(id.freed());
    }
}
