//! The NVTX ranges (src/nvtx.rs) as a profiler sees them, on the CPU backend: an NVTX
//! injection library (test/nvtx/record_ranges.c, compiled here with `cc`) is loaded the
//! way Nsight Systems and Nsight Compute load theirs (`NVTX_INJECTION64_PATH`, through the
//! real NVTX library of the nvidia-nvtx-cu12 wheel, `VISION_PREPROC_NVTX_LIBRARY` from
//! .ros/env.sh) and records every range with its thread. Checked: the names, that each
//! stage range nests in its frame range on the same thread, that push and pop balance,
//! that the frame numbers count up; and that without `NVTX_INJECTION64_PATH` the NVTX
//! library is not even loaded.
//!
//! Frames: the real CLI (`bench-cpu`, the whole `Pipeline::process` per frame) on a test
//! photograph. A batch: this test binary run again as a child process (the variable
//! must be set before the first range), `Pipeline::process_frames` on two photographs
//! and a padded slot.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;
use vision_preproc::nvtx::{self, Stage};

const RECORD_ENV: &str = "VP_NVTX_RECORD";
const CHILD_ENV: &str = "VP_NVTX_TEST_CHILD";

fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("nvtx");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{}-{name}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// The NVTX library the set-up installed (never skipped: a missing one fails the test).
fn nvtx_library() -> String {
    let lib = std::env::var(nvtx::LIBRARY_ENV).unwrap_or_default();
    assert!(
        !lib.is_empty() && Path::new(&lib).is_file(),
        "{} is {lib:?}, not a file: the NVTX library (libnvToolsExt.so.1 of the \
         nvidia-nvtx-cu12 wheel) comes from scripts/setup/setup.sh; run it and `source .ros/env.sh`",
        nvtx::LIBRARY_ENV
    );
    lib
}

/// The injection library, compiled once per test process.
fn recorder() -> &'static Path {
    static LIB: OnceLock<PathBuf> = OnceLock::new();
    LIB.get_or_init(|| {
        let out = scratch("librecord_ranges.so");
        let src = root().join("test/nvtx/record_ranges.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let status = Command::new(&cc)
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o"])
            .arg(&out)
            .arg(&src)
            .arg("-lpthread")
            .status()
            .unwrap_or_else(|e| {
                panic!("running the C compiler {cc:?} (set CC, or install gcc/clang): {e}")
            });
        assert!(status.success(), "{cc} failed to compile {}", src.display());
        out
    })
}

/// One recorded event.
#[derive(Debug, Clone, PartialEq)]
enum Event {
    Init,
    Push { tid: u64, name: String },
    Pop { tid: u64 },
    Start { id: u64, name: String },
    End { id: u64 },
}

fn parse(path: &Path) -> Vec<Event> {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no NVTX record at {}: {e}", path.display()));
    text.lines()
        .map(|line| {
            let mut f = line.splitn(3, ' ');
            let (kind, a, rest) = (f.next().unwrap(), f.next(), f.next());
            let num = |s: Option<&str>| s.unwrap().parse::<u64>().unwrap();
            match kind {
                "init" => Event::Init,
                "push" => Event::Push { tid: num(a), name: rest.unwrap_or("").into() },
                "pop" => Event::Pop { tid: num(a) },
                "start" => {
                    let name = rest.unwrap().split_once(' ').unwrap().1;
                    Event::Start { id: num(a), name: name.into() }
                }
                "end" => Event::End { id: num(a) },
                _ => panic!("unknown record line {line:?}"),
            }
        })
        .collect()
}

/// A push/pop range as recorded: its name, its thread, the names of the ranges around
/// it (outermost first), and the event indices of its push and pop.
#[derive(Debug)]
struct Range {
    name: String,
    tid: u64,
    parents: Vec<String>,
    pushed: usize,
    popped: usize,
}

/// The push/pop ranges, each thread's pushes and pops balanced (checked).
fn ranges(events: &[Event]) -> Vec<Range> {
    assert_eq!(events.first(), Some(&Event::Init), "the recorder's first line is init");
    let mut stacks: HashMap<u64, Vec<(String, usize)>> = HashMap::new();
    let mut out = Vec::new();
    for (i, e) in events.iter().enumerate() {
        match e {
            Event::Push { tid, name } => stacks.entry(*tid).or_default().push((name.clone(), i)),
            Event::Pop { tid } => {
                let stack = stacks.entry(*tid).or_default();
                let (name, pushed) =
                    stack.pop().unwrap_or_else(|| panic!("event {i}: pop with nothing pushed"));
                let parents = stack.iter().map(|(n, _)| n.clone()).collect();
                out.push(Range { name, tid: *tid, parents, pushed, popped: i });
            }
            _ => {}
        }
    }
    for (tid, stack) in stacks {
        assert!(stack.is_empty(), "thread {tid}: ranges never popped: {stack:?}");
    }
    out.sort_by_key(|r| r.pushed);
    out
}

fn stage_names() -> Vec<&'static str> {
    Stage::ALL.iter().map(|s| s.name()).collect()
}

/// Run the CLI with `env`, checking that it succeeds.
fn cli(args: &[&str], env: &[(&str, &str)], unset: &[&str]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_vision_preproc"));
    cmd.args(args).current_dir(root());
    for k in unset {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "vision_preproc {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `bench-cpu` on a photograph, conv2d on: 1 warm-up + 3 timed frames.
const BENCH_FRAMES: [&str; 9] = [
    "bench-cpu",
    "test/data/chelsea.png",
    "--frames",
    "3",
    "--warmup",
    "1",
    "--threads",
    "2",
    "--set=conv.kernel=gaussian",
];

#[test]
fn frames_on_the_cpu_backend_have_nested_stage_ranges() {
    let (lib, record) = (nvtx_library(), scratch("frames.txt"));
    let recorder = recorder().to_str().unwrap();
    cli(
        &BENCH_FRAMES,
        &[
            (nvtx::INJECTION_ENV, recorder),
            (nvtx::LIBRARY_ENV, &lib),
            (RECORD_ENV, record.to_str().unwrap()),
        ],
        &[],
    );
    let all = ranges(&parse(&record));
    let frames: Vec<&Range> = all.iter().filter(|r| r.name.starts_with("frame ")).collect();
    // The frame numbers: 1, 2, 3, 4 (the pipeline's frame sets), one after the other.
    let names: Vec<&str> = frames.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["frame 1", "frame 2", "frame 3", "frame 4"], "{all:#?}");
    assert!(frames.iter().all(|f| f.parents.is_empty()), "a frame range is outermost");
    assert!(frames.windows(2).all(|w| w[0].popped < w[1].pushed), "frames overlap");
    // Every other range is a stage range inside a frame range of its thread; each frame
    // has exactly one preprocess and one conv (the CPU backend has no copies).
    for r in all.iter().filter(|r| !r.name.starts_with("frame ")) {
        assert!(stage_names().contains(&r.name.as_str()), "unknown range {r:?}");
        assert!(matches!(r.parents.as_slice(), [f] if f.starts_with("frame ")), "{r:?}");
    }
    for f in &frames {
        let inside: Vec<&str> = all
            .iter()
            .filter(|r| r.tid == f.tid && r.pushed > f.pushed && r.popped < f.popped)
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(inside, ["preprocess", "conv"], "inside {}", f.name);
    }
}

/// The child process of [`a_batch_has_a_range_per_item`] (a no-op otherwise).
#[test]
fn batch_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    use vision_preproc::pipeline::FrameInput;
    use vision_preproc::wire::msgs::Header;
    use vision_preproc::{Config, ImageView, Pipeline};
    let photos: Vec<image::RgbImage> = ["chelsea.png", "coffee.png"]
        .iter()
        .map(|f| image::open(root().join("test/data").join(f)).unwrap().to_rgb8())
        .collect();
    let views: Vec<ImageView<'_>> = photos
        .iter()
        .map(|p| {
            ImageView::new(p.width(), p.height(), p.width() * 3, "rgb8", false, p.as_raw()).unwrap()
        })
        .collect();
    let mut cfg = Config {
        inputs: vec!["a".into(), "b".into(), "c".into()],
        network_image_width: 96,
        network_image_height: 64,
        ..Config::default()
    };
    cfg.conv.kernel = vision_preproc::config::ConvKernel::Gaussian;
    let cpu = vision_preproc::backend::cpu::CpuBackend::new();
    let mut pipeline = Pipeline::new(cfg, Box::new(cpu)).unwrap();
    let header = Header::default();
    let item = |image| FrameInput {
        topic: "",
        image,
        header: &header,
        source_encoding: "rgb8",
        repeated: false,
    };
    for _ in 0..2 {
        let items = [item(Some((&views[0]).into())), item(None), item(Some((&views[1]).into()))];
        pipeline.process_frames(&items).unwrap();
    }
}

#[test]
fn a_batch_has_a_range_per_item() {
    let (lib, record) = (nvtx_library(), scratch("batch.txt"));
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "batch_child", "--test-threads", "1"])
        .env(CHILD_ENV, "1")
        .env(nvtx::INJECTION_ENV, recorder())
        .env(nvtx::LIBRARY_ENV, &lib)
        .env(RECORD_ENV, &record)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stdout));
    let all = ranges(&parse(&record));
    let batches: Vec<&Range> = all.iter().filter(|r| r.name.starts_with("batch ")).collect();
    let names: Vec<&str> = batches.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["batch 1 (3 items)", "batch 2 (3 items)"], "{all:#?}");
    for b in &batches {
        // The slots run on rayon's threads: per slot with a frame (0 and 2, not the
        // padded 1) an item range during the batch, holding preprocess then conv.
        let items: Vec<&Range> = all
            .iter()
            .filter(|r| r.name.starts_with("item ") && r.pushed > b.pushed && r.popped < b.popped)
            .collect();
        let mut slots: Vec<&str> = items.iter().map(|r| r.name.as_str()).collect();
        slots.sort();
        assert_eq!(slots, ["item 0", "item 2"], "during {}", b.name);
        for it in items {
            // On the batch's thread an item nests in the batch; on a worker it is
            // outermost (or inside another item whose stage the worker waits in).
            for p in &it.parents {
                assert!(p == &b.name || p.starts_with("item ") || p == "preprocess", "{it:?}");
            }
            let inside: Vec<&str> = all
                .iter()
                .filter(|r| r.tid == it.tid && r.pushed > it.pushed && r.popped < it.popped)
                .filter(|r| r.parents.last() == Some(&it.name))
                .map(|r| r.name.as_str())
                .collect();
            assert_eq!(inside, ["preprocess", "conv"], "inside {it:?}");
        }
    }
    for r in all.iter().filter(|r| stage_names().contains(&r.name.as_str())) {
        assert!(r.parents.iter().any(|p| p.starts_with("item ")), "{r:?} outside an item");
    }
}

#[test]
fn without_a_tool_the_nvtx_library_is_not_loaded() {
    let (lib, record) = (nvtx_library(), scratch("off.txt"));
    let lib_file = Path::new(&lib).file_name().unwrap().to_str().unwrap().to_string();
    // The dynamic loader lists every library it loads (LD_DEBUG=files, on stderr).
    let run = |tool: bool| {
        let recorder = recorder().to_str().unwrap();
        let mut env = vec![
            (nvtx::LIBRARY_ENV, lib.as_str()),
            (RECORD_ENV, record.to_str().unwrap()),
            ("LD_DEBUG", "files"),
        ];
        let unset: &[&str] = if tool {
            env.push((nvtx::INJECTION_ENV, recorder));
            &[]
        } else {
            &[nvtx::INJECTION_ENV]
        };
        let out = cli(&BENCH_FRAMES, &env, unset);
        String::from_utf8_lossy(&out.stderr).contains(&lib_file)
    };
    assert!(!run(false), "{lib_file} was loaded although no tool set {}", nvtx::INJECTION_ENV);
    assert!(!record.exists(), "ranges were recorded without a tool");
    // The same check sees the library when a tool is attached.
    assert!(run(true), "LD_DEBUG=files did not list {lib_file} with a tool attached");
    assert!(record.exists());
}

#[test]
fn info_says_whether_the_ranges_are_on() {
    let lib = nvtx_library();
    let info = |env: &[(&str, &str)], unset: &[&str]| {
        let out = cli(&["info"], env, unset);
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.lines().find(|l| l.starts_with("NVTX ranges: ")).unwrap_or_default().to_string()
    };
    let off = info(&[], &[nvtx::INJECTION_ENV]);
    assert!(off.starts_with("NVTX ranges: off (NVTX_INJECTION64_PATH is not set"), "{off}");
    let recorder = recorder().to_str().unwrap();
    let record = scratch("info.txt");
    let tool = [(nvtx::INJECTION_ENV, recorder), (RECORD_ENV, record.to_str().unwrap())];
    let on = info(&[tool[0], tool[1], (nvtx::LIBRARY_ENV, &lib)], &[]);
    assert!(on.starts_with(&format!("NVTX ranges: on ({lib}; ")), "{on}");
    // A tool attached but no NVTX library: off, with the reason and the fix.
    let missing =
        info(&[tool[0], tool[1], (nvtx::LIBRARY_ENV, "/nonexistent/libnvToolsExt.so.1")], &[]);
    assert!(missing.starts_with("NVTX ranges: off (a tool set NVTX_INJECTION64_PATH"), "{missing}");
    assert!(missing.contains(nvtx::LIBRARY_ENV), "{missing}");
}
