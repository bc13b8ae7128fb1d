//! `vkllm serve --parallel N`: requests generating together answer as
//! they would alone, a short request does not wait for a long one, and
//! hundreds of clients (some leaving mid-stream) leave nothing behind:
//! `/health` counts them while they run and is back to idle afterwards.

use crate::http::{health, post, Response};
use crate::{start_with, Server};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

/// A server of `parallel` slots on one CPU thread (a step's second thread
/// would stall whenever the clients or another test take its core).
fn start(parallel: usize, args: &[&str]) -> Server {
    let n = parallel.to_string();
    start_with(&[&["--parallel", &n, "-t", "1"], args].concat(), &[])
}

/// `host:port` of a server's base URL.
fn addr(base: &str) -> String {
    base.trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string()
}

/// Polls `/health` until `want(slots)` holds (a client's going is noticed
/// at the server's next write, a moment later); returns the last answer.
fn health_until(addr: &str, want: impl Fn(&Value) -> bool) -> Value {
    let start = Instant::now();
    loop {
        let h = health(addr);
        if want(&h) {
            return h;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "/health never got there: {h}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn idle(total: u64) -> impl Fn(&Value) -> bool {
    move |h| {
        h["slots"] == json!({"total": total, "busy": 0, "queued": 0})
            && h["kv_pages"]["free"] == h["kv_pages"]["total"]
    }
}

/// The parts of a completion that must not depend on company.
fn answer(v: &Value) -> Value {
    json!([
        v["choices"][0]["text"],
        v["choices"][0]["finish_reason"],
        v["usage"]
    ])
}

#[test]
fn concurrent_answers_equal_the_same_requests_one_at_a_time() {
    let s = start(4, &[]);
    let addr = addr(&s.base);
    // Six requests for four slots (two wait), of different lengths, one
    // ending at a stop string.
    let reqs: Vec<String> = [
        ("The capital of France is", 12, ""),
        ("Once upon a time", 24, ""),
        ("def fibonacci(n):", 20, ""),
        ("The three primary colors are", 8, ""),
        ("Water boils at", 16, ",\"stop\":\".\""),
        ("List three fruits:", 30, ""),
    ]
    .iter()
    .map(|(p, n, extra)| format!(r#"{{"prompt":"{p}","max_tokens":{n},"temperature":0{extra}}}"#))
    .collect();
    let complete = |r: &str| {
        let res = post(&addr, "/v1/completions", r);
        let status = res.status;
        let v = res.json();
        assert_eq!(status, 200, "{r}: {v}");
        answer(&v)
    };
    let alone: Vec<Value> = reqs.iter().map(|r| complete(r)).collect();
    let together: Vec<Value> = std::thread::scope(|sc| {
        let handles: Vec<_> = reqs.iter().map(|r| sc.spawn(|| complete(r))).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert_eq!(together, alone);
    assert_eq!(alone[4][1], "stop", "{}", alone[4]);
    health_until(&addr, idle(4));
}

/// A long streaming completion, checked to be generating.
fn long_stream(addr: &str) -> Response {
    let req = r#"{"prompt":"Once upon a time","max_tokens":1000,"temperature":0,"ignore_eos":true,"stream":true}"#;
    let mut r = post(addr, "/v1/completions", req);
    assert_eq!(r.status, 200);
    let first: Value = serde_json::from_str(&r.next_data().unwrap()).unwrap();
    assert_eq!(first["choices"][0]["finish_reason"], Value::Null);
    r
}

#[test]
fn a_short_request_overtakes_a_long_one_and_health_counts_slots() {
    let s = start(2, &[]);
    let addr = addr(&s.base);
    let h = health(&addr);
    assert_eq!(h["status"], "ok");
    assert!(idle(2)(&h), "{h}");

    let mut long = long_stream(&addr);
    let short = r#"{"prompt":"The capital of France is","max_tokens":4,"temperature":0}"#;
    let started = Instant::now();
    let res = post(&addr, "/v1/completions", short);
    assert_eq!(res.status, 200);
    let v = res.json();
    let secs = started.elapsed().as_secs_f64();
    assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    // The long one (1000 tokens, many seconds on a CPU) is still generating.
    let next: Value = serde_json::from_str(&long.next_data().unwrap()).unwrap();
    assert_eq!(next["choices"][0]["finish_reason"], Value::Null, "{next}");
    eprintln!("the short request took {secs:.2} s beside the long one");

    // Two generating, a third waiting; when one leaves, the third starts.
    let second = long_stream(&addr);
    let req = r#"{"prompt":"Once upon a time","max_tokens":1000,"temperature":0,"ignore_eos":true,"stream":true}"#;
    let mut third = post(&addr, "/v1/completions", req);
    let h = health_until(&addr, |h| h["slots"]["queued"] == 1);
    assert_eq!(
        h["slots"],
        json!({"total": 2, "busy": 2, "queued": 1}),
        "{h}"
    );
    let total = h["kv_pages"]["total"].as_u64().unwrap();
    assert!(h["kv_pages"]["free"].as_u64().unwrap() < total, "{h}");
    drop(long);
    assert!(third.next_data().is_some());
    let h = health_until(&addr, |h| h["slots"]["queued"] == 0);
    assert_eq!(
        h["slots"],
        json!({"total": 2, "busy": 2, "queued": 0}),
        "{h}"
    );
    drop((second, third));
    health_until(&addr, idle(2));
}

#[test]
fn parallel_1_serves_one_request_at_a_time_in_arrival_order() {
    let s = start(1, &[]);
    let addr = addr(&s.base);
    let long = long_stream(&addr);
    std::thread::scope(|sc| {
        let short = sc.spawn(|| {
            let req = r#"{"prompt":"The capital of France is","max_tokens":4,"temperature":0}"#;
            post(&addr, "/v1/completions", req).json()
        });
        let h = health_until(&addr, |h| h["slots"]["queued"] == 1);
        assert_eq!(
            h["slots"],
            json!({"total": 1, "busy": 1, "queued": 1}),
            "{h}"
        );
        // It waits for the long one, however long that takes.
        std::thread::sleep(Duration::from_millis(500));
        assert!(!short.is_finished());
        drop(long);
        let v = short.join().unwrap();
        assert_eq!(v["usage"]["completion_tokens"], 4, "{v}");
    });
    health_until(&addr, idle(1));
}

/// Resident memory of process `pid`, in KiB.
fn rss_kb(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS")
}

/// How one client of [`burst`] behaves.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Client {
    /// Reads its stream to the end.
    Stays,
    /// Leaves after its first piece of text.
    LeavesMidStream,
    /// Leaves before anything came (possibly while queued).
    LeavesAtOnce,
}

/// `n` streaming clients at once; every one that stays gets its whole
/// answer. Returns how many stayed.
fn burst(addr: &str, n: usize, tokens: usize) -> usize {
    let kind = |i: usize| match i % 8 {
        3 => Client::LeavesMidStream,
        7 => Client::LeavesAtOnce,
        _ => Client::Stays,
    };
    std::thread::scope(|sc| {
        let handles: Vec<_> = (0..n)
            .map(|i| {
                sc.spawn(move || {
                    let req = format!(
                        r#"{{"prompt":"Client {i} says","max_tokens":{tokens},"temperature":0,"ignore_eos":true,"stream":true,"stream_options":{{"include_usage":true}}}}"#
                    );
                    let mut r = post(addr, "/v1/completions", &req);
                    assert_eq!(r.status, 200, "client {i}");
                    match kind(i) {
                        Client::LeavesAtOnce => return false,
                        Client::LeavesMidStream => {
                            r.next_data().expect("a first piece");
                            return false;
                        }
                        Client::Stays => {}
                    }
                    let mut data = Vec::new();
                    while let Some(d) = r.next_data() {
                        data.push(d);
                    }
                    assert_eq!(data.last().map(String::as_str), Some("[DONE]"), "client {i}");
                    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
                    assert_eq!(last["choices"][0]["finish_reason"], "length", "client {i}");
                    assert_eq!(last["usage"]["completion_tokens"], tokens, "client {i}");
                    true
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap())
            .filter(|&stayed| stayed)
            .count()
    })
}

#[test]
fn hundreds_of_clients_at_once_are_answered_or_cancelled_and_nothing_stays() {
    let s = start(8, &["--max-connections", "300"]);
    let addr = addr(&s.base);
    let pid = s.child.id();
    // A first, smaller burst warms up what stays (every batch size's pass,
    // the allocator's arenas); the big one must leave memory where it was.
    assert_eq!(burst(&addr, 32, 3), 24);
    health_until(&addr, idle(8));
    let warm = rss_kb(pid);
    let started = Instant::now();
    assert_eq!(burst(&addr, 256, 3), 192);
    eprintln!("256 clients: {:.1} s", started.elapsed().as_secs_f64());
    let h = health_until(&addr, idle(8));
    let end = rss_kb(pid);
    eprintln!("server RSS after warm-up {warm} KiB, at the end {end} KiB; {h}");
    assert!(
        end <= warm + 16 * 1024,
        "the server's memory grew from {warm} to {end} KiB"
    );
}

/// Host memory available now, in bytes (what the CPU backend's
/// `check_fits` measures against).
fn mem_available() -> u64 {
    let text = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kb: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemAvailable");
    kb * 1024
}

#[test]
fn the_default_parallel_shrinks_to_the_contexts_that_fit() {
    use vkllm::model::source::ModelSource;
    use vkllm::model::LoadOptions;
    use vkllm::server::sizing::{default_parallel, DEFAULT_PARALLEL};
    let path = crate::common::smollm2();
    let cfg = ModelSource::open(&path).unwrap().config().unwrap();
    let bes = vec![crate::common::cpu()];
    let at = |context: usize| {
        let load = LoadOptions {
            context: Some(context),
            ..LoadOptions::default()
        };
        default_parallel(&bes, &cfg, &path, &load)
    };
    assert_eq!(at(1024), DEFAULT_PARALLEL);
    // A context whose f32 K and V take 2/5 of the memory available: two
    // fit, three do not (with room for the weights and some drift).
    let per_position = (2 * cfg.n_layer * cfg.kv_dim() * 4) as u64;
    let context = mem_available() * 2 / 5 / per_position;
    assert_eq!(at(context as usize), 2);
    // Not even one fits: 1, and the load says what does not fit.
    assert_eq!(at(context as usize * 4), 1);
}
