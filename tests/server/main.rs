//! `vkllm serve` as a process on the default model (CPU backend): the
//! official `openai` Python client (installed by scripts/install-deps.sh
//! into .tools/openai) and `curl` against it; API keys and the server's
//! limits, each refused with its status while the server goes on serving;
//! `--parallel` (`parallel.rs`); log-probabilities (`logprobs.rs`); tool
//! calls (`tools.rs`); structured output (`structured.rs`); the chat page
//! at `/` in a headless browser (`page.rs`).

#[path = "../common/mod.rs"]
mod common;
mod http;
mod logprobs;
mod page;
mod parallel;
mod structured;
mod tools;

use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// A running server, killed when dropped.
struct Server {
    child: Child,
    base: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start() -> Server {
    start_with(&[], &[])
}

/// A server given the extra flags `args` and environment `env`.
fn start_with(args: &[&str], env: &[(&str, &str)]) -> Server {
    start_on(&common::smollm2(), args, env)
}

/// A server on `model`, given the extra flags `args`.
fn start_model(model: &std::path::Path, args: &[&str]) -> Server {
    start_on(model, args, &[])
}

fn start_on(model: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_vkllm"))
        .args(["serve", "--port", "0", "-b", "cpu", "-c", "1024", "-m"])
        .arg(model)
        .args(args)
        .env_remove("VKLLM_API_KEY")
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start vkllm serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let base = loop {
        let line = lines
            .next()
            .expect("the server exited before serving")
            .expect("read stderr");
        if let Some(url) = line
            .split(" on ")
            .nth(1)
            .filter(|_| line.starts_with("serving"))
        {
            break url.trim().to_string();
        }
    };
    // Keep draining stderr so the server never blocks on a full pipe.
    std::thread::spawn(move || lines.for_each(drop));
    Server { child, base }
}

fn curl(args: &[&str]) -> (String, String) {
    let o = Command::new("curl")
        .args(["-sS", "-w", "\n%{http_code} %{content_type}"])
        .args(args)
        .output()
        .expect("run curl");
    let text = String::from_utf8_lossy(&o.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').unwrap_or((&text, ""));
    (body.to_string(), status.to_string())
}

#[test]
fn curl_gets_openai_shapes_streams_and_errors() {
    let s = start();
    let (body, status) = curl(&[&format!("{}/health", s.base.trim_end_matches("/v1"))]);
    assert!(status.starts_with("200"), "{status}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "ok", "{body}");
    assert_eq!(
        v["slots"],
        serde_json::json!({"total": 4, "busy": 0, "queued": 0}),
        "{body}"
    );
    assert_eq!(v["kv_pages"]["free"], v["kv_pages"]["total"], "{body}");
    let chat = format!("{}/chat/completions", s.base);
    let req = r#"{"model":"m","messages":[{"role":"user","content":"What is the capital of France?"}],"temperature":0,"max_tokens":16,"stream":true}"#;
    let (body, status) = curl(&["-N", "-d", req, &chat]);
    assert!(status.contains("text/event-stream"), "{status}");
    let data: Vec<&str> = body
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "{body}");
    let text: String = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str::<Value>(d).unwrap())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(String::from)
        })
        .collect();
    assert_eq!(text, "The capital of France is Paris.");
    for (req, status, needle) in [
        ("{not json", "400", "not valid"),
        (
            r#"{"messages":[{"role":"user","content":"hi"}],"top_p":3}"#,
            "400",
            "top_p",
        ),
        (
            r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":0}"#,
            "400",
            "max_tokens",
        ),
        // SmolLM2's template never reads `tools`: it would drop them.
        (
            r#"{"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]}"#,
            "400",
            "does not take tools",
        ),
    ] {
        let (body, got) = curl(&["-d", req, &chat]);
        assert!(got.starts_with(status), "{req}: {got} {body}");
        let v: Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error", "{body}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(needle),
            "{body}"
        );
    }
    let long = format!(r#"{{"prompt":"{}","max_tokens":4}}"#, "word ".repeat(1100));
    let (body, got) = curl(&["-d", &long, &format!("{}/completions", s.base)]);
    assert!(got.starts_with("400"), "{got}");
    assert!(body.contains("context_length_exceeded"), "{body}");
    let (_, got) = curl(&[&format!("{}/nothing", s.base)]);
    assert!(got.starts_with("404"), "{got}");
}

/// The official `openai` Python client (scripts/install-deps.sh installs it
/// into .tools/openai) running tests/server_client.py.
struct OpenAiClient {
    python: String,
    lib: std::path::PathBuf,
}

impl OpenAiClient {
    /// The client, or None after saying that `what` skipped; CI installs
    /// it, so there a missing client is a failure.
    fn find(what: &str) -> Option<Self> {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".into());
        let lib = common::root().join(".tools/openai");
        let has_openai = Command::new(&python)
            .args(["-c", "import openai"])
            .env("PYTHONPATH", &lib)
            .output()
            .is_ok_and(|o| o.status.success());
        if has_openai {
            return Some(OpenAiClient { python, lib });
        }
        assert!(
            std::env::var_os("CI").is_none(),
            "the openai Python package is missing from {}; run scripts/install-deps.sh",
            lib.display()
        );
        eprintln!(
            "SKIPPING {what}: no openai package in {} (run scripts/install-deps.sh)",
            lib.display()
        );
        None
    }

    /// tests/server_client.py against the server at `base` with `args`: the
    /// one JSON object it prints.
    fn run(&self, base: &str, args: &[&str]) -> Value {
        let o = Command::new(&self.python)
            .arg(common::root().join("tests/server_client.py"))
            .arg(base)
            .args(args)
            .env("PYTHONPATH", &self.lib)
            .output()
            .expect("run tests/server_client.py");
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            o.status.success(),
            "server_client.py {args:?} failed: {stderr}"
        );
        serde_json::from_slice(&o.stdout).expect("one JSON object")
    }
}

#[test]
fn the_official_openai_client_works_unchanged() {
    let Some(client) = OpenAiClient::find("the openai client test") else {
        return;
    };
    let mut s = start();
    let v = client.run(&s.base, &[]);
    println!("{}", serde_json::to_string_pretty(&v).unwrap());
    let answer = "The capital of France is Paris.";
    assert_eq!(v["chat"]["content"], answer, "{v}");
    assert_eq!(v["chat"]["role"], "assistant");
    assert_eq!(v["chat"]["finish_reason"], "stop");
    assert_eq!(v["chat"]["usage"], serde_json::json!([37, 8, 45]));
    assert_eq!(v["chat_stream"]["content"], answer);
    assert_eq!(v["chat_stream"]["finish_reason"], "stop");
    assert!(v["chat_stream"]["chunks"].as_u64().unwrap() > 1);
    assert_eq!(v["completion"]["text"], " Paris.\n\nThe");
    assert_eq!(v["completion"]["finish_reason"], "length");
    assert_eq!(v["completion_stop"]["text"], " Paris.");
    assert_eq!(v["completion_stop"]["finish_reason"], "stop");
    assert_eq!(v["completion_stream"], " Paris.\n\nThe");
    assert_eq!(v["seeded_equal"], true);
    for name in ["empty_messages", "bad_temperature", "n2"] {
        assert_eq!(v["errors"][name][0], 400, "{name}: {v}");
    }
    assert_eq!(
        v["models"],
        serde_json::json!(["SmolLM2-135M-Instruct.Q4_1"])
    );
    // The abandoned 2000-token stream was cancelled: the next request is
    // answered at once, by the same process.
    assert_eq!(v["after_disconnect"]["content"], answer);
    assert!(
        v["after_disconnect"]["seconds"].as_f64().unwrap() < 20.0,
        "{v}"
    );
    assert_eq!(
        v["concurrent"]["completion_tokens"],
        serde_json::json!([32, 32, 32, 32])
    );
    assert!(s.child.try_wait().unwrap().is_none(), "the server died");
}

/// The `error` object of an error body, checked for OpenAI's shape.
fn error_of(body: &str) -> Value {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}: {body}"));
    assert!(v["error"]["message"].is_string(), "{body}");
    assert!(v["error"]["type"].is_string(), "{body}");
    v["error"].clone()
}

/// A short greedy completion, answered 200 (with `auth` headers, if any).
fn good_completion(base: &str, auth: &[&str]) -> Value {
    let req = r#"{"prompt":"The capital of France is","max_tokens":4,"temperature":0}"#;
    let url = format!("{base}/completions");
    let mut args = auth.to_vec();
    args.extend(["-d", req, &url]);
    let (body, status) = curl(&args);
    assert!(status.starts_with("200"), "{status} {body}");
    serde_json::from_str(&body).unwrap()
}

#[test]
fn api_keys_guard_every_endpoint_but_health() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.txt");
    std::fs::write(&file, "\nkey-from-file\n\n").unwrap();
    let file = file.to_str().unwrap();
    // No --api-key: VKLLM_API_KEY is read, and the file's keys added.
    let s = start_with(
        &["--api-key-file", file],
        &[("VKLLM_API_KEY", "key-from-env")],
    );
    let root = s.base.trim_end_matches("/v1");
    let (body, status) = curl(&[&format!("{root}/health")]);
    assert!(status.starts_with("200"), "{status} {body}");
    let models = format!("{}/models", s.base);
    let nothing = format!("{}/nothing", s.base);
    let chat = format!("{}/chat/completions", s.base);
    let req = r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    let wrong = "Authorization: Bearer key-from-envX";
    for (args, challenge) in [
        (vec![models.as_str()], "bearer\r\n"),
        (vec![nothing.as_str()], "bearer\r\n"),
        (vec!["-d", req, chat.as_str()], "bearer\r\n"),
        (
            vec!["-H", wrong, models.as_str()],
            r#"bearer error="invalid_token""#,
        ),
        (
            vec!["-H", "Authorization: key-from-env", models.as_str()],
            "bearer\r\n",
        ),
        (
            vec!["-H", wrong, "-d", req, chat.as_str()],
            r#"bearer error="invalid_token""#,
        ),
    ] {
        let (head, _) = curl(&[&["-sS", "-i", "-o", "-"], &args[..]].concat());
        let (body, status) = curl(&args);
        assert!(status.starts_with("401"), "{args:?}: {status} {body}");
        assert_eq!(error_of(&body)["code"], "invalid_api_key", "{body}");
        let head = head.to_ascii_lowercase();
        assert!(
            head.contains(&format!("www-authenticate: {challenge}")),
            "{args:?}: {head}"
        );
    }
    for key in ["key-from-env", "key-from-file"] {
        let auth = format!("Authorization: Bearer {key}");
        let (body, status) = curl(&["-H", &auth, &models]);
        assert!(status.starts_with("200"), "{key}: {status} {body}");
        good_completion(&s.base, &["-H", &auth]);
    }
    // The scheme is case-insensitive (RFC 7235); an unknown path with a
    // key is an ordinary 404.
    let (_, status) = curl(&["-H", "Authorization: bearer key-from-file", &nothing]);
    assert!(status.starts_with("404"), "{status}");
}

#[test]
fn each_limit_is_a_clear_error_and_the_server_goes_on() {
    let mut s = start_with(
        &[
            "--max-body-bytes",
            "4096",
            "--max-completion-tokens",
            "64",
            "--max-prompt-tokens",
            "48",
            "--max-connections",
            "3",
        ],
        &[],
    );
    let completions = format!("{}/completions", s.base);
    let big = format!(r#"{{"prompt":"{}","max_tokens":1}}"#, "x".repeat(5000));
    let long = format!(r#"{{"prompt":"{}","max_tokens":1}}"#, "word ".repeat(100));
    for (req, status, needles) in [
        (big.as_str(), "413", &["limit of 4096 bytes"][..]),
        (
            r#"{"prompt":"hi","max_tokens":65}"#,
            "400",
            &["max_tokens is 65", "at most 64"],
        ),
        (
            r#"{"prompt":"hi","max_completion_tokens":1000000}"#,
            "400",
            &["max_completion_tokens is 1000000", "at most 64"],
        ),
        (
            long.as_str(),
            "400",
            &["the prompt has 101 tokens", "at most 48"],
        ),
    ] {
        let (body, got) = curl(&["-d", req, &completions]);
        assert!(got.starts_with(status), "{got} {body}");
        let e = error_of(&body);
        for needle in needles {
            assert!(e["message"].as_str().unwrap().contains(needle), "{body}");
        }
        good_completion(&s.base, &[]);
    }
    // Without max_tokens a request stops at the server's bound.
    let req = r#"{"prompt":"Once upon a time","temperature":0,"ignore_eos":true}"#;
    let (body, got) = curl(&["-d", req, &completions]);
    assert!(got.starts_with("200"), "{got} {body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 64, "{body}");
    assert_eq!(v["choices"][0]["finish_reason"], "length", "{body}");

    // Three kept-alive connections fill the server; a fourth client is
    // told 503. Each of the three is known to hold its place (it was
    // answered 200); one refused while an earlier client's close was still
    // unnoticed is opened again.
    let addr = s.base.trim_start_matches("http://");
    let addr = addr.trim_end_matches("/v1");
    let mut held = Vec::new();
    for _ in 0..50 {
        if held.len() == 3 {
            break;
        }
        let r = http::get_kept_alive(addr, "/v1/models");
        match r.status {
            200 => held.push(r),
            503 => std::thread::sleep(Duration::from_millis(100)),
            other => panic!("unexpected status {other}"),
        }
    }
    assert_eq!(held.len(), 3, "three connections could not be opened");
    let (head, _) = curl(&["-sS", "-i", "-o", "-", &format!("{}/models", s.base)]);
    let (body, status) = curl(&[&format!("{}/models", s.base)]);
    assert!(status.starts_with("503"), "{status} {body}");
    assert!(error_of(&body)["message"]
        .as_str()
        .unwrap()
        .contains("3 connections open"));
    assert!(
        head.to_ascii_lowercase().contains("retry-after: 1"),
        "{head}"
    );
    // Once they close, clients are served again (the server notices each
    // close a moment later, hence the bounded retries).
    drop(held);
    let served = (0..50).any(|_| {
        let (_, status) = curl(&[&format!("{}/models", s.base)]);
        status.starts_with("200") || {
            std::thread::sleep(Duration::from_millis(100));
            false
        }
    });
    assert!(
        served,
        "the server still refuses after its connections closed"
    );
    good_completion(&s.base, &[]);
    assert!(s.child.try_wait().unwrap().is_none(), "the server died");
}
