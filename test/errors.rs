//! Every invalid image (each `ImageError` variant) and every configuration rule (except
//! `conv.*`, tested with conv2d) gives a typed error whose message names the field or
//! parameter, the bad value and the valid range. Messages are asserted in full.

use vision_preproc::config::{set_param, Config, MAX_NETWORK_SIZE};
use vision_preproc::error::ImageError;
use vision_preproc::pipeline::Geometry;
use vision_preproc::{Encoding, Error, ImageView};

fn image_err(w: u32, h: u32, step: u32, enc: &str, len: usize) -> ImageError {
    let data = vec![0u8; len];
    ImageView::new(w, h, step, enc, false, &data).unwrap_err()
}

#[test]
fn unknown_encoding() {
    let e = image_err(2, 2, 6, "8UC3", 12);
    assert_eq!(e, ImageError::UnknownEncoding("8UC3".into()));
    assert_eq!(
        e.to_string(),
        "encoding `8UC3` is not supported; use one of: rgb8, bgr8, rgba8, bgra8, mono8, mono16, \
         rgb16, bgr16, yuyv (alias yuv422_yuy2), uyvy (alias yuv422), nv12, nv21, bayer_rggb8, \
         bayer_bggr8, bayer_gbrg8, bayer_grbg8"
    );
    // Names are exact: ROS spells them in lower case.
    assert!(matches!(image_err(2, 2, 6, "RGB8", 12), ImageError::UnknownEncoding(_)));
    assert!(matches!(image_err(2, 2, 6, "bayer_rggb16", 12), ImageError::UnknownEncoding(_)));
}

#[test]
fn zero_size() {
    let e = image_err(0, 4, 0, "mono8", 0);
    assert_eq!(e, ImageError::ZeroSize { width: 0, height: 4 });
    assert_eq!(e.to_string(), "width 0 x height 4: both must be at least 1");
    assert_eq!(image_err(3, 0, 3, "mono8", 0), ImageError::ZeroSize { width: 3, height: 0 });
}

#[test]
fn step_too_small() {
    let e = image_err(640, 2, 1279, "yuyv", 2558);
    assert_eq!(
        e,
        ImageError::StepTooSmall { step: 1279, bpp: 2, min: 1280, encoding: Encoding::Yuyv }
    );
    assert_eq!(
        e.to_string(),
        "step 1279 < width*2 (1280) for encoding yuyv; step is the row length in bytes"
    );
    // 16-bit colour: 6 bytes per pixel. u32::MAX * 6 does not fit 32 bits but is compared
    // in 64: the error is still a clean StepTooSmall.
    let e = image_err(u32::MAX, 1, u32::MAX, "rgb16", 0);
    assert!(matches!(e, ImageError::StepTooSmall { min: 25769803770, .. }), "{e:?}");
}

#[test]
fn data_size() {
    let e = image_err(4, 3, 12, "rgb8", 35);
    assert_eq!(
        e,
        ImageError::DataSize {
            len: 35,
            expected: 36,
            expected_expr: "step*height",
            encoding: Encoding::Rgb8
        }
    );
    assert_eq!(e.to_string(), "data is 35 bytes but step*height = 36 for encoding rgb8");
    // Too long is as wrong as too short.
    assert!(matches!(image_err(4, 3, 12, "rgb8", 37), ImageError::DataSize { len: 37, .. }));
    // NV12: a Y plane of `height` rows and height/2 chroma rows.
    let e = image_err(4, 4, 4, "nv12", 16);
    assert_eq!(e.to_string(), "data is 16 bytes but step*height*3/2 = 24 for encoding nv12");
}

#[test]
fn overflow() {
    // step*height = 196608 * 65536 > 2^31 - 1: every GPU index is 32-bit.
    let e = image_err(65536, 65536, 196608, "rgb8", 0);
    assert_eq!(
        e,
        ImageError::Overflow {
            width: 65536,
            height: 65536,
            step: 196608,
            encoding: Encoding::Rgb8
        }
    );
    assert_eq!(
        e.to_string(),
        "width 65536 x height 65536 with step 196608 overflows the byte count for encoding rgb8"
    );
}

#[test]
fn odd_width_for_422() {
    for (enc, e) in [("yuyv", Encoding::Yuyv), ("yuv422", Encoding::Uyvy)] {
        let err = image_err(5, 2, 10, enc, 20);
        assert_eq!(err, ImageError::OddWidth { width: 5, encoding: e });
        assert_eq!(
            err.to_string(),
            format!("width 5 is odd; {e} packs 2 pixels per 4 bytes, so width must be even")
        );
    }
}

#[test]
fn odd_size_for_420() {
    let e = image_err(4, 5, 4, "nv21", 30);
    assert_eq!(e, ImageError::OddSize { width: 4, height: 5, encoding: Encoding::Nv21 });
    assert_eq!(
        e.to_string(),
        "width 4 x height 5: nv21 subsamples chroma 2x2, so both must be even"
    );
    assert!(matches!(image_err(3, 4, 3, "nv12", 18), ImageError::OddSize { width: 3, .. }));
}

#[test]
fn roi_outside() {
    let cfg = Config { roi: vec![600, 10, 50, 20], ..Config::default() };
    let e = Geometry::resolve(&cfg, 640, 480).unwrap_err();
    assert_eq!(e, ImageError::RoiOutside { x: 600, y: 10, w: 50, h: 20, width: 640, height: 480 });
    assert_eq!(
        e.to_string(),
        "roi [x 600, y 10, width 50, height 20] is not inside the 640x480 image; shrink `roi` \
         or set it to [] for the whole image"
    );
    // Through the crate error, as the pipeline reports it.
    let wrapped: Error = e.into();
    assert!(wrapped.to_string().starts_with("invalid image: roi [x 600"), "{wrapped}");
}

/// The message of `cfg.validate()`, which must be a `Config` or `Range` error for `param`.
fn config_err(cfg: Config, param: &str) -> String {
    match cfg.validate() {
        Err(Error::Config { param: p, .. } | Error::Range { param: p, .. }) if p != param => {
            panic!("error names `{p}`, expected `{param}`")
        }
        Err(e @ (Error::Config { .. } | Error::Range { .. })) => e.to_string(),
        other => panic!("expected a Config error for `{param}`, got {other:?}"),
    }
}

#[test]
fn network_size() {
    let d = Config::default;
    assert_eq!(
        config_err(Config { network_image_width: 0, ..d() }, "network_image_width"),
        "network_image_width must be in [1, 8192] (got 0)"
    );
    assert_eq!(
        config_err(
            Config { network_image_height: MAX_NETWORK_SIZE + 1, ..d() },
            "network_image_height"
        ),
        "network_image_height must be in [1, 8192] (got 8193)"
    );
    Config { network_image_width: 1, network_image_height: 8192, ..d() }.validate().unwrap();
}

#[test]
fn roi_shape_and_values() {
    let d = Config::default;
    assert_eq!(
        config_err(Config { roi: vec![1, 2, 3], ..d() }, "roi"),
        "parameter `roi`: [1, 2, 3] is invalid; give [x, y, width, height] or [] for the whole image"
    );
    assert_eq!(
        config_err(Config { roi: vec![-1, 0, 10, 10], ..d() }, "roi"),
        "parameter `roi`: [-1, 0, 10, 10] is invalid; x and y must be >= 0, width and height >= 1"
    );
    assert_eq!(
        config_err(Config { roi: vec![0, 0, 0, 10], ..d() }, "roi"),
        "parameter `roi`: [0, 0, 0, 10] is invalid; x and y must be >= 0, width and height >= 1"
    );
    assert_eq!(
        config_err(Config { roi: vec![0, 0, 10, 4294967296], ..d() }, "roi"),
        "parameter `roi`: [0, 0, 10, 4294967296] is invalid; values must fit in 32 bits"
    );
}

#[test]
fn pad_value() {
    let d = Config::default;
    assert_eq!(
        config_err(Config { pad_value: vec![1.0, 2.0], ..d() }, "pad_value"),
        "parameter `pad_value`: [1.0, 2.0] is invalid; give 1 value or 3 (one per output channel)"
    );
    assert_eq!(
        config_err(Config { pad_value: vec![0.0, 255.5, 0.0], ..d() }, "pad_value"),
        "pad_value must be in [0, 255] for each value (source 8-bit pixel units) (got [0.0, \
         255.5, 0.0])"
    );
    assert!(config_err(Config { pad_value: vec![f64::NAN], ..d() }, "pad_value").contains("NaN"));
}

#[test]
fn pixel_scale() {
    let d = Config::default;
    for v in [0.0, f64::INFINITY, f64::NAN] {
        let msg = config_err(Config { pixel_scale: v, ..d() }, "pixel_scale");
        assert_eq!(
            msg,
            format!(
                "parameter `pixel_scale`: {v} is invalid; use a finite, non-zero factor (e.g. \
                 0.00392156862745098 = 1/255)"
            )
        );
    }
}

#[test]
fn output_channels() {
    assert_eq!(
        config_err(Config { output_channels: 2, ..Config::default() }, "output_channels"),
        "output_channels must be in [1, 3] with step 2 (got 2)"
    );
}

#[test]
fn mean_and_stddev() {
    let d = Config::default;
    // One value per OUTPUT channel: 3 values for a 1-channel output are wrong.
    assert_eq!(
        config_err(
            Config { output_channels: 1, image_stddev: vec![0.5], ..d() },
            "image_mean"
        ),
        "parameter `image_mean`: [0.5, 0.5, 0.5] is invalid; give 1 value or 1 (one per output channel)"
    );
    assert_eq!(
        config_err(Config { image_stddev: vec![0.5, 0.5], ..d() }, "image_stddev"),
        "parameter `image_stddev`: [0.5, 0.5] is invalid; give 1 value or 3 (one per output channel)"
    );
    assert_eq!(
        config_err(Config { image_mean: vec![f64::NAN], ..d() }, "image_mean"),
        "parameter `image_mean`: [NaN] is invalid; values must be finite"
    );
    assert_eq!(
        config_err(Config { image_stddev: vec![0.5, 0.0, 0.5], ..d() }, "image_stddev"),
        "parameter `image_stddev`: [0.5, 0.0, 0.5] is invalid; values must be finite and non-zero"
    );
    assert_eq!(
        config_err(Config { image_stddev: vec![f64::INFINITY], ..d() }, "image_stddev"),
        "parameter `image_stddev`: [inf] is invalid; values must be finite and non-zero"
    );
}

#[test]
fn tensor_name_qos_and_debug_rate() {
    let d = Config::default;
    assert_eq!(
        config_err(Config { tensor_name: String::new(), ..d() }, "tensor_name"),
        "parameter `tensor_name`: \"\" is invalid; give the network input's name, e.g. \"input\""
    );
    assert_eq!(
        config_err(Config { input_qos_depth: 0, ..d() }, "input_qos_depth"),
        "input_qos_depth must be in [1, 100] (got 0)"
    );
    assert_eq!(
        config_err(Config { output_qos_depth: 101, ..d() }, "output_qos_depth"),
        "output_qos_depth must be in [1, 100] (got 101)"
    );
    assert_eq!(
        config_err(Config { debug_image_rate: -1.0, ..d() }, "debug_image_rate"),
        "parameter `debug_image_rate`: -1 is invalid; use a rate in Hz >= 0 (0 disables debug_image)"
    );
}

#[test]
fn yaml_errors_name_the_parameter() {
    let e = Config::from_yaml_str("resize_mode: fit\n", "f.yaml").unwrap_err();
    assert!(matches!(e, Error::Yaml { .. }));
    let msg = e.to_string();
    assert!(
        msg.starts_with("f.yaml: parameter `resize_mode`: unknown variant `fit`, expected one of"),
        "{msg}"
    );
    let e = Config::from_yaml_str("conv: {kernl: box}\n", "f.yaml").unwrap_err().to_string();
    assert_eq!(
        e,
        "f.yaml: `conv.kernl` is not a parameter of vision_preproc (ignored); did you mean \
         `conv.kernel`?"
    );
    let e = Config::from_yaml_str("roi: [1, 2, 3, x]\n", "f.yaml").unwrap_err().to_string();
    assert!(e.starts_with("f.yaml: parameter `roi[3]`: invalid type"), "{e}");
    // Broken YAML names the file.
    let e = Config::from_yaml_str("a: [\n", "f.yaml").unwrap_err();
    assert!(matches!(e, Error::Yaml { ref context, .. } if context == "f.yaml"), "{e:?}");
}

#[test]
fn overrides_set_any_parameter() {
    let sets = |v: &[(&str, &str)]| -> Vec<(String, String)> {
        v.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    let cfg = Config::from_yaml_str_with_overrides(
        "node:\n  ros__parameters:\n    network_image_width: 320\n",
        "t",
        &sets(&[
            ("network_image_height", "200"),
            ("roi", "[0, 0, 64, 48]"),
            ("resize_mode", "center_crop"),
            ("pixel_scale", "1"),
            ("image_mean", "[0.1]"),
            ("output_layout", "NHWC"),
        ]),
    )
    .unwrap();
    assert_eq!((cfg.network_image_width, cfg.network_image_height), (320, 200));
    assert_eq!(cfg.roi, vec![0, 0, 64, 48]);
    assert_eq!(cfg.pixel_scale, 1.0);
    assert_eq!(cfg.image_mean, vec![0.1]);
    // Later overrides win; the result is validated.
    let e = Config::from_yaml_str_with_overrides(
        "",
        "defaults",
        &sets(&[("output_channels", "1"), ("output_channels", "2")]),
    )
    .unwrap_err();
    assert_eq!(e.to_string(), "output_channels must be in [1, 3] with step 2 (got 2)");
    // Unknown keys are named (an error in the strict loader; a warning in the CLI's).
    let e = Config::from_yaml_str_with_overrides("", "defaults", &sets(&[("network_width", "3")]))
        .unwrap_err()
        .to_string();
    assert_eq!(
        e,
        "--set: `network_width` is not a parameter of vision_preproc (ignored); did you mean \
         `network_image_width`?"
    );
}

#[test]
fn override_syntax_errors() {
    let mut params = serde_yaml::Value::Mapping(Default::default());
    let e = set_param(&mut params, "conv..kernel", "box").unwrap_err();
    assert_eq!(
        e.to_string(),
        "parameter `--set`: \"conv..kernel\" is invalid; give a parameter name, dotted for \
         nested ones (e.g. conv.kernel)"
    );
    let e = set_param(&mut params, "roi", "[1, 2").unwrap_err();
    assert!(e.to_string().starts_with("parameter `roi`: \"[1, 2\" is invalid; give a YAML value"));
    set_param(&mut params, "network_image_width", "5").unwrap();
    let e = set_param(&mut params, "network_image_width.x", "5").unwrap_err();
    assert_eq!(
        e.to_string(),
        "parameter `network_image_width`: \"network_image_width.x\" is invalid; \
         `network_image_width` is a value, not a group of parameters"
    );
    set_param(&mut params, "conv.kernel", "box").unwrap();
    assert_eq!(params["conv"]["kernel"], serde_yaml::Value::String("box".into()));
}

/// `e` is a misuse of `call` (a call out of order, a broken invariant): not the operation
/// error, and never a device failure (no `gpu_failure_policy` starts on it).
fn assert_misuse(e: Error, call: &str) {
    assert!(matches!(&e, Error::Misuse { call: c, .. } if c == call), "{call}: {e:?}");
    assert!(!e.is_device_failure(), "{e:?}");
}

#[test]
fn misuses_reachable_without_a_gpu_are_misuse() {
    use vision_preproc::backend::cpu::CpuBackend;
    use vision_preproc::backend::{Backend, BatchWork, Out};
    use vision_preproc::pipeline::preprocess_op;
    use vision_preproc::Pipeline;

    // A preview before any frame was processed.
    let mut p = Pipeline::new(Config::default(), Box::new(CpuBackend::new())).unwrap();
    let e = p.preview_image().unwrap_err();
    assert_eq!(e.to_string(), "preview: no frame has been processed yet; process one first");
    assert_misuse(e, "preview");
    // A set of no frame.
    assert_misuse(p.process_frames(&[]).unwrap_err(), "submit");
    // A backend asked to finish with nothing in flight, or to write device memory it
    // does not have, or to compute an empty batch.
    let mut cpu = CpuBackend::new();
    let e = cpu.finish_oldest().unwrap_err();
    assert_eq!(e.to_string(), "finish_oldest: nothing in flight on cpu");
    assert_misuse(e, "finish_oldest");
    let data = [9u8; 4 * 4 * 3];
    let image = ImageView::new(4, 4, 12, "rgb8", false, &data).unwrap();
    let cfg = Config { network_image_width: 2, network_image_height: 2, ..Config::default() };
    let mut op = preprocess_op(&cfg, &Geometry::resolve(&cfg, 4, 4).unwrap());
    op.params.set_source(&image);
    let job = vision_preproc::backend::Job::Frame(vision_preproc::backend::FrameWork::new(
        &image, &op, None,
    ));
    let device = Out::Device { ptr: 0, len: 12, host: None, ready: None };
    // SAFETY: refused before anything is written (no memory is behind `device`).
    assert_misuse(unsafe { cpu.submit_to(job, device) }.unwrap_err(), "submit_to");
    let empty = cpu.process_batch_into(BatchWork::new(&[], None), &mut []).unwrap_err();
    assert_misuse(empty, "process_batch");
}
