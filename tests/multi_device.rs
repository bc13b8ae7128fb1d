//! A model split by layer over several backends (issue 15) gives exactly the
//! single-backend logits and greedy tokens, prefill and decode: two CPU
//! backends (the runner's stage logic without Vulkan), and two logical
//! Vulkan devices opened on one physical device (lavapipe here). The same
//! kernels run on both sides of each boundary, so equality is bit for bit.

mod common;

use std::path::Path;
use vkllm::model::{LoadOptions, Model, Output, Want};
use vkllm::ComputeBackend;

/// Every prompt logit, then `steps` greedy tokens four ways: a prefill's
/// argmax, chained device steps, a single step and host argmax of decode
/// logits (with those logits).
fn run(model: &mut Model, prompt: &[u32], steps: usize) -> (Vec<f32>, Vec<u32>) {
    let Output::Logits(mut all) = model.forward(prompt, Want::AllLogits).unwrap() else {
        panic!("no logits");
    };
    model.reset();
    let mut tokens = vec![model.next_token(prompt).unwrap()];
    tokens.extend(model.decode_greedy(tokens[0], 2).unwrap());
    tokens.push(model.decode_greedy(tokens[2], 1).unwrap()[0]);
    while tokens.len() < steps {
        let l = model.logits(&tokens[tokens.len() - 1..]).unwrap();
        tokens.push(argmax(&l));
        all.extend(l);
    }
    (all, tokens)
}

fn argmax(v: &[f32]) -> u32 {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] {
            best = i;
        }
    }
    best as u32
}

/// What each model runs: `prompt` ids spread over the vocabulary, then
/// `steps` tokens (see [`run`]).
#[derive(Clone, Copy)]
struct Work {
    prompt: u32,
    steps: usize,
}

/// The tiny models: a prompt longer than a pass of 4 rows (see
/// [`small_batches`]), and enough steps for every decode path twice.
const TINY: Work = Work {
    prompt: 9,
    steps: 10,
};
/// SmolLM2, lighter: a prompt of 5 and 5 tokens on the CPU; on lavapipe
/// (seconds a pass) 3 and 4, one pass of each kind.
const SMOL: Work = Work {
    prompt: 5,
    steps: 5,
};
const SMOL_LAVAPIPE: Work = Work {
    prompt: 3,
    steps: 4,
};

fn prompt_for(model: &Model, n: u32) -> Vec<u32> {
    let vocab = model.config().vocab as u32;
    (0..n).map(|i| (i * 7919 + 13) % vocab).collect()
}

/// `path` on `one`, then split over `split` by `shares`, with `opts`: the
/// same logits and tokens; returns the split model's layer ranges.
fn check_split(
    what: &str,
    path: &Path,
    one: Box<dyn ComputeBackend>,
    split: Vec<Box<dyn ComputeBackend>>,
    shares: Option<&[f64]>,
    opts: &LoadOptions,
    work: Work,
) -> Vec<std::ops::Range<usize>> {
    let mut single = common::load_model(one, path, opts);
    let prompt = prompt_for(&single, work.prompt);
    let (want_logits, want_tokens) = run(&mut single, &prompt, work.steps);
    drop(single);
    let opts = LoadOptions {
        shares: shares.map(<[f64]>::to_vec),
        ..opts.clone()
    };
    let mut model = vkllm::open::load(split, path, &opts, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("{what}: {e}"))
        .model;
    let (logits, tokens) = run(&mut model, &prompt, work.steps);
    assert_eq!(tokens, want_tokens, "{what}: greedy tokens");
    assert!(
        logits == want_logits,
        "{what}: logits differ by up to {}",
        common::max_abs_diff(&logits, &want_logits)
    );
    let stages = model.stages();
    assert_eq!(
        stages.iter().map(|s| s.layers.len()).sum::<usize>(),
        model.config().n_layer
    );
    stages.into_iter().map(|s| s.layers).collect()
}

fn tiny(arch: &str) -> std::path::PathBuf {
    common::reference_dir().join("tiny").join(arch)
}

/// Prompts longer than a pass (4 rows) cross each boundary chunk by chunk.
fn small_batches() -> LoadOptions {
    LoadOptions {
        max_batch: Some(4),
        ..LoadOptions::default()
    }
}

#[test]
fn cpu_split_equals_one_cpu() {
    for arch in common::TINY_ARCHS {
        let ranges = check_split(
            arch,
            &tiny(arch),
            common::cpu(),
            vec![common::cpu(), common::cpu()],
            None,
            &small_batches(),
            TINY,
        );
        assert_eq!(ranges, [0..1, 1..2], "{arch}");
    }
    let smol = common::smollm2();
    for (shares, lens) in [
        (&[1.0, 29.0][..], &[1, 29][..]),
        (&[1.0, 1.0, 1.0], &[10, 10, 10]),
    ] {
        let bes = shares.iter().map(|_| common::cpu()).collect();
        let what = format!("smollm2 cpu {shares:?}");
        let opts = LoadOptions::default();
        let ranges = check_split(&what, &smol, common::cpu(), bes, Some(shares), &opts, SMOL);
        let got: Vec<usize> = ranges.iter().map(|r| r.len()).collect();
        assert_eq!(got, lens, "{what}");
    }
}

#[test]
fn two_logical_vulkan_devices_equal_one() {
    if common::vulkan().is_none() {
        return;
    }
    let two = || vec![common::vulkan().unwrap(), common::vulkan().unwrap()];
    for arch in ["llama", "gemma3", "gpt2"] {
        check_split(
            arch,
            &tiny(arch),
            common::vulkan().unwrap(),
            two(),
            None,
            &small_batches(),
            TINY,
        );
    }
    let ranges = check_split(
        "smollm2 vulkan 1:29",
        &common::smollm2(),
        common::vulkan().unwrap(),
        two(),
        Some(&[1.0, 29.0]),
        &LoadOptions::default(),
        SMOL_LAVAPIPE,
    );
    assert_eq!(ranges, [0..1, 1..30]);
}

/// Two physical GPUs (the GPU machine's two-GPU kind; skipped elsewhere):
/// every tiny architecture split over them gives the first GPU's logits
/// and tokens bit for bit, each side of the boundary on its own device.
#[test]
fn two_gpus_equal_one() {
    let Ok(devices) = vkllm::vk::list_devices() else {
        return;
    };
    let gpus: Vec<usize> = devices
        .iter()
        .filter(|d| d.kind.ends_with("GPU"))
        .map(|d| d.index)
        .collect();
    if gpus.len() < 2 {
        eprintln!("skipping: {} GPU(s)", gpus.len());
        return;
    }
    let on = |i: usize| {
        let opts = vkllm::vk::Options {
            device: Some(i.to_string()),
            ..vkllm::vk::Options::from_env().unwrap()
        };
        Box::new(common::vulkan_with(&opts).unwrap()) as Box<dyn ComputeBackend>
    };
    for arch in common::TINY_ARCHS {
        check_split(
            arch,
            &tiny(arch),
            on(gpus[0]),
            vec![on(gpus[0]), on(gpus[1])],
            None,
            &small_batches(),
            TINY,
        );
    }
}

/// By default the layers follow each device's free memory: one device
/// opened twice has the same on both, so SmolLM2's 30 split 15:15; the CPU
/// cannot tell, so its backends get equal shares.
#[test]
fn default_split_follows_free_memory() {
    let mut configs = vec![("cpu", vec![common::cpu(), common::cpu()])];
    if let Some(a) = common::vulkan() {
        configs.push(("vulkan", vec![a, common::vulkan().unwrap()]));
    }
    for (name, bes) in configs {
        let model = vkllm::open::load(
            bes,
            &common::smollm2(),
            &LoadOptions::default(),
            &mut |_, _| {},
        )
        .unwrap()
        .model;
        let ranges: Vec<_> = model.stages().into_iter().map(|s| s.layers).collect();
        assert_eq!(ranges, [0..15, 15..30], "{name}");
    }
}

#[test]
fn split_reports_each_device() {
    let shares = |s: &[f64]| LoadOptions {
        shares: Some(s.to_vec()),
        ..LoadOptions::default()
    };
    let mut model = vkllm::open::load(
        vec![common::cpu(), common::cpu()],
        &tiny("llama"),
        &shares(&[1.0, 1.0]),
        &mut |_, _| {},
    )
    .unwrap()
    .model;
    let stages = model.stages();
    assert_eq!(stages.len(), 2);
    assert!(stages
        .iter()
        .all(|s| s.device.starts_with("cpu") && s.weight_bytes > 0));
    assert_eq!(
        model.weight_bytes(),
        stages.iter().map(|s| s.weight_bytes).sum::<usize>()
    );
    assert!(
        model.backend_name().contains(" + "),
        "{}",
        model.backend_name()
    );
    // Shares that do not fit the devices or the layers are errors.
    for bad in [&[1.0][..], &[0.0, 0.0], &[1.0, -1.0], &[1.0, 1.0, 1.0]] {
        let r = vkllm::open::load(
            vec![common::cpu(), common::cpu()],
            &tiny("llama"),
            &shares(bad),
            &mut |_, _| {},
        );
        assert!(r.is_err(), "shares {bad:?}");
    }
    let three = vkllm::open::load(
        vec![common::cpu(), common::cpu(), common::cpu()],
        &tiny("llama"),
        &LoadOptions::default(),
        &mut |_, _| {},
    );
    let err = three.err().expect("2 layers over 3 devices").to_string();
    assert!(err.contains("at least one"), "{err}");
    assert!(model.next_token(&[1, 2, 3]).is_ok());
}

fn vkllm(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_vkllm"))
        .args(args)
        .current_dir(common::root())
        .output()
        .expect("run the vkllm binary")
}

fn stderr(o: &std::process::Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(args: &[&str]) -> String {
    let o = vkllm(args);
    assert!(o.status.success(), "vkllm {args:?}: {}", stderr(&o));
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `--devices` gives the single-device output: SmolLM2's greedy tokens
/// over two CPU backends, and the tiny llama's logits over two logical
/// lavapipe devices; `info` and `bench` show each device's layers.
#[test]
fn cli_devices_give_the_single_device_output() {
    let smol = common::smollm2();
    let m = smol.to_str().unwrap();
    let generate = [
        "generate",
        "-m",
        m,
        "-p",
        "The capital of France is",
        "-n",
        "6",
    ];
    let tokens = |extra: &[&str]| {
        let args: Vec<&str> = generate.iter().chain(extra).copied().collect();
        let v: serde_json::Value = serde_json::from_str(&ok(&args)).unwrap();
        v["tokens"].clone()
    };
    let one = tokens(&["--temperature", "0", "--json", "-b", "cpu"]);
    let split = ["--temperature", "0", "--json", "--devices", "cpu,cpu"];
    assert_eq!(tokens(&split), one);
    let uneven: Vec<&str> = split
        .iter()
        .chain(&["--tensor-split", "1,2"])
        .copied()
        .collect();
    assert_eq!(tokens(&uneven), one);

    let tiny = tiny("llama");
    let t = tiny.to_str().unwrap();
    let info = ok(&["info", "-m", t, "--devices", "cpu,cpu"]);
    assert!(info.contains("split over 2 devices"), "{info}");
    assert!(
        info.contains("layers 0-0") && info.contains("layers 1-1"),
        "{info}"
    );
    let bench = ok(&[
        "bench",
        "-m",
        t,
        "-b",
        "cpu",
        "--devices",
        "cpu,cpu",
        "-p",
        "4",
        "-n",
        "2",
        "-r",
        "1",
        "--copy-mib",
        "0",
        "--json",
    ]);
    let records: serde_json::Value = serde_json::from_str(&bench).unwrap();
    let devices: Vec<&str> = records
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["device"].as_str().unwrap())
        .collect();
    assert_eq!(devices.len(), 4, "pp and tg, alone and split: {devices:?}");
    assert!(devices[2].contains("[layers 0-0] + ") && devices[3].contains("[layers 1-1]"));

    if common::vulkan().is_none() {
        return;
    }
    let logits = ["logits", "-m", t, "--prompt-ids", "1,2,3,4,5"];
    let with = |extra: &[&str]| ok(&logits.iter().chain(extra).copied().collect::<Vec<_>>());
    let one = with(&["-b", "vulkan:0"]);
    assert_eq!(with(&["--devices", "0,0"]), one);
    assert_eq!(
        with(&["--devices", "vulkan:0,0", "--kv-cache", "f16"]),
        with(&["-b", "vulkan:0", "--kv-cache", "f16"])
    );
}

/// Bad `--devices`/`--tensor-split` combinations are usage errors: exit 2
/// and one `error:` line, before anything loads.
#[test]
fn bad_split_flags_exit_with_2() {
    let tiny = tiny("llama");
    let t = tiny.to_str().unwrap();
    for (flags, needle) in [
        (
            "--devices cpu,cpu --tensor-split 0,0",
            "not a number above 0",
        ),
        (
            "--devices cpu,cpu --tensor-split 1,-1",
            "not a number above 0",
        ),
        (
            "--devices cpu,cpu --tensor-split 1,nan",
            "not a number above 0",
        ),
        (
            "--devices cpu,cpu --tensor-split 1,1,1",
            "3 parts for 2 devices",
        ),
        (
            "--devices cpu,cpu,cpu --tensor-split 1,1",
            "2 parts for 3 devices",
        ),
        ("--tensor-split 1,1", "required arguments were not provided"),
        ("--devices cpu", "at least two devices"),
        ("--devices cpu,,cpu", "an empty device"),
        ("--devices cpu,cpu -b cpu", "cannot be combined"),
    ] {
        let mut args = vec!["logits", "-m", t, "--prompt-ids", "1,2"];
        args.extend(flags.split_whitespace());
        let o = vkllm(&args);
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{flags}: {err}");
        let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{flags}: {err}");
        assert!(errors[0].contains(needle), "{flags}: {err}");
    }
    let o = vkllm(&["info", "--devices", "cpu,cpu"]);
    assert_eq!(
        o.status.code(),
        Some(2),
        "info needs a model: {}",
        stderr(&o)
    );
    // More devices than layers is found at load: a runtime error.
    let o = vkllm(&[
        "logits",
        "-m",
        t,
        "--prompt-ids",
        "1",
        "--devices",
        "cpu,cpu,cpu",
    ]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).starts_with("error: ") && stderr(&o).contains("at least one"),
        "{}",
        stderr(&o)
    );
}
