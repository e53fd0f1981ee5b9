//! The CPU backend against its own specification and hand-computed golden values.
//!
//! - The fast banded pass equals the per-element definition (`backend::cpu::reference`)
//!   bit for bit, for every encoding (both byte orders for 16-bit), channel count and
//!   order, layout, dtype, interpolation, resize mode and anchor, with roi, padded
//!   `step`, and awkward sizes (1xN, Nx1, odd, large up- and downscales).
//! - Golden values: each expected number is derived in a comment (hand arithmetic or the
//!   OpenCV snippet that produced it).
//! - Operation checks, buffer reuse, pipeline behaviour.
//!
//! Parity with OpenCV on real photographs is the Python suite (test/python).

use vision_preproc::backend::cpu::{reference, CpuBackend, Simd};
use vision_preproc::backend::{
    read_elements, Backend, BatchSlot, BatchWork, FrameWork, PreprocessOp,
};
use vision_preproc::config::{
    ChannelOrder, Config, DType, Interpolation, Layout, LetterboxAnchor, ResizeMode,
};
use vision_preproc::pipeline::{preprocess_op, Geometry, Pipeline};
use vision_preproc::rng::SplitMix64;
use vision_preproc::{Encoding, Error, ImageView};

/// A random image of `enc` (every byte pattern is a valid image of every encoding), with
/// `pad` extra bytes per row.
fn random_image(enc: Encoding, w: u32, h: u32, pad: u32, seed: u64) -> (Vec<u8>, u32) {
    let step = w * enc.bytes_per_pixel() + pad;
    let rows = if matches!(enc, Encoding::Nv12 | Encoding::Nv21) { h * 3 / 2 } else { h };
    (SplitMix64::new(seed).bytes((step * rows) as usize), step)
}

fn op_for(cfg: &Config, img: &ImageView<'_>) -> PreprocessOp {
    let g = Geometry::resolve(cfg, img.width(), img.height()).unwrap();
    let mut op = preprocess_op(cfg, &g);
    op.params.src_step = img.step();
    op.params.encoding = img.encoding() as u32;
    op.params.big_endian = u32::from(img.big_endian());
    op
}

/// The fast pass (both builds of its inner loops: baseline and, where the CPU has it,
/// AVX2 on x86-64 or NEON on aarch64) and the reference, byte for byte.
fn assert_fast_equals_reference(img: &ImageView<'_>, cfg: &Config, what: &str) {
    let op = op_for(cfg, img);
    let mut slow = Vec::new();
    reference::preprocess(img, &op, &mut slow).unwrap();
    for simd in [Simd::Baseline, Simd::detect()] {
        let mut cpu = CpuBackend::new();
        cpu.set_simd(simd);
        let mut fast = Vec::new();
        cpu.preprocess(img, &op, &mut fast).unwrap();
        assert_eq!(fast.len(), op.params.tensor_desc().byte_len(), "{what}");
        if fast != slow {
            let i = fast.iter().zip(&slow).position(|(a, b)| a != b).unwrap();
            panic!(
                "{what} ({:?}): fast pass differs from the reference at byte {i} of {}",
                cpu.simd(),
                fast.len()
            );
        }
    }
}

/// The build the spec tests compare with the baseline is the one a robot runs: NEON on
/// every aarch64 CPU (part of the architecture's baseline), AVX2 on the x86-64 machines
/// this is developed on. A build where detection failed would test the baseline twice.
#[test]
fn the_fast_build_of_this_cpu_is_detected_and_chosen() {
    let mut cpu = CpuBackend::new();
    assert_eq!(cpu.simd(), Simd::detect());
    #[cfg(target_arch = "aarch64")]
    assert_eq!(Simd::detect(), Simd::Neon);
    #[cfg(target_arch = "x86_64")]
    assert_ne!(Simd::detect(), Simd::Neon);
    cpu.set_simd(Simd::Baseline);
    assert_eq!(cpu.simd(), Simd::Baseline);
    // A build this CPU does not have falls back to the baseline.
    let other = if cfg!(target_arch = "aarch64") { Simd::Avx2 } else { Simd::Neon };
    cpu.set_simd(other);
    assert_eq!(cpu.simd(), Simd::Baseline);
    cpu.set_simd(Simd::detect());
    assert_eq!(cpu.simd(), Simd::detect());
    assert!(cpu.device_description().contains(&format!("{:?}", Simd::detect())));
}

fn configs() -> Vec<(String, Config)> {
    let base = Config::default();
    let mut out = Vec::new();
    let sizes = [(1, 1), (1, 9), (9, 1), (7, 5), (31, 17), (64, 48)];
    let modes = [
        (ResizeMode::Stretch, LetterboxAnchor::Center),
        (ResizeMode::Letterbox, LetterboxAnchor::Center),
        (ResizeMode::Letterbox, LetterboxAnchor::TopLeft),
        (ResizeMode::CenterCrop, LetterboxAnchor::Center),
    ];
    let mut k = 0usize;
    for &(w, h) in &sizes {
        for &(mode, anchor) in &modes {
            k += 1;
            let channels = if k.is_multiple_of(3) { 1 } else { 3 };
            let c = Config {
                network_image_width: w,
                network_image_height: h,
                resize_mode: mode,
                letterbox_anchor: anchor,
                interpolation: if k.is_multiple_of(2) {
                    Interpolation::Nearest
                } else {
                    Interpolation::Linear
                },
                channel_order: if k % 4 < 2 { ChannelOrder::Rgb } else { ChannelOrder::Bgr },
                output_channels: channels,
                image_mean: if channels == 1 { vec![0.449] } else { vec![0.485, 0.456, 0.406] },
                image_stddev: if channels == 1 { vec![0.226] } else { vec![0.229, 0.224, 0.225] },
                output_layout: if k % 5 < 3 { Layout::Nchw } else { Layout::Nhwc },
                output_dtype: if k % 7 < 4 { DType::Float32 } else { DType::Float16 },
                pad_value: vec![114.0, 30.5, 250.0],
                roi: if k % 3 == 1 { vec![3, 1, 15, 11] } else { Vec::new() },
                ..base.clone()
            };
            out.push((format!("{w}x{h} {mode:?} {anchor:?} #{k}"), c));
        }
    }
    out
}

#[test]
fn fast_pass_equals_the_per_element_definition() {
    // 24 configurations x 19 encoding/byte-order pairs x 2 source sizes.
    let cfgs = configs();
    for (si, &(w, h)) in [(22u32, 14u32), (18, 12)].iter().enumerate() {
        for enc in Encoding::ALL {
            for be in [false, true] {
                if be && !enc.is_16bit() {
                    continue;
                }
                let (data, step) = random_image(enc, w, h, 3, (enc as u64) * 10 + si as u64);
                let img = ImageView::with_encoding(w, h, step, enc, be, &data).unwrap();
                for (name, cfg) in &cfgs {
                    assert_fast_equals_reference(&img, cfg, &format!("{enc} be={be} {name}"));
                }
            }
        }
    }
}

#[test]
fn fast_pass_equals_definition_on_tiny_and_tall_sources() {
    // Sources of 1 and 2 pixels across (Bayer's all-zero case, 4:2:2 single pairs) and
    // large up/down factors.
    let cases = [
        (Encoding::Rgb8, 1, 1),
        (Encoding::Bgra8, 1, 40),
        (Encoding::Mono16, 40, 1),
        (Encoding::Yuyv, 2, 1),
        (Encoding::Uyvy, 2, 33),
        (Encoding::Nv12, 2, 2),
        (Encoding::Nv21, 40, 2),
        (Encoding::BayerRggb8, 2, 9),
        (Encoding::BayerGbrg8, 3, 3),
        (Encoding::BayerGrbg8, 300, 3),
        (Encoding::BayerBggr8, 5, 200),
    ];
    for (enc, w, h) in cases {
        let (data, step) = random_image(enc, w, h, 1, w as u64 * 1000 + h as u64);
        let img = ImageView::with_encoding(w, h, step, enc, false, &data).unwrap();
        for (nw, nh) in [(1, 1), (64, 3), (3, 64), (50, 50)] {
            for mode in [ResizeMode::Stretch, ResizeMode::Letterbox, ResizeMode::CenterCrop] {
                let cfg = Config {
                    network_image_width: nw,
                    network_image_height: nh,
                    resize_mode: mode,
                    ..Config::default()
                };
                assert_fast_equals_reference(&img, &cfg, &format!("{enc} {w}x{h} -> {nw}x{nh}"));
            }
        }
    }
}

#[test]
fn upscale_predecode_path_equals_definition() {
    // A 3x upscale of a wide roi: each source row is decoded once and gathered (the
    // path taken when the region has fewer pixels than the row has taps).
    for enc in [Encoding::Yuyv, Encoding::Nv12, Encoding::BayerRggb8, Encoding::Rgb16] {
        let (data, step) = random_image(enc, 40, 20, 0, 7);
        let img = ImageView::with_encoding(40, 20, step, enc, false, &data).unwrap();
        for roi in [vec![1, 1, 37, 17], vec![0, 0, 40, 20], vec![7, 3, 2, 2]] {
            let cfg = Config {
                network_image_width: 111,
                network_image_height: 53,
                resize_mode: ResizeMode::Stretch,
                roi,
                ..Config::default()
            };
            assert_fast_equals_reference(&img, &cfg, &format!("{enc} upscale"));
        }
    }
}

fn f32s(b: &[u8]) -> Vec<f32> {
    read_elements(DType::Float32, b)
}

fn run(cfg: &Config, w: u32, h: u32, enc: &str, data: &[u8]) -> Vec<f32> {
    let img = ImageView::new(w, h, data.len() as u32 / h, enc, false, data).unwrap();
    let op = op_for(cfg, &img);
    let mut out = Vec::new();
    CpuBackend::new().preprocess(&img, &op, &mut out).unwrap();
    f32s(&out)
}

fn close(a: &[f32], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        // f32 results of f32 arithmetic: a few ulps of the value.
        assert!((f64::from(*x) - y).abs() <= 1e-6 * y.abs().max(1.0), "element {i}: {x} != {y}");
    }
}

#[test]
fn golden_bilinear_ramp_and_normalization() {
    // 2x1 rgb8 black | white, stretched to 4x1 (linear). AxisMap 2 -> 4, scale 0.5:
    // f = (d + 0.5) * 0.5 - 0.5 = -0.25 (clamp: 0), 0.25, 0.75, 1.25 (clamp: 1):
    // values 0, 255 * 0.25 = 63.75, 255 * 0.75 = 191.25, 255.
    // (cv2.resize(np.array([[[0]*3, [255]*3]], np.float32), (4, 1)) -> 0, 63.75, 191.25, 255)
    // Normalized with the defaults (1/255, mean 0.5, std 0.5): v / 127.5 - 1.
    let cfg = Config {
        network_image_width: 4,
        network_image_height: 1,
        resize_mode: ResizeMode::Stretch,
        ..Config::default()
    };
    let out = run(&cfg, 2, 1, "rgb8", &[0, 0, 0, 255, 255, 255]);
    let row = [-1.0, 63.75 / 127.5 - 1.0, 191.25 / 127.5 - 1.0, 1.0];
    let want: Vec<f64> = (0..3).flat_map(|_| row).collect(); // NCHW: 3 equal planes
    close(&out, &want);
}

#[test]
fn golden_isaac_style_normalization_and_channel_order() {
    // One red pixel, mean 0.5, std 0.25 (Isaac ROS's docstring example):
    // RED: ((255/255) - 0.5) / 0.25 = 2.0; GREEN, BLUE: ((0/255) - 0.5) / 0.25 = -2.0.
    let mut cfg = Config {
        network_image_width: 1,
        network_image_height: 1,
        image_stddev: vec![0.25],
        ..Config::default()
    };
    close(&run(&cfg, 1, 1, "rgb8", &[255, 0, 0]), &[2.0, -2.0, -2.0]);
    // The same pixel as bgr8 bytes (0, 0, 255) decodes to red too.
    close(&run(&cfg, 1, 1, "bgr8", &[0, 0, 255]), &[2.0, -2.0, -2.0]);
    // channel_order bgr: channel 0 is blue. Means in OUTPUT order: [mean_b, mean_g, mean_r]
    // = [0, 0.5, 1]: B (0/255 - 0)/0.25 = 0; G (0 - 0.5)/0.25 = -2; R (1 - 1)/0.25 = 0.
    cfg.channel_order = ChannelOrder::Bgr;
    cfg.image_mean = vec![0.0, 0.5, 1.0];
    close(&run(&cfg, 1, 1, "rgb8", &[255, 0, 0]), &[0.0, -2.0, 0.0]);
}

#[test]
fn golden_letterbox_padding_and_layouts() {
    // 4x2 grey 100 into 4x4 letterbox: content 4x2 at rows 1..3 (pad (4-2)/2 = 1 row
    // above, 1 below). pad_value 114 -> 114/255 = 0.447059 -> (0.447059 - 0.5) / 0.5 =
    // -0.105882; pixels 100 -> (100/255 - 0.5) / 0.5 = -0.215686.
    let mut cfg = Config {
        network_image_width: 4,
        network_image_height: 4,
        pad_value: vec![114.0],
        output_channels: 1,
        image_mean: vec![0.5],
        image_stddev: vec![0.5],
        ..Config::default()
    };
    let pad = 114.0 / 127.5 - 1.0;
    let px = 100.0 / 127.5 - 1.0;
    let want: Vec<f64> = (0..16).map(|i| if (4..12).contains(&i) { px } else { pad }).collect();
    close(&run(&cfg, 4, 2, "mono8", &[100; 8]), &want);
    // Three channels, coloured pad [R 255, G 0, B 51], NHWC: (0,0) is [1, -1, -0.6]
    // (51/127.5 - 1 = -0.6); NCHW plane 1 (G) of row 0 is -1.
    cfg.output_channels = 3;
    cfg.image_mean = vec![0.5];
    cfg.image_stddev = vec![0.5];
    cfg.pad_value = vec![255.0, 0.0, 51.0];
    cfg.output_layout = Layout::Nhwc;
    let out = run(&cfg, 4, 2, "mono8", &[100; 8]);
    close(&out[..3], &[1.0, -1.0, -0.6]);
    close(&out[4 * 3..4 * 3 + 3], &[px, px, px]); // row 1, column 0: content
    cfg.output_layout = Layout::Nchw;
    let out = run(&cfg, 4, 2, "mono8", &[100; 8]);
    close(&out[16..20], &[-1.0; 4]);
    close(&out[16 + 4..16 + 8], &[px; 4]);
}

#[test]
fn golden_grey_output_from_colour_and_16_bit() {
    // Grey output converts before resampling with OpenCV 5's RGB2GRAY:
    // cv2.cvtColor(np.array([[[10, 200, 30]]], np.uint8), cv2.COLOR_RGB2GRAY) -> 124;
    // with pixel_scale 1, mean 0, std 1 the output is the grey value itself.
    let cfg = Config {
        network_image_width: 1,
        network_image_height: 1,
        output_channels: 1,
        pixel_scale: 1.0,
        image_mean: vec![0.0],
        image_stddev: vec![1.0],
        ..Config::default()
    };
    close(&run(&cfg, 1, 1, "rgb8", &[10, 200, 30]), &[124.0]);
    // rgb16 (2570, 51400, 7710) little-endian: grey16 = (9798*2570 + 19235*51400 +
    // 3735*7710 + 16384) >> 15 = 1042673094 >> 15 = 31819 (cv2.cvtColor of the u16 pixel
    // gives the same), then / 257 = 123.809339.
    let px: Vec<u8> = [2570u16, 51400, 7710].iter().flat_map(|v| v.to_le_bytes()).collect();
    close(&run(&cfg, 1, 1, "rgb16", &px), &[31819.0 / 257.0]);
}

#[test]
fn golden_yuyv_pixel() {
    // cv2.cvtColor(np.array([[128, 64, 128, 200]], np.uint8).reshape(1, 2, 2),
    //              cv2.COLOR_YUV2RGB_YUY2)[0, 0] -> [245, 97, 1]; both pixels equal.
    let cfg = Config {
        network_image_width: 1,
        network_image_height: 1,
        resize_mode: ResizeMode::Stretch,
        interpolation: Interpolation::Nearest,
        pixel_scale: 1.0,
        image_mean: vec![0.0],
        image_stddev: vec![1.0],
        ..Config::default()
    };
    close(&run(&cfg, 2, 1, "yuv422_yuy2", &[128, 64, 128, 200]), &[245.0, 97.0, 1.0]);
}

#[test]
fn golden_float16_rounds_to_nearest_even() {
    // 0.1 in f16: candidates 0x2E66 = 0.0999755859375 and 0x2E67 = 0.10003662109375;
    // 0.1 is nearer the first. Output value 0.1 = pixel 25.5 with pixel_scale 1/255,
    // mean 0, std 1: two pixels 25 and 26 averaged by a 2 -> 1 linear downscale.
    let cfg = Config {
        network_image_width: 1,
        network_image_height: 1,
        resize_mode: ResizeMode::Stretch,
        output_channels: 1,
        image_mean: vec![0.0],
        image_stddev: vec![1.0],
        output_dtype: DType::Float16,
        ..Config::default()
    };
    let img = ImageView::new(2, 1, 2, "mono8", false, &[25, 26]).unwrap();
    let op = op_for(&cfg, &img);
    let mut out = Vec::new();
    CpuBackend::new().preprocess(&img, &op, &mut out).unwrap();
    assert_eq!(out, 0x2E66u16.to_le_bytes());
}

#[test]
fn golden_nearest_picks_floor_of_scaled_index() {
    // 4 -> 3 nearest: src = floor(d * 4/3) = 0, 1, 2 (cv2.INTER_NEAREST).
    let cfg = Config {
        network_image_width: 3,
        network_image_height: 1,
        resize_mode: ResizeMode::Stretch,
        interpolation: Interpolation::Nearest,
        output_channels: 1,
        pixel_scale: 1.0,
        image_mean: vec![0.0],
        image_stddev: vec![1.0],
        ..Config::default()
    };
    close(&run(&cfg, 4, 1, "mono8", &[10, 20, 30, 40]), &[10.0, 20.0, 30.0]);
}

#[test]
fn f32_pass_equals_the_float32_tensor() {
    let (data, step) = random_image(Encoding::Nv21, 30, 20, 2, 3);
    let img = ImageView::with_encoding(30, 20, step, Encoding::Nv21, false, &data).unwrap();
    let cfg = Config { network_image_width: 17, network_image_height: 13, ..Config::default() };
    let op = op_for(&cfg, &img);
    let mut cpu = CpuBackend::new();
    let mut bytes = Vec::new();
    cpu.preprocess(&img, &op, &mut bytes).unwrap();
    cpu.preprocess_f32(&img, &op).unwrap();
    assert_eq!(cpu.f32_tensor().to_vec(), f32s(&bytes));
}

#[test]
fn output_buffer_is_reused_across_frames() {
    let (data, step) = random_image(Encoding::Bgr8, 64, 48, 0, 9);
    let img = ImageView::with_encoding(64, 48, step, Encoding::Bgr8, false, &data).unwrap();
    let cfg = Config { network_image_width: 32, network_image_height: 32, ..Config::default() };
    let op = op_for(&cfg, &img);
    let mut cpu = CpuBackend::new();
    let mut out = Vec::new();
    cpu.process(FrameWork::new(&img, &op, None), &mut out).unwrap();
    let (ptr, first) = (out.as_ptr(), out.clone());
    for _ in 0..3 {
        cpu.process(FrameWork::new(&img, &op, None), &mut out).unwrap();
        assert_eq!(out.as_ptr(), ptr, "the output buffer was reallocated");
        assert_eq!(out, first);
    }
}

#[test]
fn mismatched_operations_are_errors_not_panics() {
    let (data, step) = random_image(Encoding::Rgb8, 8, 6, 0, 1);
    let img = ImageView::with_encoding(8, 6, step, Encoding::Rgb8, false, &data).unwrap();
    let cfg = Config { network_image_width: 4, network_image_height: 4, ..Config::default() };
    let good = op_for(&cfg, &img);
    good.check(&img).unwrap();
    let msg = |op: &PreprocessOp| match CpuBackend::new().preprocess(&img, op, &mut Vec::new()) {
        Err(e @ Error::Operation(_)) => e.to_string(),
        other => panic!("expected Error::Operation, got {other:?}"),
    };
    // An operation built for another frame size.
    let other = ImageView::with_encoding(4, 6, 12, Encoding::Rgb8, false, &data[..72]).unwrap();
    assert_eq!(
        msg(&op_for(&cfg, &other)),
        "preprocessing operation does not match the image: built for a 4x6 source, image is 8x6"
    );
    let mut op = good.clone();
    op.x_map.i1[0] = 8;
    assert_eq!(
        msg(&op),
        "preprocessing operation does not match the image: x table indexes outside 0..8"
    );
    let mut op = good.clone();
    op.y_map.w1.pop();
    assert_eq!(
        msg(&op),
        "preprocessing operation does not match the image: y table lengths 3/3/2 (i0/i1/w1), \
         expected 3"
    );
    let mut op = good.clone();
    op.params.content_x = 1;
    assert_eq!(
        msg(&op),
        "preprocessing operation does not match the image: content [1, 0, 4, 3] not inside the 4x4 network image"
    );
    let mut op = good.clone();
    op.params.channels = 2;
    assert_eq!(msg(&op), "preprocessing operation does not match the image: channels 2 (1 or 3)");
    let mut op = good;
    op.x_map.w1[1] = f32::NAN;
    assert_eq!(
        msg(&op),
        "preprocessing operation does not match the image: x table has non-finite weights"
    );
}

/// The source fields an operation carries for the frame (`set_source`: step, encoding,
/// byte order) must be the frame's: the CUDA kernels read them from the operation, so
/// every backend refuses a mismatch the same way, as an operation error.
#[test]
fn an_operation_for_another_encoding_step_or_byte_order_is_an_operation_error() {
    let (data, step) = random_image(Encoding::Rgb16, 8, 6, 4, 2);
    let img = ImageView::with_encoding(8, 6, step, Encoding::Rgb16, false, &data).unwrap();
    let cfg = Config { network_image_width: 4, network_image_height: 4, ..Config::default() };
    let good = op_for(&cfg, &img);
    let mut out = vec![0u8; good.params.tensor_desc().byte_len()];
    CpuBackend::new().process_into(FrameWork::new(&img, &good, None), &mut out).unwrap();
    type Change = fn(&mut PreprocessOp);
    let cases: [(&str, Change); 4] = [
        ("(52, bgr16, 0)", |op| op.params.encoding = Encoding::Bgr16 as u32),
        ("(48, rgb16, 0)", |op| op.params.src_step = 48),
        ("(52, rgb16, 1)", |op| op.params.big_endian = 1),
        ("(52, code 99, 0)", |op| op.params.encoding = 99),
    ];
    for (fields, change) in cases {
        let mut op = good.clone();
        change(&mut op);
        let inner = format!(
            "op.params (src_step, encoding, big_endian) are {fields} but the image has (52, \
             rgb16, 0); call op.params.set_source(&image) for each frame"
        );
        let want = format!("preprocessing operation does not match the image: {inner}");
        let single = CpuBackend::new().process_into(FrameWork::new(&img, &op, None), &mut out);
        assert!(matches!(&single, Err(Error::Operation(_))), "{single:?}");
        assert_eq!(single.unwrap_err().to_string(), want);
        assert_eq!(op.check(&img).unwrap_err().to_string(), want);
        // In a batch the error names the slot (a padded slot's operation is not checked
        // against a frame).
        let slots = [
            BatchSlot::frame(&img, &good),
            BatchSlot { image: None, op: &op },
            BatchSlot::frame(&img, &op),
        ];
        let mut batch = vec![0u8; 3 * out.len()];
        match CpuBackend::new().process_batch_into(BatchWork::new(&slots, None), &mut batch) {
            Err(Error::Operation(m)) => assert_eq!(m, format!("batch slot 2: {inner}")),
            other => panic!("expected Error::Operation, got {other:?}"),
        }
    }
}

#[test]
fn pipeline_handles_every_encoding_and_size_changes() {
    let cfg = Config { network_image_width: 20, network_image_height: 12, ..Config::default() };
    let mut p = Pipeline::new(cfg, Box::new(CpuBackend::new())).unwrap();
    for (i, enc) in Encoding::ALL.into_iter().enumerate() {
        let (w, h) = if i % 2 == 0 { (16, 10) } else { (24, 8) };
        let (data, step) = random_image(enc, w, h, 5, i as u64);
        let img = ImageView::with_encoding(w, h, step, enc, false, &data).unwrap();
        let info = p.process(&img).unwrap();
        assert_eq!(info.desc.shape(), [1, 3, 12, 20]);
        assert_eq!((info.geometry.source_width, info.geometry.source_height), (w, h));
        // Same bytes as a fresh backend on a fresh operation for this frame.
        let mut want = Vec::new();
        CpuBackend::new().preprocess(&img, &op_for(p.config(), &img), &mut want).unwrap();
        assert_eq!(p.tensor_bytes(), &want[..], "{enc}");
    }
}

#[test]
fn pipeline_writes_the_whole_tensor_message_in_place() {
    // process_frames with one input: the serialized Tensor around the tensor the backend wrote in
    // place (data 64-byte aligned), decoding to the frame's header, the config's name and
    // the geometry; frame_id lengths 0..3 and a size change move every later field.
    use vision_preproc::pipeline::FrameInput;
    use vision_preproc::wire::msgs::{Header, Tensor};
    let cfg = Config {
        network_image_width: 13,
        network_image_height: 7,
        tensor_name: "images".into(),
        output_dtype: DType::Float16,
        ..Config::default()
    };
    let mut p = Pipeline::new(cfg, Box::new(CpuBackend::new())).unwrap();
    for (i, frame_id) in ["", "a", "ab", "abc"].into_iter().enumerate() {
        let (w, h) = (30 + 2 * i as u32, 20);
        let (data, step) = random_image(Encoding::Yuyv, w, h, 3, i as u64);
        let img = ImageView::new(w, h, step, "yuv422_yuy2", false, &data).unwrap();
        let header = Header { sec: 7, nanosec: 8 + i as u32, frame_id: frame_id.into() };
        let input = FrameInput::frame(&img, &header, "yuv422_yuy2");
        let info = p.process_frames(&[input]).unwrap();
        let geometry = info.geometries[0].clone().expect("processed");
        let t = Tensor::decode(p.message()).unwrap();
        assert_eq!(t.header, header);
        assert_eq!((t.name, t.layout, t.dtype), ("images", "NCHW", "float16"));
        assert_eq!((t.shape, t.source_encoding), (info.desc.shape().to_vec(), "yuv422_yuy2"));
        assert_eq!((t.source_width, t.source_height), (w, h));
        assert_eq!(t.geometry[0], geometry.scale_x as f32);
        assert_eq!(t.data, p.tensor_bytes());
        assert_eq!(p.tensor_bytes().as_ptr() as usize % 64, 0, "data not 64-byte aligned");
        let mut want = Vec::new();
        CpuBackend::new().preprocess(&img, &op_for(p.config(), &img), &mut want).unwrap();
        assert_eq!(p.tensor_bytes(), &want[..], "frame {i}");
    }
}

#[test]
fn preview_inverts_the_normalization() {
    // A 2x2 rgb8 image through an identity-size stretch: the preview is the image itself.
    let data = [10u8, 20, 30, 40, 50, 60, 70, 80, 90, 200, 210, 220];
    let img = ImageView::new(2, 2, 6, "rgb8", false, &data).unwrap();
    let cfg = Config {
        network_image_width: 2,
        network_image_height: 2,
        resize_mode: ResizeMode::Stretch,
        channel_order: ChannelOrder::Bgr,
        image_mean: vec![0.485, 0.456, 0.406],
        image_stddev: vec![0.229, 0.224, 0.225],
        output_dtype: DType::Float16,
        ..Config::default()
    };
    let mut p = Pipeline::new(cfg, Box::new(CpuBackend::new())).unwrap();
    assert!(matches!(p.preview_image(), Err(Error::Misuse { .. })));
    p.process(&img).unwrap();
    let prev = p.preview_image().unwrap();
    assert_eq!((prev.width, prev.height, prev.channels), (2, 2, 3));
    assert_eq!(prev.data, data);
}
