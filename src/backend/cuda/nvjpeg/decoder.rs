//! The decoder: [`NvJpeg`] opened on the backend's context, its JPEGs checked against
//! their headers, routed to the hardware or the hybrid decoder and decoded in batches.

use super::api::*;
use super::*;
use crate::backend::cuda::driver::drv_err;
use crate::compressed::DecodeError;
use crate::error::{CudaError, Error, Result};
use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::CudaStream;
use std::ffi::c_int;

/// The JPEG [`NvJpeg::warm_up`] decodes and its side: 64x64 colour (the `image` crate's
/// baseline encoder), a gradient.
fn warm_up_jpeg() -> Result<(Vec<u8>, u32)> {
    const SIDE: u32 = 64;
    let pixels: Vec<u8> = (0..SIDE * SIDE * 3).map(|i| ((i % 251) as u8).wrapping_mul(7)).collect();
    let mut jpeg = Vec::new();
    image::codecs::jpeg::JpegEncoder::new_with_quality(&mut jpeg, 90)
        .encode(&pixels, SIDE, SIDE, image::ExtendedColorType::Rgb8)
        .map_err(|e| Error::misuse("nvJPEG's warm-up JPEG", e.to_string()))?;
    Ok((jpeg, SIDE))
}

impl NvJpeg {
    /// Load nvJPEG and create its handles on `ctx` (the backend's), chroma interpolated.
    /// Fails with [`CudaError::Unavailable`] when the library cannot be loaded (the caller
    /// decodes on the host instead), or the error of the call that failed.
    pub fn open(ctx: &Arc<CudaContext>) -> Result<NvJpeg> {
        Self::open_with(ctx, NvJpegOptions::default())
    }

    /// [`NvJpeg::open`] with `options` (a handle that refuses chroma interpolation gets
    /// nvJPEG's default; [`NvJpeg::describe`] says which it has).
    pub fn open_with(ctx: &Arc<CudaContext>, options: NvJpegOptions) -> Result<NvJpeg> {
        let upsampling = options.upsampling;
        let (api, library) = load().map_err(|e| {
            CudaError::Unavailable(format!(
                "the nvJPEG library cannot be loaded ({e}); set {LIBRARY_ENV} to its path"
            ))
        })?;
        let version = version(&api)?;
        ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        let event = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                .map_err(|e| drv_err("cuEventCreate(nvJPEG state guard)", e))
        };
        let (handle, hybrid_upsampling) = create(&api, BACKEND_DEFAULT, upsampling)
            .map_err(|s| nv_err("nvjpegCreateEx(NVJPEG_BACKEND_DEFAULT)".into(), s))?;
        let mut state: State = std::ptr::null_mut();
        // SAFETY: a handle just created; a valid out pointer.
        let s = unsafe { (api.state_create)(handle, &mut state) };
        if s != STATUS_SUCCESS {
            // SAFETY: the handle was created above and is not used after this.
            unsafe { (api.destroy)(handle) };
            return Err(nv_err("nvjpegJpegStateCreate (hybrid)".into(), s));
        }
        let guard = match event() {
            Ok(g) => g,
            Err(e) => {
                // SAFETY: created above, not used after this.
                unsafe {
                    (api.state_destroy)(state);
                    (api.destroy)(handle);
                }
                return Err(e.into());
            }
        };
        let hybrid = Hybrid { handle, state, guard, upsampling: hybrid_upsampling };
        // From here on `Drop` releases what exists.
        let mut nv = NvJpeg {
            ctx: ctx.clone(),
            library,
            version,
            hardware: None,
            no_hardware: None,
            hybrid,
            counts: DecodeCounts::default(),
            api,
        };
        if !options.hardware {
            nv.no_hardware = Some("not asked for (NvJpegOptions::hardware false)".into());
            return Ok(nv);
        }
        match create(&nv.api, BACKEND_HARDWARE, upsampling) {
            Ok((handle, upsampling)) => {
                let mut stream: JpegStream = std::ptr::null_mut();
                // SAFETY: a handle just created; a valid out pointer.
                let s = unsafe { (nv.api.stream_create)(handle, &mut stream) };
                if s != STATUS_SUCCESS {
                    // SAFETY: created above, not used after this.
                    unsafe { (nv.api.destroy)(handle) };
                    return Err(nv_err("nvjpegJpegStreamCreate (hardware)".into(), s));
                }
                let (mut engines, mut cores) = (0, 0);
                // SAFETY: a live handle and valid out pointers.
                let info = unsafe { (nv.api.hardware_info)(handle, &mut engines, &mut cores) };
                let engines = (info == STATUS_SUCCESS).then_some((engines, cores));
                nv.hardware = Some(Hardware {
                    handle,
                    stream,
                    states: Vec::new(),
                    engines,
                    upsampling,
                    warmed: None,
                });
            }
            Err(s) => {
                nv.no_hardware =
                    Some(format!("nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE): {}", status_name(s)));
            }
        }
        Ok(nv)
    }

    /// The library, its version, the decoders and the chroma upsampling, for `info` and
    /// the diagnostics: `nvJPEG 13.0.1 (libnvjpeg.so.13), hardware decoder (1 engine x 5
    /// cores; hybrid for progressive and what it cannot), chroma interpolated`.
    pub fn describe(&self) -> String {
        let (major, minor, patch) = self.version;
        let upsampling = |u: ChromaUpsampling| match u {
            ChromaUpsampling::Interpolated => "chroma interpolated",
            ChromaUpsampling::Replicated => "chroma replicated",
        };
        let decoders = match (&self.hardware, &self.no_hardware) {
            (Some(h), _) => format!(
                "hardware decoder ({}{}; hybrid backend for progressive and what it cannot, {})",
                h.engines.map_or_else(String::new, |(e, c)| format!(
                    "{e} engine{} x {c} cores, ",
                    if e == 1 { "" } else { "s" }
                )),
                upsampling(h.upsampling),
                upsampling(self.hybrid.upsampling),
            ),
            (None, why) => format!(
                "hybrid backend, {} (no hardware decoder: {})",
                upsampling(self.hybrid.upsampling),
                why.as_deref().unwrap_or("none")
            ),
        };
        format!("nvJPEG {major}.{minor}.{patch} ({}), {decoders}", self.library)
    }

    /// The library's version (major, minor, patch).
    pub fn version(&self) -> (i32, i32, i32) {
        self.version
    }

    /// Whether the hardware decoder is in use.
    pub fn has_hardware(&self) -> bool {
        self.hardware.is_some()
    }

    /// JPEGs decoded so far, by decoder.
    pub fn counts(&self) -> &DecodeCounts {
        &self.counts
    }

    /// Decode `items` into their device destinations on `stream`: the checks of every
    /// item first (nothing is queued if one fails: a size or kind that disagrees with the
    /// caller's header is [`DecodeError::Corrupt`]), then every item the hardware decoder
    /// takes in one batched call per output format, then the others on the hybrid
    /// backend. Returns which decoder took each item. On an error after the checks, some
    /// items may have been queued: wait for the stream before reusing their destinations.
    ///
    /// # Safety
    /// Each item's `dst` holds `pitch * height` bytes of device memory of this context that
    /// nothing else reads or writes until the stream has passed this decode, and its
    /// `jpeg` bytes stay alive and untouched until then; `stream` belongs to this
    /// context.
    pub unsafe fn decode_batch(
        &mut self,
        stream: &CudaStream,
        items: &[DecodeItem<'_>],
    ) -> Result<DecodeReport> {
        self.ctx.bind_to_thread().map_err(|e| drv_err("cuCtxSetCurrent", e))?;
        let mut routes = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            self.check_item(i, item)?;
            routes.push(self.route(i, item)?);
        }
        for grey in [false, true] {
            let batch: Vec<usize> = (0..items.len())
                .filter(|&i| routes[i] == Route::Hardware && items[i].grey == grey)
                .collect();
            if !batch.is_empty() {
                // SAFETY: the caller's contract for every item.
                unsafe { self.decode_hardware(stream, items, &batch, grey) }?;
            }
        }
        for (i, item) in items.iter().enumerate() {
            if let Route::Hybrid(reason) = routes[i] {
                // SAFETY: the caller's contract.
                unsafe { self.decode_hybrid(stream, i, item) }?;
                *self.counts.hybrid.entry(reason).or_default() += 1;
            }
        }
        self.counts.hardware += routes.iter().filter(|r| **r == Route::Hardware).count() as u64;
        Ok(DecodeReport { routes })
    }

    /// Whether nvJPEG reads `jpeg`'s header as `width` x `height` with 1 (`grey`) or 3
    /// components: host work only (microseconds), for choosing where a frame is decoded.
    pub fn accepts(&self, jpeg: &[u8], width: u32, height: u32, grey: bool) -> bool {
        self.check_header(0, jpeg, width, height, grey).is_ok()
    }

    /// The library's version and the decoder JPEGs go to, in a few words (`nvJPEG 13.0.1,
    /// hardware decoder`), for a device description.
    pub fn summary(&self) -> String {
        let (major, minor, patch) = self.version;
        let decoder = match &self.hardware {
            Some(Hardware { warmed: Some((n, took)), .. }) => format!(
                "hardware decoder, ready for sets of {} ({:.0} ms)",
                if *n == 1 { "1".to_string() } else { format!("1 to {n}") },
                took.as_secs_f64() * 1e3
            ),
            Some(_) => "hardware decoder".to_string(),
            None => "hybrid backend".to_string(),
        };
        format!("nvJPEG {major}.{minor}.{patch}, {decoder}")
    }

    /// Ready the hardware decoder for sets of 1 to `max_set` colour JPEGs before the first
    /// frame comes: the state of each set size created and initialized, and a small JPEG
    /// decoded through it (nvJPEG sets up its buffers at a state's first decode), on
    /// `stream`, waited for. Without it the first set of each size waits ~100 ms for this
    /// (an H100), and a camera's frames queued behind it are dropped. Not counted as
    /// decoded frames. Nothing to do without a hardware decoder (the hybrid backend's one
    /// state is ready at [`NvJpeg::open`]) or with `max_set` 0.
    pub fn warm_up(&mut self, stream: &Arc<CudaStream>, max_set: usize) -> Result<()> {
        if self.hardware.is_none() || max_set == 0 {
            return Ok(());
        }
        let start = std::time::Instant::now();
        let (jpeg, side) = warm_up_jpeg()?;
        let pitch = side as usize * 3;
        let frame = pitch * side as usize;
        let mut dst = crate::backend::cuda::memory::DeviceBuffer::default();
        let base = dst.ensure(stream, frame * max_set, "nvJPEG's warm-up")?;
        let counts = self.counts.clone();
        let mut warm = || -> Result<()> {
            for n in 1..=max_set {
                let items: Vec<DecodeItem> = (0..n)
                    .map(|i| DecodeItem {
                        jpeg: &jpeg,
                        width: side,
                        height: side,
                        grey: false,
                        dst: base + (i * frame) as CUdeviceptr,
                        pitch,
                    })
                    .collect();
                // SAFETY: `dst` holds `max_set` frames of pitch * side bytes that nothing
                // else uses, and it and `jpeg` live until the stream is synchronized below.
                let decoded = unsafe { self.decode_batch(stream, &items) };
                stream.synchronize().map_err(|e| drv_err("waiting for nvJPEG's warm-up", e))?;
                decoded?;
            }
            Ok(())
        };
        let warmed = warm();
        self.counts = counts;
        warmed?;
        if let Some(hw) = &mut self.hardware {
            hw.warmed = Some((max_set, start.elapsed()));
        }
        Ok(())
    }

    /// The item's own fields, then nvJPEG's reading of its header against them.
    fn check_item(&self, i: usize, item: &DecodeItem<'_>) -> Result<()> {
        let row = item.width as usize * item.bytes_per_pixel();
        if item.width == 0 || item.height == 0 || item.dst == 0 || item.pitch < row {
            return Err(Error::misuse(
                "NvJpeg::decode_batch",
                format!(
                    "item {i}: {}x{} into {:#x} with pitch {} (at least {row}): give the header's \
                     size and a destination of pitch * height bytes",
                    item.width, item.height, item.dst, item.pitch
                ),
            ));
        }
        self.check_header(i, item.jpeg, item.width, item.height, item.grey)
    }

    /// nvJPEG's reading of a JPEG's header (item `i`) against the size and kind the
    /// caller's header check found.
    fn check_header(
        &self,
        i: usize,
        jpeg: &[u8],
        width: u32,
        height: u32,
        grey: bool,
    ) -> Result<()> {
        let (mut components, mut subsampling) = (0, 0);
        let (mut widths, mut heights) = ([0; MAX_COMPONENT], [0; MAX_COMPONENT]);
        // SAFETY: the JPEG's bytes for the call; out pointers valid, the arrays hold
        // NVJPEG_MAX_COMPONENT entries as the function writes.
        let s = unsafe {
            (self.api.image_info)(
                self.hybrid.handle,
                jpeg.as_ptr(),
                jpeg.len(),
                &mut components,
                &mut subsampling,
                widths.as_mut_ptr(),
                heights.as_mut_ptr(),
            )
        };
        check(s, || format!("nvjpegGetImageInfo (item {i}, {} bytes)", jpeg.len()))?;
        let expected_components = if grey { 1 } else { 3 };
        if (widths[0], heights[0], components)
            != (width as c_int, height as c_int, expected_components)
        {
            return Err(Error::Decode(DecodeError::Corrupt {
                codec: Codec::Jpeg,
                message: format!(
                    "nvJPEG reads {}x{} with {components} components ({}), the header check \
                     {}x{} with {expected_components}",
                    widths[0],
                    heights[0],
                    usize::try_from(subsampling)
                        .ok()
                        .and_then(|s| SUBSAMPLING_NAMES.get(s))
                        .unwrap_or(&"unknown chroma subsampling"),
                    width,
                    height
                ),
            }));
        }
        Ok(())
    }

    /// Which decoder takes `item`: the hardware one when there is one and it says it can.
    fn route(&mut self, i: usize, item: &DecodeItem<'_>) -> Result<Route> {
        let Some(hw) = &self.hardware else {
            return Ok(Route::Hybrid(HybridReason::NoHardware));
        };
        // SAFETY: the JPEG's bytes for the call; the hardware handle and its parse stream
        // are live and used by this thread only (`&mut self`).
        let s = unsafe {
            (self.api.parse_header)(hw.handle, item.jpeg.as_ptr(), item.jpeg.len(), hw.stream)
        };
        check(s, || format!("nvjpegJpegStreamParseHeader (item {i})"))?;
        let mut unsupported = 0;
        // SAFETY: the stream was parsed just above; a valid out pointer.
        let s = unsafe { (self.api.batched_supported)(hw.handle, hw.stream, &mut unsupported) };
        check(s, || format!("nvjpegDecodeBatchedSupported (item {i})"))?;
        if unsupported == 0 {
            return Ok(Route::Hardware);
        }
        let mut encoding = 0;
        // SAFETY: as above.
        let s = unsafe { (self.api.jpeg_encoding)(hw.stream, &mut encoding) };
        check(s, || format!("nvjpegJpegStreamGetJpegEncoding (item {i})"))?;
        Ok(Route::Hybrid(if encoding == ENCODING_PROGRESSIVE {
            HybridReason::Progressive
        } else {
            HybridReason::Unsupported
        }))
    }

    /// The items `batch` of `items` in one hardware `nvjpegDecodeBatched` (RGBI, or Y when
    /// `grey`), on the state of that batch size and format.
    ///
    /// # Safety
    /// `decode_batch`'s contract.
    unsafe fn decode_hardware(
        &mut self,
        stream: &CudaStream,
        items: &[DecodeItem<'_>],
        batch: &[usize],
        grey: bool,
    ) -> Result<()> {
        let format = if grey { OUTPUT_Y } else { OUTPUT_RGBI };
        let (api, ctx) = (&self.api, &self.ctx);
        let hw = self.hardware.as_mut().ok_or_else(|| {
            Error::misuse("NvJpeg::decode_hardware", "no hardware decoder: route the items first")
        })?;
        let n = batch.len();
        let k = match hw.states.iter().position(|s| s.size == n && s.format == format) {
            Some(k) => k,
            None => {
                let mut state: State = std::ptr::null_mut();
                // SAFETY: a live handle; a valid out pointer.
                let s = unsafe { (api.state_create)(hw.handle, &mut state) };
                check(s, || format!("nvjpegJpegStateCreate (hardware, batches of {n})"))?;
                let guard = ctx
                    .new_event(Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING))
                    .map_err(|e| drv_err("cuEventCreate(nvJPEG state guard)", e));
                let guard = match guard {
                    Ok(g) => g,
                    Err(e) => {
                        // SAFETY: created above, not used after this.
                        unsafe { (api.state_destroy)(state) };
                        return Err(e.into());
                    }
                };
                hw.states.push(BatchState { state, size: n, format, ready: false, guard });
                hw.states.len() - 1
            }
        };
        let st = &mut hw.states[k];
        // The state's buffers may still be read by its previous decode.
        st.guard.synchronize().map_err(|e| drv_err("waiting for the previous JPEG batch", e))?;
        if !st.ready {
            // SAFETY: a live handle and state, no decode on it pending (waited above).
            let s = unsafe { (api.batched_initialize)(hw.handle, st.state, n as c_int, 1, format) };
            check(s, || format!("nvjpegDecodeBatchedInitialize(batch size {n})"))?;
            st.ready = true;
        }
        let data: Vec<*const u8> = batch.iter().map(|&i| items[i].jpeg.as_ptr()).collect();
        let lengths: Vec<usize> = batch.iter().map(|&i| items[i].jpeg.len()).collect();
        let mut images: Vec<Image> = batch.iter().map(|&i| output(&items[i])).collect();
        // SAFETY: `n` JPEGs (pointers and lengths of live slices) and `n` destinations of
        // `pitch * height` device bytes each (the caller's contract), the batch size the
        // state was initialized with; the arrays outlive the call (nvJPEG reads them
        // during it).
        let s = unsafe {
            (api.batched)(
                hw.handle,
                st.state,
                data.as_ptr(),
                lengths.as_ptr(),
                images.as_mut_ptr(),
                stream.cu_stream(),
            )
        };
        if s != STATUS_SUCCESS {
            // A failed batch leaves the state to be initialized again.
            st.ready = false;
            return Err(nv_err(format!("nvjpegDecodeBatched (hardware, items {batch:?})"), s));
        }
        st.guard.record(stream).map_err(|e| drv_err("cuEventRecord(nvJPEG state guard)", e))?;
        Ok(())
    }

    /// Item `i` on the hybrid backend (`nvjpegDecode`).
    ///
    /// # Safety
    /// `decode_batch`'s contract.
    unsafe fn decode_hybrid(
        &mut self,
        stream: &CudaStream,
        i: usize,
        item: &DecodeItem<'_>,
    ) -> Result<()> {
        let h = &self.hybrid;
        h.guard.synchronize().map_err(|e| drv_err("waiting for the previous hybrid JPEG", e))?;
        let format = if item.grey { OUTPUT_Y } else { OUTPUT_RGBI };
        let mut image = output(item);
        // SAFETY: a live handle and state with no decode pending (waited above); the
        // JPEG's live bytes; a destination of `pitch * height` device bytes (the caller's
        // contract).
        let s = unsafe {
            (self.api.decode)(
                h.handle,
                h.state,
                item.jpeg.as_ptr(),
                item.jpeg.len(),
                format,
                &mut image,
                stream.cu_stream(),
            )
        };
        check(s, || format!("nvjpegDecode (hybrid, item {i})"))?;
        h.guard.record(stream).map_err(|e| drv_err("cuEventRecord(nvJPEG state guard)", e))?;
        Ok(())
    }
}

/// The `nvjpegImage_t` of an item: plane 0 only (interleaved RGB or luma).
fn output(item: &DecodeItem<'_>) -> Image {
    let mut image =
        Image { channel: [std::ptr::null_mut(); MAX_COMPONENT], pitch: [0; MAX_COMPONENT] };
    image.channel[0] = item.dst as *mut u8;
    image.pitch[0] = item.pitch;
    image
}

impl Drop for NvJpeg {
    fn drop(&mut self) {
        // Every state's last decode completes before its buffers are freed; errors while
        // tearing down have nowhere to go.
        let _ = self.ctx.bind_to_thread();
        let api = &self.api;
        if let Some(hw) = self.hardware.take() {
            for st in &hw.states {
                let _ = st.guard.synchronize();
                // SAFETY: created by this value, no decode pending, not used again.
                unsafe { (api.state_destroy)(st.state) };
            }
            // SAFETY: as above; the handle last.
            unsafe {
                (api.stream_destroy)(hw.stream);
                (api.destroy)(hw.handle);
            }
        }
        let _ = self.hybrid.guard.synchronize();
        // SAFETY: created by this value, no decode pending, not used again; the handle last.
        unsafe {
            (api.state_destroy)(self.hybrid.state);
            (api.destroy)(self.hybrid.handle);
        }
    }
}
