//! Many sequences at once (model/engine.rs, model/batch.rs): every
//! sequence's output equals the same sequence run alone, with sequences of
//! different lengths joining, leaving, cancelled and preempted mid-run, on
//! every device; the KV pages all return to the pool.

mod common;

use vkllm::backend::ComputeBackend;
use vkllm::model::engine::{Engine, EngineOptions, Event, Request, RequestId};
use vkllm::model::generate::StopReason;
use vkllm::model::sampling::SamplerConfig;
use vkllm::model::{LoadOptions, Model, Output, Want};
use vkllm::DType;

type Device = (
    &'static str,
    fn() -> Option<Box<dyn ComputeBackend>>,
    DType,
    f32,
);

fn cpu_devices() -> Vec<Device> {
    vec![("cpu", || Some(common::cpu()), DType::F32, 1e-4)]
}

fn vulkan_devices() -> Vec<Device> {
    vec![
        ("vulkan exact", common::vulkan_exact, DType::F32, 1e-4),
        ("vulkan default", common::vulkan, DType::F16, 2e-2),
    ]
}

fn load(dev: &Device, arch: &str, opts: LoadOptions) -> Option<Model> {
    let be = (dev.1)()?;
    let dir = common::reference_dir().join("tiny").join(arch);
    let opts = LoadOptions {
        kv_cache: Some(dev.2),
        ..opts
    };
    Some(common::load_model(be, &dir, &opts))
}

/// Deterministic ids spread over the vocabulary.
fn prompt(len: usize, seed: u32, vocab: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 7919 + seed * 104_729 + 13) % vocab)
        .collect()
}

/// Greedy tokens after `prompt`, one sequence alone (the single-sequence API).
fn alone(model: &mut Model, prompt: &[u32], n: usize) -> Vec<u32> {
    model.reset();
    let mut out = vec![model.next_token(prompt).unwrap()];
    while out.len() < n {
        let last = *out.last().unwrap();
        out.push(model.next_token(&[last]).unwrap());
    }
    out
}

fn greedy(prompt: Vec<u32>, max_tokens: usize) -> Request {
    Request {
        prompt,
        max_tokens,
        sampler: SamplerConfig::greedy(),
        stop_ids: Vec::new(),
        ignore_eos: false,
        logprobs: None,
        echo_logprobs: false,
        constraint: None,
    }
}

/// Steps `engine` until idle, adding `later[i]` before step `later[i].0`
/// and cancelling `cancel` requests after they have that many tokens;
/// returns each request's tokens and end.
fn run(
    engine: &mut Engine,
    first: Vec<Request>,
    later: Vec<(usize, Request)>,
    cancel: &[(usize, usize)],
) -> Vec<(Vec<u32>, Option<StopReason>)> {
    let mut ids: Vec<RequestId> = first.into_iter().map(|r| engine.add(r).unwrap()).collect();
    let mut later = later;
    let total = ids.len() + later.len();
    let mut results = vec![(Vec::new(), None); total];
    let mut step = 0;
    while !engine.is_idle() || !later.is_empty() {
        while let Some(pos) = later.iter().position(|(at, _)| *at <= step) {
            ids.push(engine.add(later.remove(pos).1).unwrap());
        }
        for event in engine.step().unwrap() {
            match event {
                Event::Token(id, t, _) => {
                    let i = ids.iter().position(|&x| x == id).unwrap();
                    // A client ignores what its step made after it cancelled.
                    if results[i].1 == Some(StopReason::Cancelled) {
                        continue;
                    }
                    results[i].0.push(t);
                    if let Some(&(_, after)) = cancel.iter().find(|(c, _)| *c == i) {
                        if results[i].0.len() == after {
                            engine.cancel(id).unwrap();
                            results[i].1 = Some(StopReason::Cancelled);
                        }
                    }
                }
                Event::Finished(id, r) => {
                    let i = ids.iter().position(|&x| x == id).unwrap();
                    if results[i].1 != Some(StopReason::Cancelled) {
                        results[i].1 = Some(r);
                    }
                }
                Event::Failed(id, e) => panic!("request {id} failed: {e}"),
                Event::PromptLogprobs(..) => {}
            }
        }
        step += 1;
        assert!(step < 10_000, "the engine does not finish");
    }
    results
}

/// Seven requests of prompt lengths around the 64-position page (1 to
/// 130), four at a time, three joining later, one cancelled, prompts
/// evaluated 32 tokens per step: each one's greedy tokens equal its run
/// alone, and every page returns to the pool.
fn batch_equals_alone(dev: Device) {
    for arch in common::TINY_ARCHS {
        let opts = LoadOptions {
            context: Some(256),
            sequences: Some(4),
            ..LoadOptions::default()
        };
        let Some(mut solo) = load(&dev, arch, LoadOptions::default()) else {
            return;
        };
        let model = load(&dev, arch, opts).unwrap();
        let vocab = model.config().vocab as u32;
        let pages = model.free_pages();
        let shapes = [
            (1, 8),
            (5, 12),
            (17, 5),
            (64, 20),
            (65, 9),
            (130, 7),
            (3, 16),
        ];
        let reqs: Vec<Request> = shapes
            .iter()
            .enumerate()
            .map(|(i, &(len, n))| greedy(prompt(len, i as u32, vocab), n))
            .collect();
        let expected: Vec<Vec<u32>> = reqs
            .iter()
            .map(|r| alone(&mut solo, &r.prompt, r.max_tokens))
            .collect();
        let mut engine = Engine::new(model, EngineOptions { prefill_chunk: 32 }).unwrap();
        let later = vec![
            (2, reqs[4].clone()),
            (3, reqs[5].clone()),
            (5, reqs[6].clone()),
        ];
        let got = run(&mut engine, reqs[..4].to_vec(), later, &[(3, 6)]);
        for (i, ((tokens, end), want)) in got.iter().zip(&expected).enumerate() {
            let (name, arch) = (dev.0, arch);
            if i == 3 {
                assert_eq!(*end, Some(StopReason::Cancelled), "{arch} {name}");
                assert_eq!(tokens[..], want[..6], "{arch} on {name}: request {i}");
            } else {
                assert_eq!(*end, Some(StopReason::MaxTokens), "{arch} {name}");
                assert_eq!(tokens, want, "{arch} on {name}: request {i}");
            }
        }
        assert_eq!(
            engine.model().free_pages(),
            pages,
            "{arch} {}: pages leaked",
            dev.0
        );
    }
}
test_device!(
    batch_equals_alone,
    batch_equals_alone_cpu: cpu_devices,
    batch_equals_alone_vulkan: vulkan_devices
);

/// Rows of several sequences at different depths in one decode step: each
/// row's logits equal its sequence's single-sequence step, teacher-forced.
fn decode_rows_logits_equal_alone(dev: Device) {
    for arch in common::TINY_ARCHS {
        let opts = LoadOptions {
            context: Some(256),
            sequences: Some(3),
            ..LoadOptions::default()
        };
        let Some(mut solo) = load(&dev, arch, LoadOptions::default()) else {
            return;
        };
        let mut model = load(&dev, arch, opts).unwrap();
        let vocab = model.config().vocab as u32;
        let prompts: Vec<Vec<u32>> = [3, 70, 129]
            .iter()
            .enumerate()
            .map(|(i, &n)| prompt(n, 10 + i as u32, vocab))
            .collect();
        let feeds: Vec<Vec<u32>> = (0..3).map(|i| prompt(5, 20 + i, vocab)).collect();
        let mut want = Vec::new();
        for (p, f) in prompts.iter().zip(&feeds) {
            solo.reset();
            solo.logits(p).unwrap();
            want.push(
                f.iter()
                    .map(|&t| solo.logits(&[t]).unwrap())
                    .collect::<Vec<_>>(),
            );
        }
        let seqs: Vec<_> = prompts
            .iter()
            .map(|p| {
                let (seq, reused) = model.add_sequence(p).unwrap();
                assert_eq!(reused, 0);
                model.prefill(seq, p, Want::LastLogits).unwrap();
                seq
            })
            .collect();
        for step in 0..5 {
            let rows: Vec<_> = seqs
                .iter()
                .zip(&feeds)
                .map(|(&s, f)| (s, f[step]))
                .collect();
            let outs = model.decode_rows(&rows, Want::LastLogits).unwrap();
            for (i, out) in outs.into_iter().enumerate() {
                let Output::Logits(l) = out else {
                    panic!("expected logits")
                };
                let err = common::max_abs_diff(&l, &want[i][step]);
                assert!(
                    err <= dev.3,
                    "{arch} on {}: row {i} step {step}: {err} > {}",
                    dev.0,
                    dev.3
                );
            }
        }
    }
}
test_device!(
    decode_rows_logits_equal_alone,
    decode_rows_logits_equal_alone_cpu: cpu_devices,
    decode_rows_logits_equal_alone_vulkan: vulkan_devices
);

/// A prompt sharing a cached prefix with an earlier one evaluates only the
/// rest, with the same output; a pool too small for everyone at once
/// queues and preempts instead of failing, outputs unchanged; a prompt
/// longer than the context is refused.
fn shared_prefixes_and_a_full_pool(dev: Device) {
    let arch = "llama";
    let Some(mut solo) = load(&dev, arch, LoadOptions::default()) else {
        return;
    };
    let vocab = solo.config().vocab as u32;
    let system = prompt(150, 99, vocab);
    let with = |tail: u32| {
        let mut p = system.clone();
        p.extend(prompt(7, tail, vocab));
        p
    };
    // Prefix reuse: the second prompt finds two whole pages cached.
    let mut model = load(
        &dev,
        arch,
        LoadOptions {
            context: Some(256),
            sequences: Some(2),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    let (a, reused) = model.add_sequence(&with(1)).unwrap();
    assert_eq!(reused, 0);
    model.prefill(a, &with(1), Want::Argmax).unwrap();
    let (b, reused) = model.add_sequence(&with(2)).unwrap();
    assert_eq!(
        reused, 128,
        "{}: two pages of the system prompt reused",
        dev.0
    );
    let Output::Token(t) = model.prefill(b, &with(2)[reused..], Want::Argmax).unwrap() else {
        panic!("expected a token")
    };
    assert_eq!(t, alone(&mut solo, &with(2), 1)[0]);
    model.free_sequence(a).unwrap();
    model.free_sequence(b).unwrap();

    // 5 pages of 64 positions for sequences that need 3 each at the end:
    // they queue, and the newest is preempted when pages run out.
    let mut engine = Engine::new(
        load(
            &dev,
            arch,
            LoadOptions {
                context: Some(256),
                sequences: Some(3),
                kv_positions: Some(5 * 64),
                ..LoadOptions::default()
            },
        )
        .unwrap(),
        EngineOptions::default(),
    )
    .unwrap();
    let pages = engine.model().free_pages();
    let reqs: Vec<Request> = (0..4)
        .map(|i| greedy(prompt(100, 50 + i, vocab), 60))
        .collect();
    let got = run(&mut engine, reqs.clone(), Vec::new(), &[]);
    for (r, (tokens, end)) in reqs.iter().zip(&got) {
        assert_eq!(*end, Some(StopReason::MaxTokens));
        assert_eq!(*tokens, alone(&mut solo, &r.prompt, 60), "{}", dev.0);
    }
    assert!(engine.preemptions() > 0, "{}: nothing was preempted", dev.0);
    assert_eq!(engine.model().free_pages(), pages);
    assert!(engine.add(greedy(prompt(257, 7, vocab), 1)).is_err());
    assert!(engine.is_idle());
}
test_device!(
    shared_prefixes_and_a_full_pool,
    shared_prefixes_and_a_full_pool_cpu: cpu_devices,
    shared_prefixes_and_a_full_pool_vulkan: vulkan_devices
);

/// The real SmolLM2: six chat prompts generating together (more rows than
/// the few-row GEMV takes, so the batch's matmuls run another kernel than a
/// single sequence's) give each one's greedy reply alone.
fn smollm2_batch_equals_alone(dev: Device) {
    let path = common::smollm2();
    let Some(be) = (dev.1)() else {
        return;
    };
    let opts = LoadOptions {
        context: Some(256),
        kv_cache: Some(dev.2),
        ..LoadOptions::default()
    };
    let loaded = vkllm::open::load(vec![be], &path, &opts, &mut |_, _| {}).unwrap();
    let (mut solo, tok) = (loaded.model, loaded.tokenizer.unwrap());
    let questions = [
        "What is the capital of France?",
        "Name three colours.",
        "What is 2 + 2?",
        "Say hello in Spanish.",
        "What is the largest planet?",
        "Write one word that rhymes with cat.",
    ];
    let reqs: Vec<Request> = questions
        .iter()
        .map(|q| {
            let text = vkllm::model::generate::render_chat_prompt(&tok, None, q).unwrap();
            Request {
                prompt: tok.encode(&text, false).unwrap(),
                max_tokens: 24,
                sampler: SamplerConfig::greedy(),
                stop_ids: tok.stop_ids().to_vec(),
                ignore_eos: false,
                logprobs: None,
                echo_logprobs: false,
                constraint: None,
            }
        })
        .collect();
    let expected: Vec<Vec<u32>> = reqs
        .iter()
        .map(|r| {
            let mut out = alone(&mut solo, &r.prompt, r.max_tokens);
            if let Some(end) = out.iter().position(|t| r.stop_ids.contains(t)) {
                out.truncate(end + 1);
            }
            out
        })
        .collect();
    let be = (dev.1)().unwrap();
    let opts = LoadOptions {
        sequences: Some(6),
        ..opts
    };
    let model = vkllm::open::load(vec![be], &path, &opts, &mut |_, _| {})
        .unwrap()
        .model;
    let mut engine = Engine::new(model, EngineOptions::default()).unwrap();
    let got = run(&mut engine, reqs, Vec::new(), &[]);
    for (i, ((tokens, _), want)) in got.iter().zip(&expected).enumerate() {
        assert_eq!(tokens, want, "{}: {:?}", dev.0, questions[i]);
    }
}
test_device!(
    smollm2_batch_equals_alone,
    smollm2_batch_equals_alone_cpu: cpu_devices,
    smollm2_batch_equals_alone_vulkan: vulkan_devices
);

fn log_softmax(l: &[f32]) -> Vec<f32> {
    let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let lse = max + l.iter().map(|&x| (x as f64 - max).exp()).sum::<f64>().ln();
    l.iter().map(|&x| (x as f64 - lse) as f32).collect()
}

/// A request asking for log-probabilities and scoring its prompt (in
/// chunks of 16), batched with plain greedy ones: its tokens are those it
/// gets alone, its scores the log-softmax of the single-sequence API's
/// logits, and the others' tokens carry none.
fn logprobs_batched_equal_log_softmax_alone(dev: Device) {
    let dev = &dev;
    let arch = common::TINY_ARCHS[0];
    let Some(mut solo) = load(dev, arch, LoadOptions::default()) else {
        return;
    };
    let opts = LoadOptions {
        context: Some(256),
        sequences: Some(4),
        ..LoadOptions::default()
    };
    let model = load(dev, arch, opts).unwrap();
    let vocab = model.config().vocab;
    let p = prompt(100, 1, vocab as u32);
    let want = alone(&mut solo, &p, 6);
    let scored = Request {
        logprobs: Some(3),
        echo_logprobs: true,
        ..greedy(p.clone(), 6)
    };
    let mut engine = Engine::new(model, EngineOptions { prefill_chunk: 16 }).unwrap();
    engine.add(greedy(p.clone(), 8)).unwrap();
    let id = engine.add(scored).unwrap();
    engine.add(greedy(prompt(20, 2, vocab as u32), 8)).unwrap();
    let (mut tokens, mut scores, mut prompt_scores) = (Vec::new(), Vec::new(), None);
    while !engine.is_idle() {
        for event in engine.step().unwrap() {
            match event {
                Event::Token(i, t, s) if i == id => {
                    tokens.push(t);
                    scores.push(s.expect("scores asked for"));
                }
                Event::Token(_, _, s) => assert!(s.is_none()),
                Event::PromptLogprobs(i, s) => {
                    assert!(i == id && tokens.is_empty());
                    prompt_scores = Some(s);
                }
                Event::Failed(i, e) => panic!("request {i} failed: {e}"),
                Event::Finished(..) => {}
            }
        }
    }
    assert_eq!(tokens, want);
    let close = |a: f32, b: f32| (a - b).abs() < dev.3;
    solo.reset();
    let Output::Logits(rows) = solo.forward(&p, Want::AllLogits).unwrap() else {
        panic!("no logits")
    };
    let prompt_scores = prompt_scores.expect("the prompt's scores");
    assert_eq!(prompt_scores.len(), p.len() - 1);
    for (j, (s, row)) in prompt_scores
        .iter()
        .zip(rows.chunks_exact(vocab))
        .enumerate()
    {
        let ls = log_softmax(row);
        assert_eq!(s.token, p[j + 1]);
        assert!(close(s.logprob, ls[s.token as usize]), "prompt row {j}");
        assert_eq!(s.top.len(), 3);
        assert!(s.top.windows(2).all(|w| w[0].1 >= w[1].1));
    }
    solo.reset();
    let mut l = solo.logits(&p).unwrap();
    for (i, s) in scores.iter().enumerate() {
        if i > 0 {
            l = solo.logits(&[want[i - 1]]).unwrap();
        }
        let ls = log_softmax(&l);
        assert_eq!(s.token, want[i]);
        assert!(close(s.logprob, ls[want[i] as usize]), "token {i}");
        // Greedy: the chosen token is the most likely.
        assert_eq!(s.top[0], (s.token, s.logprob));
    }
}
test_device!(
    logprobs_batched_equal_log_softmax_alone,
    logprobs_batched_equal_log_softmax_alone_cpu: cpu_devices,
    logprobs_batched_equal_log_softmax_alone_vulkan: vulkan_devices
);

/// A greedy request alone decodes several steps per engine step, chained
/// on the device: 40 tokens in far fewer than 40 steps, equal to the
/// single-sequence API's; with a stop id met mid-chunk it ends at the stop
/// and its pages (the chunk's too) return to the pool.
fn alone_request_chains_steps(dev: Device) {
    let arch = "llama";
    let Some(mut solo) = load(&dev, arch, LoadOptions::default()) else {
        return;
    };
    let opts = LoadOptions {
        context: Some(256),
        sequences: Some(2),
        ..LoadOptions::default()
    };
    let model = load(&dev, arch, opts).unwrap();
    let vocab = model.config().vocab as u32;
    let p = prompt(30, 5, vocab);
    let want = alone(&mut solo, &p, 40);
    let mut engine = Engine::new(model, EngineOptions::default()).unwrap();
    let pages = engine.model().free_pages();
    engine.add(greedy(p.clone(), 40)).unwrap();
    let (mut tokens, mut steps) = (Vec::new(), 0);
    while !engine.is_idle() {
        for event in engine.step().unwrap() {
            if let Event::Token(_, t, _) = event {
                tokens.push(t);
            }
        }
        steps += 1;
    }
    assert_eq!(tokens, want, "{}", dev.0);
    assert!(steps <= 8, "{}: 40 tokens took {steps} steps", dev.0);
    // The first occurrence of the 25th token, mid-chunk, as a stop id.
    let stop = want[24];
    let end = want.iter().position(|&t| t == stop).unwrap();
    let req = Request {
        stop_ids: vec![stop],
        ..greedy(p, 40)
    };
    let got = run(&mut engine, vec![req], Vec::new(), &[]);
    assert_eq!(got[0].0, want[..=end], "{}", dev.0);
    assert_eq!(got[0].1, Some(StopReason::StopToken));
    assert_eq!(
        engine.model().free_pages(),
        pages,
        "{}: pages leaked",
        dev.0
    );
}
test_device!(
    alone_request_chains_steps,
    alone_request_chains_steps_cpu: cpu_devices,
    alone_request_chains_steps_vulkan: vulkan_devices
);
