//! The kernels the backend launches, loaded once at start-up ([`load_backend`]: embedded
//! code, else NVRTC and its disk cache, through `kernels.rs`), and the conv2d weights in
//! the conv module's constant memory: a part the backend owns.

use super::driver::drv_err;
use super::kernels::{
    find_embedded, functions, load_prepared, nvrtc_available, prepare, resize_normalize_entry,
    Embedded, KernelFile, KernelPolicy, LoadReport, Origin, Prepared, CONV_SIZES,
    RESIZE_NORMALIZE_BATCH,
};
use super::launch::{self, Conv2dParams};
use crate::backend::{Conv2dOp, PreprocessParams};
use crate::error::{CudaError, Error, Result};
use crate::image::Encoding;
use cudarc::driver::sys::CUdeviceptr;
use cudarc::driver::{CudaContext, CudaFunction, CudaModule, CudaStream, LaunchConfig};
use std::sync::Arc;
use std::time::Instant;
/// Every function the backend launches, loaded ([`load_backend`]).
pub(super) struct BackendKernels {
    /// How each module was obtained.
    pub loads: Vec<LoadReport>,
    /// The fused kernel of each encoding (indexed by its code) and its name.
    pub resize: Vec<CudaFunction>,
    pub resize_names: Vec<String>,
    /// [`RESIZE_NORMALIZE_BATCH`].
    pub resize_batch: CudaFunction,
    /// `conv2d_tiled_k<K>` and `conv2d_separable_k<K>`, indexed like [`CONV_SIZES`].
    pub conv_tiled: Vec<CudaFunction>,
    pub conv_separable: Vec<CudaFunction>,
    /// The conv2d module (its constant memory holds the weights).
    pub conv_module: Arc<CudaModule>,
    /// The conv2d whose weights (and separable factors) are in the conv module's
    /// constant memory.
    pub conv_constants: Option<Conv2dOp>,
}

/// Load the embedded module (`e`), timing it.
fn load_embedded(
    ctx: &Arc<CudaContext>,
    e: &Embedded,
    origin: Origin,
) -> Result<(Arc<CudaModule>, LoadReport), CudaError> {
    let t = Instant::now();
    // cudarc passes the bytes to cuModuleLoadData, which takes a CUBIN or PTX text.
    let image = match origin {
        Origin::EmbeddedPtx => cudarc::nvrtc::Ptx::from_src(
            String::from_utf8_lossy(e.code).trim_end_matches('\0').to_string(),
        ),
        _ => cudarc::nvrtc::Ptx::from_binary(e.code.to_vec()),
    };
    let module = ctx
        .load_module(image)
        .map_err(|err| drv_err(format!("cuModuleLoadData({} {})", e.file, e.target), err))?;
    let report = LoadReport {
        file: e.file,
        origin,
        compile_ms: t.elapsed().as_secs_f64() * 1e3,
        log: String::new(),
        why_not_embedded: String::new(),
    };
    Ok((module, report))
}

/// Load every kernel file of the backend for `arch`: the embedded code when it fits
/// (`VISION_PREPROC_KERNELS`, [`KernelPolicy`]), else compiled with NVRTC (or read from
/// its disk cache), one thread per file; then look up every entry point. `staged`: the
/// fused kernel reads packed encodings through shared memory (`-DRN_STAGED=1`).
pub(super) fn load_backend(
    ctx: &Arc<CudaContext>,
    arch: &str,
    driver_version: i32,
    cache: Option<&std::path::Path>,
    staged: bool,
) -> Result<BackendKernels, CudaError> {
    // A kernel that cannot be had leaves no usable GPU (`backend: auto` falls back).
    let err = |message: &str| CudaError::Unavailable(format!("loading kernels: {message}"));
    let policy = KernelPolicy::from_env()?;
    let extra = |file: KernelFile| match file {
        KernelFile::ResizeNormalize if staged => vec!["-DRN_STAGED=1".to_string()],
        _ => Vec::new(),
    };
    // The embedded modules first; a file without one (or whose load fails) is compiled.
    let (loaded, why_not): (Vec<_>, Vec<_>) = KernelFile::ALL
        .iter()
        .map(|&file| {
            let found = find_embedded(file.file_name(), arch, &extra(file), policy);
            match found.and_then(|(e, origin)| {
                load_embedded(ctx, e, origin).map_err(|e| format!("the driver refused it: {e}"))
            }) {
                Ok(m) => (Some(m), String::new()),
                Err(why) => (None, why),
            }
        })
        .unzip();
    if loaded.iter().any(Option::is_none) && !nvrtc_available() {
        return Err(CudaError::Unavailable(format!(
            "libnvrtc.so could not be loaded, and the embedded kernels cannot be used ({}): \
             install the CUDA 12 NVRTC (JetPack, or PyPI nvidia-cuda-nvrtc-cu12) and put its \
             lib directory on LD_LIBRARY_PATH",
            why_not.iter().find(|w| !w.is_empty()).map_or("", String::as_str)
        )));
    }
    let prepared: Vec<Option<Result<Prepared, CudaError>>> = std::thread::scope(|scope| {
        let jobs: Vec<_> = KernelFile::ALL
            .iter()
            .zip(&loaded)
            .map(|(&file, done)| {
                let extra = extra(file);
                done.is_none().then(|| {
                    scope.spawn(move || prepare(file, arch, driver_version, cache, &extra))
                })
            })
            .collect();
        jobs.into_iter()
            .map(|j| {
                j.map(|j| j.join().unwrap_or_else(|_| Err(err("a compiling thread panicked"))))
            })
            .collect()
    });
    let mut loads = Vec::new();
    let mut modules = Vec::new();
    for ((done, p), why) in loaded.into_iter().zip(prepared).zip(why_not) {
        let (m, mut report) = match (done, p) {
            (Some(m), _) => m,
            (None, Some(p)) => load_prepared(ctx, p?)?,
            (None, None) => return Err(err("a kernel file was neither embedded nor compiled")),
        };
        report.why_not_embedded = why;
        loads.push(report);
        modules.push(m);
    }
    let [rn_module, conv_module] =
        <[Arc<CudaModule>; 2]>::try_from(modules).map_err(|_| err("expected two modules"))?;
    entry_points(loads, &rn_module, conv_module)
}

/// Every entry point the backend launches, looked up in its two modules.
fn entry_points(
    loads: Vec<LoadReport>,
    rn_module: &Arc<CudaModule>,
    conv_module: Arc<CudaModule>,
) -> Result<BackendKernels, CudaError> {
    let err = |message: &str| CudaError::Unavailable(format!("loading kernels: {message}"));
    let rn = KernelFile::ResizeNormalize;
    let resize_names: Vec<String> =
        Encoding::ALL.iter().map(|&e| resize_normalize_entry(e)).collect();
    let resize = functions(rn_module, rn, &resize_names)?;
    let resize_batch = functions(rn_module, rn, &[RESIZE_NORMALIZE_BATCH.to_string()])?
        .into_iter()
        .next()
        .ok_or_else(|| err("resize_normalize_batch missing"))?;
    let names = |kind: &str| -> Vec<String> {
        CONV_SIZES.iter().map(|k| format!("conv2d_{kind}_k{k}")).collect()
    };
    let conv_tiled = functions(&conv_module, KernelFile::Conv2dTiled, &names("tiled"))?;
    let conv_separable = functions(&conv_module, KernelFile::Conv2dTiled, &names("separable"))?;
    Ok(BackendKernels {
        loads,
        resize,
        resize_names,
        resize_batch,
        conv_tiled,
        conv_separable,
        conv_module,
        conv_constants: None,
    })
}

/// conv2d in a submission: the kernel, its parameters and launch, and its input.
pub(crate) struct ConvStep<'a> {
    pub f: &'a CudaFunction,
    pub name: String,
    pub params: Conv2dParams,
    pub cfg: LaunchConfig,
    pub src: CUdeviceptr,
}

impl BackendKernels {
    /// The fused kernel of `enc` and its name.
    pub(super) fn fused(&self, enc: Encoding) -> (&CudaFunction, &str) {
        (&self.resize[enc as usize], &self.resize_names[enc as usize])
    }

    /// The conv2d kernel of `size` (an odd size 1..=15; another size gets the 1x1 one,
    /// which `Conv2dOp::check` rules out first): `conv2d_separable_k<size>` or
    /// `conv2d_tiled_k<size>`, and its name.
    pub(super) fn conv_kernel(&self, size: u32, separable: bool) -> (&CudaFunction, String) {
        let k = CONV_SIZES.iter().position(|&k| k == size).unwrap_or(0);
        let (f, kind) = match separable {
            true => (&self.conv_separable[k], "conv2d_separable_k"),
            false => (&self.conv_tiled[k], "conv2d_tiled_k"),
        };
        (f, format!("{kind}{}", CONV_SIZES[k]))
    }

    /// The conv2d launch on the fused output of `p`: its parameters, the kernel for
    /// `c.size` (separable or dense tiled) and its name. A submission and the benchmark's
    /// GPU frame use it, so both run the same kernel.
    pub(super) fn conv_launch(
        &self,
        p: &PreprocessParams,
        c: &Conv2dOp,
    ) -> (Conv2dParams, &CudaFunction, String) {
        let cp = Conv2dParams {
            width: p.dst_width,
            height: p.dst_height,
            channels: p.channels,
            size: c.size,
            border: c.border,
            layout: p.layout,
            dtype: p.dtype,
            skip: 0,
        };
        let (f, name) = self.conv_kernel(c.size, c.separable.is_some());
        (cp, f, name)
    }

    /// The conv2d step over `slots` tensors of `p` (bit i of `skip`: slot i padded, left
    /// alone), reading `src`. Its weights must be in constant memory
    /// ([`BackendKernels::ensure_conv_constants`]).
    pub(crate) fn conv_step(
        &self,
        p: &PreprocessParams,
        conv: &Conv2dOp,
        slots: u32,
        skip: u32,
        src: CUdeviceptr,
    ) -> ConvStep<'_> {
        let (mut params, f, name) = self.conv_launch(p, conv);
        params.skip = skip;
        let cfg = launch::conv_tiled_batch_cfg(p.dst_width, p.dst_height, slots);
        ConvStep { f, name, params, cfg, src }
    }

    /// Put the conv2d weights (and the separable factors) of `conv` into the conv
    /// module's constant memory, where the conv2d kernels read them, when they change.
    pub(super) fn ensure_conv_constants(
        &mut self,
        stream: &Arc<CudaStream>,
        conv: &Conv2dOp,
    ) -> Result<()> {
        let same = |c: &Conv2dOp| c.weights == conv.weights && c.separable == conv.separable;
        if self.conv_constants.as_ref().is_some_and(same) {
            return Ok(());
        }
        let set = |symbol: &str, values: &[f32]| -> Result<()> {
            let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            let mut sym = self
                .conv_module
                .get_global(symbol, stream)
                .map_err(|e| drv_err(format!("cuModuleGetGlobal({symbol})"), e))?;
            if bytes.len() > sym.len() {
                return Err(Error::misuse(
                    format!("setting {symbol}"),
                    format!(
                        "{} bytes of conv2d weights do not fit its {} bytes (a Conv2dOp larger \
                         than conv.size allows: build it with Conv2dOp::new)",
                        bytes.len(),
                        sym.len()
                    ),
                ));
            }
            let mut dst = sym.slice_mut(..bytes.len());
            stream
                .memcpy_htod(&bytes, &mut dst)
                .map_err(|e| drv_err(format!("copying conv2d weights to {symbol}"), e).into())
        };
        set("c_conv_w", &conv.weights)?;
        if let Some((col, row)) = &conv.separable {
            set("c_conv_col", col)?;
            set("c_conv_row", row)?;
        }
        self.conv_constants = Some(conv.clone());
        Ok(())
    }
}
