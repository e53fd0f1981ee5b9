//! GStreamer's CUDA memory read on the device: the GPU backend's CUDA context wrapped as
//! GStreamer's ([`GpuShare`]: `gst_cuda_context_new_wrapped` from libgstcuda-1.0, loaded at
//! run time so that the product runs where it is absent) and set on the pipeline (the
//! `gst.cuda.context` context, also the answer to an element's `need-context` message), so
//! that `nvh264dec` and the other nvcodec elements allocate their output in the node's own
//! context; then a buffer of CUDA memory mapped with `GST_MAP_CUDA` to its device address
//! ([`map_device`]) and kept mapped while its frame lives: the kernels read it in place, no
//! download, no upload, no host copy.
//!
//! GStreamer 1.22's CUDA memory (`gstcudamemory.c`) lays NV12 out as one `cuMemAllocPitch`
//! block: both planes at the pitch, the chroma plane at `pitch * height` (an
//! [`ImageView`](crate::image::ImageView)'s layout); its decoders finish their copy into
//! it (`CuStreamSynchronize`) before they push the buffer. From 1.24 a memory may carry
//! work still queued on its stream: `gst_cuda_memory_sync`, where the library has it, waits
//! for it before the frame is handed on.

use std::ffi::c_void;
use std::sync::{Arc, OnceLock};

use gstreamer as gst;
use gstreamer_video as gst_video;

use crate::image::DeviceContext;

/// The caps feature of GStreamer's CUDA memory.
pub const CUDA_MEMORY_FEATURE: &str = "memory:CUDAMemory";
/// The memory type name of GStreamer's CUDA memory (`GST_CUDA_MEMORY_TYPE_NAME`).
const CUDA_MEMORY_TYPE: &str = "gst.cuda.memory";
/// The context type the nvcodec elements ask for (`GST_CUDA_CONTEXT_TYPE`).
pub(super) const CUDA_CONTEXT_TYPE: &str = "gst.cuda.context";
/// `GST_MAP_CUDA`: map the device memory, not a host copy of it.
const GST_MAP_CUDA: u32 = gst::ffi::GST_MAP_FLAG_LAST << 1;
/// The library, by its SONAME (Debian: libgstreamer-plugins-bad1.0-0).
const LIBRARY: &str = "libgstcuda-1.0.so.0";

type NewWrapped = unsafe extern "C" fn(*mut c_void, i32) -> *mut gst::ffi::GstObject;
type NewContext = unsafe extern "C" fn(*mut gst::ffi::GstObject) -> *mut gst::ffi::GstContext;
type GetHandle = unsafe extern "C" fn(*mut gst::ffi::GstObject) -> *mut c_void;
type MemorySync = unsafe extern "C" fn(*mut gst::ffi::GstMemory);
type LoadLibrary = unsafe extern "C" fn() -> gst::glib::ffi::gboolean;

/// The functions of libgstcuda-1.0 that the capture calls.
struct Api {
    /// Loads the driver's libcuda into GStreamer's table; the other functions assert that
    /// it was (a process abort without a driver), so it is called first.
    load_library: LoadLibrary,
    new_wrapped: NewWrapped,
    new_context: NewContext,
    get_handle: GetHandle,
    /// 1.24 and later only.
    memory_sync: Option<MemorySync>,
    /// Kept loaded for the process's life (the functions above point into it).
    _library: libloading::Library,
}

/// libgstcuda-1.0 from `path` and its functions, or why not (the library is absent, or
/// lacks a function: older than 1.22).
fn load(path: &str) -> Result<Api, String> {
    // SAFETY: loading GStreamer's CUDA library runs its constructors only (it loads
    // libcuda itself when a context is made); the symbols are looked up by their
    // documented C names and given their C signatures (gstcudacontext.h, gstcudautils.h,
    // gstcudamemory.h).
    unsafe {
        let library = libloading::Library::new(path).map_err(|e| format!("{path}: {e}"))?;
        let sym = |name: &str| -> Result<*mut c_void, String> {
            let s: libloading::Symbol<'_, *mut c_void> = library
                .get(name.as_bytes())
                .map_err(|_| format!("{path} has no `{name}` (GStreamer older than 1.22?)"))?;
            Ok(*s)
        };
        let load_library =
            std::mem::transmute::<*mut c_void, LoadLibrary>(sym("gst_cuda_load_library")?);
        let new_wrapped =
            std::mem::transmute::<*mut c_void, NewWrapped>(sym("gst_cuda_context_new_wrapped")?);
        let new_context =
            std::mem::transmute::<*mut c_void, NewContext>(sym("gst_context_new_cuda_context")?);
        let get_handle =
            std::mem::transmute::<*mut c_void, GetHandle>(sym("gst_cuda_context_get_handle")?);
        let memory_sync = sym("gst_cuda_memory_sync")
            .ok()
            .map(|p| std::mem::transmute::<*mut c_void, MemorySync>(p));
        Ok(Api {
            load_library,
            new_wrapped,
            new_context,
            get_handle,
            memory_sync,
            _library: library,
        })
    }
}

/// The library, loaded once (`VISION_PREPROC_GSTCUDA_LIBRARY` names another path).
fn api() -> Result<&'static Api, String> {
    static API: OnceLock<Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        let path = std::env::var("VISION_PREPROC_GSTCUDA_LIBRARY").unwrap_or(LIBRARY.into());
        load(&path)
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// Whether frames can be taken in CUDA memory here, or why not: what `vision_preproc
/// info` says beside GStreamer's status.
pub fn cuda_status() -> String {
    match api() {
        Ok(a) => format!(
            "GStreamer's CUDA library loads ({LIBRARY}{}): with the CUDA backend, frames in \
             CUDA memory (`{CUDA_MEMORY_FEATURE}`, NV12: nvh264dec, nvh265dec) are read in \
             place on the device",
            if a.memory_sync.is_some() { ", 1.24 or later" } else { "" }
        ),
        Err(e) => format!(
            "no GStreamer CUDA library ({e}): frames are taken in system memory only (install \
             libgstreamer-plugins-bad1.0-0 for CUDA memory)"
        ),
    }
}

/// A GPU backend's CUDA context wrapped as GStreamer's: set on a pipeline
/// (`CaptureSource::start_on`), its CUDA elements allocate in that context, whose kernels then
/// read their buffers in place.
pub struct GpuShare {
    /// The `gst.cuda.context` context holding the wrapped `GstCudaContext`.
    context: gst::Context,
    /// The wrapped `GstCudaContext` (one reference, ours).
    cuda: *mut gst::ffi::GstObject,
    /// The backend's context and what keeps it alive while GStreamer may use it.
    device: DeviceContext,
}

// SAFETY: a GstCudaContext is a GstObject (reference counted, thread-safe); the share only
// reads it and unrefs it once on drop.
unsafe impl Send for GpuShare {}
// SAFETY: as above; nothing mutates it through a shared reference.
unsafe impl Sync for GpuShare {}

impl GpuShare {
    /// `device`'s context wrapped for GStreamer, or why it cannot be (no libgstcuda-1.0,
    /// GStreamer refused the context).
    pub fn new(device: DeviceContext) -> Result<Arc<GpuShare>, String> {
        let api = api()?;
        gst::init().map_err(|e| format!("GStreamer cannot be initialized: {e}"))?;
        // SAFETY: no arguments; loads libcuda once (GStreamer's own guard) and says whether
        // it could. Without it `gst_cuda_context_new_wrapped` aborts the process.
        if unsafe { (api.load_library)() } == 0 {
            return Err(format!(
                "{LIBRARY} cannot load the driver's CUDA library (libcuda.so.1): no NVIDIA \
                 driver here"
            ));
        }
        // SAFETY: `device.handle` is a live CUcontext of CUdevice `device.device` (the
        // backend's, kept alive by `device.keep` for as long as this share lives, which
        // outlives every pipeline given it); the wrapper does not own it (it never
        // destroys a wrapped context).
        let cuda = unsafe { (api.new_wrapped)(device.handle as *mut c_void, device.device) };
        if cuda.is_null() {
            return Err(format!(
                "gst_cuda_context_new_wrapped refused the context of CUDA device {}",
                device.device
            ));
        }
        // SAFETY: `cuda` is a live GstCudaContext; the new GstContext takes its own
        // reference to it and is returned with full ownership.
        let raw = unsafe { (api.new_context)(cuda) };
        if raw.is_null() {
            // SAFETY: our one reference to `cuda`.
            unsafe { gst::ffi::gst_object_unref(cuda.cast()) };
            return Err("gst_context_new_cuda_context failed".into());
        }
        // SAFETY: `raw` is a new GstContext, ownership transferred to us.
        let context = unsafe { gst::glib::translate::from_glib_full(raw) };
        Ok(Arc::new(GpuShare { context, cuda, device }))
    }

    /// The `gst.cuda.context` context to set on a pipeline.
    pub(super) fn context(&self) -> &gst::Context {
        &self.context
    }

    /// The backend's context (a `CUcontext` as an address).
    pub fn handle(&self) -> usize {
        self.device.handle
    }
}

impl Drop for GpuShare {
    fn drop(&mut self) {
        // SAFETY: our one reference, taken in `new`.
        unsafe { gst::ffi::gst_object_unref(self.cuda.cast()) };
    }
}

/// A buffer of CUDA memory mapped for the device (`GST_MAP_READ | GST_MAP_CUDA`): its
/// device address and size, and the CUDA context it belongs to; unmapped on drop (the
/// buffer is kept alive by the mapping's own reference).
pub(super) struct DeviceMapping {
    buffer: gst::Buffer,
    info: gst::ffi::GstMapInfo,
    /// The `CUcontext` of the memory's `GstCudaContext`, as an address.
    pub context: usize,
}

// SAFETY: the mapping only holds the buffer's reference and the map info GStreamer filled;
// unmapping from another thread is allowed (the memory's map lock is a mutex).
unsafe impl Send for DeviceMapping {}
// SAFETY: nothing mutates it through a shared reference.
unsafe impl Sync for DeviceMapping {}

impl DeviceMapping {
    /// The device address of the memory's first byte.
    pub(super) fn ptr(&self) -> u64 {
        self.info.data as u64
    }
    /// The memory's size in bytes.
    pub(super) fn size(&self) -> usize {
        self.info.size
    }
}

impl Drop for DeviceMapping {
    fn drop(&mut self) {
        // SAFETY: `info` was filled by a successful gst_buffer_map of `buffer`, unmapped once.
        unsafe { gst::ffi::gst_buffer_unmap(self.buffer.as_mut_ptr(), &mut self.info) };
    }
}

/// The head of GStreamer's `GstCudaMemory` (public and stable since 1.22): the memory, its
/// `GstCudaContext`, its video info (the planes' strides and offsets).
#[repr(C)]
struct CudaMemoryHead {
    mem: gst::ffi::GstMemory,
    context: *mut gst::ffi::GstObject,
    info: gst_video::ffi::GstVideoInfo,
}

/// Whether `buffer` is one block of GStreamer's CUDA memory.
pub(super) fn is_cuda_memory(buffer: &gst::BufferRef) -> bool {
    buffer.n_memory() == 1 && buffer.peek_memory(0).is_type(CUDA_MEMORY_TYPE)
}

/// The planes' strides and offsets of `buffer`'s CUDA memory (its own video info, which
/// the decoder's pool wrote; a `GstVideoMeta` says the same where there is one).
pub(super) fn cuda_planes(buffer: &gst::BufferRef) -> (Vec<i32>, Vec<usize>) {
    let memory = buffer.peek_memory(0);
    // SAFETY: the memory is a GstCudaMemory (`is_cuda_memory`, checked by the caller),
    // whose public head is `CudaMemoryHead`; alive while `buffer` is.
    let info = unsafe { &(*(memory.as_ptr() as *const CudaMemoryHead)).info };
    let n = if info.finfo.is_null() {
        1
    } else {
        // SAFETY: a non-null finfo is GStreamer's static format info.
        unsafe { (*info.finfo).n_planes as usize }
    }
    .clamp(1, 4);
    (info.stride[..n].to_vec(), info.offset[..n].to_vec())
}

/// `buffer` (one block of CUDA memory: [`is_cuda_memory`]) mapped for the device, after
/// any work still queued on its stream (1.24+), with the CUDA context it belongs to.
pub(super) fn map_device(buffer: gst::Buffer) -> Result<DeviceMapping, String> {
    let api = api()?;
    let memory = buffer.peek_memory(0);
    let head = memory.as_ptr() as *mut CudaMemoryHead;
    if let Some(sync) = api.memory_sync {
        // SAFETY: a GstCudaMemory alive while `buffer` is (the caller's check).
        unsafe { sync(head.cast()) };
    }
    // SAFETY: as above; its `context` is a live GstCudaContext the memory holds a reference to.
    let handle = unsafe { (api.get_handle)((*head).context) } as usize;
    // SAFETY: an all-zero GstMapInfo is the C initializer (GST_MAP_INFO_INIT).
    let mut info: gst::ffi::GstMapInfo = unsafe { std::mem::zeroed() };
    let flags = gst::ffi::GST_MAP_READ | GST_MAP_CUDA;
    // SAFETY: a valid buffer and map info; on success `info` holds the mapping, undone
    // once by `DeviceMapping`'s drop.
    let ok = unsafe { gst::ffi::gst_buffer_map(buffer.as_mut_ptr(), &mut info, flags) };
    if ok == 0 {
        return Err("the buffer's CUDA memory cannot be mapped for the device".into());
    }
    Ok(DeviceMapping { buffer, info, context: handle })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_refused_by_name() {
        let e = load("/nonexistent/libgstcuda-1.0.so.0").err().expect("refused");
        assert!(e.contains("/nonexistent/libgstcuda-1.0.so.0"), "{e}");
    }

    #[test]
    fn a_library_without_the_functions_is_refused_naming_the_function() {
        // libgstreamer is a real library, without any of gstcuda's functions.
        let e = load("libgstreamer-1.0.so.0").err().expect("refused");
        assert!(e.contains("gst_cuda_load_library"), "{e}");
        assert!(e.contains("1.22"), "{e}");
    }

    #[test]
    fn the_map_flag_is_gstreamers() {
        // GST_MAP_FLAG_LAST is 1 << 16 (gstmemory.h): GST_MAP_CUDA is 1 << 17.
        assert_eq!(GST_MAP_CUDA, 1 << 17);
    }
}
