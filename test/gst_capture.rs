//! `capture::CaptureSource` against real GStreamer (feature `gstreamer`; Debian 12's
//! GStreamer 1.22 with plugins base, good and bad, and gst-launch-1.0).
//!
//! The oracle is independent of the module: `gst-launch-1.0 -q <the same description> !
//! filesink` writes the same pipeline's buffers, whose rows this file strips of
//! GStreamer's padding by the default layout's rule (every row of every plane padded to a
//! multiple of 4 bytes; the file's size checks the rule), and the photographs are decoded
//! by the `image` crate. The tests share one lock: the restart test counts the process's
//! fds and threads (in a process of its own) and the others spawn gst-launch-1.0.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use vision_preproc::capture::{CaptureSource, ClockKind, Frame};
use vision_preproc::{CaptureError, Encoding, Error, ImageView};

/// How long a test waits for one frame.
const WAIT: Duration = Duration::from_secs(10);

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Every frame of a pipeline that ends, and the end of stream it ends with.
fn capture_all(description: &str) -> Vec<Frame> {
    let mut source = CaptureSource::start(description).unwrap_or_else(|e| panic!("{e}"));
    assert!(!source.is_live(), "{description} is not live");
    let mut frames = Vec::new();
    loop {
        match source.next(WAIT) {
            Ok(Some(frame)) => frames.push(frame),
            Ok(None) => panic!("`{description}`: no frame within {WAIT:?}"),
            Err(Error::Capture { fault: CaptureError::EndOfStream, .. }) => break,
            Err(e) => panic!("{e}"),
        }
    }
    source.stop().unwrap();
    frames
}

/// The fault a pipeline ends in, from `start` or a later `next`.
fn fault_of(description: &str) -> (CaptureError, String) {
    let error = match CaptureSource::start(description) {
        Err(e) => e,
        Ok(mut source) => loop {
            match source.next(WAIT) {
                Ok(Some(_)) => continue,
                Ok(None) => panic!("`{description}`: no fault within {WAIT:?}"),
                Err(e) => break e,
            }
        },
    };
    let message = error.to_string();
    match error {
        Error::Capture { description: d, fault } => {
            assert_eq!(d, description);
            (fault, message)
        }
        other => panic!("not a capture error: {other:?}"),
    }
}

/// What gst-launch-1.0 writes for `description` (the source part, as the module takes it).
fn gst_launch_bytes(description: &str) -> Vec<u8> {
    static N: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let path = std::env::temp_dir().join(format!("vp_gst_oracle_{}_{n}.raw", std::process::id()));
    let status = Command::new("gst-launch-1.0")
        .arg("-q")
        .args(description.split_whitespace())
        .args(["!", "filesink", &format!("location={}", path.display())])
        .status()
        .expect("gst-launch-1.0 (Debian: gstreamer1.0-tools)");
    assert!(status.success(), "gst-launch-1.0 {description}: {status}");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    bytes
}

/// Bytes of one row of pixels and the rows of each plane (the Y plane, then NV12/NV21's
/// chroma rows).
fn row_bytes_and_rows(encoding: Encoding, width: usize, height: usize) -> (usize, usize) {
    let bpp = match encoding {
        Encoding::Rgb8 | Encoding::Bgr8 => 3,
        Encoding::Rgba8 | Encoding::Bgra8 => 4,
        Encoding::Mono16 | Encoding::Yuyv | Encoding::Uyvy => 2,
        _ => 1,
    };
    let rows = match encoding {
        Encoding::Nv12 | Encoding::Nv21 => height + height / 2,
        _ => height,
    };
    (width * bpp, rows)
}

/// The pixels of a view without row padding.
fn tight(view: &ImageView<'_>) -> Vec<u8> {
    let (w, h) = (view.width() as usize, view.height() as usize);
    let (row, rows) = row_bytes_and_rows(view.encoding(), w, h);
    let step = view.step() as usize;
    (0..rows).flat_map(|r| view.data()[r * step..r * step + row].to_vec()).collect()
}

/// gst-launch-1.0's output cut into frames of tight rows, by GStreamer's default layout
/// (rows padded to 4 bytes); also that padded step.
fn oracle_frames(
    description: &str,
    encoding: Encoding,
    w: usize,
    h: usize,
) -> (Vec<Vec<u8>>, usize) {
    let bytes = gst_launch_bytes(description);
    let (row, rows) = row_bytes_and_rows(encoding, w, h);
    let stride = row.div_ceil(4) * 4;
    let size = stride * rows;
    assert!(
        !bytes.is_empty() && bytes.len().is_multiple_of(size),
        "{description}: filesink wrote {} bytes, not frames of {rows} rows of {stride} bytes",
        bytes.len()
    );
    let frames = bytes
        .chunks(size)
        .map(|f| (0..rows).flat_map(|r| f[r * stride..r * stride + row].to_vec()).collect())
        .collect();
    (frames, stride)
}

/// (GStreamer caps of the format, our encoding, big-endian)
const RAW: [(&str, Encoding, bool); 13] = [
    ("video/x-raw,format=BGR", Encoding::Bgr8, false),
    ("video/x-raw,format=RGB", Encoding::Rgb8, false),
    ("video/x-raw,format=BGRx", Encoding::Bgra8, false),
    ("video/x-raw,format=BGRA", Encoding::Bgra8, false),
    ("video/x-raw,format=RGBx", Encoding::Rgba8, false),
    ("video/x-raw,format=RGBA", Encoding::Rgba8, false),
    ("video/x-raw,format=GRAY8", Encoding::Mono8, false),
    ("video/x-raw,format=GRAY16_LE", Encoding::Mono16, false),
    ("video/x-raw,format=GRAY16_BE", Encoding::Mono16, true),
    ("video/x-raw,format=YUY2", Encoding::Yuyv, false),
    ("video/x-raw,format=UYVY", Encoding::Uyvy, false),
    ("video/x-raw,format=NV12", Encoding::Nv12, false),
    ("video/x-raw,format=NV21", Encoding::Nv21, false),
];

const BAYER: [(&str, Encoding); 4] = [
    ("rggb", Encoding::BayerRggb8),
    ("bggr", Encoding::BayerBggr8),
    ("gbrg", Encoding::BayerGbrg8),
    ("grbg", Encoding::BayerGrbg8),
];

/// Captures `description` and compares every frame byte for byte with gst-launch-1.0's.
fn check_format(description: &str, encoding: Encoding, big_endian: bool, w: usize, h: usize) {
    let frames = capture_all(description);
    let (expected, stride) = oracle_frames(description, encoding, w, h);
    assert_eq!(frames.len(), 3, "{description}");
    assert_eq!(expected.len(), 3, "{description}");
    let mut last_time = None;
    for (i, (frame, want)) in frames.iter().zip(&expected).enumerate() {
        let view = frame.view().unwrap();
        assert_eq!(
            (view.width() as usize, view.height() as usize, view.encoding(), view.big_endian()),
            (w, h, encoding, big_endian),
            "{description}"
        );
        assert_eq!(
            frame.view().unwrap().step() as usize,
            stride,
            "{description}: the padded step, in place"
        );
        assert!(
            !frame.copied(),
            "{description}: GStreamer's default layout is borrowed, not copied"
        );
        assert_eq!(frame.sequence(), i as u64);
        let got = tight(&view);
        if let Some(at) = got.iter().zip(want).position(|(a, b)| a != b) {
            panic!("{description}: frame {i} differs from gst-launch-1.0's at tight byte {at}");
        }
        assert_eq!(got.len(), want.len(), "{description}");
        let time = frame.capture_time().unwrap_or_else(|| panic!("{description}: no capture time"));
        assert_eq!(time.clock, ClockKind::Monotonic, "GStreamer's default system clock");
        if let Some(t) = last_time {
            assert!(time.clock_ns > t, "{description}: capture times increase");
        }
        last_time = Some(time.clock_ns);
    }
}

#[test]
fn every_accepted_raw_format_equals_gst_launch_byte_for_byte() {
    let _serial = serial();
    for (caps, encoding, big_endian) in RAW {
        // A size without row padding, one with (not for 4:2:2/4:2:0, which need an even
        // width: 322 pads NV12's rows to 324, YUY2/UYVY rows of even widths never pad).
        let padded = match encoding {
            Encoding::Yuyv | Encoding::Uyvy | Encoding::Nv12 | Encoding::Nv21 => (322, 6),
            _ => (321, 7),
        };
        for (w, h) in [(64, 48), padded] {
            let description =
                format!("videotestsrc num-buffers=3 pattern=smpte ! {caps},width={w},height={h}");
            check_format(&description, encoding, big_endian, w, h);
        }
    }
}

#[test]
fn camera_sized_frames_equal_gst_launch_byte_for_byte() {
    let _serial = serial();
    for (caps, encoding) in [
        ("video/x-raw,format=BGR", Encoding::Bgr8),
        ("video/x-raw,format=YUY2", Encoding::Yuyv),
        ("video/x-raw,format=NV12", Encoding::Nv12),
    ] {
        let description =
            format!("videotestsrc num-buffers=3 pattern=smpte ! {caps},width=1920,height=1080");
        check_format(&description, encoding, false, 1920, 1080);
    }
}

#[test]
fn every_bayer_order_equals_gst_launch_byte_for_byte() {
    let _serial = serial();
    for (order, encoding) in BAYER {
        for (w, h) in [(64, 48), (321, 7)] {
            let description = format!(
                "videotestsrc num-buffers=3 pattern=smpte ! video/x-raw,format=ARGB,width={w},height={h} ! rgb2bayer ! video/x-bayer,format={order}"
            );
            check_format(&description, encoding, false, w, h);
        }
    }
}

fn data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("test/data").join(name)
}

#[test]
fn photographs_through_multifilesrc_and_pngdec_equal_the_image_crate() {
    let _serial = serial();
    // chelsea 451 wide: RGB rows of 1353 bytes padded to 1356.
    for (name, encoding) in [
        ("chelsea.png", Encoding::Rgb8),
        ("astronaut.png", Encoding::Rgb8),
        ("camera.png", Encoding::Mono8),
    ] {
        let path = data(name);
        let description = format!(
            "multifilesrc location={} stop-index=0 caps=image/png,framerate=1/1 ! pngdec",
            path.display()
        );
        let frames = capture_all(&description);
        assert_eq!(frames.len(), 1, "{name}");
        let view = frames[0].view().unwrap();
        let decoded = image::open(&path).unwrap();
        let want = match encoding {
            Encoding::Mono8 => decoded.to_luma8().into_raw(),
            _ => decoded.to_rgb8().into_raw(),
        };
        assert_eq!((view.width(), view.height()), (decoded.width(), decoded.height()), "{name}");
        assert_eq!(view.encoding(), encoding, "{name}");
        assert!(!frames[0].copied(), "{name}");
        // A decoder's output is system memory too: lent (a GPU backend reads it in place).
        assert!(frames[0].is_lent(), "{name}: pngdec's buffer is not lent");
        assert!(tight(&view) == want, "{name}: pixels differ from the image crate's");
    }
}

#[test]
fn a_live_source_stamps_frames_on_the_monotonic_clock_now() {
    let _serial = serial();
    let description =
        "videotestsrc is-live=true ! video/x-raw,format=BGR,width=64,height=48,framerate=30/1";
    let mut source = CaptureSource::start(description).unwrap();
    assert!(source.is_live(), "videotestsrc is-live=true is a live source");
    let mut last = 0;
    for _ in 0..5 {
        let frame = source.next(WAIT).unwrap().expect("a frame");
        let mut now = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: clock_gettime writes the timespec it is given, which lives on the stack.
        assert_eq!(unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) }, 0);
        let now_ns = now.tv_sec as u64 * 1_000_000_000 + now.tv_nsec as u64;
        let t = frame.capture_time().unwrap();
        assert_eq!(t.clock, ClockKind::Monotonic);
        // videotestsrc stamps a live frame with the clock's time when it made it.
        assert!(
            t.clock_ns <= now_ns && now_ns - t.clock_ns < 200_000_000,
            "{} vs {now_ns}",
            t.clock_ns
        );
        assert!(t.clock_ns > last);
        last = t.clock_ns;
        assert!(source.clock_now_ns().unwrap() >= t.clock_ns);
    }
    assert_eq!(source.delivered(), 5);
    source.stop().unwrap();
}

/// A pool's buffers are lent to the backend (one block of system memory each, the frame's
/// bytes inside it) and come back again and again (a GPU backend registers each once),
/// each buffer's memory says when it is freed (the pipeline stopped: the registration must
/// go), never while a frame holds it.
#[test]
fn a_pools_buffers_are_lent_and_say_when_they_are_freed() {
    use std::sync::atomic::Ordering;
    use std::sync::Arc;
    use vision_preproc::image::{LentMemory, LentReads};
    let _s = serial();
    let description = "videotestsrc num-buffers=40 ! video/x-raw,format=BGR,width=64,height=48";
    let mut source = CaptureSource::start(description).unwrap();
    let reads = Arc::new(LentReads::default());
    source.count_reads_in(reads.clone());
    let mut memories: Vec<Arc<LentMemory>> = Vec::new();
    let mut held = Vec::new();
    for i in 0..40 {
        let frame = source.next(WAIT).unwrap().expect("a frame");
        assert!(frame.is_lent() && !frame.copied(), "frame {i}: a pool buffer in place");
        let view = frame.view().unwrap();
        let lent = view.lent().expect("the view carries the lent memory");
        let (_, len) = lent.range();
        let at = lent.offset_of(view.data(), 0).expect("the frame lies in its memory");
        assert!(at + view.data().len() <= len && view.data().len() == 64 * 3 * 48);
        assert_eq!(lent.offset_of(view.data(), len - at - view.data().len() + 1), None);
        if !memories.iter().any(|m| Arc::ptr_eq(m, lent.memory())) {
            memories.push(lent.memory().clone());
        }
        assert!(!lent.memory().freed(), "frame {i}: its memory is alive while it is held");
        lent.count_read(if i % 2 == 0 { Ok(()) } else { Err(("test", format!("frame {i}"))) });
        if i == 5 {
            held.push(frame);
        }
    }
    // 40 frames from a few buffers: a fixed pool, each buffer seen many times.
    assert!((2..=8).contains(&memories.len()), "{} memories for 40 frames", memories.len());
    assert_eq!(reads.in_place.load(Ordering::Relaxed), 20);
    assert_eq!(reads.staged.load(Ordering::Relaxed), 20);
    assert_eq!(reads.why_staged.lock().unwrap().as_deref(), Some("frame 39"));
    assert_eq!(reads.staged_by.lock().unwrap().get("test"), Some(&20));
    source.stop().unwrap();
    // The held frame keeps its buffer, and the pool (inactive) its other buffers until
    // that one comes back.
    let kept = held[0].view().unwrap().lent().map(|l| l.memory().clone()).expect("lent");
    assert!(!kept.freed(), "the held frame's memory is alive after the pipeline stopped");
    drop(held);
    // The pool lets its buffers go when its last reference goes, which the streaming
    // thread can hold a moment after the pipeline stopped (seen: all 5 alive at once,
    // none 200 ms later, under load).
    let deadline = Instant::now() + WAIT;
    while !memories.iter().all(|m| m.freed()) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(memories.iter().all(|m| m.freed()), "every buffer's memory said it was freed");
}

#[test]
fn frames_and_sources_move_between_threads() {
    fn send<T: Send>() {}
    send::<Frame>();
    send::<CaptureSource>();
}

#[test]
fn faults_are_named_with_their_fix() {
    let _serial = serial();
    let (fault, message) = fault_of("videotestsrc num-buffers=3 !");
    assert!(matches!(fault, CaptureError::Syntax { .. }), "{fault:?}");
    assert!(
        message.starts_with("inputs `gst:videotestsrc num-buffers=3 !`: syntax error"),
        "{message}"
    );

    let (fault, message) = fault_of("nosuchelement ! video/x-raw");
    assert!(
        matches!(&fault, CaptureError::NoSuchElement { element, .. } if element == "nosuchelement"),
        "{fault:?}"
    );
    assert!(
        message.contains("no GStreamer element `nosuchelement`: install its plugin"),
        "{message}"
    );
    assert!(message.contains("`gst-inspect-1.0 nosuchelement`"), "{message}");

    let (fault, message) = fault_of("videotestsrc nosuchproperty=1");
    assert!(matches!(fault, CaptureError::Property { .. }), "{fault:?}");
    assert!(message.contains("nosuchproperty"), "{message}");

    // I420 is not ours: not negotiated, named with what we take and the fix; a source
    // that is not live fails at start, a live one on its first `next`.
    for live in [false, true] {
        let description = format!(
            "videotestsrc is-live={live} num-buffers=3 ! video/x-raw,format=I420,width=64,height=48"
        );
        let (fault, message) = fault_of(&description);
        assert!(
            matches!(&fault, CaptureError::NotNegotiated { element, offered, .. }
            if offered.contains("I420") && !element.is_empty()),
            "{description}: {fault:?}"
        );
        assert!(message.contains("decodes only video/x-raw BGR, RGB,"), "{message}");
        assert!(message.contains("end the description with `! videoconvert`"), "{message}");
        if !live {
            assert!(
                CaptureSource::start(&description).is_err(),
                "a source that is not live fails at start"
            );
        }
    }

    let (fault, message) = fault_of("v4l2src device=/dev/video_vp_missing");
    assert!(
        matches!(&fault, CaptureError::NoDevice { element, .. } if element.starts_with("v4l2src")),
        "{fault:?}"
    );
    assert!(message.contains("cannot open its device or file"), "{message}");
    assert!(message.contains("/dev/video_vp_missing"), "{message}");
    assert!(message.contains("`v4l2-ctl --list-devices`"), "{message}");

    let (fault, message) =
        fault_of(&format!("filesrc location={} ! jpegdec", data("README.md").display()));
    assert!(
        matches!(&fault, CaptureError::Element { element, .. } if element.starts_with("jpegdec")),
        "{fault:?}"
    );
    assert!(message.contains("element `jpegdec0`: No valid frames decoded"), "{message}");

    // A network source that cannot connect names its address and the server, not a
    // camera; a file source names its path.
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    let url = format!("rtsp://127.0.0.1:{port}/x");
    let (fault, message) = fault_of(&format!("rtspsrc location={url} ! rtpjpegdepay ! jpegdec"));
    assert!(
        matches!(&fault, CaptureError::Unreachable { element, address, .. }
        if element.starts_with("rtspsrc") && *address == url),
        "{fault:?}"
    );
    assert!(message.contains(&format!("element `rtspsrc0` cannot reach {url}: ")), "{message}");
    assert!(
        message.contains("check that the server (a camera, a streaming server) is up"),
        "{message}"
    );
    let alone = format!("gst-launch-1.0 rtspsrc location={url} ! fakesink");
    assert!(message.contains(&format!("`{alone}` tries the source alone")), "{message}");
    assert!(!message.contains("v4l2-ctl") && !message.contains("device"), "{message}");

    // A server that goes away once connected (its end of the RTSP connection closes, as a
    // camera's that dies) is the same fault, named with the source alone to try (quoted:
    // the URL holds `?` and `&`). rtspsrc connects twice (it tries again once); our own
    // connect ends the server's wait for a second one where it did not.
    let dying = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let at = dying.local_addr().unwrap();
    let dying_url = format!("rtsp://{at}/cam?a=1&b=2");
    let server = std::thread::spawn(move || dying.incoming().take(2).for_each(drop));
    let (fault, message) = fault_of(&format!("rtspsrc location={dying_url} ! rtph264depay"));
    let _ = std::net::TcpStream::connect(at);
    server.join().unwrap();
    assert!(
        matches!(&fault, CaptureError::Unreachable { element, address, alone, .. }
        if element.starts_with("rtspsrc") && *address == dying_url
            && *alone == format!("gst-launch-1.0 rtspsrc location='{dying_url}' ! fakesink")),
        "{fault:?}"
    );
    assert!(!message.contains("v4l2-ctl") && !message.contains("device"), "{message}");

    let (fault, message) = fault_of(&format!("tcpclientsrc host=127.0.0.1 port={port} ! jpegdec"));
    assert!(
        matches!(&fault, CaptureError::Unreachable { element, address, .. }
        if element.starts_with("tcpclientsrc") && *address == format!("127.0.0.1:{port}")),
        "{fault:?}"
    );
    assert!(message.contains(&format!("cannot reach 127.0.0.1:{port}: ")), "{message}");
    let alone = format!("gst-launch-1.0 tcpclientsrc host=127.0.0.1 port={port} ! fakesink");
    assert!(message.contains(&alone), "{message}");

    let (fault, message) = fault_of("filesrc location=/nonexistent_vp ! jpegdec");
    assert!(
        matches!(&fault, CaptureError::NoFile { element, path, .. }
        if element.starts_with("filesrc") && path == "/nonexistent_vp"),
        "{fault:?}"
    );
    assert!(message.contains("cannot read the file /nonexistent_vp: "), "{message}");
    assert!(message.contains("check that it exists and is readable"), "{message}");
    assert!(!message.contains("v4l2-ctl") && !message.contains("device"), "{message}");
    // multifilesrc fails on its first read (a `Read` error, not an open error).
    let (fault, _) = fault_of("multifilesrc location=/nonexistent_vp_%d.png ! pngdec");
    assert!(
        matches!(&fault, CaptureError::NoFile { element, path, .. }
        if element.starts_with("multifilesrc") && path == "/nonexistent_vp_%d.png"),
        "{fault:?}"
    );

    let (fault, message) =
        fault_of("videotestsrc num-buffers=1 ! video/x-raw,format=YUY2,width=321,height=4");
    assert!(matches!(fault, CaptureError::Frame { .. }), "{fault:?}");
    assert!(message.contains("YUY2 at odd width 321"), "{message}");

    // End of stream after num-buffers: three frames, then the named end.
    let mut source =
        CaptureSource::start("videotestsrc num-buffers=3 ! video/x-raw,format=GRAY8").unwrap();
    for _ in 0..3 {
        assert!(source.next(WAIT).unwrap().is_some());
    }
    let message = source.next(WAIT).unwrap_err().to_string();
    assert!(
        message.starts_with(
            "inputs `gst:videotestsrc num-buffers=3 ! video/x-raw,format=GRAY8`: end of stream"
        ),
        "{message}"
    );
}

#[test]
fn cuda_memory_is_refused_with_the_fix_without_a_shared_gpu_context() {
    let _guard = serial();
    // CUDA memory to an appsink that was given no CUDA context (the CPU backend, or no
    // GStreamer CUDA library): not negotiated, and the message says what to do.
    let description = "videotestsrc num-buffers=3 ! \
                       video/x-raw(memory:CUDAMemory),format=NV12,width=64,height=48";
    let (fault, message) = fault_of(description);
    assert!(
        matches!(&fault, CaptureError::NotNegotiated { element, offered, .. }
            if element.starts_with("videotestsrc") && offered.contains("memory:CUDAMemory")),
        "{fault:?}"
    );
    assert!(message.contains("`! cudadownload`"), "{message}");
    // Without a driver (this machine), wrapping a context is refused by name, never a
    // crash; the status says whether GStreamer's CUDA library loads.
    // SAFETY: only tries to dlopen libcuda.
    if unsafe { libloading::Library::new("libcuda.so.1") }.is_err() {
        let fake = vision_preproc::DeviceContext {
            handle: 0x1000,
            device: 0,
            keep: std::sync::Arc::new(()),
        };
        let e = vision_preproc::capture::GpuShare::new(fake).err().expect("refused");
        assert!(e.contains("libgstcuda") && e.contains("libcuda.so.1"), "{e}");
    }
    let status = vision_preproc::capture::cuda_status();
    assert!(
        status.contains("GStreamer's CUDA library loads")
            || status.contains("no GStreamer CUDA library"),
        "{status}"
    );
}

#[test]
fn a_source_without_frames_times_out_with_none() {
    let _serial = serial();
    // A live source at 1 frame per 10 s: after its first frame, nothing for a while.
    let mut source = CaptureSource::start(
        "videotestsrc is-live=true ! video/x-raw,format=GRAY8,width=8,height=8,framerate=1/10",
    )
    .unwrap();
    assert!(source.next(WAIT).unwrap().is_some());
    let t0 = std::time::Instant::now();
    assert!(source.next(Duration::from_millis(300)).unwrap().is_none());
    let waited = t0.elapsed();
    assert!(waited >= Duration::from_millis(300) && waited < Duration::from_secs(2), "{waited:?}");
}

fn count(dir: &str) -> usize {
    std::fs::read_dir(dir).unwrap().count()
}

/// Growth of the process's fds and threads allowed over 100 restarts (GStreamer's task
/// pool keeps idle threads for reuse; nothing may grow per restart).
const RESTART_FD_GROWTH: usize = 4;
const RESTART_THREAD_GROWTH: usize = 4;

#[test]
fn restarting_100_times_leaks_no_fd_or_thread() {
    let _serial = serial();
    // In a process of its own: the harness's other test threads would count here.
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "restart_100_times_in_this_process",
            "--test-threads=1",
            "--nocapture",
        ])
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("1 passed"), "{text}");
    let line = text.lines().find_map(|l| l.split_once("restarts:")).map(|(_, r)| r);
    println!("restarts:{}", line.unwrap_or(" (no count printed)"));
}

#[test]
#[ignore = "run by restarting_100_times_leaks_no_fd_or_thread in a process of its own"]
fn restart_100_times_in_this_process() {
    let description =
        "videotestsrc is-live=true ! video/x-raw,format=YUY2,width=64,height=48,framerate=30/1";
    let once = || {
        let mut source = CaptureSource::start(description).unwrap();
        let frame = source.next(WAIT).unwrap().expect("a frame");
        source.stop().unwrap();
        // A frame outlives its source (it owns its buffer).
        assert_eq!(frame.view().unwrap().width(), 64);
    };
    for _ in 0..3 {
        once();
    }
    let (fds, threads) = (count("/proc/self/fd"), count("/proc/self/task"));
    for _ in 0..100 {
        once();
    }
    let (fds_after, threads_after) = (count("/proc/self/fd"), count("/proc/self/task"));
    println!("restarts: fds {fds} -> {fds_after}, threads {threads} -> {threads_after} over 100 restarts");
    assert!(fds_after <= fds + RESTART_FD_GROWTH, "fds {fds} -> {fds_after}");
    assert!(
        threads_after <= threads + RESTART_THREAD_GROWTH,
        "threads {threads} -> {threads_after}"
    );
}
